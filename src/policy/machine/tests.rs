//! The machine's rules as scripts: each case feeds a sequence of answers and checks
//! the steps asked for and the outcome, one case (or a table of cases) per rule of
//! ARCHITECTURE.md, "The state machine": the reserve and how a lost one is judged, the
//! charge, reconciliation of an old key, a replayed 5xx, a payment in flight, one
//! success per order, complete and release, and a call with no answer (no time left,
//! a timeout, a store error). No store, provider or clock: they run in milliseconds.

use crate::domain::ForOrder;
use std::time::Duration;

use super::{Input, Machine, NoAnswer, Start, Step, WriteKind};
use crate::contracts::payment::{Cancel, FailureKind, Lookup, PaymentError, Receipt};
use crate::contracts::store::{ReleaseKind, StoreError, Write, WriteOutcome};
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Fingerprint, Identity, Owner, Record, State};
use crate::policy::outcome::{Call, Outcome, ReconcileCause, RetryCause};
use crate::policy::rules::Rules;

const NOW_MS: i64 = 1_800_000_000_000;
const TTL: Duration = Duration::from_secs(23 * 3600);
const WAIT: Duration = Duration::from_secs(7 * 86_400);
const AWAIT: Step = Step::Write(WriteKind::Await);

/// The record awaits its customer's confirmation of `payment_id`.
fn awaits(outcome: &Outcome, payment_id: &str) -> bool {
    matches!(
        outcome,
        Outcome::AuthenticationRequired { payment_id: id, wait_until, .. }
            if id == payment_id && *wait_until == Time::from_secs(NOW_MS / 1000 + 7 * 86_400)
    )
}

fn order() -> Order {
    Order::new("o-1", 5000, "EUR", "cus_1", "pm_card_visa").unwrap()
}

fn start() -> (Machine, Step) {
    Machine::new(Start {
        identity: Identity::for_order(&order()),
        owner: Owner::new("me"),
        now: Time::from_ms(NOW_MS),
        deadline: Time::from_ms(NOW_MS + 60_000),
        expires: Time::from_secs(NOW_MS / 1000 + 90 * 86_400),
        max_declines: 3,
        key_ttl: TTL,
        authentication_wait: WAIT,
        processing_wait: WAIT,
        rules: Rules::ALL,
    })
}

/// The record as the reservation left it: ours, at `attempt`, its key first sent
/// `sent_ago` before now, created an hour ago.
fn reserved(attempt: u32, sent_ago: Duration) -> Record {
    let identity = Identity::for_order(&order());
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
        (release(ReleaseKind::Refused), written()),
    ]);
    assert!(
        matches!(outcome, Outcome::Declined { attempt: 1, .. }),
        "{outcome:?}"
    );
}

