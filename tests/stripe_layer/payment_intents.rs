//! PaymentIntents as Stripe keeps them: lists, off-session confirms, authentication,
//! cancels, the version's declared names, stored server errors, events on the partner
//! bus.

use super::*;

#[tokio::test]
async fn the_payment_intent_list_keeps_one_customers_page_by_page() {
    let (ours, theirs) = (localstripe::customer().await, localstripe::customer().await);
    let (our_card, their_card) = (
        localstripe::card(&ours, Card::Visa).await,
        localstripe::card(&theirs, Card::Visa).await,
    );
    let mut made = Vec::new();
    for order in ["a", "b", "c"] {
        let made_now = payment_intent(&ours, &our_card, order).await;
        made.push(made_now.body["id"].as_str().unwrap().to_owned());
        payment_intent(&theirs, &their_card, order).await;
    }
    let list = |query: Vec<(&'static str, String)>| async move {
        let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        get(localstripe_url(), "/v1/payment_intents", &query).await
    };
    let first = list(vec![("customer", ours.clone()), ("limit", "2".into())]).await;
    assert_eq!(first.body["has_more"], true, "{first:?}");
    let last = ids(&first)[1].clone();
    let rest = list(vec![
        ("customer", ours.clone()),
        ("limit", "2".into()),
        ("starting_after", last),
    ])
    .await;
    assert_eq!(rest.body["has_more"], false, "{rest:?}");
    assert_eq!([ids(&first), ids(&rest)].concat(), made);
    assert_eq!(localstripe::payment_intents_of(&theirs).await.len(), 3);
    let nobody = localstripe::customer().await;
    assert!(localstripe::payment_intents_of(&nobody).await.is_empty());
}

#[tokio::test]
async fn an_off_session_confirm_succeeds_declines_or_asks_for_authentication_by_test_card() {
    let customer = localstripe::customer().await;
    let visa = localstripe::card(&customer, Card::Visa).await;
    let succeeded = payment_intent(&customer, &visa, "visa").await;
    assert_eq!(succeeded.status, 200, "{succeeded:?}");
    assert_eq!(succeeded.body["status"], "succeeded");
    // The charge comes as an object, never as an id.
    assert_eq!(succeeded.body["latest_charge"]["status"], "succeeded");

    let declining = localstripe::card(&customer, Card::DeclinesOnCharge).await;
    let declined = payment_intent(&customer, &declining, "declined").await;
    assert_eq!(
        (
            declined.status,
            declined.error("type"),
            declined.error("code")
        ),
        (
            402,
            Some("invalid_request_error".to_owned()),
            Some("card_declined".to_owned())
        ),
        "{declined:?}"
    );
    assert!(declined.charge().unwrap().starts_with("ch_"));
    // The layer names the PaymentIntent the decline left behind, as Stripe does.
    let left = &declined.body["error"]["payment_intent"];
    assert_eq!(left["status"], "requires_payment_method", "{declined:?}");
    assert_eq!(
        left["last_payment_error"]["charge"],
        declined.charge().unwrap()
    );
    let left_behind = left["id"].as_str().unwrap().to_owned();
    assert_eq!(declined.body["error"].get("decline_code"), None);

    let authenticating = localstripe::card(&customer, Card::RequiresAuthentication).await;
    let asks = payment_intent(&customer, &authenticating, "authenticate").await;
    assert_eq!(asks.status, 200, "{asks:?}");
    assert_eq!(asks.body["status"], "requires_action");
    assert_eq!(asks.body["next_action"]["type"], "use_stripe_sdk");
    assert_eq!(asks.body["latest_charge"], Value::Null);

    // The declined PaymentIntent is kept, found by its customer and metadata.
    let listed = localstripe::payment_intents_of(&customer).await;
    let by_order = |order: &str| {
        listed
            .iter()
            .find(|pi| pi["metadata"]["order_id"] == order)
            .unwrap_or_else(|| panic!("{order} listed: {listed:?}"))
            .clone()
    };
    let declined = by_order("declined");
    assert_eq!(declined["id"], left_behind.as_str());
    assert_eq!(declined["status"], "requires_payment_method");
    assert_eq!(declined["last_payment_error"]["code"], "card_declined");
    assert_eq!(by_order("visa")["status"], "succeeded");
    assert_eq!(by_order("authenticate")["status"], "requires_action");
}

