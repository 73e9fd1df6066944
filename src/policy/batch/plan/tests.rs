//! The unit tests of `plan.rs`.

use super::*;
use std::time::Duration;

use idempotent_consumer::retry::{Backoff, Disposition, Jitter};

use crate::contracts::queue::QueueError;
use crate::domain::clock::Time;
use crate::policy::batch::ending::RecordOutcome;
use crate::policy::outcome::Outcome;

/// A message of a standard queue; its text is leaked, as a test's records live
/// for the whole test anyway.
fn message(id: &str, body: &str) -> Message<'static> {
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    Message {
        message_id: Some(leak(id.to_owned())),
        body: Some(leak(body.to_owned())),
        event_source_arn: Some("arn:aws:sqs:eu-west-1:123456789012:orders"),
        receipt_handle: Some(leak(format!("rh-{id}"))),
        ..Message::default()
    }
}

fn order(id: &str) -> String {
    order_of(id, &format!("cus_{id}"))
}

fn order_of(id: &str, customer: &str) -> String {
    format!(
        r#"{{"id":"{id}","amount":100,"currency":"EUR","customer":"{customer}","payment_method":"pm_card_visa"}}"#
    )
}

fn fifo(m: Message<'static>, group: Option<&'static str>) -> Message<'static> {
    Message {
        event_source_arn: Some("arn:aws:sqs:eu-west-1:123456789012:orders.fifo"),
        message_group_id: group,
        ..m
    }
}

fn declined() -> RecordOutcome {
    RecordOutcome::Processed(Outcome::Declined {
        code: "card_declined".into(),
        decline_code: None,
        attempt: 1,
    })
}

fn charged() -> RecordOutcome {
    RecordOutcome::Processed(Outcome::Charged {
        receipt: "ch_1".into(),
        charge: None,
        attempt: 1,
    })
}

#[test]
fn a_record_without_a_message_id_fails_the_whole_batch_and_an_invalid_one_only_itself() {
    let mut nameless = message("m", &order("A"));
    nameless.message_id = None;
    assert!(matches!(
        parse(&[message("m0", &order("A")), nameless]),
        Err(BatchError::MissingMessageId { index: 1 })
    ));
    let records = [message("m0", "{"), message("m1", &order("A"))];
    let entries = parse(&records).unwrap();
    assert!(matches!(entries[0].outcome, RecordOutcome::Invalid));
    assert!(entries[0].reason().is_some());
    assert_eq!(entries[1].key(), Some("cobro#A"));
    assert!(matches!(entries[1].outcome, RecordOutcome::NoOutcome));
}

#[test]
fn a_standard_queue_groups_copies_of_an_order_and_leaves_invalid_records_out() {
    let records = [
        message("m0", &order("A")),
        message("m1", "not json"),
        message("m2", &order("B")),
        message("m3", &order("A")),
    ];
    let mut entries = parse(&records).unwrap();
    let schedule = schedule(&mut entries, FifoScope::Group);
    assert_eq!(schedule.groups, vec![vec![0, 3], vec![2]]);
    assert_eq!(schedule.skip, Skip::SameFact);
    let groups: Vec<Option<usize>> = entries.iter().map(|e| e.group).collect();
    assert_eq!(groups, [Some(0), None, Some(1), Some(0)]);
}

#[test]
fn one_customers_orders_run_one_after_another_and_other_customers_alongside() {
    let records = [
        message("m0", &order_of("A", "cus_1")),
        message("m1", &order_of("B", "cus_2")),
        message("m2", &order_of("C", "cus_1")),
        message("m3", &order_of("A", "cus_1")),
        message("m4", &order_of("D", "cus_3")),
        message("m5", &order_of("E", "cus_1")),
    ];
    let mut entries = parse(&records).unwrap();
    let schedule = schedule(&mut entries, FifoScope::Group);
    // Each order is still its own group (a failure skips only its own copies)...
    assert_eq!(
        schedule.groups,
        vec![vec![0, 3], vec![1], vec![2], vec![4], vec![5]]
    );
    // ...and the groups of cus_1 form one chain, run one after another.
    assert_eq!(schedule.chains, vec![vec![0, 2, 4], vec![1], vec![3]]);
}