#[test]
fn a_payment_in_flight_is_looked_up_and_awaited_with_its_key() {
    let processing = PaymentError::Pending {
        payment_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let still = Lookup::Pending {
        payment_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(processing)),
        (Step::Lookup, Input::Looked(Ok(still))),
        (Step::Write(WriteKind::Await), written()),
    ]);
    assert!(
        matches!(
            &outcome,
            Outcome::PaymentProcessing { payment_id, .. } if payment_id == "pi_sepa"
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_payment_in_flight_that_settled_completes_the_record() {
    let processing = PaymentError::Pending {
        payment_id: "pi_sepa".into(),
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
fn a_payment_awaiting_the_customer_is_awaited_in_the_table_and_never_cancelled() {
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
        (AWAIT, written()),
    ]);
    assert!(awaits(&outcome, "pi_3ds"), "{outcome:?}");
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

// ---- Reserve: won, or lost and judged ----

fn refused(record: Record) -> Input {
    Input::Written(Ok(WriteOutcome::Refused(Some(record))))
}

/// The record another holder left: `owner`, its lease ending `lease_s` from now.
fn held_by(owner: &str, lease_s: i64) -> Record {
    Record {
        owner: Some(Owner::new(owner)),
        lease_until: Some(Time::from_ms(NOW_MS + lease_s * 1000)),
        ..reserved(1, Duration::ZERO)
    }
}

#[test]
fn a_lost_reserve_is_judged_by_the_record_it_returns_with_no_provider_call() {
    let now = Time::from_ms(NOW_MS);
    let legacy = Record {
        fingerprint: None,
        owner: None,
        ..reserved(1, Duration::ZERO)
    };
    let cases: Vec<(&str, Input, Outcome)> = vec![
        (
            "another payload under the same id is a conflict",
            refused(Record {
                fingerprint: Some(Fingerprint::new("another")),
                ..reserved(1, Duration::ZERO)
            }),
            Outcome::Conflict,
        ),
        (
            "a live lease of another holder is in progress until it ends",
            refused(held_by("someone else", 30)),
            Outcome::InProgress {
                until: Some(now + Duration::from_secs(30)),
            },
        ),
        (
            "an item swept between the write and its read is in progress, end unknown",
            Input::Written(Ok(WriteOutcome::Refused(None))),
            Outcome::InProgress { until: None },
        ),
        (
            "an order at its decline limit is not sent to the provider",
            refused(Record {
                state: State::Free,
                owner: None,
                lease_until: None,
                refusals: Some(3),
                ..reserved(2, Duration::ZERO)
            }),
            Outcome::DeclineLimit { declines: 3 },
        ),
        (
            "a legacy-format item in progress is never taken over",
            refused(legacy.clone()),
            Outcome::NeedsReconciliation {
                cause: ReconcileCause::LegacyItemNotDone,
            },
        ),
        (
            "a legacy-format done item is a duplicate",
            refused(Record {
                state: State::Done,
                receipt: Some("ch_legacy".into()),
                ..legacy
            }),
            Outcome::Duplicate {
                receipt: Some("ch_legacy".into()),
            },
        ),
        (
            "an unknown state needs a person",
            refused(Record {
                state: State::Other("pagado".into()),
                ..reserved(1, Duration::ZERO)
            }),
            Outcome::NeedsReconciliation {
                cause: ReconcileCause::UnknownState,
            },
        ),
    ];
    for (rule, answer, expected) in cases {
        assert_eq!(run(vec![(RESERVE, answer)]), expected, "{rule}");
    }
}

#[test]
fn our_own_reserve_retried_by_the_sdk_is_won_and_charged_under_the_records_attempt() {
    let outcome = run(vec![
        (RESERVE, refused(held_by("me", 60))),
        (
            charge("cobro#o-1#1"),
            Input::Charged(Ok(Receipt::new("pi_1"))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(matches!(outcome, Outcome::Charged { .. }), "{outcome:?}");
}

#[test]
fn a_takeover_of_an_ended_lease_replays_the_same_key() {
    let outcome = run(vec![
        (RESERVE, applied(reserved(2, Duration::from_secs(600)))),
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

// ---- The charge's answers ----

#[test]
fn an_unexpected_status_releases_and_keeps_the_key() {
    let unexpected = PaymentError::UnexpectedStatus {
        payment_id: "pi_x".into(),
        status: "requires_capture".into(),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(unexpected)),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert_eq!(outcome.name(), "needs_reconciliation", "{outcome:?}");
}

#[test]
fn a_refusal_for_good_cancels_what_it_left_open_then_moves_to_the_next_key() {
    let rejected = || PaymentError::Rejected {
        status: 400,
        code: Some("parameter_invalid_integer".into()),
    };
    let open = Lookup::Open {
        payment_id: "pi_left".into(),
        status: "requires_payment_method".into(),
        awaits_customer: false,
    };
    let next_key = release(ReleaseKind::NextKey {
        reset_refusals: false,
    });
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(rejected())),
        (Step::Lookup, Input::Looked(Ok(open))),
        (
            Step::Cancel {
                payment_id: "pi_left".into(),
            },
            Input::Cancelled(Ok(Cancel::Cancelled)),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (next_key.clone(), written()),
    ]);
    assert_eq!(outcome.name(), "rejected", "{outcome:?}");
    // Nothing left open: straight to the next key.
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(rejected())),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (next_key, written()),
    ]);
    assert_eq!(outcome.name(), "rejected", "{outcome:?}");
}

/// The record as another payload of the order left it, `state`, its key `sent` or not.
fn other_payload(state: State, sent: bool) -> Record {
    Record {
        fingerprint: Some(Fingerprint::new("another payload")),
        attempt: Some(2),
        sent: sent.then(|| Time::from_ms(NOW_MS - 60_000)),
        ..Record::new(Identity::for_order(&order()).key, state)
    }
}

#[test]
fn a_corrected_copy_of_an_order_that_ended_without_a_payment_takes_it_as_a_new_attempt() {
    const CORRECT: Step = Step::Write(WriteKind::Correct);
    let outcome = run(vec![
        (RESERVE, refused(other_payload(State::Free, false))),
        (CORRECT, applied(other_payload(State::Free, false))),
        (RESERVE, applied(reserved(3, Duration::ZERO))),
        (
            charge("cobro#o-1#3"),
            Input::Charged(Ok(Receipt::new("pi_3"))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(outcome, Outcome::Charged { attempt: 3, .. }),
        "{outcome:?}"
    );
    // A payment of the order may still succeed (its key was sent): the table refuses
    // the correction, and the copy is a conflict, once (no loop).
    let outcome = run(vec![
        (RESERVE, refused(other_payload(State::Free, true))),
        (CORRECT, refused(other_payload(State::Free, true))),
    ]);
    assert_eq!(outcome, Outcome::Conflict);
    // Done, or leased: a conflict at once, no correction tried.
    for state in [State::Done, State::Awaiting] {
        let outcome = run(vec![(
            RESERVE,
            refused(other_payload(state.clone(), false)),
        )]);
        assert_eq!(outcome.name(), "conflict", "{state:?}");
    }
}

#[test]
fn a_decline_that_names_no_payment_looks_for_open_ones_before_the_next_key() {
    let declined = PaymentError::Declined {
        code: "card_declined".into(),
        decline_code: Some("insufficient_funds".into()),
        payment_id: None,
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(declined)),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (release(ReleaseKind::Refused), written()),
    ]);
    assert!(matches!(outcome, Outcome::Declined { .. }), "{outcome:?}");
}

#[test]
fn a_failed_release_still_ends_the_record_with_the_outcome_it_released_for() {
    let declined = || PaymentError::Declined {
        code: "card_declined".into(),
        decline_code: None,
        payment_id: None,
    };
    for release_answer in [
        Input::Written(Err(NoAnswer::TimedOut)),
        Input::Written(Err(NoAnswer::NoTime)),
        Input::Written(Err(NoAnswer::Failed(store_error()))),
        Input::Written(Ok(WriteOutcome::Refused(None))),
    ] {
        let outcome = run(vec![
            (RESERVE, won()),
            (charge("cobro#o-1#1"), failed(declined())),
            (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
            (release(ReleaseKind::Refused), release_answer),
        ]);
        assert!(matches!(outcome, Outcome::Declined { .. }), "{outcome:?}");
    }
}

// ---- Reconciliation of a key older than PROVIDER_KEY_TTL ----

fn old_key() -> Input {
    applied(reserved(1, TTL + Duration::from_secs(60)))
}

#[test]
fn an_old_key_found_charged_completes_with_that_payment_and_sends_nothing() {
    let outcome = run(vec![
        (RESERVE, old_key()),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Succeeded(Receipt::new("pi_old")))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::Reconciled { receipt, attempt: 1, .. } if receipt == "pi_old"),
        "{outcome:?}"
    );
}

#[test]
fn an_old_key_with_a_pending_payment_keeps_the_key_and_awaits_it() {
    let outcome = run(vec![
        (RESERVE, old_key()),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Pending {
                payment_id: "pi_sepa".into(),
                status: "processing".into(),
            })),
        ),
        (Step::Write(WriteKind::Await), written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::PaymentProcessing { .. }),
        "{outcome:?}"
    );
}

#[test]
fn an_old_key_with_a_payment_awaiting_the_customer_keeps_the_key_and_is_dead_lettered() {
    let outcome = run(vec![
        (RESERVE, old_key()),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Open {
                payment_id: "pi_3ds".into(),
                status: "requires_action".into(),
                awaits_customer: true,
            })),
        ),
        (AWAIT, written()),
    ]);
    assert!(awaits(&outcome, "pi_3ds"), "{outcome:?}");
}

#[test]
fn an_old_key_with_an_open_payment_cancels_it_and_looks_again_before_the_next_key() {
    let outcome = run(vec![
        (RESERVE, old_key()),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Open {
                payment_id: "pi_open".into(),
                status: "requires_payment_method".into(),
                awaits_customer: false,
            })),
        ),
        (
            Step::Cancel {
                payment_id: "pi_open".into(),
            },
            Input::Cancelled(Ok(Cancel::Cancelled)),
        ),
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
fn the_move_to_the_next_key_fails_safe_when_the_lease_is_lost_or_the_store_fails() {
    let lost = run(vec![
        (RESERVE, old_key()),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (
            Step::Write(WriteKind::NextAttempt),
            Input::Written(Ok(WriteOutcome::Refused(None))),
        ),
    ]);
    assert_eq!(
        lost,
        Outcome::FailedRetryable {
            cause: RetryCause::LeaseLostBeforeNextAttempt,
            attempt: Some(1),
        }
    );
    let failed = run(vec![
        (RESERVE, old_key()),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (
            Step::Write(WriteKind::NextAttempt),
            Input::Written(Err(NoAnswer::Failed(store_error()))),
        ),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert!(
        matches!(
            &failed,
            Outcome::FailedRetryable {
                cause: RetryCause::Store {
                    call: Call::NextAttempt,
                    ..
                },
                ..
            }
        ),
        "{failed:?}"
    );
}

#[test]
fn a_failed_or_timed_out_lookup_releases_and_keeps_the_key() {
    for answer in [
        Err(NoAnswer::TimedOut),
        Err(NoAnswer::Failed(PaymentError::retryable(
            FailureKind::Server(503),
        ))),
    ] {
        let outcome = run(vec![
            (RESERVE, old_key()),
            (Step::Lookup, Input::Looked(answer)),
            (release(ReleaseKind::KeepKey), written()),
        ]);
        assert_eq!(outcome.name(), "failed_retryable", "{outcome:?}");
    }
}

// ---- A payment in flight, and one awaiting the customer ----

#[test]
fn a_payment_in_flight_that_failed_is_cancelled_and_counts_as_a_decline() {
    let processing = PaymentError::Pending {
        payment_id: "pi_sepa".into(),
        status: "processing".into(),
    };
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), failed(processing)),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Open {
                payment_id: "pi_sepa".into(),
                status: "requires_payment_method".into(),
                awaits_customer: false,
            })),
        ),
        (
            Step::Cancel {
                payment_id: "pi_sepa".into(),
            },
            Input::Cancelled(Ok(Cancel::Cancelled)),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (release(ReleaseKind::Refused), written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::Declined { code, .. } if code == "payment_failed"),
        "{outcome:?}"
    );
}