#[tokio::test]
async fn a_payment_intent_that_requires_action_succeeds_once_the_customer_authenticates() {
    let customer = localstripe::customer().await;
    let card = localstripe::card(&customer, Card::RequiresAuthentication).await;
    let asks = payment_intent(&customer, &card, "authenticate").await;
    let id = asks.body["id"].as_str().unwrap();
    let done = localstripe::authenticate(id).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["latest_charge"]["status"], "succeeded");
    let listed = localstripe::payment_intents_of(&customer).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["status"], "succeeded");
}

#[tokio::test]
async fn a_payment_intent_is_cancelled_until_it_succeeds_and_refused_after() {
    let customer = localstripe::customer().await;
    let cards = [
        Card::Visa,
        Card::DeclinesOnCharge,
        Card::RequiresAuthentication,
    ];
    for card in cards {
        let method = localstripe::card(&customer, card).await;
        payment_intent(&customer, &method, &format!("{card:?}")).await;
    }
    let listed = localstripe::payment_intents_of(&customer).await;
    let mut seen = Vec::new();
    for intent in &listed {
        let id = intent["id"].as_str().unwrap();
        let first = cancel(id).await;
        let again = cancel(id).await;
        seen.push((
            intent["status"].as_str().unwrap().to_owned(),
            first.status,
            first.body["status"].clone(),
            again.status,
            again.error("code"),
        ));
    }
    let cancelled = |status: &str| (status.to_owned(), 200, Value::from("canceled"), 400, None);
    assert_eq!(
        seen,
        [
            ("succeeded".to_owned(), 400, Value::Null, 400, None),
            cancelled("requires_payment_method"),
            cancelled("requires_action"),
        ]
    );
}

#[tokio::test]
async fn a_declined_payment_intent_cannot_be_confirmed_again_with_another_card() {
    let customer = localstripe::customer().await;
    let declining = localstripe::card(&customer, Card::DeclinesOnCharge).await;
    let visa = localstripe::card(&customer, Card::Visa).await;
    payment_intent(&customer, &declining, "again").await;
    let declined = localstripe::payment_intents_of(&customer).await;
    let id = declined[0]["id"].as_str().unwrap();
    let confirm = format!("/v1/payment_intents/{id}/confirm");
    let with_card = Call::default()
        .post(localstripe_url(), &confirm, &[("payment_method", &visa)])
        .await;
    assert_eq!(
        (with_card.status, with_card.error("message")),
        (500, Some("Not implemented".to_owned()))
    );
    let update = format!("/v1/payment_intents/{id}");
    let updated = Call::default()
        .post(localstripe_url(), &update, &[("payment_method", &visa)])
        .await;
    assert_eq!(updated.status, 200, "{updated:?}");
    assert_eq!(updated.body["status"], "requires_payment_method");
    let plain = Call::default().post(localstripe_url(), &confirm, &[]).await;
    assert_eq!(plain.status, 400, "{plain:?}");
}

#[tokio::test]
async fn the_payment_intent_list_carries_metadata_filters_on_creation_and_on_nothing_else() {
    let customer = localstripe::customer().await;
    let card = localstripe::card(&customer, Card::Visa).await;
    payment_intent(&customer, &card, "order-7").await;
    let listed = localstripe::payment_intents_of(&customer).await;
    assert_eq!(listed[0]["metadata"]["order_id"], "order-7");
    // Stripe has no metadata filter on the list (Search has one, and lags).
    let refused = get(
        localstripe_url(),
        "/v1/payment_intents",
        &[("metadata[order_id]", "1")],
    )
    .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    // The layer adds the creation filter the audit lists by.
    let accepted = get(
        localstripe_url(),
        "/v1/payment_intents",
        &[("created[gte]", "1")],
    )
    .await;
    assert_eq!(accepted.status, 200, "{accepted:?}");
}

