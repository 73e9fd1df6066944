//! Records charged through the real client: crashes, old keys, declines,
//! authentication, rejections, a 404 that names nothing, the audit's listings.

use super::*;

#[tokio::test]
async fn a_crash_between_charge_and_complete_is_replayed_by_the_next_owner_and_charges_once() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4200, &payer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let first = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(first.len(), 1, "charged before the crash");
    assert_eq!(h.record(order.id()).await.unwrap().state, State::InProgress);

    // After the lease expires, a second invocation takes over and replays the key.
    h.redeliver_later();
    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt.as_deref(),
        Some(first[0].as_str()),
        "the same PaymentIntent"
    );
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1,
        "localstripe holds one PaymentIntent"
    );
}

#[tokio::test]
async fn an_old_key_is_reconciled_and_the_payment_found_is_completed() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 990, &payer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let charged = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charged.len(), 1);

    // A day later the key is older than PROVIDER_KEY_TTL: look up, do not re-send.
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    done_with_its_first_keys_payment(&h, &order, &payer, &charged[0]).await;
}
/// The order is done with the one PaymentIntent its customer has, `charged`, made under
/// its first key: nothing was ever sent under the next attempt's.
async fn done_with_its_first_keys_payment(
    h: &Harness<HttpProvider>,
    order: &Order,
    payer: &Payer,
    charged: &str,
) {
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(charged));
    assert!(
        localstripe::versions_sent_under(&key(order, 2))
            .await
            .is_empty(),
        "nothing sent under the next attempt's key"
    );
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1
    );
}

#[tokio::test]
async fn an_old_key_not_found_moves_to_the_next_attempt_and_charges_once() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 1234, &payer);
    let h = Harness::new(provider()).await;
    // A reservation made a day ago whose invocation died before sending anything.
    Lease::of(&order, "died-before-sending", h.clock.now())
        .max_declines(harness::rig::MAX_DECLINES)
        .make(h.table.store.as_ref())
        .await;
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));

    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        localstripe::versions_sent_under(&key(&order, 2)).await,
        [STRIPE_VERSION],
        "not found: the payment went under the next attempt's key"
    );
    assert!(
        localstripe::versions_sent_under(&key(&order, 1))
            .await
            .is_empty()
    );
    let charges = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(record.receipt.as_deref(), Some(charges[0].as_str()));
}

/// After a decline, the declined PaymentIntent is cancelled before the order moves to
/// its next key: nobody can confirm it later, so at most one payment can succeed.
/// (localstripe cannot confirm a declined PaymentIntent again, and the payment method
/// is part of the order, so the same order is never paid with another card.)
#[tokio::test]
async fn a_declined_order_has_its_open_payment_cancelled_before_it_moves_to_attempt_two() {
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 3100, &payer);
    let h = Harness::new(provider()).await;
    let event = single_event_with_body(&body(&order));
    assert_eq!(
        h.invoke_event_with(event.clone(), harness::rig::INVOCATION)
            .await
            .len(),
        1
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(2)));
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(
        statuses(&intents),
        ["canceled"],
        "the declined payment is cancelled: {intents:?}"
    );

    // SQS redelivers: attempt two is declined too, and cancelled in turn.
    h.redeliver_later();
    assert_eq!(
        h.invoke_event_with(event, harness::rig::INVOCATION)
            .await
            .len(),
        1
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(3)));
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["canceled", "canceled"], "{intents:?}");
    assert!(localstripe::succeeded_of(&payer.customer).await.is_empty());
}

