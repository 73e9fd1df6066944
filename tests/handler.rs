//! Handler tests: the real handler, driven with `LambdaEvent`s parsed from the JSON
//! files in `events/`, against moto (behind its lock) and an in-process provider that
//! honours idempotency keys. Every test ends by checking that no order was charged
//! twice. Stripe's events are tested end to end on the real parts: localstripe behind
//! its layer puts them on a partner event bus on moto, whose rule delivers them to a
//! queue, from which the handler is invoked as Lambda would invoke it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::adapters::sqs::SqsReports;
use charge_once::config::{FifoScope, Secret};
use charge_once::contracts::queue::Unreported;
use charge_once::contracts::schema;
use charge_once::contracts::store::{AwaitRequest, IdempotencyStore, Write, WriteOutcome};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, Owner, Record, State};
use charge_once::drivers::charge::resolve;
use charge_once::drivers::settle::Settler;
use charge_once::policy::resolve::{Confirmed, Resolution, ResolveError};
use harness::event_source::{Queues, event_of};
use harness::eventbridge::{stripe_event, stripe_events_to};
use harness::lease::Lease;
use harness::localstripe::{self, Card, Payer};
use harness::logs::Captured;
use harness::provider::{Fault, TestProvider};
use harness::rig::{
    DEADLINE_MARGIN, Harness, INVOCATION, Options, PAYMENT_TIMEOUT, PROVIDER_KEY_TTL, batch_of,
    event, message_ids,
};
use harness::servers::localstripe_url;

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
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt,
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
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(2));
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

/// `faults` fail the first delivery's charge (a 5xx is retried once within the
/// invocation, so it takes two); the retry replays the same key and charges.
async fn failure_keeps_the_key(faults: &[Fault]) {
    let fault = faults[0];
    let h = harness().await;
    h.provider.script("ord-1001", faults);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Free, "released after {fault:?}");
    assert_eq!(record.attempt, Some(1), "{fault:?} keeps the attempt");
    assert_eq!(record.owner, None);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        vec!["cobro#ord-1001#1"; faults.len() + 1]
    );
    let charges = h.provider.charges_for("ord-1001");
    assert_eq!(charges.len(), 1);
    assert_eq!(
        h.record("ord-1001").await.unwrap().receipt,
        Some(charges[0].clone())
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn timeout_after_the_charge_fails_releases_and_the_retry_replays_the_same_key() {
    failure_keeps_the_key(&[Fault::ChargeThenTimeout]).await;
}

#[tokio::test]
async fn timeout_before_the_charge_fails_releases_and_the_retry_sends_the_same_key() {
    failure_keeps_the_key(&[Fault::Timeout]).await;
}

#[tokio::test]
async fn server_error_fails_releases_and_the_retry_sends_the_same_key() {
    failure_keeps_the_key(&[Fault::ServerError, Fault::ServerError]).await;
}

#[tokio::test]
async fn a_server_error_is_retried_once_within_the_invocation_under_the_same_key() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::ServerError]);
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_timeout_is_not_retried_within_the_invocation() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    assert_eq!(h.provider.keys_for("ord-1001"), ["cobro#ord-1001#1"]);
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
    assert_eq!(record.state, State::Done);
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
    h.provider
        .script("ord-8001", &[Fault::ServerError, Fault::ServerError]);
    let failed = h.invoke("tests/same-order-thrice.json").await;
    assert_eq!(
        failed,
        message_ids("tests/same-order-thrice.json", &[0, 1, 2])
    );
    // The first record's charge and its one retry; the others make no call.
    assert_eq!(h.provider.calls_for("ord-8001").len(), 2);
    assert_eq!(h.record("ord-8001").await.unwrap().state, State::Free);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn skipped_records_retry_with_the_delay_of_the_failure_ahead_of_them() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider
        .script("ord-8001", &[Fault::ServerError, Fault::ServerError]);
    h.invoke("tests/same-order-thrice.json").await;
    let lines = outcome_lines(&logs);
    let delays: Vec<(&str, u64)> = lines
        .iter()
        .map(|(_, outcome, _, fields)| (outcome.as_str(), fields["retry_in_s"].as_u64().unwrap()))
        .collect();
    assert_eq!(delays.len(), 3, "{lines:?}");
    let (first, delay) = delays[0];
    assert_eq!(first, "failed_retryable");
    // The first receive's step is RETRY_BASE (30 s); the jitter keeps the upper half.
    assert!((15..=30).contains(&delay), "{delays:?}");
    assert_eq!(delays[1..], [("skipped", delay), ("skipped", delay)]);
}