#[test]
fn an_authentication_request_the_customer_confirmed_since_completes_the_record() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::AuthenticationRequired {
                payment_id: Some("pi_3ds".into()),
            }),
        ),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Succeeded(Receipt::new("pi_3ds")))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(matches!(outcome, Outcome::Reconciled { .. }), "{outcome:?}");
}

#[test]
fn an_authentication_request_with_nothing_found_awaits_the_customer_on_the_payment_it_names() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::AuthenticationRequired {
                payment_id: Some("pi_3ds".into()),
            }),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (AWAIT, written()),
    ]);
    assert!(awaits(&outcome, "pi_3ds"), "{outcome:?}");
}

// ---- One success per order: cancel, look again, at most three cancels ----

fn declined_naming(payment_id: &str) -> Input {
    failed(PaymentError::Declined {
        code: "card_declined".into(),
        decline_code: None,
        payment_id: Some(payment_id.into()),
    })
}

fn open(payment_id: &str) -> Input {
    Input::Looked(Ok(Lookup::Open {
        payment_id: payment_id.into(),
        status: "requires_payment_method".into(),
        awaits_customer: false,
    }))
}

fn cancel(payment_id: &str) -> Step {
    Step::Cancel {
        payment_id: payment_id.into(),
    }
}

#[test]
fn a_refused_cancel_means_the_payment_changed_so_the_machine_looks_again() {
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), declined_naming("pi_1")),
        (cancel("pi_1"), Input::Cancelled(Ok(Cancel::NotCancellable))),
        (
            Step::Lookup,
            Input::Looked(Ok(Lookup::Succeeded(Receipt::new("pi_1")))),
        ),
        (COMPLETE, written()),
    ]);
    assert!(
        matches!(&outcome, Outcome::Reconciled { receipt, .. } if receipt == "pi_1"),
        "someone confirmed the declined payment: {outcome:?}"
    );
}