/// An order that needs the customer's authentication is acknowledged and awaits its
/// customer with its one PaymentIntent; a redelivery makes no other; once the customer
/// has confirmed it, the scheduled settler finds it paid and completes the order with it.
#[tokio::test]
async fn an_order_that_needs_authentication_awaits_its_customer_and_the_settler_completes_it_once_confirmed()
 {
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let order = order_of(&unique_id(), 2700, &payer);
    let h = Harness::new(provider()).await;
    let event = single_event_with_body(&body(&order));
    assert!(
        h.invoke_event_with(event.clone(), harness::rig::INVOCATION)
            .await
            .is_empty(),
        "acknowledged: the table holds the order"
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Awaiting, Some(1)));
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["requires_action"]);
    let payment_id = intents[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(record.awaited.as_deref(), Some(payment_id.as_str()));

    // Delivered again while it waits: no call, no other payment.
    h.redeliver_later();
    assert!(
        h.invoke_event_with(event, harness::rig::INVOCATION)
            .await
            .is_empty()
    );
    localstripe::authenticate(&payment_id).await;
    let run = charge_once::drivers::settle::Settler {
        store: h.table.store.as_ref(),
        provider: h.provider.as_ref(),
        refunds: None,
        reports: &charge_once::contracts::queue::Unreported,
        settings: &h.settings,
        time: Duration::from_secs(120),
        limit: 10,
        per_run: usize::MAX,
    }
    .run()
    .await
    .unwrap();
    assert_eq!((run.read, run.completed), (1, 1), "{run:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(payment_id.as_str()));
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1,
        "no second payment"
    );
}

#[tokio::test]
async fn a_charge_the_provider_rejects_for_good_fails_as_rejected_with_its_code_and_moves_to_the_next_key()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    // The provider has no such customer: 404 `resource_missing`, on every retry alike.
    let order = Order::new(
        &unique_id(),
        800,
        "eur",
        "cus_nobodyknows",
        "pm_nobodyknows",
    )
    .unwrap();
    let h = Harness::new(provider()).await;
    let failed = invoke_order(&h, &order).await;
    assert_eq!(failed.len(), 1);
    // Nothing under its key can succeed: the redrive after the fix, or a corrected
    // copy, is a new attempt, whose key was never sent.
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(
        (record.state, record.attempt, record.sent),
        (State::Free, Some(2), None)
    );

    let text = logs.text();
    let line: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["fields"]["outcome"].is_string())
        .unwrap_or_else(|| panic!("no outcome line:\n{text}"));
    assert_eq!(line["fields"]["outcome"], "rejected", "{line}");
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["fields"]["code"], "resource_missing", "{line}");
    assert_eq!(line["fields"]["status"], 404, "{line}");
    assert!(
        !text.contains("Not Found"),
        "provider text is never logged:\n{text}"
    );
}

#[tokio::test]
async fn a_404_that_names_no_missing_object_is_a_setting_fault_retried_never_rejected() {
    // A base URL pasted with its `/v1`: every payment goes to /v1/v1/payment_intents,
    // which the provider answers 404 without `resource_missing`. Every order would fail
    // alike, so it is a setting to fix: retried with the key kept, at error level,
    // counted by the breaker; never `rejected`, which would dead-letter every order.
    let logs = Captured::default();
    let _guard = logs.install();
    let url = format!("{}/v1", harness::servers::localstripe_url());
    let options = Options {
        breaker_threshold: Some(2),
        ..Options::default()
    };
    let h = Harness::with(provider_at(&url, PAYMENT_TIMEOUT), options).await;
    let payer = localstripe::payer(Card::Visa).await;
    let orders: Vec<Order> = (0..3)
        .map(|_| order_of(&unique_id(), 900, &payer))
        .collect();
    for order in &orders {
        let failed = invoke_order(&h, order).await;
        assert_eq!(failed.len(), 1);
    }
    let lines: Vec<serde_json::Value> = logs
        .text()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["fields"]["outcome"].is_string())
        .collect();
    let seen: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["fields"]["outcome"].as_str().unwrap(),
                l["level"].as_str().unwrap(),
            )
        })
        .collect();
    // Two failures in a row open the breaker: the third order is deferred.
    assert_eq!(
        seen,
        [
            ("failed_retryable", "ERROR"),
            ("failed_retryable", "ERROR"),
            ("deferred", "WARN")
        ]
    );
    assert!(
        lines[0]["fields"]["reason"]
            .as_str()
            .unwrap()
            .contains("check PAYMENT_API_URL"),
        "{}",
        lines[0]
    );
    let record = h.record(orders[0].id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    assert!(
        h.record(orders[2].id()).await.is_none(),
        "deferred: no write"
    );
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
}