/// A FIFO batch of `(order id, MessageGroupId)`, in message order.
fn fifo_batch(records: &[(&str, Option<&str>)]) -> SqsEvent {
    let bodies: Vec<String> = records
        .iter()
        .map(|(id, _)| {
            format!(r#"{{"id":"{id}","amount":700,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}}"#)
        })
        .collect();
    let mut batch = batch_of(&bodies);
    for (record, (_, group)) in batch.records.iter_mut().zip(records) {
        record.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:orders.fifo".into());
        record.attributes.remove("MessageGroupId");
        if let Some(group) = group {
            record
                .attributes
                .insert("MessageGroupId".into(), (*group).into());
        }
    }
    batch
}

fn ids_of(event: &SqsEvent, positions: &[usize]) -> Vec<String> {
    positions
        .iter()
        .map(|&i| event.records[i].message_id.clone().unwrap())
        .collect()
}

#[tokio::test]
async fn a_decline_in_one_fifo_group_stops_that_group_and_the_other_groups_go_on() {
    let h = harness().await;
    h.provider.script("g-a2", &[Fault::Decline]);
    let event = fifo_batch(&[
        ("g-a1", Some("A")),
        ("g-b1", Some("B")),
        ("g-a2", Some("A")),
        ("g-b2", Some("B")),
        ("g-a3", Some("A")),
        ("g-b3", Some("B")),
    ]);
    let failed = h.invoke_event_with(event.clone(), INVOCATION).await;
    assert_eq!(failed, ids_of(&event, &[2, 4]), "a2 declined, a3 skipped");
    for charged in ["g-a1", "g-b1", "g-b2", "g-b3"] {
        assert_eq!(h.provider.charges_for(charged).len(), 1, "{charged}");
    }
    assert!(
        h.provider.calls_for("g-a3").is_empty(),
        "a3 is never started"
    );
    assert!(h.record("g-a3").await.is_none());
}

#[tokio::test]
async fn fifo_failure_scope_batch_stops_every_later_record_of_the_batch() {
    let options = Options {
        fifo_failure_scope: FifoScope::Batch,
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    h.provider.script("s-a1", &[Fault::Decline]);
    let event = fifo_batch(&[("s-a1", Some("A")), ("s-b1", Some("B"))]);
    let failed = h.invoke_event_with(event.clone(), INVOCATION).await;
    assert_eq!(failed, ids_of(&event, &[0, 1]));
    assert!(h.provider.calls_for("s-b1").is_empty());
}

#[tokio::test]
async fn a_fifo_record_without_a_message_group_stops_the_whole_batch() {
    let h = harness().await;
    h.provider.script("n-a1", &[Fault::Decline]);
    let event = fifo_batch(&[("n-a1", Some("A")), ("n-b1", None)]);
    let failed = h.invoke_event_with(event.clone(), INVOCATION).await;
    assert_eq!(failed, ids_of(&event, &[0, 1]));
    assert!(h.provider.calls_for("n-b1").is_empty());
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
    assert_eq!(h.record("ord-1001").await.unwrap().state, State::InProgress);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charges_for("ord-1001"), charges);
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt, Some(charges[0].clone()));
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
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt,
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
    // The done record keeps only what a done order is read for: no attempt.
    let done = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (done.state, done.attempt, done.sent),
        (State::Done, None, None)
    );
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_replayed_server_error_keeps_the_key_and_its_late_payment_completes_the_record() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider
        .script("ord-1001", &[Fault::StoredServerErrorThenPayment]);
    // The in-invocation retry gets the stored 5xx replayed: the order is looked up,
    // nothing is found yet, and the record fails with the key kept: its payment may
    // still appear.
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    assert_eq!(h.provider.lookups(), ["ord-1001"]);
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "failed_retryable");
    // Stripe rolls the payment forward; the redelivery replays the key, finds it and
    // completes with it.
    h.provider.roll_forward("ord-1001");
    h.redeliver_later();
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "reconciled");
    assert!(
        h.provider
            .keys_for("ord-1001")
            .iter()
            .all(|k| k == "cobro#ord-1001#1")
    );
    assert_eq!(h.record("ord-1001").await.unwrap().state, State::Done);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn the_mixed_batch_acks_charges_and_duplicates_and_fails_only_the_invalid_record() {
    let h = harness().await;
    let failed = h.invoke("sqs-batch.json").await;
    assert_eq!(failed, message_ids("sqs-batch.json", &[5]));
    // The test provider charges every card (the simulator's test cards decline and
    // ask for authentication: tests/cli.rs).
    for order in ["ord-3001", "ord-3002", "ord-3003", "ord-3005", "ord-3006"] {
        assert_eq!(h.provider.charges_for(order).len(), 1, "{order}");
    }
    assert_eq!(h.provider.calls().len(), 5);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_record_without_a_message_id_fails_the_whole_batch() {
    let h = harness().await;
    let mut event = event("sqs-single.json");
    event.records[0].message_id = None;
    let result = h
        .consumer
        .run(&event, h.clock.now() + Duration::from_millis(60_000))
        .await;
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
    let response = h.consumer.handle(event).await.unwrap();
    assert!(response.batch_item_failures.is_empty());
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Done);
    h.provider.assert_no_order_charged_twice();
}

// --- Lambda conventions: message shapes, trace ids, log format --------------------

/// An order as an EventBridge rule delivers it to SQS: the order is `detail`.
fn eventbridge(order: &str) -> String {
    format!(
        r#"{{"version":"0","id":"6a7e8feb-b491-4cf7-a9f1-bf3703467718","detail-type":"OrderPlaced","source":"shop.orders","account":"123456789012","time":"2026-11-30T12:00:00Z","region":"eu-west-1","resources":[],"detail":{order}}}"#
    )
}

#[tokio::test]
async fn an_eventbridge_record_is_charged_and_its_raw_copy_is_a_duplicate() {
    let h = harness().await;
    let order = r#"{"id":"eb-1","amount":4200,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#;
    let failed = h
        .invoke_event_with(
            batch_of(&[eventbridge(order), order.to_owned()]),
            INVOCATION,
        )
        .await;
    assert_eq!(failed, Vec::<String>::new());
    assert_eq!(h.provider.charges_for("eb-1").len(), 1);
    assert_eq!(
        h.provider.calls_for("eb-1").len(),
        1,
        "the copy sent nothing"
    );
    assert_eq!(h.record("eb-1").await.unwrap().state, State::Done);
}

#[tokio::test]
async fn each_outcome_line_carries_the_receive_count_and_the_trace_id() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    let mut event = batch_of(&[
        r#"{"id":"tr-1","amount":100,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#,
        "not an order",
    ]);
    for record in &mut event.records {
        record
            .attributes
            .insert("ApproximateReceiveCount".into(), "3".into());
        record.attributes.insert(
            "AWSTraceHeader".into(),
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1".into(),
        );
    }
    h.invoke_event_with(event, INVOCATION).await;
    let lines: Vec<serde_json::Value> = logs
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l["fields"]["outcome"].is_string())
        .collect();
    assert_eq!(lines.len(), 2, "{}", logs.text());
    for line in lines {
        assert_eq!(line["span"]["receive_count"], 3, "{line}");
        assert_eq!(
            line["span"]["trace_id"], "1-5759e988-bd862e3fe1be46a994272793",
            "{line}"
        );
    }
}

// --- Hardening: bad input, outcome lines, one line per record ---------------------

/// The outcome lines of a captured log: (message id, outcome, level, fields).
fn outcome_lines(logs: &Captured) -> Vec<(String, String, String, serde_json::Value)> {
    logs.text()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["fields"]["outcome"].is_string())
        .map(|l| {
            (
                l["span"]["message_id"].as_str().unwrap_or("").to_owned(),
                l["fields"]["outcome"].as_str().unwrap().to_owned(),
                l["level"].as_str().unwrap().to_owned(),
                l["fields"].clone(),
            )
        })
        .collect()
}

