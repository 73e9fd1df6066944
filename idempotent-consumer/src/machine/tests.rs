//! The machine's rules for any effect, as scripts: each case feeds a sequence of
//! answers and checks the steps asked for and the end. The effect here is a test
//! transfer whose failures classify themselves; charge-once's `policy/machine/tests.rs`
//! runs the same machine with its own effect, rule by rule.

use std::time::Duration;

use super::*;
use crate::record::{Fingerprint, Key};

/// A test effect's failure: it says its own class.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Failure(Class);

impl Classify for Failure {
    fn class(&self) -> Class {
        self.0.clone()
    }
}

type M = Machine<Failure>;

const NOW: Time = Time::from_ms(1_800_000_000_000);
const RESERVE: Step<Failure> = Step::Write(WriteKind::Reserve);
const COMPLETE: Step<Failure> = Step::Write(WriteKind::Complete);

fn start_with(rules: Rules, unknown: Unknown) -> (M, Step<Failure>) {
    Machine::new(Start {
        identity: Identity {
            key: Key::new("transfer#", "t-1"),
            fingerprint: Fingerprint::new("f"),
        },
        owner: Owner::new("me"),
        now: NOW,
        deadline: NOW + Duration::from_secs(60),
        expires: Time::from_secs(NOW.as_secs() + 3600),
        max_refusals: 3,
        key_ttl: Duration::from_secs(23 * 3600),
        someone_wait: Duration::from_secs(3600),
        processing_wait: Duration::from_secs(7200),
        unknown,
        rules,
    })
}

fn won() -> Input<Failure> {
    let record = Record {
        attempt: Some(1),
        created: Some(NOW),
        sent: Some(NOW),
        fingerprint: Some(Fingerprint::new("f")),
        owner: Some(Owner::new("me")),
        ..Record::new(Key::new("transfer#", "t-1"), State::InProgress)
    };
    Input::Written(Ok(WriteOutcome::Applied(record)))
}

fn written() -> Input<Failure> {
    won()
}

fn failed(class: Class) -> Input<Failure> {
    Input::Performed(Err(NoAnswer::Failed(Failure(class))))
}

fn done(id: &str) -> Receipt {
    Receipt {
        id: id.to_owned(),
        detail: None,
    }
}

/// Feeds each answer after checking the step it answers; the end.
fn run(rules: Rules, script: Vec<(Step<Failure>, Input<Failure>)>) -> End<Failure> {
    run_with(Unknown::LookedUp, rules, script)
}

fn run_with(
    unknown: Unknown,
    rules: Rules,
    script: Vec<(Step<Failure>, Input<Failure>)>,
) -> End<Failure> {
    let (mut machine, mut step) = start_with(rules, unknown);
    for (expected, answer) in script {
        assert_eq!(step, expected);
        step = machine.on(answer);
    }
    match step {
        Step::Done(end) => end,
        other => panic!("not done: {other:?}"),
    }
}

fn perform() -> Step<Failure> {
    Step::Perform {
        key: "transfer#t-1#1".to_owned(),
    }
}

#[test]
fn a_fresh_fact_is_reserved_performed_under_its_first_key_and_completed() {
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), Input::Performed(Ok(done("tr_1")))),
            (COMPLETE, written()),
        ],
    );
    assert_eq!(
        end,
        End::Done {
            receipt: done("tr_1"),
            attempt: 1,
            found: false
        }
    );
}

#[test]
fn an_unknown_outcome_keeps_the_key_and_a_mutant_moves_it() {
    let keep = Step::Write(WriteKind::Release(ReleaseKind::KeepKey));
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), Input::Performed(Err(NoAnswer::TimedOut))),
            (keep, written()),
        ],
    );
    assert_eq!(end, End::retry(Retry::EffectTimedOut, Some(1)));
    let mutant = Rules {
        keep_key_when_uncertain: false,
        ..Rules::ALL
    };
    let next = Step::Write(WriteKind::Release(ReleaseKind::NextKey {
        reset_refusals: false,
    }));
    run(
        mutant,
        vec![
            (RESERVE, won()),
            (perform(), failed(Class::Unknown)),
            (next, written()),
        ],
    );
}

