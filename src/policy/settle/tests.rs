//! The settlement machine's rules, one table each: the machine is run against a record
//! and a provider written out in the test, its writes applied by the table's own
//! `holds` and `apply`.

use std::time::Duration;

use super::*;
use crate::contracts::store::{AdoptRequest, SettleRequest, Settled};
use crate::domain::{Fingerprint, OrderKey, State};
use crate::policy::table::{apply, holds};

const NOW: Time = Time::from_ms(1_800_000_000_000);
const PAID_UNTIL: Time = Time::from_secs(1_900_000_000);
const PI: &str = "pi_1";

fn key() -> Key {
    Key::for_order_id("o-1")
}

fn print() -> Fingerprint {
    Fingerprint::new("h")
}

fn record(state: State) -> Record {
    Record {
        fingerprint: Some(print()),
        attempt: Some(1),
        ..Record::new(key(), state)
    }
}

/// An awaiting record naming `PI`, its wait ending `ends_in` after `NOW` (negative:
/// already past).
fn awaiting(ends_in: i64) -> Record {
    Record {
        awaited: Some(PI.to_owned()),
        wait_until: Some(Time::from_secs(NOW.as_secs() + ends_in)),
        ..record(State::Awaiting)
    }
}

fn found(status: PaymentNow) -> Option<Found> {
    Some(Found {
        status,
        fact_id: Some("o-1".to_owned()),
        fingerprint: Some(print()),
    })
}

/// The provider as a test writes it: what a fetch answers (in turn; the last one
/// repeats) and whether a cancel is refused.
struct Provider {
    fetches: Vec<Option<Found>>,
    cancel_refused: bool,
}

/// What a run did.
#[derive(Debug)]
struct Run {
    outcome: Outcome,
    table: Option<Record>,
    steps: Vec<&'static str>,
}

fn run(table: Option<Record>, trigger: Trigger, mut provider: Provider, rules: Rules) -> Run {
    let mut table = table;
    let (mut machine, mut step) = Settlement::new(key(), trigger, NOW, PAID_UNTIL, rules);
    let mut steps = Vec::new();
    for _ in 0..20 {
        step = match step {
            SettleStep::Done(outcome) => {
                return Run {
                    outcome,
                    table,
                    steps,
                };
            }
            SettleStep::Read => {
                steps.push("read");
                machine.on(SettleInput::Read(Ok(table.clone())))
            }
            SettleStep::Fetch => {
                steps.push("fetch");
                let answer = if provider.fetches.len() > 1 {
                    provider.fetches.remove(0)
                } else {
                    provider.fetches[0].clone()
                };
                machine.on(SettleInput::Fetched(Ok(answer)))
            }
            SettleStep::Cancel => {
                steps.push("cancel");
                let answer = if provider.cancel_refused {
                    Cancel::NotCancellable
                } else {
                    Cancel::Cancelled
                };
                machine.on(SettleInput::Cancelled(Ok(answer)))
            }
            SettleStep::Report => {
                steps.push("report");
                machine.on(SettleInput::Reported(Ok(())))
            }
            SettleStep::Write => {
                let write = machine.write().expect("a write step names its write");
                steps.push(write.operation());
                let outcome = if holds(&write, table.as_ref(), rules) {
                    let new = apply(&write, table.as_ref());
                    table = Some(new.clone());
                    WriteOutcome::Applied(new)
                } else {
                    WriteOutcome::Refused(table.clone())
                };
                machine.on(SettleInput::Written(Ok(outcome)))
            }
        };
    }
    panic!("the settlement did not end in 20 steps");
}

fn event(claimed: PaymentNow) -> Trigger {
    Trigger::Event {
        payment_id: PI.to_owned(),
        claimed,
    }
}

fn provider(status: Option<PaymentNow>) -> Provider {
    Provider {
        fetches: vec![status.and_then(found)],
        cancel_refused: false,
    }
}

fn state(run: &Run) -> Option<State> {
    run.table.as_ref().map(|r| r.state.clone())
}

#[test]
fn a_status_reads_as_what_it_means_for_the_wait() {
    let cases = [
        ("succeeded", PaymentNow::Succeeded),
        ("canceled", PaymentNow::Canceled),
        ("processing", PaymentNow::Processing),
        ("requires_payment_method", PaymentNow::AttemptFailed),
        ("requires_action", PaymentNow::Open),
        ("requires_confirmation", PaymentNow::Open),
    ];
    for (status, now) in cases {
        assert_eq!(PaymentNow::of_status(status), now, "{status}");
    }
}