/// A Stripe event through EventBridge about PaymentIntent `pi`, naming no order (a thin
/// event: its order is the one the provider's answer names).
fn thin_event(pi: &str) -> String {
    serde_json::json!({
        "source": "aws.partner/stripe.com/ed_test", "detail-type": "payment_intent.succeeded",
        "detail": {"id": "evt_1", "object": "event", "type": "payment_intent.succeeded",
            "data": {"object": {"id": pi, "object": "payment_intent", "status": "succeeded"}}},
    })
    .to_string()
}

#[test]
fn an_event_that_names_no_order_runs_on_a_chain_of_its_own_never_dropped() {
    let records = [
        message("m0", &order_of("A", "cus_1")),
        message("m1", &thin_event("pi_9")),
        message("m2", &thin_event("pi_9")),
    ];
    let mut entries = parse(&records).unwrap();
    assert!(matches!(
        entries[1].fact,
        Ok(Valid::Event { key: None, .. })
    ));
    let schedule = schedule(&mut entries, FifoScope::Group);
    // Copies of one event are one group, after each other...
    assert_eq!(schedule.groups, vec![vec![0], vec![1, 2]]);
    // ...and that group runs: every group is on a chain.
    assert_eq!(schedule.chains, vec![vec![0], vec![1]]);
}

#[test]
fn a_fifo_batch_runs_by_message_group_or_whole_invalid_records_included() {
    let records = [
        fifo(message("m0", &order("A")), Some("g1")),
        fifo(message("m1", "not json"), Some("g2")),
        fifo(message("m2", &order("B")), Some("g1")),
    ];
    let mut entries = parse(&records).unwrap();
    let by_group = schedule(&mut entries, FifoScope::Group);
    assert_eq!(by_group.groups, vec![vec![0, 2], vec![1]]);
    assert_eq!(by_group.chains, vec![vec![0], vec![1]], "FIFO: unchained");
    assert_eq!(by_group.skip, Skip::FifoGroup);
    let whole = schedule(&mut entries, FifoScope::Batch);
    assert_eq!(whole.groups, vec![vec![0, 1, 2]]);
    assert_eq!(whole.skip, Skip::Fifo);
}

#[test]
fn a_fifo_record_without_a_group_puts_the_whole_batch_in_order() {
    let records = [
        fifo(message("m0", &order("A")), Some("g1")),
        fifo(message("m1", &order("B")), None),
    ];
    let mut entries = parse(&records).unwrap();
    let schedule = schedule(&mut entries, FifoScope::Group);
    assert_eq!(schedule.groups, vec![vec![0, 1]]);
    assert_eq!(schedule.skip, Skip::Fifo);
}

#[test]
fn a_group_stops_at_its_first_failure_and_names_it() {
    let mut rule = InOrder::new(Skip::FifoGroup);
    assert!(rule.skipped::<Outcome>().is_none());
    rule.ended(0, &charged());
    assert!(
        rule.skipped::<Outcome>().is_none(),
        "a success lets the next one run"
    );
    rule.ended(2, &declined());
    let Some(RecordOutcome::Skipped { why, behind }) = rule.skipped() else {
        panic!("the record after a failure is skipped");
    };
    assert_eq!((why, behind), (Skip::FifoGroup, 2));
    rule.ended(5, &rule.skipped::<Outcome>().unwrap());
    assert!(
        matches!(
            rule.skipped(),
            Some(RecordOutcome::Skipped { behind: 2, .. })
        ),
        "every later record is skipped behind the first failure"
    );
}

fn retries(backoff: &Backoff) -> Retries<'_> {
    Retries {
        now: Time::from_secs(1_000_000),
        backoff,
        longest: Duration::from_secs(11 * 3600),
    }
}

const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(30),
    cap: Duration::from_secs(900),
};

