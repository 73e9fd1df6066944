//! Handler tests: the real handler, driven with `LambdaEvent`s parsed from the JSON
//! files in `events/`, against moto (behind its lock) and an in-process provider that
//! honours idempotency keys. Every test ends by checking that no order was charged
//! twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use charge_once::idempotency::Estado;
use support::harness::{DEADLINE_MARGIN, Harness, event, message_ids};
use support::provider::{Fault, TestProvider};

async fn harness() -> Harness<TestProvider> {
    Harness::new(TestProvider::new()).await
}

#[tokio::test]
async fn raw_and_sns_wrapped_copies_of_one_order_in_one_batch_charge_once() {
    let h = harness().await;
    assert_eq!(h.invoke("sqs-sns-fanout.json").await, Vec::<String>::new());
    assert_eq!(h.provider.charges_for("ord-2001").len(), 1);
    assert_eq!(
        h.provider.calls_for("ord-2001").len(),
        1,
        "the copy is a duplicate, not a call"
    );
    let record = h.record("ord-2001").await.unwrap();
    assert_eq!(record.estado, Estado::Hecho);
    assert_eq!(
        record.recibo,
        Some(h.provider.charges_for("ord-2001")[0].clone())
    );
    // Delivered again later (SNS retry, producer retry): still acknowledged, no call.
    h.redeliver_later();
    assert_eq!(h.invoke("sqs-sns-fanout.json").await, Vec::<String>::new());
    assert_eq!(h.provider.calls_for("ord-2001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn each_invalid_body_fails_with_its_message_id_while_valid_neighbours_are_charged() {
    let h = harness().await;
    let failed = h.invoke("tests/invalid-bodies.json").await;
    // not JSON, missing id, float amount, bad currency, `#` in id, id over 128, broken SNS
    assert_eq!(
        failed,
        message_ids("tests/invalid-bodies.json", &[1, 2, 3, 4, 5, 6, 7])
    );
    assert_eq!(h.provider.charges_for("ord-6001").len(), 1);
    assert_eq!(h.provider.charges_for("ord-6008").len(), 1);
    assert_eq!(h.provider.charge_count(), 2);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn declined_fails_releases_and_the_next_delivery_uses_the_next_attempt() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Decline]);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.estado, Estado::Libre);
    assert_eq!(record.intento, Some(2));
    assert_eq!(h.provider.charge_count(), 0);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#2"]
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