/// An event is a hint: whatever it claims, the provider's answer decides.
#[test]
fn an_event_settles_by_what_the_provider_answers_never_by_what_it_claims() {
    use PaymentNow::*;
    let cases = [
        // (claimed, the provider's status, outcome, state after)
        (Succeeded, Succeeded, "reconciled", State::Done),
        (Succeeded, Open, "event_ignored", State::Awaiting),
        (Succeeded, AttemptFailed, "event_ignored", State::Awaiting),
        (Succeeded, Processing, "event_ignored", State::Awaiting),
        (Canceled, Open, "event_ignored", State::Awaiting),
        (Canceled, Canceled, "authentication_expired", State::Failed),
        (AttemptFailed, Succeeded, "reconciled", State::Done),
        (
            AttemptFailed,
            AttemptFailed,
            "event_ignored",
            State::Awaiting,
        ),
    ];
    for (claimed, answer, outcome, after) in cases {
        let run = run(
            Some(awaiting(3600)),
            event(claimed),
            provider(Some(answer)),
            Rules::ALL,
        );
        assert_eq!(
            run.outcome.name(),
            outcome,
            "{claimed:?} / {answer:?}: {run:?}"
        );
        assert_eq!(state(&run), Some(after), "{claimed:?} / {answer:?}");
        assert_eq!(run.steps[..2], ["read", "fetch"], "{run:?}");
    }
}

#[test]
fn an_awaited_payment_paid_with_another_card_settles_with_what_was_paid_kept() {
    let paid = |fingerprint: &str| Provider {
        fetches: vec![Some(Found {
            status: PaymentNow::Succeeded,
            fact_id: Some("o-1".to_owned()),
            fingerprint: Some(Fingerprint::new(fingerprint)),
        })],
        cancel_refused: false,
    };
    let trigger = || event(PaymentNow::Succeeded);
    // The customer chose another card: done, and the audit can hold the payment to it.
    let other = run(
        Some(awaiting(3600)),
        trigger(),
        paid("another card"),
        Rules::ALL,
    );
    let done = other.table.expect("written");
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(PI));
    assert_eq!(
        done.done_fingerprint,
        Some(Fingerprint::new("another card"))
    );
    // Paid as the order said: nothing more to keep.
    let same = run(Some(awaiting(3600)), trigger(), paid("h"), Rules::ALL);
    assert_eq!(same.table.expect("written").done_fingerprint, None);
}

#[test]
fn an_early_end_moves_the_wait_then_reports_then_writes() {
    let run = run(
        Some(awaiting(3600)),
        event(PaymentNow::Canceled),
        provider(Some(PaymentNow::Canceled)),
        Rules::ALL,
    );
    assert_eq!(run.steps, ["read", "fetch", "settle", "report", "settle"]);
    // At its end already: no move.
    let run = super::tests::run(
        Some(awaiting(-1)),
        event(PaymentNow::Canceled),
        provider(Some(PaymentNow::Canceled)),
        Rules::ALL,
    );
    assert_eq!(run.steps, ["read", "fetch", "report", "settle"]);
}

#[test]
fn an_event_whose_payment_is_already_the_receipt_costs_no_call() {
    let done = Record {
        receipt: Some(PI.to_owned()),
        ..record(State::Done)
    };
    let run = run(
        Some(done),
        event(PaymentNow::Succeeded),
        provider(Some(PaymentNow::Succeeded)),
        Rules::ALL,
    );
    assert_eq!(run.outcome.name(), "event_ignored");
    assert_eq!(run.steps, ["read"]);
}

/// A settlement whose write was refused because the record was completed with the
/// same payment meanwhile (the event and the settler, or a redelivery and an event,
/// at once) is settled, never "charged twice".
#[test]
fn a_write_refused_by_a_record_done_with_the_same_payment_is_settled_not_a_double_charge() {
    let done = Record {
        receipt: Some(PI.to_owned()),
        ..record(State::Done)
    };
    // The settler read the awaiting record from the index; meanwhile the event wrote.
    let (mut machine, step) = Settlement::new(
        key(),
        Trigger::Due(Box::new(awaiting(3600))),
        NOW,
        PAID_UNTIL,
        Rules::ALL,
    );
    assert_eq!(step, SettleStep::Fetch);
    assert_eq!(
        machine.on(SettleInput::Fetched(Ok(found(PaymentNow::Succeeded)))),
        SettleStep::Write
    );
    let step = machine.on(SettleInput::Written(Ok(WriteOutcome::Refused(Some(
        done.clone(),
    )))));
    let SettleStep::Done(outcome) = step else {
        panic!("{step:?}")
    };
    assert_eq!(outcome.name(), "event_ignored", "{outcome:?}");
    // A released record whose redelivery completed it with this payment meanwhile.
    let run = run(
        Some(record(State::Free)),
        event(PaymentNow::Succeeded),
        provider(Some(PaymentNow::Succeeded)),
        Rules::ALL,
    );
    assert_eq!(run.outcome.name(), "reconciled");
    let (mut machine, _) = Settlement::new(
        key(),
        event(PaymentNow::Succeeded),
        NOW,
        PAID_UNTIL,
        Rules::ALL,
    );
    machine.on(SettleInput::Read(Ok(Some(record(State::Free)))));
    assert_eq!(
        machine.on(SettleInput::Fetched(Ok(found(PaymentNow::Succeeded)))),
        SettleStep::Write
    );
    let step = machine.on(SettleInput::Written(Ok(WriteOutcome::Refused(Some(done)))));
    assert!(
        matches!(&step, SettleStep::Done(o) if o.name() == "event_ignored"),
        "{step:?}"
    );
}

