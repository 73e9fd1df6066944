//! Stripe's restricted keys (`rk_…`), as the layer in front of localstripe answers them:
//! each function works with exactly the permissions docs/deploy.md ("Keys") lists for
//! its key, and a key without one is a setting fault, never a decline or an outage:
//! the record keeps its key, nothing is charged, no new attempt follows, and the line
//! names the missing permission.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::contracts::payment::{
    Cancel, ChargePath, FailureKind, Lookup, PaymentError, PaymentListing,
};
use charge_once::domain::ForOrder;
use charge_once::domain::clock::{Time, wall_ms};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, State};
use harness::localstripe::{self, Card, Payer};
use harness::logs::Captured;
use harness::rig::{Harness, PAYMENT_TIMEOUT, single_event_with_body};

/// What the consumer's key needs, and the scheduled function's (docs/deploy.md).
const CONSUMER: &[&str] = &["rak_payment_intent_write"];
const SCHEDULED: &[&str] = &["rak_payment_intent_write", "rak_event_read"];
const REFUND: &[&str] = &["rak_refund_write"];

fn provider(key: &str) -> HttpProvider {
    HttpProvider::new(
        harness::servers::localstripe_url(),
        &Secret::new(key.to_owned()),
        PAYMENT_TIMEOUT,
        &harness::tls(),
    )
    .unwrap()
}

fn order_of(payer: &Payer, amount: u64) -> Order {
    let id = format!("rk-{}", uuid::Uuid::new_v4().simple());
    Order::new(&id, amount, "eur", &payer.customer, &payer.card).unwrap()
}

/// One delivery of `order` to the consumer over `provider`: the ids that failed.
async fn deliver(h: &Harness<HttpProvider>, order: &Order) -> Vec<String> {
    let body = serde_json::json!({
        "id": order.id(), "amount": order.amount(), "currency": order.currency(),
        "customer": order.customer(), "payment_method": order.payment_method()
    });
    h.invoke_event_with(
        single_event_with_body(&body.to_string()),
        harness::rig::INVOCATION,
    )
    .await
}

fn forbidden(answer: &Result<impl std::fmt::Debug, PaymentError>) -> Option<&'static str> {
    match answer {
        Err(PaymentError::Retryable {
            kind: FailureKind::Forbidden(permission),
            ..
        }) => *permission,
        _ => None,
    }
}

#[tokio::test]
async fn the_consumers_key_with_payment_intents_write_alone_charges_looks_up_and_cancels() {
    let key = localstripe::restricted_key(CONSUMER).await;
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 2500);
    let h = Harness::new(provider(&key)).await;
    assert!(deliver(&h, &order).await.is_empty());
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    // The lookup and the cancel of the consumer's other paths.
    let since = Time::from_ms(wall_ms() - 3_600_000);
    let found = provider(&key).find_payment(&order, since).await.unwrap();
    assert!(matches!(found, Lookup::Succeeded(_)), "{found:?}");
    let declining = localstripe::payer(Card::RequiresAuthentication).await;
    let open = order_of(&declining, 2600);
    let asked = provider(&key)
        .charge(&open, &Key::for_order(&open).provider_key(1))
        .await;
    let Err(PaymentError::AuthenticationRequired {
        payment_id: Some(payment),
    }) = asked
    else {
        panic!("{asked:?}")
    };
    let cancelled = provider(&key).cancel(&payment).await.unwrap();
    assert_eq!(cancelled, Cancel::Cancelled);
}

#[tokio::test]
async fn a_consumers_key_without_write_keeps_the_key_charges_nothing_and_names_the_permission() {
    let key = localstripe::restricted_key(&["rak_payment_intent_read"]).await;
    let logs = Captured::default();
    let _guard = logs.install();
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 2700);
    let h = Harness::new(provider(&key)).await;
    for _ in 0..2 {
        assert_eq!(
            deliver(&h, &order).await.len(),
            1,
            "the record fails, to come back"
        );
    }
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(
        record.attempt,
        Some(1),
        "a 403 keeps the key: no new attempt"
    );
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty(),
        "nothing charged"
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("failed_retryable"))
        .unwrap_or_else(|| panic!("no outcome line:\n{text}"));
    assert!(
        line.contains("ERROR"),
        "a setting fault is an error: {line}"
    );
    assert!(
        line.contains("lacks the permission rak_payment_intent_write"),
        "{line}"
    );
    // The layer's message quotes the key's last characters; none reach the logs.
    assert!(!text.contains(&key[key.len() - 4..]), "{text}");
}