#[test]
fn at_most_three_cancels_per_attempt_then_the_record_retries_with_its_key() {
    let outcome = run(vec![
        (RESERVE, won()),
        (charge("cobro#o-1#1"), declined_naming("pi_1")),
        (cancel("pi_1"), Input::Cancelled(Ok(Cancel::Cancelled))),
        (Step::Lookup, open("pi_2")),
        (cancel("pi_2"), Input::Cancelled(Ok(Cancel::Cancelled))),
        (Step::Lookup, open("pi_3")),
        (cancel("pi_3"), Input::Cancelled(Ok(Cancel::Cancelled))),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert_eq!(
        outcome,
        Outcome::FailedRetryable {
            cause: RetryCause::OpenPaymentsLeft(3),
            attempt: Some(1),
        }
    );
}

#[test]
fn a_cancel_that_fails_or_times_out_keeps_the_key() {
    for answer in [
        Err(NoAnswer::TimedOut),
        Err(NoAnswer::Failed(PaymentError::retryable(
            FailureKind::Connection,
        ))),
    ] {
        let outcome = run(vec![
            (RESERVE, won()),
            (charge("cobro#o-1#1"), declined_naming("pi_1")),
            (cancel("pi_1"), Input::Cancelled(answer)),
            (release(ReleaseKind::KeepKey), written()),
        ]);
        assert_eq!(outcome.name(), "failed_retryable", "{outcome:?}");
    }
}

// ---- Complete ----

fn charged_then(complete: Input) -> Vec<(Step, Input)> {
    vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            Input::Charged(Ok(Receipt::new("pi_1"))),
        ),
        (COMPLETE, complete),
    ]
}