#[test]
fn an_event_for_a_payment_of_another_order_changes_nothing() {
    let mut other = provider(Some(PaymentNow::Succeeded));
    other.fetches[0].as_mut().unwrap().fact_id = Some("o-2".into());
    let run = run(
        Some(awaiting(3600)),
        event(PaymentNow::Succeeded),
        other,
        Rules::ALL,
    );
    assert_eq!(run.outcome.name(), "event_ignored");
    assert_eq!(state(&run), Some(State::Awaiting));
}

/// Money taken is never acknowledged as nothing: by the record it finds, a success is
/// recorded, retried, or dead-lettered.
#[test]
fn a_success_the_record_does_not_await_is_recorded_when_provably_the_orders_else_dead_lettered() {
    let live = NOW + Duration::from_secs(30);
    let ended = NOW - Duration::from_secs(30);
    let leased = |until| Record {
        lease_until: Some(until),
        ..record(State::InProgress)
    };
    let other_receipt = Record {
        receipt: Some("pi_0".into()),
        ..record(State::Done)
    };
    let awaiting_another = Record {
        awaited: Some("pi_2".into()),
        ..awaiting(3600)
    };
    let cases = [
        (Some(record(State::Free)), "reconciled", Some(State::Done)),
        (Some(record(State::Failed)), "reconciled", Some(State::Done)),
        (Some(leased(ended)), "reconciled", Some(State::Done)),
        (Some(leased(live)), "in_progress", Some(State::InProgress)),
        (
            Some(other_receipt),
            "needs_reconciliation",
            Some(State::Done),
        ),
        (
            Some(awaiting_another),
            "needs_reconciliation",
            Some(State::Awaiting),
        ),
        (None, "payment_unrecorded", None),
    ];
    for (table, outcome, after) in cases {
        let run = run(
            table.clone(),
            event(PaymentNow::Succeeded),
            provider(Some(PaymentNow::Succeeded)),
            Rules::ALL,
        );
        assert_eq!(run.outcome.name(), outcome, "{table:?}: {run:?}");
        assert_eq!(state(&run), after, "{table:?}");
        if outcome == "reconciled" {
            assert_eq!(run.table.unwrap().receipt.as_deref(), Some(PI));
        }
    }
    // Another payload's payment (another card, amount…) is not provably the order's.
    let mut other = provider(Some(PaymentNow::Succeeded));
    other.fetches[0].as_mut().unwrap().fingerprint = Some(Fingerprint::new("other"));
    let run = run(
        Some(record(State::Free)),
        event(PaymentNow::Succeeded),
        other,
        Rules::ALL,
    );
    assert_eq!(run.outcome.name(), "needs_reconciliation");
    assert_eq!(state(&run), Some(State::Free));
}

#[test]
fn a_missing_payment_is_a_fault_that_ends_nothing_unless_the_rule_is_off() {
    for trigger in [
        event(PaymentNow::Canceled),
        Trigger::Due(Box::new(awaiting(-1))),
    ] {
        let run = run(
            Some(awaiting(-1)),
            trigger.clone(),
            provider(None),
            Rules::ALL,
        );
        assert_eq!(run.outcome.name(), "failed_retryable", "{run:?}");
        assert_eq!(
            run.outcome.level(),
            crate::policy::outcome_kind::Level::Error
        );
        assert_eq!(state(&run), Some(State::Awaiting));
        let mutant = without(|r| r.missing_is_a_fault = false);
        let run = super::tests::run(Some(awaiting(-1)), trigger, provider(None), mutant);
        assert_eq!(state(&run), Some(State::Failed), "{run:?}");
    }
}