#[test]
fn a_skipped_record_waits_as_long_as_the_failure_ahead_or_the_backoff_behind_a_dead_letter() {
    let records: Vec<Message<'_>> = (0..4)
        .map(|i| message(&format!("m{i}"), &order("A")))
        .collect();
    let mut entries = parse(&records).unwrap();
    entries[0].outcome = declined();
    entries[1].outcome = RecordOutcome::Skipped {
        why: Skip::SameFact,
        behind: 0,
    };
    entries[2].outcome = RecordOutcome::Processed(Outcome::Conflict);
    entries[3].outcome = RecordOutcome::Skipped {
        why: Skip::SameFact,
        behind: 2,
    };
    dispose(&mut entries, &retries(&BACKOFF), || Jitter::new(0.5));
    let Disposition::Retry(declined) = entries[0].disposition else {
        panic!("{:?}", entries[0].disposition);
    };
    assert!(declined >= BACKOFF.cap, "a decline waits past the cap");
    assert_eq!(entries[1].disposition, Disposition::Retry(declined));
    assert_eq!(entries[2].disposition, Disposition::DeadLetter);
    let Disposition::Retry(behind_letter) = entries[3].disposition else {
        panic!("{:?}", entries[3].disposition);
    };
    assert!(
        behind_letter <= BACKOFF.base,
        "the first step of the backoff"
    );
    assert_eq!(dead_letters(&entries), vec![2]);
}

#[test]
fn a_dead_letter_is_acknowledged_only_once_sent() {
    let records = [message("m0", "{"), message("m1", "{")];
    let mut entries = parse(&records).unwrap();
    dispose(&mut entries, &retries(&BACKOFF), || Jitter::new(0.0));
    assert_eq!(dead_letters(&entries), vec![0, 1]);
    dead_lettered(
        &mut entries[0],
        Ok(()),
        &retries(&BACKOFF),
        Jitter::new(0.0),
    );
    dead_lettered(
        &mut entries[1],
        Err(QueueError::TimedOut),
        &retries(&BACKOFF),
        Jitter::new(0.0),
    );
    assert!(entries[0].acknowledged());
    assert_eq!(entries[0].retry_in_s(), None);
    assert!(!entries[1].acknowledged());
    assert!(
        entries[1].retry_in_s().is_some(),
        "retried with the backoff"
    );
    assert_eq!(response(&entries).failures.len(), 1);
}

#[test]
fn a_retried_record_asks_for_its_delay_or_says_what_it_lacks() {
    let mut orphan = message("m1", &order("B"));
    orphan.receipt_handle = None;
    let records = [
        message("m0", &order("A")),
        orphan,
        message("m2", &order("C")),
    ];
    let mut entries = parse(&records).unwrap();
    entries[0].outcome = declined();
    entries[1].outcome = declined();
    entries[2].outcome = charged();
    dispose(&mut entries, &retries(&BACKOFF), || Jitter::new(0.0));
    let changes = visibility_changes(&mut entries);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].0, 0);
    assert_eq!(changes[0].1.receipt_handle, "rh-m0");
    assert!(matches!(
        entries[1].queue_error,
        Some(QueueError::Missing("receiptHandle"))
    ));
    assert!(entries[2].queue_error.is_none());
}

#[test]
fn the_response_lists_each_failed_message_once() {
    let records = [
        message("m0", "{"),
        message("m0", "{"),
        message("m1", &order("A")),
    ];
    let mut entries = parse(&records).unwrap();
    entries[2].outcome = charged();
    assert_eq!(response(&entries).failures, ["m0"]);
}

#[test]
fn a_record_skipped_behind_a_copy_of_its_order_says_so() {
    let records = [message("m0", &order("A")), message("m1", &order("A"))];
    let mut entries = parse(&records).unwrap();
    entries[1].outcome = RecordOutcome::Skipped {
        why: Skip::SameFact,
        behind: 0,
    };
    assert_eq!(
        entries[1].reason().as_deref(),
        Some("an earlier record of the same order failed in this batch")
    );
}
