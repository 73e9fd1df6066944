//! The machine's rules as scripts: each case feeds a sequence of answers and checks
//! the steps asked for and the outcome, one case per rule of ARCHITECTURE.md, "The
//! state machine". No store, provider or clock: they run in milliseconds.

use std::time::Duration;

use super::{Input, Machine, NoAnswer, Start, Step, WriteKind};
use crate::contracts::payment::{Cancel, FailureKind, Lookup, PaymentError, Receipt};
use crate::contracts::store::{ReleaseKind, WriteOutcome};
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Owner, Record, State};
use crate::policy::outcome::{Outcome, ReconcileCause, RetryCause};
use crate::policy::rules::Rules;

const NOW_MS: i64 = 1_800_000_000_000;
const TTL: Duration = Duration::from_secs(23 * 3600);

fn order() -> Order {
    Order::new("o-1", 5000, "EUR", "cus_1", "pm_card_visa").unwrap()
}

fn start() -> (Machine, Step) {
    Machine::new(Start {
        identity: Identity::of(&order()),
        owner: Owner::new("me"),
        now: Time::from_ms(NOW_MS),
        deadline: Time::from_ms(NOW_MS + 60_000),
        expires: Time::from_secs(NOW_MS / 1000 + 90 * 86_400),
        max_declines: 3,
        key_ttl: TTL,
        rules: Rules::ALL,
    })
}

/// The record as the reservation left it: ours, at `attempt`, its key first sent
/// `sent_ago` before now, created an hour ago.
fn reserved(attempt: u32, sent_ago: Duration) -> Record {
    let identity = Identity::of(&order());
    let now = Time::from_ms(NOW_MS);
    Record {
        created: Some(now - Duration::from_secs(3600)),
        fingerprint: Some(identity.fingerprint),
        owner: Some(Owner::new("me")),
        lease_until: Some(now + Duration::from_secs(60)),
        attempt: Some(attempt),
        sent: Some(now - sent_ago),
        ..Record::new(identity.key, State::InProgress)
    }
}

fn won() -> Input {
    Input::Written(Ok(WriteOutcome::Applied(reserved(1, Duration::ZERO))))
}

fn applied(record: Record) -> Input {
    Input::Written(Ok(WriteOutcome::Applied(record)))
}

fn written() -> Input {
    applied(reserved(1, Duration::ZERO))
}

fn charge(key: &str) -> Step {
    Step::Charge {
        key: key.to_owned(),
    }
}

fn failed(e: PaymentError) -> Input {
    Input::Charged(Err(NoAnswer::Failed(e)))
}

fn release(kind: ReleaseKind) -> Step {
    Step::Write(WriteKind::Release(kind))
}

/// Feeds `script` (each answer with the step it must follow) to a fresh machine; the
/// outcome it ends with.
fn run(script: Vec<(Step, Input)>) -> Outcome {
    let (mut machine, first) = start();
    let mut step = first;
    for (i, (expected, input)) in script.into_iter().enumerate() {
        assert_eq!(step, expected, "step {i}");
        step = machine.on(input);
    }
    match step {
        Step::Done(outcome) => outcome,
        other => panic!("the script ended before the record did, at {other:?}"),
    }
}

const RESERVE: Step = Step::Write(WriteKind::Reserve);
const COMPLETE: Step = Step::Write(WriteKind::Complete);

#[test]
fn a_fresh_order_is_reserved_charged_under_its_first_key_and_completed() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            Input::Charged(Ok(Receipt::new("pi_1"))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(outcome, Outcome::Charged { attempt: 1, .. }),
        "{outcome:?}"
    );
}

#[test]
fn a_done_record_with_the_same_fingerprint_is_a_duplicate_with_no_provider_call() {
    let done = Record {
        receipt: Some("pi_1".into()),
        ..reserved(1, Duration::ZERO)
    };
    let done = Record {
        state: State::Done,
        ..done
    };
    let outcome = run(vec![(
        RESERVE,
        Input::Written(Ok(WriteOutcome::Refused(Some(done)))),
    )]);
    assert_eq!(
        outcome,
        Outcome::Duplicate {
            receipt: Some("pi_1".into())
        }
    );
}