#[test]
fn a_refusal_cancels_the_attempt_it_left_open_and_looks_again_before_the_next_key() {
    let open = Class::Refused {
        open: Some("tr_open".to_owned()),
    };
    let cancel = Step::Cancel {
        reference: "tr_open".to_owned(),
    };
    let refused = Step::Write(WriteKind::Release(ReleaseKind::Refused));
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), failed(open.clone())),
            (cancel, Input::Cancelled(Ok(Cancel::Cancelled))),
            (Step::Lookup, Input::Looked(Ok(Found::Nothing))),
            (refused.clone(), written()),
        ],
    );
    assert!(matches!(
        end,
        End::Refused {
            refusal: Refusal::Failure(_),
            attempt: 1
        }
    ));
    // Without the rule, the refused attempt stays open while the next key makes another.
    let mutant = Rules {
        close_open_attempts: false,
        ..Rules::ALL
    };
    run(
        mutant,
        vec![
            (RESERVE, won()),
            (perform(), failed(open)),
            (refused, written()),
        ],
    );
}

#[test]
fn a_replayed_server_error_is_looked_up_and_an_effect_found_completes_the_record() {
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (
                perform(),
                failed(Class::ReplayedServerError { status: 500 }),
            ),
            (Step::Lookup, Input::Looked(Ok(Found::Done(done("tr_2"))))),
            (COMPLETE, written()),
        ],
    );
    assert_eq!(
        end,
        End::Done {
            receipt: done("tr_2"),
            attempt: 1,
            found: true
        }
    );
}

#[test]
fn an_attempt_someone_must_confirm_is_awaited_and_never_cancelled() {
    let asks = Class::AwaitsSomeone {
        reference: Some("tr_3".to_owned()),
    };
    let still_open = Found::Open {
        reference: "tr_3".to_owned(),
        status: "awaiting".to_owned(),
        awaits_someone: true,
    };
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), failed(asks)),
            (Step::Lookup, Input::Looked(Ok(still_open))),
            (Step::Write(WriteKind::Await), written()),
        ],
    );
    assert_eq!(
        end,
        End::Awaiting {
            reference: "tr_3".to_owned(),
            attempt: 1,
            wait_until: Time::from_secs(NOW.as_secs() + 3600),
            awaited: Awaited::Someone,
        }
    );
}

#[test]
fn a_complete_whose_fence_was_lost_completes_by_attempt() {
    let refused = Input::Written(Ok(WriteOutcome::Refused(None)));
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), Input::Performed(Ok(done("tr_4")))),
            (COMPLETE, refused),
            (Step::Write(WriteKind::CompleteAttempt), written()),
        ],
    );
    assert!(matches!(end, End::Done { found: false, .. }));
}

#[test]
fn no_time_left_starts_no_call() {
    let end = run(
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), Input::Performed(Err(NoAnswer::NoTime))),
        ],
    );
    assert_eq!(
        end,
        End::Deadline {
            before: Call::Perform,
            attempt: Some(1)
        }
    );
}

#[test]
fn an_effect_without_a_key_or_lookup_goes_the_way_it_states_after_an_unknown_outcome() {
    // At least once: performed again under the next key, never looked up.
    let next = Step::Write(WriteKind::Release(ReleaseKind::NextKey {
        reset_refusals: false,
    }));
    let in_flight = Class::InFlight {
        reference: "tr_5".to_owned(),
        status: "queued".to_owned(),
    };
    for unknown in [Input::Performed(Err(NoAnswer::TimedOut)), failed(in_flight)] {
        let end = run_with(
            Unknown::AtLeastOnce,
            Rules::ALL,
            vec![
                (RESERVE, won()),
                (perform(), unknown),
                (next.clone(), written()),
            ],
        );
        assert!(
            matches!(
                end,
                End::Retry {
                    attempt: Some(1),
                    ..
                }
            ),
            "{end:?}"
        );
    }
    // At most once: the record becomes `Uncertain` and the fact goes to a person.
    let uncertain = Step::Write(WriteKind::Release(ReleaseKind::Uncertain));
    let end = run_with(
        Unknown::AtMostOnce,
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), Input::Performed(Err(NoAnswer::TimedOut))),
            (uncertain, written()),
        ],
    );
    assert_eq!(
        end,
        End::Unresolved {
            cause: Unresolved::Table(crate::table::Unsettled::UncertainOutcome)
        }
    );
}