/// `events/sqs-single.json` with another message id: the same order delivered again
/// as a new message (SNS fan-out, producer retry, redrive).
fn another_copy() -> SqsEvent {
    let mut copy = event("sqs-single.json");
    copy.records[0].message_id = Some("a-second-copy-of-ord-1001".to_owned());
    copy
}

#[tokio::test]
async fn a_message_id_twice_in_a_batch_is_listed_once_in_the_failures() {
    let h = harness().await;
    let mut batch = batch_of(&["not json", r#"{"id":"x#y"}"#]);
    let id = batch.records[0].message_id.clone().unwrap();
    batch.records[1].message_id = Some(id.clone());
    assert_eq!(h.invoke_event_with(batch, INVOCATION).await, [id]);
}

#[tokio::test]
async fn declines_are_bounded_per_order_across_copies_and_deliveries() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Decline; 6]);
    // Two copies of one order, delivered in turn: three declines in all reach the card.
    for copy in [
        event("sqs-single.json"),
        another_copy(),
        event("sqs-single.json"),
    ] {
        assert_eq!(h.invoke_event_with(copy, INVOCATION).await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#2", "cobro#ord-1001#3"]
    );
    // From now on any delivery of any copy fails as declined without a provider call.
    for copy in [another_copy(), event("sqs-single.json")] {
        assert_eq!(h.invoke_event_with(copy, INVOCATION).await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(
        h.provider.calls_for("ord-1001").len(),
        3,
        "no fourth try of the card"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(4));
    let lines = outcome_lines(&logs);
    assert_eq!(lines.len(), 5);
    for (_, outcome, _, fields) in &lines[3..] {
        assert_eq!(outcome, "decline_limit");
        let reason = fields["reason"].as_str().unwrap_or("");
        assert!(reason.contains("limit"), "{fields}");
    }
    assert_eq!(h.provider.charge_count(), 0);
}

/// Asserts the handler answered before its deadline, with every record failed.
async fn answers_before_the_deadline<P: charge_once::contracts::payment::ChargePath + 'static>(
    h: &Harness<P>,
    event: SqsEvent,
    time_left: Duration,
) -> Vec<String> {
    let started = std::time::Instant::now();
    let failed = h.invoke_event_with(event, time_left).await;
    let took = started.elapsed();
    assert!(
        took < time_left,
        "the handler answered after its deadline: {took:?} > {time_left:?}"
    );
    failed
}

#[tokio::test]
async fn a_slow_store_cannot_make_the_handler_outlive_its_deadline() {
    let logs = Captured::default();
    let _guard = logs.install();
    // Each store call takes 1.5 s: reserve, charge and complete would end 3 s in.
    let options = Options {
        store_latency: Some(Duration::from_millis(1500)),
        wall_clock: true,
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    let time_left = DEADLINE_MARGIN + Duration::from_millis(200);
    let failed = answers_before_the_deadline(&h, event("sqs-single.json"), time_left).await;
    assert_eq!(failed, message_ids("sqs-single.json", &[0]));
    let lines = outcome_lines(&logs);
    assert_eq!(lines[0].1, "deadline", "{:?}", lines[0].3);
    // Nothing is lost: the lease ends at the deadline and the next delivery charges.
    tokio::time::sleep(time_left).await;
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_slow_listing_after_a_replayed_server_error_cannot_make_the_handler_outlive_its_deadline()
{
    let logs = Captured::default();
    let _guard = logs.install();
    let options = Options {
        wall_clock: true,
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    // Attempt 1 stores a 500.
    h.provider.script("ord-1001", &[Fault::StoredServerError]);
    // The in-invocation retry gets the 500 replayed, which sends the record to the
    // listing, which takes most of the time.
    h.provider
        .delay_lookups(PAYMENT_TIMEOUT - Duration::from_millis(100));
    let time_left = DEADLINE_MARGIN + Duration::from_millis(600);
    let failed = answers_before_the_deadline(&h, event("sqs-single.json"), time_left).await;
    assert_eq!(failed.len(), 1);
    // Nothing found: the key is kept, and nothing else is sent.
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "failed_retryable");
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        ["cobro#ord-1001#1", "cobro#ord-1001#1"]
    );
    assert_eq!(h.provider.charge_count(), 0);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_pending_charge_at_the_provider_is_never_charged_again_under_a_new_key() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    // Attempt 1's charge went out and the invocation died; the key is now old.
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    h.provider.add_pending_charge("ord-1001", 5000);
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    let calls_before = h.provider.calls_for("ord-1001").len();

    assert!(
        h.invoke("sqs-single.json").await.is_empty(),
        "acknowledged: the record awaits the payment"
    );
    assert_eq!(
        h.provider.calls_for("ord-1001").len(),
        calls_before,
        "nothing is sent while the provider holds a live charge"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Awaiting);
    assert_eq!(record.attempt, Some(1), "the same key");
    let (_, outcome, level, _) = outcome_lines(&logs).pop().unwrap();
    assert_eq!(
        (outcome.as_str(), level.as_str()),
        ("payment_processing", "INFO")
    );
}

/// A bank debit settles in days: the record awaits its `processing` payment (no DLQ
/// after the queue's receives), and the settler completes the order once it succeeded,
/// two weeks later.
#[tokio::test]
async fn a_processing_payment_that_succeeds_after_two_weeks_ends_done_with_no_dead_letter() {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    // The charge's answer was lost; the provider holds the debit `processing`.
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    let debit = h.provider.add_processing_payment(&ord_1001());
    // The key is old: the next delivery looks the order's payments up first.
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    assert!(h.invoke("sqs-single.json").await.is_empty(), "acknowledged");
    assert_eq!(outcome_lines(&logs).pop().unwrap().1, "payment_processing");
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (record.state, record.payment.as_deref()),
        (State::Awaiting, Some(debit.as_str()))
    );
    // Delivered again while it settles: acknowledged, no call.
    let calls = h.provider.calls_for("ord-1001").len();
    h.redeliver_later();
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(h.provider.calls_for("ord-1001").len(), calls);
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    // Fifteen days on, past the end of its wait (two weeks at least for a payment
    // the provider processes), still processing: it may still succeed, so nothing ends
    // (and nothing can cancel a processing payment).
    h.clock.advance(Duration::from_secs(15 * 24 * 3600));
    let run = settler.run().await.unwrap();
    assert_eq!((run.read, run.waiting, run.ended), (1, 1, 0), "{run:?}");
    assert!(h.provider.cancels().is_empty());
    // The bank pays: the next run completes the order.
    assert!(h.provider.settle_processing(&debit, true));
    let run = settler.run().await.unwrap();
    assert_eq!((run.read, run.completed), (1, 1), "{run:?}");
    let done = h.record("ord-1001").await.unwrap();
    assert_eq!(
        (done.state, done.receipt.as_deref()),
        (State::Done, Some(debit.as_str()))
    );
    h.provider.assert_no_order_charged_twice();
}

/// The order of `events/sqs-single.json`, as `resolve` gets it from the DLQ message.
fn ord_1001() -> Order {
    Order::new("ord-1001", 5000, "EUR", "cus_123", "pm_card_visa").unwrap()
}

#[tokio::test]
async fn resolve_refuses_to_move_to_a_new_key_while_the_charge_is_pending() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    h.provider.add_pending_charge("ord-1001", 5000);
    h.redeliver_later();
    let resolved = resolve(
        h.table.store.as_ref(),
        h.provider.as_ref(),
        &h.settings,
        &ord_1001(),
        Confirmed::default(),
    )
    .await;
    assert!(
        matches!(resolved, Err(ResolveError::Pending { ref status, .. }) if status == "pending"),
        "{resolved:?}"
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    assert_eq!(h.provider.charge_count(), 0);
}

#[tokio::test]
async fn resolve_with_retry_declined_lets_a_declined_order_try_the_card_again() {
    let h = harness().await;
    h.provider.script("ord-1001", &[Fault::Decline; 3]);
    for _ in 0..4 {
        assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
        h.redeliver_later();
    }
    assert_eq!(h.provider.calls_for("ord-1001").len(), 3, "the limit holds");
    // Without --retry-declined, resolve releases with a new key but keeps the count.
    let confirmed = Confirmed::default();
    let order = ord_1001();
    let settle = |confirmed| {
        resolve(
            h.table.store.as_ref(),
            h.provider.as_ref(),
            &h.settings,
            &order,
            confirmed,
        )
    };
    assert!(matches!(
        settle(confirmed).await.unwrap(),
        Resolution::Released { next_attempt: 5 }
    ));
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    assert_eq!(h.provider.calls_for("ord-1001").len(), 3);
    // The customer fixed the card.
    let retry = Confirmed {
        retry_declined: true,
        ..Confirmed::default()
    };
    assert!(matches!(
        settle(retry).await.unwrap(),
        Resolution::Released { next_attempt: 6 }
    ));
    assert!(h.invoke("sqs-single.json").await.is_empty());
    assert_eq!(
        h.provider.keys_for("ord-1001").last().unwrap(),
        "cobro#ord-1001#6"
    );
    assert_eq!(h.provider.charges_for("ord-1001").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn once_the_providers_breaker_opens_records_are_deferred_without_a_write_until_a_probe() {
    let logs = Captured::default();
    let _guard = logs.install();
    let options = Options {
        breaker_threshold: Some(2),
        ..Options::default()
    };
    let h = Harness::with(TestProvider::new(), options).await;
    // A customer each: one customer's orders run one after another, and the probe
    // must be out while the other record is admitted.
    let body = |id: &str| {
        let customer = id.replace('-', "_");
        format!(
            r#"{{"id":"{id}","amount":700,"currency":"EUR","customer":"cus_{customer}","payment_method":"pm_card_visa"}}"#
        )
    };
    // A 5xx and its in-invocation retry: two failures in a row open the breaker.
    h.provider
        .script("brk-1", &[Fault::ServerError, Fault::ServerError]);
    let event = batch_of(&[body("brk-1")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    // The next order is deferred: no provider call, no reservation.
    let event = batch_of(&[body("brk-2")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    assert!(h.provider.calls_for("brk-2").is_empty());
    assert!(
        h.record("brk-2").await.is_none(),
        "a deferred record is not reserved"
    );
    let deferred = outcome_lines(&logs);
    let (_, outcome, level, fields) = deferred.last().unwrap();
    assert_eq!((outcome.as_str(), level.as_str()), ("deferred", "WARN"));
    // Deferred with the backoff of a first receive (the upper half of 30 s), capped by
    // the breaker's next probe (30 s away) plus at most 5 s.
    let retry = fields["retry_in_s"].as_u64().unwrap();
    assert!((15..=30).contains(&retry), "{fields}");
    // After the open period (RETRY_BASE, 30 s) one record probes; the others of its
    // batch are deferred while it is out.
    h.clock.advance(Duration::from_secs(31));
    let event = batch_of(&[body("brk-2"), body("brk-3")]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    let charged: usize = ["brk-2", "brk-3"]
        .map(|id| h.provider.charges_for(id).len())
        .iter()
        .sum();
    assert_eq!(charged, 1, "one probe");
    // Its success closed the breaker: the deferred one goes through.
    let event = batch_of(&[body("brk-2"), body("brk-3")]);
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(h.provider.charges_for("brk-2").len(), 1);
    assert_eq!(h.provider.charges_for("brk-3").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

/// A body of order `id` paid with the test provider's card, or with no payment method.
fn paid(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","amount":900,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}}"#
    )
}

fn unpaid(id: &str) -> String {
    format!(r#"{{"id":"{id}","amount":900,"currency":"EUR","customer":"cus_1"}}"#)
}

#[tokio::test]
async fn a_declined_payment_is_cancelled_before_the_next_key_so_no_later_confirm_can_charge_twice()
{
    let h = harness().await;
    h.provider.script("pi-dec", &[Fault::Decline]);
    let event = batch_of(&[paid("pi-dec")]);
    assert_eq!(
        h.invoke_event_with(event.clone(), INVOCATION).await.len(),
        1
    );
    // The declined payment was looked up and cancelled before the record moved on.
    let cancelled = h.provider.cancels();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(h.provider.open_for("pi-dec").is_empty());
    let record = h.record("pi-dec").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(2)));
    // The shop's page or a person in the Dashboard cannot confirm it any more.
    assert!(!h.provider.confirm(&cancelled[0]));
    h.redeliver_later();
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(
        h.provider.keys_for("pi-dec"),
        ["cobro#pi-dec#1", "cobro#pi-dec#2"]
    );
    assert_eq!(h.provider.charges_for("pi-dec").len(), 1);
    h.provider.assert_no_order_charged_twice();
}

/// The settler on `table` and `provider` with the consumer's `settings` (its clock,
/// breakers and pace), reporting to nobody, with two minutes to run.
fn settler<'a>(
    table: &'a harness::servers::Table,
    provider: &'a dyn charge_once::contracts::payment::ChargePath,
    settings: &'a charge_once::drivers::charge::Settings,
) -> Settler<'a> {
    Settler {
        store: table.store.as_ref(),
        provider,
        reports: &Unreported,
        settings,
        time: Duration::from_secs(120),
        limit: 100,
        per_run: usize::MAX,
    }
}

#[tokio::test]
async fn authentication_required_acknowledges_the_order_which_awaits_its_customer_with_no_other_call_until_the_event_of_the_confirmed_payment_completes_it()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let h = harness().await;
    h.provider
        .script("pi-sca", &[Fault::AuthenticationRequired]);
    let event = batch_of(&[paid("pi-sca")]);
    assert!(
        h.invoke_event_with(event.clone(), INVOCATION)
            .await
            .is_empty(),
        "acknowledged: no DLQ"
    );
    let open = h.provider.open_for("pi-sca");
    assert_eq!(open.len(), 1, "the payment awaits the customer");
    let lines = outcome_lines(&logs);
    let (_, outcome, level, fields) = lines.last().unwrap();
    assert_eq!(
        (outcome.as_str(), level.as_str()),
        ("authentication_required", "INFO")
    );
    assert_eq!(fields["payment"], open[0].as_str(), "{fields}");
    let record = h.record("pi-sca").await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Awaiting, Some(1)));
    assert_eq!(record.payment.as_deref(), Some(open[0].as_str()));
    let wait_until = record.wait_until.unwrap();
    assert_eq!(
        wait_until.as_secs(),
        (h.now() + harness::rig::AUTHENTICATION_WAIT).as_secs()
    );
    // Delivered again while it waits: a duplicate, no provider call.
    h.redeliver_later();
    assert!(
        h.invoke_event_with(event.clone(), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "awaiting_customer");
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    assert!(h.provider.cancels().is_empty(), "it is never cancelled");
    // The customer authenticates on the shop's page; Stripe's event completes it.
    assert!(h.provider.confirm(&open[0]));
    let succeeded = stripe_event("payment_intent.succeeded", &open[0], "succeeded", "pi-sca");
    assert!(
        h.invoke_event_with(batch_of(&[succeeded]), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(outcome_lines(&logs).last().unwrap().1, "reconciled");
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    assert_eq!(h.provider.charges_for("pi-sca"), open);
    let done = h.record("pi-sca").await.unwrap();
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(open[0].as_str()));
    // A later delivery of the order is a duplicate of a done order.
    h.redeliver_later();
    assert!(h.invoke_event_with(event, INVOCATION).await.is_empty());
    assert_eq!(h.provider.keys_for("pi-sca"), ["cobro#pi-sca#1"]);
    h.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_message_without_a_payment_method_is_invalid_and_never_charged() {
    let h = harness().await;
    let unpaid = batch_of(&[unpaid("pi-none")]);
    // Failed alone (dead-lettered by the batch: tests/queue.rs), with the reason
    // `domain/order.rs`'s tests name.
    assert_eq!(h.invoke_event_with(unpaid, INVOCATION).await.len(), 1);
    assert!(h.provider.calls_for("pi-none").is_empty(), "never charged");
    assert!(h.record("pi-none").await.is_none(), "nothing written");
}

// --- Stripe's events: localstripe (behind its layer) puts them on a partner event bus
// on moto, whose rule delivers them to a queue; the handler reads them from there. ---

/// The handler on moto and localstripe, with the events of this test's orders routed
/// to a queue of its own.
struct Events {
    h: Harness<HttpProvider>,
    queues: Queues,
    destination: String,
    run: String,
    payer: Payer,
    /// SQS events of one record each, received and not yet taken.
    received: tokio::sync::Mutex<Vec<SqsEvent>>,
}

impl Events {
    /// Asserts that `order_id`'s record is `hecho` with `payment` as its receipt.
    async fn assert_done_with(&self, order_id: &str, payment: &str) {
        let done = self.h.record(order_id).await.unwrap();
        assert_eq!(
            (done.state, done.receipt.as_deref()),
            (State::Done, Some(payment))
        );
    }

    async fn new() -> Self {
        Self::with(Options::default()).await
    }

    async fn with(options: Options) -> Self {
        let provider = HttpProvider::new(
            localstripe_url(),
            &Secret::new(localstripe::TEST_KEY.to_owned()),
            PAYMENT_TIMEOUT,
            &harness::tls(),
        )
        .unwrap();
        let h = Harness::with(provider, options).await;
        let queues = Queues::create(Duration::from_secs(30), 10).await;
        let run = format!("ev{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let destination = stripe_events_to(&queues.arn, Some(&run), ("test", "test")).await;
        Self {
            h,
            queues,
            destination,
            run,
            payer: localstripe::payer(Card::RequiresAuthentication).await,
            received: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    fn order_id(&self, n: usize) -> String {
        format!("{}-{n}", self.run)
    }

    /// Order `n`, paid with the card that always asks for authentication.
    fn order(&self, n: usize) -> SqsEvent {
        let body = serde_json::json!({"id": self.order_id(n), "amount": 900, "currency": "EUR",
            "customer": self.payer.customer, "payment_method": self.payer.card});
        batch_of(&[body.to_string()])
    }

    /// Delivers order `n`: acknowledged, its record awaits the customer. Returns the
    /// PaymentIntent it awaits.
    async fn awaiting(&self, n: usize) -> String {
        assert_eq!(
            self.h.invoke_event_with(self.order(n), INVOCATION).await,
            Vec::<String>::new(),
            "acknowledged: the table holds the order"
        );
        let record = self.h.record(&self.order_id(n)).await.unwrap();
        assert_eq!(record.state, State::Awaiting, "{record:?}");
        record.payment.unwrap()
    }

    /// The event `kind` of `payment` as the queue delivers it (at most 10 s).
    async fn event(&self, kind: &str, payment: &str) -> SqsEvent {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let mut received = self.received.lock().await;
            let found = received.iter().position(|e| {
                let body: serde_json::Value =
                    serde_json::from_str(e.records[0].body.as_deref().unwrap()).unwrap();
                body["detail-type"] == kind && body["detail"]["data"]["object"]["id"] == payment
            });
            if let Some(at) = found {
                return received.remove(at);
            }
            for m in self.queues.receive(Duration::from_secs(60)).await {
                let one = event_of(std::slice::from_ref(&m), &self.queues.arn);
                received.push(serde_json::from_value(one).unwrap());
            }
            drop(received);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no {kind} event of {payment} within 10 s")
    }

    /// A PaymentIntent for order `n` made at localstripe outside the consumer, off
    /// session with the card that asks for authentication: `requires_action`.
    async fn open_payment(&self, n: usize) -> String {
        let form = [
            ("amount", "900"),
            ("currency", "eur"),
            ("customer", self.payer.customer.as_str()),
            ("payment_method", self.payer.card.as_str()),
            ("confirm", "true"),
            ("off_session", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
            ("metadata[order_id]", &self.order_id(n)),
        ];
        let made: serde_json::Value = harness::http_client()
            .post(format!("{}/v1/payment_intents", localstripe_url()))
            .bearer_auth(localstripe::TEST_KEY)
            .form(&form)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(made["status"], "requires_action", "{made}");
        made["id"].as_str().unwrap().to_owned()
    }

    async fn cancel(&self, payment: &str) {
        let cancelled: serde_json::Value = harness::http_client()
            .post(format!(
                "{}/v1/payment_intents/{payment}/cancel",
                localstripe_url()
            ))
            .bearer_auth(localstripe::TEST_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(cancelled["status"], "canceled", "{cancelled}");
    }

    async fn done(self) {
        localstripe::disarm_eventbridge(&self.destination).await;
    }
}

/// The outcome of the last line logged.
fn last_outcome(logs: &Captured) -> (String, serde_json::Value) {
    let (_, outcome, _, fields) = outcome_lines(logs).pop().expect("an outcome line");
    (outcome, fields)
}

#[tokio::test]
async fn a_succeeded_event_completes_the_order_that_awaits_its_customer_and_a_repeat_changes_nothing()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let payment = events.awaiting(1).await;
    assert_eq!(last_outcome(&logs).0, "authentication_required");
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;

    let h = &events.h;
    assert!(
        h.invoke_event_with(succeeded.clone(), INVOCATION)
            .await
            .is_empty()
    );
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "reconciled", "{fields}");
    let done = h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(payment.as_str()));
    assert_eq!(
        done.wait_until, None,
        "the record leaves the awaiting index"
    );

    // The same event again (EventBridge and SQS deliver at least once): refused by its
    // condition, nothing written.
    assert!(h.invoke_event_with(succeeded, INVOCATION).await.is_empty());
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    assert_eq!(h.record(&events.order_id(1)).await.unwrap(), done);
    assert_eq!(
        localstripe::succeeded_of(&events.payer.customer).await,
        [payment]
    );
    events.done().await;
}

/// A success of a payment the awaiting record does not name: Stripe took money for the
/// order while another of its payments may still succeed, so a person looks.
#[tokio::test]
async fn a_success_of_a_payment_the_awaiting_record_does_not_name_is_dead_lettered_and_the_wait_goes_on()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let awaited = events.awaiting(1).await;
    // Another PaymentIntent names the same order: made elsewhere, confirmed.
    let other = events.open_payment(1).await;
    localstripe::authenticate(&other).await;
    let succeeded = events.event("payment_intent.succeeded", &other).await;
    let before = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .len(),
        1,
        "to the DLQ, never acknowledged as nothing"
    );
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "needs_reconciliation", "{fields}");
    assert!(
        fields["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&other) && r.contains("awaits another payment")),
        "{fields}"
    );
    let after = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after.payment.as_deref(), Some(awaited.as_str()));
    events.done().await;
}

#[tokio::test]
async fn a_payment_failed_event_leaves_the_order_awaiting_its_customer() {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let payment = events.awaiting(1).await;
    // Stripe sends one for the very answer that started the wait.
    let failed = events
        .event("payment_intent.payment_failed", &payment)
        .await;
    let before = events.h.record(&events.order_id(1)).await.unwrap();
    assert!(
        events
            .h
            .invoke_event_with(failed, INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    assert_eq!(events.h.record(&events.order_id(1)).await.unwrap(), before);
    // The customer can still confirm it, and its event completes the order.
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&events.order_id(1), &payment).await;
    events.done().await;
}

#[tokio::test]
async fn a_canceled_event_ends_the_wait_reports_the_order_and_its_next_message_starts_a_new_attempt()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let mut events = Events::new().await;
    let reports = events.queues.create_report_queue().await;
    events.h = events.h.reporting_to(std::sync::Arc::new(SqsReports::new(
        events.queues.client.clone(),
        &reports,
    )));
    let payment = events.awaiting(1).await;
    // Cancelled in the Dashboard, say.
    events.cancel(&payment).await;
    let canceled = events.event("payment_intent.canceled", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(canceled.clone(), INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "authentication_expired");
    let ended = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!((ended.state, ended.attempt), (State::Failed, Some(2)));
    let sent = events.queues.drain_reports(&reports).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let report = &sent[0];
    assert_eq!(report["order_id"], events.order_id(1).as_str());
    assert_eq!(report["outcome"], "authentication_expired");
    assert_eq!(report["payment_id"], payment.as_str());
    // The same event again: the wait already ended, nothing reported again.
    assert!(
        events
            .h
            .invoke_event_with(canceled, INVOCATION)
            .await
            .is_empty()
    );
    assert_eq!(last_outcome(&logs).0, "event_ignored");
    // The shop sends the order again: a new attempt, a new PaymentIntent.
    let again = events.awaiting(1).await;
    assert_ne!(again, payment);
    let record = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(record.attempt, Some(2));
    events.done().await;
}

#[tokio::test]
async fn an_event_that_arrives_while_the_order_is_leased_is_retried_and_completes_it_once_the_record_awaits()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let id = events.order_id(1);
    // Another invocation holds the order, has made its PaymentIntent, and has not yet
    // written that it awaits the customer, who confirms meanwhile.
    let body = events.order(1).records[0].body.clone().unwrap();
    let order = Order::parse(&body).unwrap();
    let other = "another-invocation";
    Lease::of(&order, other, events.h.now())
        .make(events.h.store.as_ref())
        .await;
    let payment = events.open_payment(1).await;
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    let failed = events
        .h
        .invoke_event_with(succeeded.clone(), INVOCATION)
        .await;
    assert_eq!(failed.len(), 1, "retried");
    assert_eq!(last_outcome(&logs).0, "in_progress");
    assert_eq!(events.h.record(&id).await.unwrap().state, State::InProgress);
    // The other invocation writes its wait; the event's retry completes the order.
    let key = Key::for_order_id(&id);
    let written = events
        .h
        .store
        .write(&Write::Await(AwaitRequest {
            pk: &key,
            owner: &Owner::new(other),
            payment_id: &payment,
            wait_until: events.h.now() + Duration::from_secs(7 * 24 * 3600),
            expires: events.h.now() + Duration::from_secs(97 * 24 * 3600),
        }))
        .await
        .unwrap();
    assert!(matches!(written, WriteOutcome::Applied(_)), "{written:?}");
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&id, &payment).await;
    events.done().await;
}

#[tokio::test]
async fn a_late_confirmation_of_an_old_payment_for_an_order_already_paid_is_dead_lettered_as_charged_twice()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let old = events.awaiting(1).await;
    // Meanwhile the order was paid with another PaymentIntent.
    let paid = events.open_payment(1).await;
    localstripe::authenticate(&paid).await;
    let key = Key::for_order_id(&events.order_id(1));
    let awaiting = events.h.record(&events.order_id(1)).await.unwrap();
    events
        .h
        .table
        .put_item(schema::attributes(&Record {
            state: State::Done,
            receipt: Some(paid.clone()),
            payment: None,
            wait_until: None,
            owner: None,
            lease_until: None,
            ..awaiting
        }))
        .await;
    // Then the customer confirms the old one, from an old page.
    localstripe::authenticate(&old).await;
    let late = events.event("payment_intent.succeeded", &old).await;
    let failed = events.h.invoke_event_with(late, INVOCATION).await;
    assert_eq!(failed.len(), 1, "to the DLQ: a person refunds one");
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "needs_reconciliation", "{fields}");
    let record = events.h.record(&events.order_id(1)).await.unwrap();
    assert_eq!(record.pk, key);
    assert_eq!(
        (record.state, record.receipt.as_deref()),
        (State::Done, Some(paid.as_str()))
    );
    let mut succeeded = localstripe::succeeded_of(&events.payer.customer).await;
    succeeded.sort();
    let mut both = vec![old, paid];
    both.sort();
    assert_eq!(succeeded, both, "charged twice");
    events.done().await;
}

#[tokio::test]
async fn a_customer_who_confirms_after_the_fourteen_days_a_dead_letter_is_kept_still_ends_with_the_order_recorded()
 {
    let wait = Duration::from_secs(20 * 24 * 3600);
    let events = Events::with(Options {
        authentication_wait: Some(wait),
        ..Options::default()
    })
    .await;
    let h = &events.h;
    let by_event = events.awaiting(1).await;
    let by_settler = events.awaiting(2).await;
    let started = h.now();
    assert_eq!(
        h.record(&events.order_id(1))
            .await
            .unwrap()
            .wait_until
            .map(|t| t.as_secs()),
        Some((started + wait).as_secs())
    );
    // Fifteen days on: an SQS queue keeps a message 14 days at most, so a dead letter
    // of either order would be gone; only the table holds them.
    h.clock.advance(Duration::from_secs(15 * 24 * 3600));
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    let before = settler.run().await.unwrap();
    assert_eq!(
        (before.read, before.waiting, before.ended),
        (2, 2, 0),
        "{before:?}"
    );
    // Both customers come back and confirm.
    localstripe::authenticate(&by_event).await;
    localstripe::authenticate(&by_settler).await;
    // The first order's event completes it; the second's is lost, and the settler's
    // next run completes that order from its payment.
    let succeeded = events.event("payment_intent.succeeded", &by_event).await;
    assert!(h.invoke_event_with(succeeded, INVOCATION).await.is_empty());
    let after = settler.run().await.unwrap();
    assert_eq!(
        (after.read, after.completed, after.ended),
        (1, 1, 0),
        "{after:?}"
    );
    for (n, payment) in [(1, &by_event), (2, &by_settler)] {
        let record = h.record(&events.order_id(n)).await.unwrap();
        assert_eq!(record.state, State::Done, "{record:?}");
        assert_eq!(
            record.receipt.as_deref(),
            Some(payment.as_str()),
            "{record:?}"
        );
    }
    let mut succeeded = localstripe::succeeded_of(&events.payer.customer).await;
    succeeded.sort();
    let mut both = vec![by_event.clone(), by_settler.clone()];
    both.sort();
    assert_eq!(succeeded, both, "one PaymentIntent per order");
    events.done().await;
}

/// Anyone allowed to send to the orders queue can write a body that looks like Stripe's
/// event: a forged success or cancellation of an awaited payment changes nothing, since
/// the consumer asks Stripe, and the customer's real confirmation completes the order
/// with one payment.
#[tokio::test]
async fn a_forged_success_or_cancellation_of_an_awaited_payment_changes_nothing_and_the_customer_still_pays_once()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let id = events.order_id(1);
    let payment = events.awaiting(1).await;
    let before = events.h.record(&id).await.unwrap();
    for (kind, status) in [
        ("payment_intent.succeeded", "succeeded"),
        ("payment_intent.canceled", "canceled"),
    ] {
        let forged = batch_of(&[stripe_event(kind, &payment, status, &id)]);
        assert!(
            events
                .h
                .invoke_event_with(forged, INVOCATION)
                .await
                .is_empty()
        );
        let (outcome, fields) = last_outcome(&logs);
        assert_eq!(outcome, "event_ignored", "{kind}: {fields}");
        assert_eq!(events.h.record(&id).await.unwrap(), before, "{kind}");
    }
    // The customer confirms: Stripe's own event completes the order.
    localstripe::authenticate(&payment).await;
    let succeeded = events.event("payment_intent.succeeded", &payment).await;
    assert!(
        events
            .h
            .invoke_event_with(succeeded, INVOCATION)
            .await
            .is_empty()
    );
    events.assert_done_with(&id, &payment).await;
    assert_eq!(
        localstripe::succeeded_of(&events.payer.customer).await,
        [payment]
    );
    events.done().await;
}

/// Stripe's own success for an order whose record does not await it (released after a
/// lost answer, or a wait that ended) completes the order: money taken is never
/// acknowledged as nothing.
#[tokio::test]
async fn a_genuine_success_for_a_released_or_ended_record_completes_the_order() {
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    for (n, state) in [(1, State::Free), (2, State::Failed)] {
        let id = events.order_id(n);
        let body = events.order(n).records[0].body.clone().unwrap();
        let order = Order::parse(&body).unwrap();
        events
            .h
            .table
            .put_item(schema::attributes(&Record {
                fingerprint: Some(charge_once::domain::Fingerprint::of(&order)),
                attempt: Some(1),
                created: Some(events.h.now()),
                expires: Some(events.h.now() + Duration::from_secs(30 * 24 * 3600)),
                ..Record::new(Key::for_order_id(&id), state.clone())
            }))
            .await;
        let payment = events.open_payment(n).await;
        localstripe::authenticate(&payment).await;
        let succeeded = events.event("payment_intent.succeeded", &payment).await;
        assert!(
            events
                .h
                .invoke_event_with(succeeded, INVOCATION)
                .await
                .is_empty(),
            "{state:?}"
        );
        let (outcome, fields) = last_outcome(&logs);
        assert_eq!(outcome, "reconciled", "{state:?}: {fields}");
        events.assert_done_with(&id, &payment).await;
    }
    events.done().await;
}

/// Stripe never deletes a PaymentIntent: one it does not know means a wrong key, mode
/// or URL. The settler ends no wait on it and says which setting to check; the event
/// path retries.
#[tokio::test]
async fn a_payment_the_provider_does_not_know_ends_no_wait_and_the_run_names_the_setting_to_check()
{
    let logs = Captured::default();
    let _guard = logs.install();
    let events = Events::new().await;
    let h = &events.h;
    let id = events.order_id(1);
    let unknown = format!("pi_unknown{}", &events.run[2..]);
    let awaiting = Record {
        fingerprint: Some(charge_once::domain::Fingerprint::new("f")),
        attempt: Some(1),
        payment: Some(unknown.clone()),
        wait_until: Some(h.now() - Duration::from_secs(60)),
        expires: Some(h.now() + Duration::from_secs(30 * 24 * 3600)),
        ..Record::new(Key::for_order_id(&id), State::Awaiting)
    };
    h.table.put_item(schema::attributes(&awaiting)).await;
    let settler = settler(&h.table, h.provider.as_ref(), &h.settings);
    let run = settler.run().await.unwrap();
    assert_eq!(
        (run.missing, run.ended, run.completed),
        (1, 0, 0),
        "{run:?}"
    );
    assert_eq!(run.summary()["settle"], "incomplete");
    assert_eq!(h.record(&id).await.unwrap(), awaiting, "nothing ended");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("does not have the payment"))
        .expect("the fault's line");
    assert!(
        line.contains("\"ERROR\"") && line.contains("PAYMENT_API_URL"),
        "{line}"
    );
    // An event naming it is retried, at error level, and ends nothing either.
    let event = batch_of(&[stripe_event(
        "payment_intent.canceled",
        &unknown,
        "canceled",
        &id,
    )]);
    assert_eq!(h.invoke_event_with(event, INVOCATION).await.len(), 1);
    let (outcome, fields) = last_outcome(&logs);
    assert_eq!(outcome, "failed_retryable", "{fields}");
    assert_eq!(h.record(&id).await.unwrap(), awaiting);
    events.done().await;
}