/// The audit's reads: `created[gte]`, every page of the listing (more than one page of
/// 100 here), each PaymentIntent once with what the audit compares, whatever its
/// status; one by id; an unknown id is none.
#[tokio::test]
async fn the_audit_lists_every_page_of_payment_intents_since_a_time_and_finds_one_by_id() {
    let p = provider();
    let payer = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let since = charge_once::domain::clock::Time::from_ms(charge_once::domain::clock::wall_ms())
        - Duration::from_secs(5);
    let mut made = Vec::new();
    for n in 0..130 {
        let o = order_of(&unique_id(), 100 + n, &payer);
        let receipt = p.charge(&o, &key(&o, 1)).await.unwrap();
        made.push((receipt.id, o));
    }
    let declined = order_of(&unique_id(), 555, &declining);
    assert!(p.charge(&declined, &key(&declined, 1)).await.is_err());

    let listed = p.payments_since(since).await.unwrap();
    let mine: Vec<_> = listed
        .iter()
        .filter(|c| c.customer.as_deref() == Some(payer.customer.as_str()))
        .collect();
    assert_eq!(mine.len(), made.len(), "each PaymentIntent listed once");
    for (id, o) in &made {
        let c = mine.iter().find(|c| c.id == *id).expect("listed");
        assert_eq!(c.order_id.as_deref(), Some(o.id()));
        assert_eq!((c.amount, c.currency.as_str()), (o.amount(), "eur"));
        assert_eq!(c.payment_method.as_deref(), Some(payer.card.as_str()));
        assert!(c.succeeded() && c.created.as_secs() >= since.as_secs());
    }
    let theirs: Vec<_> = listed
        .iter()
        .filter(|c| c.customer.as_deref() == Some(declining.customer.as_str()))
        .collect();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0].status, "requires_payment_method");
    assert!(!theirs[0].succeeded());
    // Nothing was made after a time to come.
    let later = since + Duration::from_secs(3600);
    assert!(p.payments_since(later).await.unwrap().is_empty());
    // The server filters on `created` itself, before the page is cut: a page of 100
    // says there is more, the next holds the rest, and a time to come lists nothing.
    let page = |created: i64, after: Option<&str>| {
        let mut query = vec![
            ("customer", payer.customer.clone()),
            ("created[gte]", created.to_string()),
            ("limit", "100".to_owned()),
        ];
        query.extend(after.map(|a| ("starting_after", a.to_owned())));
        async move {
            let answer = harness::http_client()
                .get(format!(
                    "{}/v1/payment_intents",
                    harness::servers::localstripe_url()
                ))
                .bearer_auth(TEST_KEY)
                .query(&query)
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success(), "{answer:?}");
            answer.json::<Value>().await.unwrap()
        }
    };
    let first = page(since.as_secs(), None).await;
    assert_eq!(first["data"].as_array().unwrap().len(), 100);
    assert_eq!(first["has_more"], true);
    let last = first["data"][99]["id"].as_str().unwrap();
    let rest = page(since.as_secs(), Some(last)).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 30);
    assert_eq!(rest["has_more"], false);
    let none = page(later.as_secs(), None).await;
    assert_eq!(
        (none["data"].as_array().unwrap().len(), &none["has_more"]),
        (0, &Value::Bool(false))
    );

    let (id, o) = &made[0];
    let one = p.payment_by_id(id).await.unwrap().expect("found by id");
    assert_eq!(one.order_id.as_deref(), Some(o.id()));
    assert!(one.succeeded());
    assert_eq!(p.payment_by_id("pi_never_issued").await.unwrap(), None);
    // A receipt is whatever the table holds: it stays one path segment.
    assert_eq!(p.payment_by_id("../customers").await.unwrap(), None);
}