async fn failure_keeps_the_key(fault: Fault) {
    let h = harness().await;
    h.provider.script("ord-1001", &[fault]);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.estado, Estado::Libre, "released after {fault:?}");
    assert_eq!(record.intento, Some(1), "{fault:?} keeps the attempt");
    assert_eq!(record.titular, None);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    let charges = h.provider.charges_for("ord-1001");
    assert_eq!(charges.len(), 1);
    assert_eq!(
        h.record("ord-1001").await.unwrap().recibo,
        Some(charges[0].clone())
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn timeout_after_the_charge_fails_releases_and_the_retry_replays_the_same_key() {
    failure_keeps_the_key(Fault::ChargeThenTimeout).await;
}

#[tokio::test]
async fn timeout_before_the_charge_fails_releases_and_the_retry_sends_the_same_key() {
    failure_keeps_the_key(Fault::Timeout).await;
}

#[tokio::test]
async fn server_error_fails_releases_and_the_retry_sends_the_same_key() {
    failure_keeps_the_key(Fault::ServerError).await;
}

#[tokio::test]
async fn conflict_fails_and_is_not_charged() {
    let h = harness().await;
    let failed = h.invoke("tests/conflict.json").await;
    assert_eq!(failed, message_ids("tests/conflict.json", &[1]));
    assert_eq!(
        h.provider.calls_for("ord-7001").len(),
        1,
        "the conflicting copy is never sent"
    );
    let record = h.record("ord-7001").await.unwrap();
    assert_eq!(record.estado, Estado::Hecho);
    // Delivered again on its own, the conflicting copy still fails and is not charged.
    h.redeliver_later();
    assert_eq!(
        h.invoke("tests/conflict.json").await,
        message_ids("tests/conflict.json", &[1])
    );
    assert_eq!(h.provider.calls_for("ord-7001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn after_a_failure_the_same_keys_later_records_fail_without_calls() {
    let h = harness().await;
    h.provider.script("ord-8001", &[Fault::ServerError]);
    let failed = h.invoke("tests/same-order-thrice.json").await;
    assert_eq!(
        failed,
        message_ids("tests/same-order-thrice.json", &[0, 1, 2])
    );
    assert_eq!(h.provider.calls_for("ord-8001").len(), 1);
    assert_eq!(h.record("ord-8001").await.unwrap().estado, Estado::Libre);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn fifo_batch_stops_at_the_first_failure() {
    let h = harness().await;
    h.provider.script("ord-4002", &[Fault::Decline]);
    let failed = h.invoke("sqs-fifo.json").await;
    assert_eq!(failed, message_ids("sqs-fifo.json", &[1, 2, 3]));
    assert_eq!(h.provider.charges_for("ord-4001").len(), 1);
    assert!(h.provider.calls_for("ord-4003").is_empty());
    assert!(h.provider.calls_for("ord-4004").is_empty());
    assert!(
        h.record("ord-4003").await.is_none(),
        "later records touch nothing"
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn records_past_the_deadline_margin_fail_unstarted() {
    let h = harness().await;
    let failed = h
        .invoke_with("sqs-batch.json", DEADLINE_MARGIN - Duration::from_millis(1))
        .await;
    assert_eq!(failed.len(), event("sqs-batch.json").records.len());
    assert!(h.provider.calls().is_empty());
    assert!(h.record("ord-3001").await.is_none());
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_panicking_provider_call_fails_only_its_record() {
    let h = harness().await;
    h.provider.script("ord-9002", &[Fault::Panic]);
    let failed = h.invoke("tests/three-orders.json").await;
    assert_eq!(failed, message_ids("tests/three-orders.json", &[1]));
    assert_eq!(h.provider.charges_for("ord-9001").len(), 1);
    assert_eq!(h.provider.charges_for("ord-9003").len(), 1);
    // The panicking record's lease ends at the invocation deadline; then it is retried.
    h.redeliver_later();
    assert_eq!(
        h.invoke("tests/three-orders.json").await,
        Vec::<String>::new()
    );
    assert_eq!(h.provider.charges_for("ord-9002").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_store_error_on_complete_fails_the_record_and_the_retry_completes_it_with_the_same_receipt()
 {
    let h = harness().await;
    h.store.fail_completes.store(1, Ordering::SeqCst);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let charges = h.provider.charges_for("ord-1001");
    assert_eq!(charges.len(), 1, "charged, but the receipt was not stored");
    assert_eq!(h.record("ord-1001").await.unwrap().estado, Estado::EnCurso);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charges_for("ord-1001"), charges);
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.estado, Estado::Hecho);
    assert_eq!(record.recibo, Some(charges[0].clone()));
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_retry_while_the_lease_is_live_fails_as_in_progress_without_a_call() {
    let h = harness().await;
    h.store.fail_completes.store(1, Ordering::SeqCst);
    h.invoke("sqs-single.json").await;
    // Redelivered before the first invocation's deadline: the lease still holds.
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    assert_eq!(h.provider.calls_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_key_older_than_the_provider_ttl_is_reconciled_and_found() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::ChargeThenTimeout]);
    h.invoke("sqs-single.json").await;
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    // A day later the provider has forgotten the key; re-sending it would charge again.
    h.clock.advance(Duration::from_secs(24 * 3600));
    h.provider.forget_keys();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(h.provider.calls_for("ord-1001").len(), 1, "nothing re-sent");
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.estado, Estado::Hecho);
    assert_eq!(
        record.recibo,
        Some(h.provider.charges_for("ord-1001")[0].clone())
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_key_older_than_the_provider_ttl_not_found_moves_to_the_next_attempt() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    h.invoke("sqs-single.json").await;
    h.clock.advance(Duration::from_secs(24 * 3600));
    h.provider.forget_keys();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#2"]
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    assert_eq!(h.record("ord-1001").await.unwrap().intento, Some(2));
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_replayed_server_error_is_reconciled_before_a_new_key_is_sent() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::StoredServerError]);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1", "cobro#ord-1001#2"]
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn the_mixed_batch_acks_charges_and_duplicates_and_fails_only_the_invalid_record() {
    let h = harness().await;
    let failed = h.invoke("sqs-batch.json").await;
    assert_eq!(failed, message_ids("sqs-batch.json", &[5]));
    for order in ["ord-3001", "ord-3002", "ord-3003"] {
        assert_eq!(h.provider.charges_for(order).len(), 1, "{order}");
    }
    assert_eq!(h.provider.calls().len(), 3);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_record_without_a_message_id_fails_the_whole_batch() {
    let h = harness().await;
    let mut event = event("sqs-single.json");
    event.records[0].message_id = None;
    let result = h.consumer.handle(&event, h.clock.now_ms() + 60_000).await;
    let err = result.expect_err("the batch cannot be judged");
    assert!(err.to_string().contains("messageId"), "{err}");
    assert!(h.provider.calls().is_empty());
    h.provider.assert_no_order_charged_twice();
}

/// The test harness always unwinds, whatever the profile says, so the panic test above
/// cannot prove the shipped binary unwinds; this guards the profile that builds it.
#[test]
fn the_release_profile_keeps_panic_unwind() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let release = manifest
        .split("\n[")
        .find(|section| section.starts_with("profile.release]"))
        .expect("[profile.release] in Cargo.toml");
    let panic_line = release
        .lines()
        .find(|line| line.trim_start().starts_with("panic"))
        .expect("[profile.release] sets panic explicitly");
    assert_eq!(
        panic_line.replace(' ', ""),
        "panic=\"unwind\"",
        "{panic_line}"
    );
}

#[tokio::test]
async fn an_emulator_deadline_that_is_not_an_epoch_falls_back_to_the_invoke_deadline() {
    let h = harness().await;
    let mut context = lambda_runtime::Context::default();
    // `cargo lambda watch` sends a duration (600000) where Lambda sends an epoch.
    context.deadline = 600_000;
    let event = lambda_runtime::LambdaEvent::new(event("sqs-single.json"), context);
    let response = h.consumer.handle_lambda_event(event).await.unwrap();
    assert!(response.batch_item_failures.is_empty());
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.estado, Estado::Hecho);
    h.provider.assert_no_order_charged_twice();
}