#[test]
fn an_uncertain_record_is_never_performed_again_by_any_delivery() {
    let uncertain = Record {
        fingerprint: Some(Fingerprint::new("f")),
        // Past its retention too: an uncertain record is final, as a done one is.
        expires: Some(Time::from_secs(0)),
        ..Record::new(Key::new("transfer#", "t-1"), State::Uncertain)
    };
    let (mut machine, _) = start_with(Rules::ALL, Unknown::AtMostOnce);
    let reserve = machine.write(WriteKind::Reserve, NOW);
    assert!(!crate::table::holds(&reserve, Some(&uncertain), Rules::ALL));
    let step = machine.on(Input::Written(Ok(WriteOutcome::Refused(Some(uncertain)))));
    assert_eq!(
        step,
        Step::Done(End::Unresolved {
            cause: Unresolved::Table(crate::table::Unsettled::UncertainOutcome)
        })
    );
}

#[test]
fn a_refusal_without_a_lookup_moves_to_the_next_key_with_no_cancel() {
    let open = Class::Refused {
        open: Some("tr_open".to_owned()),
    };
    let refused = Step::Write(WriteKind::Release(ReleaseKind::Refused));
    let end = run_with(
        Unknown::AtLeastOnce,
        Rules::ALL,
        vec![
            (RESERVE, won()),
            (perform(), failed(open)),
            (refused, written()),
        ],
    );
    assert!(matches!(end, End::Refused { attempt: 1, .. }));
}

#[test]
fn at_most_once_a_key_an_earlier_delivery_sent_is_never_performed_again() {
    // An earlier delivery reserved the fact (its key sent a minute ago) and died: it may
    // have performed the effect before recording it.
    let earlier = Record {
        attempt: Some(1),
        created: Some(NOW - Duration::from_secs(60)),
        sent: Some(NOW - Duration::from_secs(60)),
        fingerprint: Some(Fingerprint::new("f")),
        owner: Some(Owner::new("me")),
        ..Record::new(Key::new("transfer#", "t-1"), State::InProgress)
    };
    let uncertain = Step::Write(WriteKind::Release(ReleaseKind::Uncertain));
    let (mut machine, step) = start_with(Rules::ALL, Unknown::AtMostOnce);
    assert_eq!(step, RESERVE);
    assert_eq!(
        machine.on(Input::Written(Ok(WriteOutcome::Applied(earlier.clone())))),
        uncertain
    );
    // At least once, the same record is performed again under its key.
    let (mut machine, _) = start_with(Rules::ALL, Unknown::AtLeastOnce);
    assert_eq!(
        machine.on(Input::Written(Ok(WriteOutcome::Applied(earlier)))),
        perform()
    );
}

#[test]
fn at_most_once_a_refusal_that_leaves_an_attempt_open_or_an_unexpected_answer_is_uncertain() {
    let uncertain = Step::Write(WriteKind::Release(ReleaseKind::Uncertain));
    let open = Class::Refused {
        open: Some("tr_open".to_owned()),
    };
    let unexpected = Class::Unexpected {
        reference: "tr_6".to_owned(),
        status: "odd".to_owned(),
    };
    for class in [open, unexpected] {
        let end = run_with(
            Unknown::AtMostOnce,
            Rules::ALL,
            vec![
                (RESERVE, won()),
                (perform(), failed(class)),
                (uncertain.clone(), written()),
            ],
        );
        assert!(matches!(end, End::Unresolved { .. }), "{end:?}");
    }
}
