//! The requests the HTTP provider makes and their answers on localstripe behind its
//! layer: a payment and its replay, declines, authentication, cancels, lookups, the
//! pinned version.

use super::*;
use charge_once::domain::OrderKey;

#[tokio::test]
async fn a_payment_and_its_replay_are_one_payment_intent_made_under_the_pinned_version() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 5000, &payer);
    let key = key(&order, 1);
    let first = provider().charge(&order, &key).await.unwrap();
    assert!(first.id.starts_with("pi_"), "{first:?}");
    assert!(
        first
            .charge
            .as_deref()
            .is_some_and(|c| c.starts_with("ch_")),
        "{first:?}"
    );
    let again = provider().charge(&order, &key).await.unwrap();
    assert_eq!(again, first);

    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(intents.len(), 1, "one PaymentIntent: {intents:?}");
    let intent = &intents[0];
    assert_eq!(intent["id"], first.id.as_str());
    assert_eq!(status(intent), "succeeded");
    assert_eq!(intent["amount"], 5000);
    assert_eq!(intent["currency"], "eur");
    assert_eq!(intent["payment_method"], payer.card.as_str());
    assert_eq!(intent["metadata"]["order_id"], order.id());
    assert_eq!(
        intent["automatic_payment_methods"],
        serde_json::json!({"enabled": true, "allow_redirects": "never"}),
        "no redirect-based method can be chosen off-session"
    );
    assert_eq!(
        intent["payment_method_options"]["card"]["stored_credential_usage"], "unscheduled",
        "a merchant-initiated charge on a saved card says so"
    );
    assert_eq!(
        localstripe::versions_sent_under(&key).await,
        [STRIPE_VERSION, STRIPE_VERSION],
        "both requests carried the pinned version"
    );
}

#[tokio::test]
async fn a_decline_and_its_replay_are_declined_with_their_code_and_leave_one_open_payment() {
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 700, &payer);
    let key = key(&order, 1);
    let mut named = Vec::new();
    for _ in 0..2 {
        match provider().charge(&order, &key).await {
            Err(PaymentError::Declined {
                code,
                decline_code,
                payment_id,
            }) => {
                assert_eq!(code, "card_declined");
                // localstripe names no decline_code (Stripe does).
                assert_eq!(decline_code, None);
                named.push(payment_id);
            }
            other => panic!("expected Declined, got {other:?}"),
        }
    }
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(
        statuses(&intents),
        ["requires_payment_method"],
        "{intents:?}"
    );
    let left = intents[0]["id"].as_str().unwrap().to_owned();
    assert!(left.starts_with("pi_"), "{left}");
    assert_eq!(
        named,
        [Some(left.clone()), Some(left)],
        "the decline and its replay name the PaymentIntent localstripe made"
    );
    assert_eq!(intents[0]["metadata"]["order_id"], order.id());
    match provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    {
        Lookup::Open {
            payment_id, status, ..
        } => {
            assert_eq!(payment_id, intents[0]["id"].as_str().unwrap());
            assert_eq!(status, "requires_payment_method");
        }
        other => panic!("expected the declined payment open, got {other:?}"),
    }
}

#[tokio::test]
async fn a_payment_that_needs_the_customer_names_its_payment_intent_which_stays_open() {
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let order = order_of(&unique_id(), 2500, &payer);
    let payment_id = match provider().charge(&order, &key(&order, 1)).await {
        Err(PaymentError::AuthenticationRequired {
            payment_id: Some(id),
        }) => id,
        other => panic!("expected AuthenticationRequired with its id, got {other:?}"),
    };
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["requires_action"]);
    assert_eq!(intents[0]["id"], payment_id.as_str());
    assert_eq!(
        provider()
            .find_payment(&order, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::Open {
            payment_id: payment_id.clone(),
            status: "requires_action".into(),
            awaits_customer: true,
        }
    );
    // The customer confirms it on the shop's page: the lookup finds it paid.
    localstripe::authenticate(&payment_id).await;
    match provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    {
        Lookup::Succeeded(receipt) => assert_eq!(receipt.id, payment_id),
        other => panic!("expected the authenticated payment, got {other:?}"),
    }
}