#[test]
fn each_uncertain_charge_keeps_the_key() {
    let uncertain = [
        Input::Charged(Err(NoAnswer::TimedOut)),
        failed(PaymentError::retryable(FailureKind::Server(500))),
        failed(PaymentError::retryable(FailureKind::Connection)),
        failed(PaymentError::retryable(FailureKind::Lock)),
    ];
    for input in uncertain {
        let outcome = run(vec![
            (RESERVE, won()),
            (charge("cobro#o-1#1"), input),
            (release(ReleaseKind::KeepKey), written()),
        ]);
        assert!(
            matches!(
                outcome,
                Outcome::FailedRetryable {
                    attempt: Some(1),
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
}

#[test]
fn a_replayed_server_error_is_looked_up_and_keeps_the_key_while_nothing_is_found() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::ReplayedServerError { status: 500 }),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert_eq!(
        outcome,
        Outcome::FailedRetryable {
            cause: RetryCause::ServerErrorUnsettled { status: 500 },
            attempt: Some(1),
        }
    );
}

#[test]
fn a_replayed_server_error_whose_payment_appeared_completes_with_it() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::ReplayedServerError { status: 503 }),
        ),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Succeeded(Receipt::new("pi_late")))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::Reconciled { receipt, attempt: 1, .. } if receipt == "pi_late"),
        "{outcome:?}"
    );
}

#[test]
fn a_decline_cancels_the_payment_it_names_then_looks_for_others_before_the_next_key() {
    let declined = PaymentError::Declined {
        code: "card_declined".into(),
        decline_code: None,
        payment_id: Some("pi_declined".into()),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(declined)),
        (
            Step::Cancel {
                payment_id: "pi_declined".into(),
            },
            Input::Cancelled(Ok(Cancel::Cancelled)),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (release(ReleaseKind::Declined), written()),
    ]);
    assert!(
        matches!(outcome, Outcome::Declined { attempt: 1, .. }),
        "{outcome:?}"
    );
}

#[test]
fn a_payment_in_flight_is_looked_up_and_stays_pending_with_its_key() {
    let processing = PaymentError::Pending {
        charge_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let still = Lookup::Pending {
        charge_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(processing)),
        (Step::Lookup, Input::Looked(Ok(still))),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert!(
        matches!(
            &outcome,
            Outcome::NeedsReconciliation { cause } if cause.is_pending()
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_payment_in_flight_that_settled_completes_the_record() {
    let processing = PaymentError::Pending {
        charge_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(processing)),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Succeeded(Receipt::new("pi_sepa")))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(matches!(outcome, Outcome::Reconciled { .. }), "{outcome:?}");
}

#[test]
fn a_key_older_than_the_ttl_is_reconciled_and_moved_only_when_nothing_is_found() {
    let old = applied(reserved(1, TTL + Duration::from_secs(60)));
    let outcome = run(vec![
        (RESERVE, old),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (
            Step::Write(WriteKind::NextAttempt),
            applied(reserved(2, Duration::ZERO)),
        ),
        (
            charge("cobro#o-1#2"),
            Input::Charged(Ok(Receipt::new("pi_2"))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(outcome, Outcome::Charged { attempt: 2, .. }),
        "{outcome:?}"
    );
}

#[test]
fn a_payment_awaiting_the_customer_keeps_the_key_and_is_never_cancelled() {
    let awaiting = Lookup::Open {
        payment_id: "pi_3ds".into(),
        status: "requires_action".into(),
        awaits_customer: true,
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::AuthenticationRequired {
                payment_id: Some("pi_3ds".into()),
            }),
        ),
        (Step::Lookup, Input::Looked(Ok(awaiting))),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::AuthenticationRequired { payment_id: Some(id), .. } if id == "pi_3ds"),
        "{outcome:?}"
    );
}

#[test]
fn a_complete_whose_fence_was_lost_completes_by_attempt() {
    let taken = Record {
        owner: Some(Owner::new("someone else")),
        ..reserved(1, Duration::ZERO)
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            Input::Charged(Ok(Receipt::new("pi_1"))),
        ),
        (
            COMPLETE,
            Input::Written(Ok(WriteOutcome::Refused(Some(taken)))),
        ),
        (Step::Write(WriteKind::CompleteAttempt), written()),
    ]);
    assert!(matches!(outcome, Outcome::Charged { .. }), "{outcome:?}");
}

#[test]
fn a_key_reused_with_other_parameters_needs_a_person() {
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(PaymentError::KeyReused)),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert!(
        matches!(
            outcome,
            Outcome::NeedsReconciliation {
                cause: ReconcileCause::KeyReused { .. }
            }
        ),
        "{outcome:?}"
    );
}

#[test]
fn lookups_start_at_the_records_creation_less_the_clock_margin() {
    let (mut machine, _) = start();
    machine.on(won());
    let created = reserved(1, Duration::ZERO).created.unwrap();
    assert_eq!(machine.lookup_since(), created - super::LOOKUP_CLOCK_MARGIN);
}