#[test]
fn the_settler_completes_ends_cancels_or_waits_by_what_it_finds_and_the_clock() {
    use PaymentNow::*;
    let cases = [
        // (the wait ends in, found, outcome, steps)
        (60, Succeeded, "reconciled", vec!["fetch", "settle"]),
        (-1, Succeeded, "reconciled", vec!["fetch", "settle"]),
        (
            60,
            Canceled,
            "authentication_expired",
            vec!["fetch", "settle", "report", "settle"],
        ),
        (-1, Processing, "event_ignored", vec!["fetch"]),
        (60, Open, "event_ignored", vec!["fetch"]),
        (60, AttemptFailed, "event_ignored", vec!["fetch"]),
        (
            -1,
            Open,
            "authentication_expired",
            vec!["fetch", "cancel", "report", "settle"],
        ),
        (
            -1,
            AttemptFailed,
            "authentication_expired",
            vec!["fetch", "cancel", "report", "settle"],
        ),
    ];
    for (ends_in, status, outcome, steps) in cases {
        let run = run(
            Some(awaiting(ends_in)),
            Trigger::Due(Box::new(awaiting(ends_in))),
            provider(Some(status)),
            Rules::ALL,
        );
        assert_eq!(run.outcome.name(), outcome, "{status:?} {ends_in}: {run:?}");
        assert_eq!(run.steps, steps, "{status:?} {ends_in}");
    }
}

#[test]
fn a_refused_cancel_means_look_again_and_a_late_confirmation_completes_the_order() {
    let late = Provider {
        fetches: vec![found(PaymentNow::Open), found(PaymentNow::Succeeded)],
        cancel_refused: true,
    };
    let run = run(
        Some(awaiting(-1)),
        Trigger::Due(Box::new(awaiting(-1))),
        late,
        Rules::ALL,
    );
    assert_eq!(run.steps, ["fetch", "cancel", "fetch", "settle"]);
    assert_eq!(state(&run), Some(State::Done));
    // Still open after the refused cancel: the wait goes on, the next run looks again.
    let still = Provider {
        fetches: vec![found(PaymentNow::Open)],
        cancel_refused: true,
    };
    let run = super::tests::run(
        Some(awaiting(-1)),
        Trigger::Due(Box::new(awaiting(-1))),
        still,
        Rules::ALL,
    );
    assert_eq!(run.steps, ["fetch", "cancel", "fetch"]);
    assert_eq!(state(&run), Some(State::Awaiting));
}

#[test]
fn a_failed_report_leaves_the_record_awaiting_with_its_end_at_now_and_is_retried() {
    let (mut machine, step) = Settlement::new(
        key(),
        event(PaymentNow::Canceled),
        NOW,
        PAID_UNTIL,
        Rules::ALL,
    );
    assert_eq!(step, SettleStep::Read);
    let step = machine.on(SettleInput::Read(Ok(Some(awaiting(3600)))));
    assert_eq!(step, SettleStep::Fetch);
    let step = machine.on(SettleInput::Fetched(Ok(found(PaymentNow::Canceled))));
    assert_eq!(step, SettleStep::Write);
    let moved = apply(&machine.write().unwrap(), Some(&awaiting(3600)));
    assert_eq!(moved.wait_until, Some(Time::from_secs(NOW.as_secs())));
    let step = machine.on(SettleInput::Written(Ok(WriteOutcome::Applied(moved))));
    assert_eq!(step, SettleStep::Report);
    let step = machine.on(SettleInput::Reported(Err(NoAnswer::TimedOut)));
    let SettleStep::Done(outcome) = step else {
        panic!("{step:?}")
    };
    assert_eq!(outcome.name(), "failed_retryable");
    assert!(!outcome.handling().is_ack());
}

/// The rules with one switched off, as a model mutant runs them.
fn without(switch_off: impl FnOnce(&mut Rules)) -> Rules {
    let mut rules = Rules::ALL;
    switch_off(&mut rules);
    rules
}

#[test]
fn a_forged_event_moves_nothing_unless_the_rule_that_asks_the_provider_is_off() {
    let mutant = without(|r| r.event_is_a_hint = false);
    for (claimed, forged_into) in [
        (PaymentNow::Succeeded, State::Done),
        (PaymentNow::Canceled, State::Failed),
    ] {
        let honest = run(
            Some(awaiting(3600)),
            event(claimed),
            provider(Some(PaymentNow::Open)),
            Rules::ALL,
        );
        assert_eq!(state(&honest), Some(State::Awaiting), "{claimed:?}");
        let believed = run(
            Some(awaiting(3600)),
            event(claimed),
            provider(Some(PaymentNow::Open)),
            mutant,
        );
        assert_eq!(state(&believed), Some(forged_into), "{claimed:?}");
        assert!(!believed.steps.contains(&"fetch"));
    }
}