#[tokio::test]
async fn the_old_request_is_refused_for_its_missing_return_url_and_nothing_is_kept_under_its_key() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 1500);
    let key = unique("old-form");
    let call = endive(&key);
    let post = |form: Vec<(&'static str, String)>| {
        let call = call.clone();
        async move {
            call.post(localstripe_url(), "/v1/payment_intents", &pairs(&form))
                .await
        }
    };
    let refused = post(old_form(&order)).await;
    assert_eq!(
        (refused.status, refused.error("type").as_deref()),
        (400, Some("invalid_request_error")),
        "{refused:?}"
    );
    assert!(
        refused
            .error("message")
            .is_some_and(|m| m.contains(RETURN_URL_REQUIRED)),
        "{refused:?}"
    );
    // Validation reached no endpoint: the same request is refused again by the rule,
    // not replayed, and nothing was made.
    let again = post(old_form(&order)).await;
    assert_eq!((again.status, again.replayed), (400, false), "{again:?}");
    assert_eq!(again.body, refused.body);
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
    // Nothing is stored under the key: the corrected request under it is a new one
    // (a stored answer would refuse other parameters with `idempotency_error`).
    let corrected = post(charge_form(&order, Default::default()).to_vec()).await;
    assert_eq!(
        (corrected.status, corrected.replayed),
        (200, false),
        "{corrected:?}"
    );
    assert_eq!(corrected.body["status"], "succeeded");
    // The request `charge_form` makes, under a key of its own.
    let other = order_of(&payer, 1600);
    let fresh = endive(&unique("new-form"))
        .post(
            localstripe_url(),
            "/v1/payment_intents",
            &pairs(&charge_form(&other, Default::default())),
        )
        .await;
    assert_eq!((fresh.status, fresh.replayed), (200, false), "{fresh:?}");
    assert_eq!(
        localstripe::succeeded_of(&payer.customer).await,
        [
            corrected.body["id"].as_str().unwrap(),
            fresh.body["id"].as_str().unwrap()
        ]
    );
}

#[tokio::test]
async fn a_confirm_is_taken_with_any_of_the_three_ways_out_and_endive_refuses_payment_method_types()
{
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 1700);
    let with = |extra: &[(&'static str, &str)]| {
        let mut form = old_form(&order);
        form.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        form
    };
    let types = [("payment_method_types[]", "card")];
    let cases: [Case; 5] = [
        ("nothing", None, with(&[]), 400, None),
        (
            "return_url",
            Some(STRIPE_VERSION),
            with(&[("return_url", "https://shop.example/back")]),
            200,
            None,
        ),
        (
            "no redirects",
            Some(STRIPE_VERSION),
            charge_form(&order, Default::default()).to_vec(),
            200,
            None,
        ),
        (
            "types before endive",
            Some("2025-12-15.clover"),
            with(&types),
            200,
            None,
        ),
        (
            "types on endive",
            Some(STRIPE_VERSION),
            with(&types),
            400,
            Some("payment_method_types_no_longer_supported"),
        ),
    ];
    let mut seen = Vec::new();
    for (case, version, form, _, _) in &cases {
        let call = Call {
            stripe_version: version.map(str::to_owned),
            ..Call::key(&unique("three-ways"))
        };
        let reply = call
            .post(localstripe_url(), "/v1/payment_intents", &pairs(form))
            .await;
        seen.push((*case, reply.status, reply.error("code")));
    }
    let expected: Vec<_> = cases
        .iter()
        .map(|(case, _, _, status, code)| (*case, *status, code.map(str::to_owned)))
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(
        localstripe::succeeded_of(&payer.customer).await.len(),
        3,
        "one payment per accepted request"
    );
}

