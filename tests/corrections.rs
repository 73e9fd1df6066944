//! An order corrected after it ended without a payment, on the real parts (the handler
//! on moto, localstripe behind its layer): a rejected order (a customer the provider
//! does not know) and an order declined at the limit each take a corrected copy
//! (another customer, another card) as a new attempt, by redrive of the corrected
//! message and by `resolve` with the corrected data, and each is charged once. While
//! a payment of the order may still succeed, a corrected copy stays a conflict
//! (`policy/machine/tests.rs`, and the model's `correct-while-open`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::domain::State;
use charge_once::domain::order::Order;
use charge_once::drivers::charge::resolve;
use charge_once::policy::resolve::{Confirmed, Resolution};
use harness::localstripe::{self, Card};
use harness::logs::Captured;
use harness::rig::{Harness, INVOCATION, MAX_DECLINES, PAYMENT_TIMEOUT, batch_of};
use harness::servers::localstripe_url;

fn harness_provider() -> HttpProvider {
    HttpProvider::new(
        localstripe_url(),
        &Secret::new(localstripe::TEST_KEY.to_owned()),
        PAYMENT_TIMEOUT,
        &harness::tls(),
    )
    .unwrap()
}

fn unique_id() -> String {
    format!("cr-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

fn body(id: &str, customer: &str, card: &str) -> String {
    serde_json::json!({"id": id, "amount": 1400, "currency": "EUR",
        "customer": customer, "payment_method": card})
    .to_string()
}

/// The outcome of the last record's line.
fn last_outcome(logs: &Captured) -> String {
    logs.text()
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|l| l["fields"]["outcome"].as_str().map(str::to_owned))
        .expect("an outcome line")
}

/// The corrected order: by `resolve` first when asked, then its message redriven;
/// charged once, under a key never sent before.
async fn correct(
    h: &Harness<HttpProvider>,
    logs: &Captured,
    corrected: &str,
    customer: &str,
    by_resolve: bool,
) {
    let order = Order::parse(corrected).unwrap();
    if by_resolve {
        let resolved = resolve(
            h.table.store.as_ref(),
            h.provider.as_ref(),
            &h.settings,
            &order,
            Confirmed::default(),
        )
        .await
        .unwrap();
        assert!(
            matches!(resolved, Resolution::Released { .. }),
            "{resolved:?}"
        );
    }
    h.redeliver_later();
    assert!(
        h.invoke_event_with(batch_of(&[corrected]), INVOCATION)
            .await
            .is_empty(),
        "the corrected copy is charged"
    );
    assert_eq!(last_outcome(logs), "charged");
    let done = h.record(order.id()).await.unwrap();
    assert_eq!(done.state, State::Done, "{done:?}");
    let paid = localstripe::succeeded_of(customer).await;
    assert_eq!(paid.len(), 1, "{paid:?}");
    assert_eq!(done.receipt.as_deref(), Some(paid[0].as_str()));
    // Delivered again: a duplicate.
    h.redeliver_later();
    assert!(
        h.invoke_event_with(batch_of(&[corrected]), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(logs), "duplicate");
}

#[tokio::test]
async fn a_rejected_order_is_corrected_and_charged_once_by_redrive_and_by_resolve() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = Harness::new(harness_provider()).await;
    for by_resolve in [false, true] {
        let payer = localstripe::payer(Card::Visa).await;
        let id = unique_id();
        // The producer's bug: a customer the provider does not know.
        let wrong = body(&id, "cus_nobodyknows", &payer.card);
        assert_eq!(
            h.invoke_event_with(batch_of(&[wrong]), INVOCATION)
                .await
                .len(),
            1
        );
        assert_eq!(last_outcome(&logs), "rejected");
        let corrected = body(&id, &payer.customer, &payer.card);
        correct(&h, &logs, &corrected, &payer.customer, by_resolve).await;
    }
}

#[tokio::test]
async fn an_order_declined_at_the_limit_is_corrected_with_another_card_and_charged_once_by_redrive_and_by_resolve()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = Harness::new(harness_provider()).await;
    for by_resolve in [false, true] {
        let payer = localstripe::payer(Card::DeclinesOnCharge).await;
        let id = unique_id();
        let declining = body(&id, &payer.customer, &payer.card);
        for _ in 0..MAX_DECLINES {
            h.redeliver_later();
            assert_eq!(
                h.invoke_event_with(batch_of(&[&declining]), INVOCATION)
                    .await
                    .len(),
                1
            );
            assert_eq!(last_outcome(&logs), "declined");
        }
        h.redeliver_later();
        assert_eq!(
            h.invoke_event_with(batch_of(&[&declining]), INVOCATION)
                .await
                .len(),
            1
        );
        assert_eq!(last_outcome(&logs), "decline_limit");
        // The customer adds a card that pays; the shop sends the order with it.
        let card = localstripe::card(&payer.customer, Card::Visa).await;
        let corrected = body(&id, &payer.customer, &card);
        correct(&h, &logs, &corrected, &payer.customer, by_resolve).await;
    }
}
