//! The batch: copies of one order, invalid bodies, failures and their keys, FIFO
//! groups, the deadline.

use super::*;

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