#[tokio::test]
async fn an_open_payment_is_cancelled_once_and_a_succeeded_one_cannot_be() {
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 1100, &declining);
    let declined = provider().charge(&order, &key(&order, 1)).await;
    assert!(
        matches!(declined, Err(PaymentError::Declined { .. })),
        "{declined:?}"
    );
    let Lookup::Open { payment_id, .. } = provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    else {
        panic!("the declined payment is open")
    };
    assert_eq!(
        provider().cancel(&payment_id).await.unwrap(),
        Cancel::Cancelled
    );
    assert_eq!(
        statuses(&localstripe::payment_intents_of(&declining.customer).await),
        ["canceled"]
    );
    assert_eq!(
        provider()
            .find_payment(&order, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::NotFound,
        "a cancelled payment does not count"
    );
    assert_eq!(
        provider().cancel(&payment_id).await.unwrap(),
        Cancel::NotCancellable,
        "cancelled already"
    );

    let paying = localstripe::payer(Card::Visa).await;
    let paid = order_of(&unique_id(), 1100, &paying);
    let receipt = provider().charge(&paid, &key(&paid, 1)).await.unwrap();
    assert_eq!(
        provider().cancel(&receipt.id).await.unwrap(),
        Cancel::NotCancellable
    );
    assert_eq!(
        localstripe::succeeded_of(&paying.customer).await,
        [receipt.id]
    );
    // No such payment: the provider names the missing object.
    let unknown = provider().cancel("pi_never_issued").await;
    assert!(
        matches!(
            unknown,
            Err(PaymentError::Rejected {
                status: 404,
                code: Some(ref code)
            }) if code == "resource_missing"
        ),
        "{unknown:?}"
    );
}

/// More than one page of the customer's PaymentIntents (100 a page): the order's
/// payment is found on the last one, and "not found" is said only after every page.
#[tokio::test]
async fn a_lookup_reads_every_page_of_the_customers_payments() {
    let p = provider();
    let payer = localstripe::payer(Card::Visa).await;
    for n in 0..100 {
        let other = order_of(&unique_id(), 200 + n, &payer);
        p.charge(&other, &key(&other, 1)).await.unwrap();
    }
    let order = order_of(&unique_id(), 4321, &payer);
    assert_eq!(
        p.find_payment(&order, Time::from_ms(0)).await.unwrap(),
        Lookup::NotFound
    );
    let receipt = p.charge(&order, &key(&order, 1)).await.unwrap();
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        101
    );
    match p.find_payment(&order, Time::from_ms(0)).await.unwrap() {
        Lookup::Succeeded(found) => assert_eq!(found.id, receipt.id),
        other => panic!("expected the order's payment on page two, got {other:?}"),
    }
    // The same order id with another amount is not this order's payment.
    let other_amount = order_of(order.id(), 4322, &payer);
    assert_eq!(
        p.find_payment(&other_amount, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::NotFound
    );
}