#[tokio::test]
async fn a_create_naming_what_its_version_does_not_declare_is_refused_as_stripe_refuses_it() {
    let payer = localstripe::payer(Card::Visa).await;
    let post = |version: &'static str, form: Vec<(&'static str, String)>| async move {
        let call = Call {
            stripe_version: Some(version.to_owned()),
            ..Call::key(&unique("declared"))
        };
        call.post(localstripe_url(), "/v1/payment_intents", &pairs(&form))
            .await
    };
    let usage = "payment_method_options[card][stored_credential_usage]";
    // The pinned version declares the card-on-file usage, and the object shows it.
    let form = charge_form(&order_of(&payer, 1810), Default::default()).to_vec();
    let taken = post(STRIPE_VERSION, form).await;
    assert_eq!(taken.status, 200, "{taken:?}");
    assert_eq!(
        taken.body["payment_method_options"]["card"]["stored_credential_usage"],
        "unscheduled"
    );
    // The version pinned before it did not (it was in a preview only): the body of
    // today under the version of then is refused, and nothing is made.
    let form = charge_form(&order_of(&payer, 1820), Default::default()).to_vec();
    let before = post("2026-09-30.endive", form).await;
    assert_eq!(
        (before.status, before.error("code"), before.error("param")),
        (
            400,
            Some("parameter_unknown".to_owned()),
            Some(usage.to_owned())
        ),
        "{before:?}"
    );
    // A value Stripe does not know, and a parameter no version declares.
    let mut form = charge_form(&order_of(&payer, 1830), Default::default()).to_vec();
    form[8].1 = "subscription".to_owned();
    let wrong = post(STRIPE_VERSION, form).await;
    assert_eq!(
        (wrong.status, wrong.error("param")),
        (400, Some(usage.to_owned())),
        "{wrong:?}"
    );
    let mut form = charge_form(&order_of(&payer, 1840), Default::default()).to_vec();
    form.push(("payment_method_option[card][moto]", "true".to_owned()));
    let typo = post(STRIPE_VERSION, form).await;
    assert_eq!(
        (typo.status, typo.error("code")),
        (400, Some("parameter_unknown".to_owned())),
        "{typo:?}"
    );
    assert_eq!(
        localstripe::succeeded_of(&payer.customer).await.len(),
        1,
        "only the declared request made a payment"
    );
    // A list, a retrieve or a cancel naming what Stripe does not declare, the same.
    let id = taken.body["id"].as_str().unwrap().to_owned();
    for (path, query) in [
        (
            "/v1/payment_intents".to_owned(),
            ("customer_id", payer.customer.as_str()),
        ),
        (format!("/v1/payment_intents/{id}"), ("include", "charges")),
        (
            "/v1/events".to_owned(),
            ("kind", "payment_intent.succeeded"),
        ),
    ] {
        let reply = get(localstripe_url(), &path, &[query]).await;
        assert_eq!(
            (reply.status, reply.error("code")),
            (400, Some("parameter_unknown".to_owned())),
            "{path}: {reply:?}"
        );
    }
    let cancel = endive(&unique("cancel"))
        .post(
            localstripe_url(),
            &format!("/v1/payment_intents/{id}/cancel"),
            &[("reason", "abandoned")],
        )
        .await;
    assert_eq!(
        cancel.error("code").as_deref(),
        Some("parameter_unknown"),
        "{cancel:?}"
    );
}

#[tokio::test]
async fn a_stored_server_error_that_rolls_forward_hides_its_payment_until_the_time_given() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 2100);
    let key = unique("rolls-forward");
    let after = Duration::from_secs(2);
    localstripe::arm_fault(&key, Fault::ServerErrorRollsForward { after }).await;
    let armed = Instant::now();
    let api_error = Some("api_error".to_owned());
    assert_eq!(
        charged_under(&key, &order).await,
        (500, false, api_error.clone())
    );
    assert_eq!(charged_under(&key, &order).await, (500, true, api_error));
    // The payment was made, but neither lists nor GETs show it yet.
    let made = payment_intent_charged(&payer.customer).await;
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
    let hidden = get(
        localstripe_url(),
        &format!("/v1/payment_intents/{made}"),
        &[],
    )
    .await;
    assert_eq!(
        (hidden.status, hidden.error("code").as_deref()),
        (404, Some("resource_missing"))
    );
    assert!(armed.elapsed() < after, "the checks above took too long");
    // Then it appears, succeeded; the key still replays the 500.
    let mut listed = Vec::new();
    for _ in 0..50 {
        listed = localstripe::payment_intents_of(&payer.customer).await;
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(armed.elapsed() >= after);
    assert_eq!(listed.len(), 1, "it rolled forward: {listed:?}");
    assert_eq!(listed[0]["id"], made.as_str());
    assert_eq!(listed[0]["status"], "succeeded");
    assert_eq!(listed[0]["metadata"]["order_id"], order.id());
    assert_eq!(
        localstripe::payment_intent(&made).await["status"],
        "succeeded"
    );
    assert_eq!(charged_under(&key, &order).await.0, 500);
}

#[tokio::test]
async fn a_stored_server_error_makes_no_payment_and_only_the_next_create_under_its_key_meets_it() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 2200);
    let key = unique("server-error");
    localstripe::arm_fault(&key, Fault::ServerError).await;
    let api_error = Some("api_error".to_owned());
    assert_eq!(
        charged_under(&key, &order).await,
        (500, false, api_error.clone())
    );
    assert_eq!(charged_under(&key, &order).await, (500, true, api_error));
    let charges = get(
        localstripe_url(),
        "/v1/charges",
        &[("customer", &payer.customer)],
    )
    .await;
    assert_eq!(charges.body["data"], Value::Array(vec![]), "{charges:?}");
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
    // The fault was spent on that key: another key charges as usual.
    assert_eq!(
        charged_under(&unique("after"), &order).await,
        (200, false, None)
    );
}