#[test]
fn a_complete_refused_by_a_record_already_done_with_our_receipt_is_our_own_retried_write() {
    let done = Record {
        state: State::Done,
        receipt: Some("pi_1".into()),
        ..reserved(1, Duration::ZERO)
    };
    let outcome = run(charged_then(refused(done)));
    assert!(matches!(outcome, Outcome::Charged { .. }), "{outcome:?}");
}

#[test]
fn a_charge_the_record_moved_on_from_needs_a_person() {
    let moved = Record {
        state: State::Free,
        attempt: Some(2),
        owner: None,
        ..reserved(2, Duration::ZERO)
    };
    let mut script = charged_then(refused(held_by("someone else", 60)));
    script.push((Step::Write(WriteKind::CompleteAttempt), refused(moved)));
    let outcome = run(script);
    assert!(
        matches!(
            &outcome,
            Outcome::NeedsReconciliation {
                cause: ReconcileCause::RecordMovedOn {
                    attempt: 1,
                    record_attempt: Some(2),
                    ..
                }
            }
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_store_error_on_complete_fails_the_record_without_a_release() {
    let outcome = run(charged_then(Input::Written(Err(NoAnswer::Failed(
        store_error(),
    )))));
    assert!(
        matches!(
            &outcome,
            Outcome::FailedRetryable {
                cause: RetryCause::Store {
                    call: Call::Complete,
                    ..
                },
                attempt: Some(1),
            }
        ),
        "the retry replays the key and gets the same receipt: {outcome:?}"
    );
}

#[test]
fn every_write_after_the_reserve_is_fenced_on_our_owner_and_names_the_attempt() {
    let (mut machine, _) = start();
    machine.on(applied(reserved(2, Duration::ZERO)));
    machine.on(Input::Charged(Ok(Receipt::new("pi_2"))));
    let now = Time::from_ms(NOW_MS);
    let me = Owner::new("me");
    match machine.write(WriteKind::Complete, now) {
        Write::Complete(req) => {
            assert_eq!((req.owner, req.attempt, req.receipt), (&me, 2, "pi_2"));
        }
        other => panic!("{other:?}"),
    }
    match machine.write(WriteKind::Release(ReleaseKind::KeepKey), now) {
        Write::Release(req) => {
            assert_eq!((req.owner, req.kind), (&me, ReleaseKind::KeepKey));
        }
        other => panic!("{other:?}"),
    }
    match machine.write(WriteKind::Reserve, now) {
        Write::Reserve(req) => {
            assert_eq!(req.owner, &me);
            assert_eq!(req.lease_until, Time::from_ms(NOW_MS + 60_000));
        }
        other => panic!("{other:?}"),
    }
}

// ---- A call with no answer ----

fn store_error() -> StoreError {
    StoreError::backend(
        "UpdateItem",
        "cobro#o-1",
        std::io::Error::other("connection reset"),
    )
}

/// The scripts that reach each call of the machine, the call's answer left out.
fn up_to(call: Call) -> Vec<(Step, Input)> {
    let declined = || declined_naming("pi_1");
    match call {
        Call::Reserve => vec![],
        Call::Charge => vec![(RESERVE, won())],
        Call::Lookup => vec![(RESERVE, old_key())],
        Call::NextAttempt => vec![
            (RESERVE, old_key()),
            (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        ],
        Call::Cancel => vec![(RESERVE, won()), (charge("cobro#o-1#1"), declined())],
        Call::Complete => vec![
            (RESERVE, won()),
            (
                charge("cobro#o-1#1"),
                Input::Charged(Ok(Receipt::new("pi_1"))),
            ),
        ],
        Call::Await => vec![
            (RESERVE, won()),
            (charge("cobro#o-1#1"), authentication_required()),
            (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        ],
        Call::Read | Call::Settle => unreachable!("the machine reads and settles nothing"),
    }
}

fn authentication_required() -> Input {
    failed(PaymentError::AuthenticationRequired {
        payment_id: Some("pi_3ds".into()),
    })
}

/// No answer of either kind: not started for want of time, or timed out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Silence {
    NoTime,
    TimedOut,
}

impl Silence {
    fn of<E>(self) -> NoAnswer<E> {
        match self {
            Self::NoTime => NoAnswer::NoTime,
            Self::TimedOut => NoAnswer::TimedOut,
        }
    }
}

/// The step that makes `call`, and no answer to it.
fn no_answer(call: Call, silence: Silence) -> (Step, Input) {
    let store = || silence.of();
    let provider = || silence.of();
    match call {
        Call::Reserve => (RESERVE, Input::Written(Err(store()))),
        Call::NextAttempt => (
            Step::Write(WriteKind::NextAttempt),
            Input::Written(Err(store())),
        ),
        Call::Complete => (COMPLETE, Input::Written(Err(store()))),
        Call::Charge => (charge("cobro#o-1#1"), Input::Charged(Err(provider()))),
        Call::Lookup => (Step::Lookup, Input::Looked(Err(provider()))),
        Call::Cancel => (cancel("pi_1"), Input::Cancelled(Err(provider()))),
        Call::Await => (AWAIT, Input::Written(Err(store()))),
        Call::Read | Call::Settle => unreachable!("the machine reads and settles nothing"),
    }
}

#[test]
fn no_call_starts_without_time_left_and_the_record_ends_at_once_as_deadline() {
    for call in [
        Call::Reserve,
        Call::Charge,
        Call::Lookup,
        Call::NextAttempt,
        Call::Cancel,
        Call::Complete,
        Call::Await,
    ] {
        let mut script = up_to(call);
        script.push(no_answer(call, Silence::NoTime));
        let outcome = run(script);
        let attempt = (call != Call::Reserve).then_some(1);
        assert_eq!(
            outcome,
            Outcome::Deadline {
                before: call,
                attempt
            },
            "no release either: the lease ends at the deadline"
        );
    }
}

#[test]
fn a_store_call_that_times_out_fails_the_record_with_a_retry_and_no_further_write() {
    for call in [
        Call::Reserve,
        Call::NextAttempt,
        Call::Complete,
        Call::Await,
    ] {
        let mut script = up_to(call);
        script.push(no_answer(call, Silence::TimedOut));
        let outcome = run(script);
        let attempt = (call != Call::Reserve).then_some(1);
        assert_eq!(
            outcome,
            Outcome::FailedRetryable {
                cause: RetryCause::StoreTimedOut(call),
                attempt
            }
        );
    }
}

#[test]
fn a_store_error_on_the_reserve_fails_the_record_before_any_charge() {
    let outcome = run(vec![(
        RESERVE,
        Input::Written(Err(NoAnswer::Failed(store_error()))),
    )]);
    assert!(
        matches!(
            &outcome,
            Outcome::FailedRetryable {
                cause: RetryCause::Store {
                    call: Call::Reserve,
                    ..
                },
                attempt: None,
            }
        ),
        "{outcome:?}"
    );
}

#[test]
fn an_answer_out_of_phase_fails_the_record_safely_and_a_done_machine_stays_done() {
    let (mut machine, _) = start();
    let step = machine.on(Input::Looked(Ok(Lookup::NotFound)));
    let Step::Done(outcome) = step else {
        panic!("{step:?}");
    };
    assert_eq!(
        outcome,
        Outcome::FailedRetryable {
            cause: RetryCause::OutOfPhase {
                phase: "reserving",
                answer: "looked up",
            },
            attempt: Some(1),
        }
    );
    assert_eq!(machine.on(won()), Step::Done(outcome));
}

// ---- An order that awaits its customer ----

#[test]
fn a_delivery_of_an_order_that_awaits_its_customer_is_acknowledged_with_no_provider_call() {
    let awaiting = Record {
        owner: None,
        lease_until: None,
        awaited: Some("pi_3ds".into()),
        wait_until: Some(Time::from_secs(NOW_MS / 1000 + 3600)),
        ..Record::new(Identity::for_order(&order()).key, State::Awaiting)
    };
    let awaiting = Record {
        fingerprint: Some(Identity::for_order(&order()).fingerprint),
        ..awaiting
    };
    let outcome = run(vec![(
        RESERVE,
        Input::Written(Ok(WriteOutcome::Refused(Some(awaiting)))),
    )]);
    assert_eq!(
        outcome,
        Outcome::AwaitingCustomer {
            payment_id: Some("pi_3ds".into())
        }
    );
    assert!(outcome.handling().is_ack());
}

#[test]
fn the_await_write_names_the_payment_and_the_end_of_the_wait_fenced_on_the_lease() {
    let (mut machine, _) = start();
    machine.on(won());
    machine.on(authentication_required());
    assert_eq!(machine.on(Input::Looked(Ok(Lookup::NotFound))), AWAIT);
    let Write::Await(req) = machine.write(WriteKind::Await, Time::from_ms(NOW_MS)) else {
        panic!("not an await");
    };
    assert_eq!(
        (req.awaited, req.owner.to_string(), req.wait_until),
        (
            "pi_3ds",
            "me".to_owned(),
            Time::from_secs(NOW_MS / 1000 + 7 * 86_400)
        )
    );
}

#[test]
fn an_await_whose_fence_was_lost_is_retried_and_a_failed_one_releases_the_key_kept() {
    let mut script = up_to(Call::Await);
    script.push((AWAIT, Input::Written(Ok(WriteOutcome::Refused(None)))));
    assert_eq!(
        run(script),
        Outcome::FailedRetryable {
            cause: RetryCause::LeaseLostBeforeAwaiting,
            attempt: Some(1)
        }
    );
    let mut script = up_to(Call::Await);
    script.push((AWAIT, Input::Written(Err(NoAnswer::Failed(store_error())))));
    script.push((release(ReleaseKind::KeepKey), written()));
    assert!(matches!(
        run(script),
        Outcome::FailedRetryable {
            cause: RetryCause::Store {
                call: Call::Await,
                ..
            },
            ..
        }
    ));
}

#[test]
fn an_authentication_request_that_names_no_payment_and_finds_none_keeps_the_key_for_a_person() {
    let outcome = run(vec![
        (RESERVE, won()),
        (
            charge("cobro#o-1#1"),
            failed(PaymentError::AuthenticationRequired { payment_id: None }),
        ),
        (Step::Lookup, Input::Looked(Ok(Lookup::NotFound))),
        (release(ReleaseKind::KeepKey), written()),
    ]);
    assert_eq!(
        outcome,
        Outcome::NeedsReconciliation {
            cause: ReconcileCause::AuthenticationWithoutPayment
        }
    );
}