/// Stripe stores a 500 under its key and says its payment may still appear: the record
/// keeps the key through every delivery, and the payment that appears completes it. No
/// second PaymentIntent is ever made for the order.
/// The audit's read of late confirmations: the `payment_intent.succeeded` events
/// since a time (`type`, `created[gte]`, every page of 100, under the pinned version),
/// each one's PaymentIntent: one created before that time and confirmed after it by
/// the customer is there, succeeded, with its order; one that was only created before
/// is not.
#[tokio::test]
async fn the_audit_lists_the_payments_that_succeeded_since_a_time_whenever_they_were_created() {
    let p = provider();
    let waiting = localstripe::payer(Card::RequiresAuthentication).await;
    let late = order_of(&unique_id(), 2600, &waiting);
    let Err(PaymentError::AuthenticationRequired {
        payment_id: Some(late_id),
    }) = p.charge(&late, &key(&late, 1)).await
    else {
        panic!("expected AuthenticationRequired with its id")
    };
    let payer = localstripe::payer(Card::Visa).await;
    let before = order_of(&unique_id(), 2601, &payer);
    let before_id = p.charge(&before, &key(&before, 1)).await.unwrap().id;
    // The window starts at the next whole second (`created` is in seconds).
    let since = Time::from_secs(now().as_secs() + 1);
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(since.as_ms() - now().as_ms()).unwrap_or(0),
    ))
    .await;
    localstripe::authenticate(&late_id).await;
    let mut made = Vec::new();
    for n in 0..101 {
        let o = order_of(&unique_id(), 2700 + n, &payer);
        made.push(p.charge(&o, &key(&o, 1)).await.unwrap().id);
    }

    let confirmed = p.confirmed_since(since).await.unwrap();
    let once = |id: &str| confirmed.iter().filter(|c| c.payment.id == id).count();
    let found = confirmed
        .iter()
        .find(|c| c.payment.id == late_id)
        .expect("the late confirmation is listed");
    assert!(found.payment.succeeded(), "{found:?}");
    assert_eq!(found.payment.order_id.as_deref(), Some(late.id()));
    assert!(
        found.payment.created < since && found.at >= since,
        "{found:?}"
    );
    assert_eq!(once(&late_id), 1);
    assert!(
        made.iter().all(|id| once(id) == 1),
        "each payment of the window once"
    );
    assert_eq!(once(&before_id), 0, "succeeded before the window");
    // Every page was read, each under the pinned version and the filters.
    let pages: Vec<_> = localstripe::requests_seen(Some("/v1/events"))
        .await
        .into_iter()
        .filter(|r| r.param("created[gte]") == Some(since.as_secs().to_string().as_str()))
        .collect();
    assert!(pages.len() >= 2, "{pages:?}");
    assert!(
        pages.iter().all(|r| r.stripe_version == STRIPE_VERSION
            && r.param("type") == Some("payment_intent.succeeded")
            && r.param("limit") == Some("100")),
        "{pages:?}"
    );
    assert!(
        p.confirmed_since(since + Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_stored_server_error_whose_payment_appears_later_completes_the_order_with_one_payment() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4321, &payer);
    let h = Harness::new(provider()).await;
    let after = Duration::from_secs(2);
    localstripe::arm_fault(
        &key(&order, 1),
        localstripe::Fault::ServerErrorRollsForward { after },
    )
    .await;

    // The 500 and its replay: looked up, nothing yet, the key kept.
    assert_eq!(invoke_order(&h, &order).await.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    h.redeliver_later();
    assert_eq!(
        invoke_order(&h, &order).await.len(),
        1,
        "still indeterminate"
    );

    // Stripe rolls the payment forward; the next delivery finds it.
    tokio::time::sleep(after).await;
    h.redeliver_later();
    assert!(invoke_order(&h, &order).await.is_empty());
    let charged = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charged.len(), 1);
    done_with_its_first_keys_payment(&h, &order, &payer, &charged[0]).await;
}