/// 5,000 earlier PaymentIntents of the customer, made two days ago: a lookup bounded by
/// the record's creation reads one page and finds the order; one from the epoch reads
/// every page it may and refuses to say "not found".
#[tokio::test]
async fn a_lookup_bounded_by_the_records_creation_reads_one_page_past_thousands_of_earlier_payments()
 {
    let payer = localstripe::payer(Card::Visa).await;
    let two_days_ago = now() - Duration::from_secs(2 * 86_400);
    localstripe::seed_payment_intents(&payer.customer, 5_000, two_days_ago.as_secs()).await;
    let order = order_of(&unique_id(), 3300, &payer);
    let since = now() - Duration::from_secs(60);
    let receipt = provider().charge(&order, &key(&order, 1)).await.unwrap();

    assert_eq!(
        provider().find_payment(&order, since).await.unwrap(),
        Lookup::Succeeded(receipt.clone())
    );
    let bounded = listings_of(&payer.customer).await;
    assert_eq!(bounded.len(), 1, "one page: {bounded:?}");
    assert_eq!(
        bounded[0].param("created[gte]"),
        Some(since.as_secs().to_string().as_str())
    );
    assert_eq!(bounded[0].param("starting_after"), None);

    // From the epoch the order's payment is past the pages a lookup reads: an error,
    // never a false "not found" that would send a new key.
    let unbounded = provider().find_payment(&order, Time::from_ms(0)).await;
    assert!(
        matches!(
            unbounded,
            Err(PaymentError::Retryable {
                kind: FailureKind::BadResponse,
                ..
            })
        ),
        "{unbounded:?}"
    );
    let all = listings_of(&payer.customer).await;
    assert!(all.len() > 2, "it read page after page: {}", all.len());
    assert!(all.len() <= 1 + 5_001 / 100, "bounded: {}", all.len());
    assert!(
        all.iter().all(|r| r.param("created[gte]").is_some()),
        "created[gte] on every lookup: {all:?}"
    );
}

/// Charge (a decline), lookup, fetch by id and cancel, and the audit's two listings:
/// every request the provider makes carries the pinned version, whatever the account's
/// default, and names only what Stripe declares for that version (the layer refuses
/// anything else with Stripe's `parameter_unknown`, so each call below succeeding holds
/// its request to that).
#[tokio::test]
async fn every_request_the_provider_makes_carries_the_pinned_version_and_only_declared_names() {
    let p = provider();
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 1900, &payer);
    let key = key(&order, 1);
    let Err(PaymentError::Declined {
        payment_id: Some(payment_id),
        ..
    }) = p.charge(&order, &key).await
    else {
        panic!("expected a decline naming its PaymentIntent")
    };
    assert!(matches!(
        p.find_payment(&order, now() - Duration::from_secs(60))
            .await
            .unwrap(),
        Lookup::Open { .. }
    ));
    assert!(p.payment_by_id(&payment_id).await.unwrap().is_some());
    assert_eq!(p.cancel(&payment_id).await.unwrap(), Cancel::Cancelled);
    let since = now() - Duration::from_secs(60);
    assert!(
        p.payments_since(since)
            .await
            .unwrap()
            .iter()
            .any(|l| l.id == payment_id)
    );
    p.confirmed_since(since).await.unwrap();

    let seen = localstripe::requests_seen(None).await;
    let intent_path = format!("/v1/payment_intents/{payment_id}");
    let cancel_path = format!("{intent_path}/cancel");
    let mine: Vec<(&str, &str, &str)> = seen
        .iter()
        .filter(|r| {
            r.idempotency_key.as_deref() == Some(key.as_str())
                || r.param("customer") == Some(payer.customer.as_str())
                || r.path == intent_path
                || r.path == cancel_path
        })
        .map(|r| {
            (
                r.method.as_str(),
                r.path.as_str(),
                r.stripe_version.as_str(),
            )
        })
        .collect();
    assert_eq!(
        mine,
        [
            ("POST", "/v1/payment_intents", STRIPE_VERSION),
            ("GET", "/v1/payment_intents", STRIPE_VERSION),
            ("GET", intent_path.as_str(), STRIPE_VERSION),
            ("POST", cancel_path.as_str(), STRIPE_VERSION),
        ]
    );
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_needs_reconciliation() {
    let payer = localstripe::payer(Card::Visa).await;
    let id = unique_id();
    let key = Key::for_order_id(&id).provider_key(1);
    provider()
        .charge(&order_of(&id, 100, &payer), &key)
        .await
        .unwrap();
    let other = provider().charge(&order_of(&id, 200, &payer), &key).await;
    assert!(matches!(other, Err(PaymentError::KeyReused)), "{other:?}");
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1
    );
}