#[test]
fn a_success_the_record_does_not_await_is_ignored_only_when_the_rule_is_off() {
    let mutant = without(|r| r.effect_found_is_recorded = false);
    let run = run(
        Some(record(State::Free)),
        event(PaymentNow::Succeeded),
        provider(Some(PaymentNow::Succeeded)),
        mutant,
    );
    assert_eq!(run.outcome.name(), "event_ignored");
    assert_eq!(state(&run), Some(State::Free));
}

#[test]
fn only_the_payment_an_awaiting_record_names_settles_it_unless_the_rule_is_off() {
    let pk = key();
    let settle = |payment_id| {
        Write::Settle(SettleRequest {
            pk: &pk,
            awaited: payment_id,
            settled: Settled::Ended,
        })
    };
    let named = Record {
        awaited: Some("pi_2".into()),
        ..awaiting(3600)
    };
    assert!(holds(&settle("pi_2"), Some(&named), Rules::ALL));
    // An older attempt's payment (cancelled before the next key) is not the wait's.
    assert!(!holds(&settle("pi_1"), Some(&named), Rules::ALL));
    let mutant = without(|r| r.settle_names_what_it_awaits = false);
    assert!(holds(&settle("pi_1"), Some(&named), mutant));
}

#[test]
fn a_wait_ends_only_once_its_payment_is_cancelled_unless_the_rule_is_off() {
    let mutant = without(|r| r.wait_ends_only_when_cancelled = false);
    for status in [PaymentNow::Open, PaymentNow::AttemptFailed] {
        let kept = run(
            Some(awaiting(-1)),
            Trigger::Due(Box::new(awaiting(-1))),
            provider(Some(status)),
            Rules::ALL,
        );
        assert!(kept.steps.contains(&"cancel"), "{status:?}");
        let ended = run(
            Some(awaiting(-1)),
            Trigger::Due(Box::new(awaiting(-1))),
            provider(Some(status)),
            mutant,
        );
        assert!(!ended.steps.contains(&"cancel"), "{status:?}");
        assert_eq!(state(&ended), Some(State::Failed));
    }
    // A failed attempt before the end: the customer may still confirm.
    let run = run(
        Some(awaiting(3600)),
        event(PaymentNow::AttemptFailed),
        provider(Some(PaymentNow::AttemptFailed)),
        mutant,
    );
    assert_eq!(state(&run), Some(State::Failed));
}

#[test]
fn no_delivery_reserves_an_awaiting_order_even_past_its_retention_unless_the_rule_is_off() {
    use crate::contracts::store::ReserveRequest;
    use crate::domain::Owner;
    let (pk, fingerprint, owner) = (key(), print(), Owner::new("me"));
    let reserve = Write::Reserve(ReserveRequest {
        pk: &pk,
        fingerprint: &fingerprint,
        owner: &owner,
        now: NOW,
        lease_until: NOW + Duration::from_secs(60),
        expires: NOW + Duration::from_secs(3600),
        max_refusals: 3,
    });
    let record = Record {
        expires: Some(NOW - Duration::from_secs(1)),
        ..awaiting(3600)
    };
    assert!(!holds(&reserve, Some(&record), Rules::ALL));
    let mutant = without(|r| r.awaiting_holds_the_fact = false);
    assert!(holds(&reserve, Some(&record), mutant));
}

#[test]
fn adopt_takes_only_a_record_of_the_same_order_that_no_one_holds_and_that_is_not_done() {
    let pk = key();
    let fingerprint = print();
    let adopt = Write::Adopt(AdoptRequest {
        pk: &pk,
        receipt: PI,
        fingerprint: &fingerprint,
        now: NOW,
        expires: PAID_UNTIL,
    });
    let leased = |until| Record {
        lease_until: Some(until),
        ..record(State::InProgress)
    };
    let cases = [
        (record(State::Free), true),
        (record(State::Failed), true),
        (leased(NOW - Duration::from_secs(1)), true),
        (leased(NOW + Duration::from_secs(1)), false),
        (record(State::Done), false),
        (awaiting(3600), false),
        (
            Record {
                fingerprint: Some(Fingerprint::new("other")),
                ..record(State::Free)
            },
            false,
        ),
    ];
    for (stored, applies) in cases {
        assert_eq!(
            holds(&adopt, Some(&stored), Rules::ALL),
            applies,
            "{stored:?}"
        );
    }
    assert!(!holds(&adopt, None, Rules::ALL));
    let done = apply(&adopt, Some(&record(State::Free)));
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some(PI));
}