#[tokio::test]
async fn the_scheduled_functions_key_reads_payments_and_events_and_without_events_read_says_so() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 2800);
    let paid = provider(localstripe::TEST_KEY)
        .charge(&order, &Key::for_order(&order).provider_key(1))
        .await
        .unwrap();
    let since = Time::from_ms(wall_ms() - 3_600_000);

    // The audit lists payments and the succeeded events; the settler fetches by id.
    let scheduled = provider(&localstripe::restricted_key(SCHEDULED).await);
    let listed = scheduled.payments_since(since).await.unwrap();
    assert!(listed.iter().any(|p| p.id == paid.id));
    let confirmed = scheduled.confirmed_since(since).await.unwrap();
    assert!(confirmed.iter().any(|c| c.payment.id == paid.id));
    let fetched = scheduled.payment_by_id(&paid.id).await.unwrap();
    assert_eq!(fetched.map(|p| p.id), Some(paid.id.clone()));

    // Without Events read, the audit's events call is refused, naming the permission.
    let no_events = provider(&localstripe::restricted_key(CONSUMER).await);
    let refused = no_events.confirmed_since(since).await;
    assert_eq!(forbidden(&refused), Some("rak_event_read"), "{refused:?}");
    // And a key the provider does not know is a 401, not a 403.
    let unknown = provider("rk_test_nobodyissuedthiskey0000")
        .charge(&order, "k")
        .await;
    assert!(
        matches!(
            unknown,
            Err(PaymentError::Retryable {
                kind: FailureKind::Unauthorized,
                ..
            })
        ),
        "{unknown:?}"
    );
}

#[tokio::test]
async fn the_refund_functions_key_with_refunds_write_alone_refunds_and_looks_up_and_names_it_when_missing()
 {
    use charge_once::contracts::payment::RefundPath;
    use charge_once::domain::refund::RefundRequest;

    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 1500);
    let paid = localstripe::charge_directly(&payer, order.amount(), order.id()).await;
    let payment = paid["id"].as_str().unwrap();
    let request = RefundRequest::new(
        &format!("ref-{}", uuid::Uuid::new_v4().simple()),
        order.id(),
        Some(500),
        None,
    )
    .unwrap();
    let key_of_attempt = format!("{}#1", request.identity().key.as_str());

    // The consumer's key cannot refund: 403, naming what it lacks.
    let consumer = provider(&localstripe::restricted_key(CONSUMER).await);
    let refused = consumer.refund(&request, payment, &key_of_attempt).await;
    assert_eq!(forbidden(&refused), Some("rak_refund_write"), "{refused:?}");
    let looked = consumer.find_refund(&request, payment).await;
    assert_eq!(forbidden(&looked), Some("rak_refund_read"), "{looked:?}");

    let refunds = provider(&localstripe::restricted_key(REFUND).await);
    let receipt = refunds
        .refund(&request, payment, &key_of_attempt)
        .await
        .unwrap();
    let found = refunds.find_refund(&request, payment).await.unwrap();
    assert_eq!(found, Lookup::Succeeded(receipt.clone()));

    // The settler's fetch of a pending refund: the scheduled key needs Refunds Read.
    let scheduled = provider(&localstripe::restricted_key(SCHEDULED).await);
    let fetched = scheduled.refund_by_id(&receipt.id).await;
    assert_eq!(forbidden(&fetched), Some("rak_refund_read"), "{fetched:?}");
    let with_refunds = [SCHEDULED, &["rak_refund_read"]].concat();
    let scheduled = provider(&localstripe::restricted_key(&with_refunds).await);
    let seen = scheduled.refund_by_id(&receipt.id).await.unwrap().unwrap();
    assert_eq!(seen.status, "succeeded");
    assert_eq!(seen.refund_id.as_deref(), Some(request.id()));
}
