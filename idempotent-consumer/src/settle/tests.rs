//! The settlement's rules for any awaited effect, as scripts: an event is a hint, the
//! provider's answer decides; a 404 ends nothing; a wait ends only once its object is
//! cancelled; an effect done that the record does not await is recorded when it is
//! provably the fact's. charge-once's `policy/settle/tests.rs` runs the same machine
//! with its own effect.

use super::*;

type Step = SettleStep<()>;

const NOW: Time = Time::from_ms(1_800_000_000_000);

fn key() -> Key {
    Key::new("transfer#", "t-1")
}

fn awaiting(ends_in_s: i64) -> Record {
    Record {
        fingerprint: Some(Fingerprint::new("f")),
        awaited: Some("tr_1".to_owned()),
        wait_until: Some(Time::from_secs(NOW.as_secs() + ends_in_s)),
        attempt: Some(1),
        ..Record::new(key(), State::Awaiting)
    }
}

fn seen(now: Now) -> SettleInput<()> {
    SettleInput::Fetched(Ok(Some(Seen {
        now,
        fact_id: Some("t-1".to_owned()),
        fingerprint: Some(Fingerprint::new("f")),
    })))
}

fn event(claimed: Now, rules: Rules) -> (Settlement, Step) {
    let trigger = Trigger::Event {
        reference: "tr_1".to_owned(),
        claimed,
    };
    Settlement::new(
        key(),
        trigger,
        NOW,
        Time::from_secs(NOW.as_secs() + 3600),
        rules,
    )
}

fn due(record: Record) -> (Settlement, Step) {
    let trigger = Trigger::Due(Box::new(record));
    Settlement::new(
        key(),
        trigger,
        NOW,
        Time::from_secs(NOW.as_secs() + 3600),
        Rules::ALL,
    )
}

fn ignored(why: Ignored) -> Step {
    SettleStep::Done(End::Ignored {
        reference: "tr_1".to_owned(),
        why,
    })
}

#[test]
fn an_event_is_a_hint_and_the_providers_answer_decides_unless_the_rule_is_off() {
    let (mut settlement, step) = event(Now::Done, Rules::ALL);
    assert_eq!(step, SettleStep::Read);
    assert_eq!(
        settlement.on::<()>(SettleInput::Read(Ok(Some(awaiting(60))))),
        SettleStep::Fetch
    );
    assert_eq!(settlement.on(seen(Now::Open)), ignored(Ignored::NotFinal));

    let mutant = Rules {
        event_is_a_hint: false,
        ..Rules::ALL
    };
    let (mut settlement, _) = event(Now::Done, mutant);
    assert_eq!(
        settlement.on::<()>(SettleInput::Read(Ok(Some(awaiting(60))))),
        SettleStep::Write
    );
    assert!(matches!(
        settlement.write(),
        Some(Write::Settle(SettleRequest {
            settled: Settled::Done { .. },
            ..
        }))
    ));
}

#[test]
fn an_awaited_object_done_settles_the_record_done_with_it() {
    let (mut settlement, step) = due(awaiting(60));
    assert_eq!(step, SettleStep::Fetch);
    assert_eq!(settlement.on(seen(Now::Done)), SettleStep::Write);
    let record = Record {
        receipt: Some("tr_1".to_owned()),
        ..Record::new(key(), State::Done)
    };
    assert_eq!(
        settlement.on::<()>(SettleInput::Written(Ok(WriteOutcome::Applied(record)))),
        SettleStep::Done(End::Settled {
            reference: "tr_1".to_owned(),
            done: true
        })
    );
}

#[test]
fn an_object_the_provider_does_not_know_ends_nothing_unless_the_rule_is_off() {
    let (mut settlement, _) = due(awaiting(-1));
    assert_eq!(
        settlement.on::<()>(SettleInput::Fetched(Ok(None))),
        SettleStep::Done(missing("tr_1"))
    );
    let mutant = Rules {
        missing_is_a_fault: false,
        ..Rules::ALL
    };
    let trigger = Trigger::Due(Box::new(awaiting(-1)));
    let (mut settlement, _) = Settlement::new::<()>(key(), trigger, NOW, NOW, mutant);
    assert_eq!(
        settlement.on::<()>(SettleInput::Fetched(Ok(None))),
        SettleStep::Report
    );
}

#[test]
fn past_its_end_a_wait_is_cancelled_before_it_ends_and_a_refused_cancel_looks_again() {
    let (mut settlement, _) = due(awaiting(-1));
    assert_eq!(settlement.on(seen(Now::Open)), SettleStep::Cancel);
    assert_eq!(
        settlement.on::<()>(SettleInput::Cancelled(Ok(Cancel::NotCancellable))),
        SettleStep::Fetch
    );
    // Done meanwhile: the record completes with it.
    assert_eq!(settlement.on(seen(Now::Done)), SettleStep::Write);

    let (mut settlement, _) = due(awaiting(-1));
    settlement.on::<()>(seen(Now::Open));
    assert_eq!(
        settlement.on::<()>(SettleInput::Cancelled(Ok(Cancel::Cancelled))),
        SettleStep::Report
    );
}

#[test]
fn an_effect_done_that_the_record_does_not_await_is_recorded_only_when_it_is_the_facts() {
    let free = Record {
        fingerprint: Some(Fingerprint::new("f")),
        ..Record::new(key(), State::Free)
    };
    let (mut settlement, _) = event(Now::Done, Rules::ALL);
    settlement.on::<()>(SettleInput::Read(Ok(Some(free.clone()))));
    assert_eq!(settlement.on(seen(Now::Done)), SettleStep::Write);
    assert!(matches!(settlement.write(), Some(Write::Adopt(_))));

    let other = Record {
        fingerprint: Some(Fingerprint::new("other")),
        ..free
    };
    let (mut settlement, _) = event(Now::Done, Rules::ALL);
    settlement.on::<()>(SettleInput::Read(Ok(Some(other))));
    assert_eq!(
        settlement.on(seen(Now::Done)),
        SettleStep::Done(End::Unresolved {
            cause: Unresolved::Unproven {
                reference: "tr_1".to_owned(),
                why: Unproven::OtherFields
            }
        })
    );
}