#[tokio::test]
async fn the_layer_puts_each_payment_intent_event_on_the_partner_bus_and_the_rule_delivers_it_to_the_queue()
 {
    let queues = harness::event_source::Queues::create(Duration::from_secs(30), 10).await;
    let run = unique("events");
    let destination =
        harness::eventbridge::stripe_events_to(&queues.arn, Some(&run), ("test", "test")).await;
    let customer = localstripe::customer().await;
    let card = localstripe::card(&customer, Card::RequiresAuthentication).await;
    // A destination for another customer's payments only gets none of these.
    let other_bus = harness::eventbridge::route_to_queue(&queues.arn).await;
    let elsewhere = localstripe::arm_eventbridge(&localstripe::EventDestination {
        endpoint: harness::servers::Backend::Moto.url().to_owned(),
        region: harness::eventbridge::REGION.to_owned(),
        access_key: "test".to_owned(),
        secret_key: "test".to_owned(),
        bus: other_bus.clone(),
        source: other_bus,
        order_id_prefix: Some(run.clone()),
        customer: Some(localstripe::customer().await),
    })
    .await;
    // Asks for authentication (a failed payment at Stripe), then the customer confirms.
    let confirmed = payment_intent(&customer, &card, &format!("{run}-1")).await;
    let confirmed = confirmed.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        localstripe::authenticate(&confirmed).await["status"],
        "succeeded"
    );
    // Asks, then is cancelled.
    let cancelled = payment_intent(&customer, &card, &format!("{run}-2")).await;
    let cancelled = cancelled.body["id"].as_str().unwrap().to_owned();
    assert_eq!(cancel(&cancelled).await.body["status"], "canceled");
    // Another order's payment is not this destination's.
    payment_intent(&customer, &card, "someone-else").await;

    let mut bodies = received(&queues, 4).await;
    assert_eq!(bodies.len(), 4, "{bodies:?}");
    let published = localstripe::events_settled(&destination, Duration::from_secs(5)).await;
    assert_eq!(
        (published.published, published.failed),
        (4, 0),
        "{published:?}"
    );
    bodies.sort_by_key(|b| {
        let object = &b["detail"]["data"]["object"];
        (
            object["metadata"]["order_id"].as_str().unwrap().to_owned(),
            b["detail"]["created"].as_i64(),
            b["detail-type"] != "payment_intent.payment_failed",
        )
    });
    let seen: Vec<(String, String, String, String)> = bodies
        .iter()
        .map(|b| {
            let object = &b["detail"]["data"]["object"];
            assert!(
                b["source"]
                    .as_str()
                    .unwrap()
                    .starts_with("aws.partner/stripe.com/ed_test_"),
                "{b}"
            );
            // The envelope's type is the Stripe Event's.
            assert_eq!(b["detail-type"], b["detail"]["type"], "{b}");
            assert_eq!(b["detail"]["object"], "event", "{b}");
            assert!(
                b["detail"]["id"].as_str().unwrap().starts_with("evt_"),
                "{b}"
            );
            (
                b["detail-type"].as_str().unwrap().to_owned(),
                object["id"].as_str().unwrap().to_owned(),
                object["status"].as_str().unwrap().to_owned(),
                object["metadata"]["order_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let one = format!("{run}-1");
    let two = format!("{run}-2");
    let event = |kind: &str, id: &str, status: &str, order: &str| {
        (
            kind.to_owned(),
            id.to_owned(),
            status.to_owned(),
            order.to_owned(),
        )
    };
    assert_eq!(
        seen,
        [
            event(
                "payment_intent.payment_failed",
                &confirmed,
                "requires_action",
                &one
            ),
            event("payment_intent.succeeded", &confirmed, "succeeded", &one),
            event(
                "payment_intent.payment_failed",
                &cancelled,
                "requires_action",
                &two
            ),
            event("payment_intent.canceled", &cancelled, "canceled", &two),
        ]
    );
    // The failed payment says why, as Stripe's does.
    assert_eq!(
        bodies[0]["detail"]["data"]["object"]["last_payment_error"]["code"],
        "authentication_required"
    );
    let none = localstripe::events_settled(&elsewhere, Duration::from_secs(5)).await;
    assert_eq!((none.published, none.failed), (0, 0), "{none:?}");
    localstripe::disarm_eventbridge(&elsewhere).await;
    localstripe::disarm_eventbridge(&destination).await;
}