/// Waits that stay open fill the head of the awaiting index; a wait behind more than
/// one run's worth of them is still reached: each run goes on from where the last one
/// stopped, and a run that could not go round says `incomplete`.
#[tokio::test]
async fn the_settler_reaches_a_wait_behind_more_than_one_runs_worth_of_open_waits() {
    let h = harness().await;
    let ids: Vec<String> = (1..=5).map(|n| format!("pg-{n}")).collect();
    for id in &ids {
        h.provider.script(id, &[Fault::AuthenticationRequired]);
        assert!(
            h.invoke_event_with(batch_of(&[paid(id)]), INVOCATION)
                .await
                .is_empty()
        );
        // Each wait ends a minute after the one before: the last is last in the index.
        h.clock.advance(Duration::from_secs(60));
    }
    let last = h.record("pg-5").await.unwrap().payment.unwrap();
    assert!(h.provider.confirm(&last), "its customer confirms");
    let settler = Settler {
        limit: 2,
        per_run: 2,
        ..settler(&h.table, h.provider.as_ref(), &h.settings)
    };
    for _ in 0..2 {
        let run = settler.run().await.unwrap();
        assert_eq!((run.read, run.waiting, run.completed), (2, 2, 0), "{run:?}");
        assert_eq!(run.summary()["settle"], "incomplete");
    }
    let run = settler.run().await.unwrap();
    assert_eq!(run.completed, 1, "{run:?}");
    let done = h.record("pg-5").await.unwrap();
    assert_eq!(
        (done.state, done.receipt.as_deref()),
        (State::Done, Some(last.as_str()))
    );
    // Round the whole index in one run: `done`.
    let everything = Settler {
        per_run: usize::MAX,
        ..settler
    };
    let run = everything.run().await.unwrap();
    assert_eq!((run.read, run.waiting), (4, 4), "{run:?}");
    assert_eq!(run.summary()["settle"], "done");
    h.provider.assert_no_order_charged_twice();
}
