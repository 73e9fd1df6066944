//! The unit tests of `table.rs`: each write's condition and result, and how a refused
//! reservation is judged.

use super::*;
use crate::record::Key;

fn record(state: State, fingerprint: Option<&str>, owner: Option<&str>) -> Record {
    Record {
        pk: Key::new("hecho#", "a"),
        state,
        created: Some(Time::from_ms(1)),
        expires: Some(Time::from_secs(10)),
        receipt: Some("ch_1".into()),
        fingerprint: fingerprint.map(Fingerprint::new),
        owner: owner.map(Owner::new),
        lease_until: Some(Time::from_ms(5)),
        attempt: Some(1),
        sent: Some(Time::from_ms(1)),
        refusals: None,
        awaited: None,
        wait_until: None,
        done_fingerprint: None,
    }
}

fn judge(old: Record) -> Reservation {
    let (pk, fingerprint, owner) = (
        Key::new("hecho#", "a"),
        Fingerprint::new("h"),
        Owner::new("me"),
    );
    let req = ReserveRequest {
        pk: &pk,
        fingerprint: &fingerprint,
        owner: &owner,
        now: Time::from_ms(0),
        lease_until: Time::from_ms(1),
        expires: Time::from_secs(2),
        max_refusals: 3,
    };
    classify_lost(old, &req)
}

#[test]
fn lost_reserve_is_classified_per_design() {
    assert_eq!(
        judge(record(State::Done, Some("h"), None)),
        Reservation::Duplicate {
            receipt: Some("ch_1".into())
        }
    );
    assert!(matches!(
        judge(record(State::Done, Some("x"), None)),
        Reservation::Conflict { .. }
    ));
    assert!(matches!(
        judge(record(State::InProgress, Some("h"), Some("other"))),
        Reservation::InProgress { .. }
    ));
    assert!(matches!(
        judge(record(State::InProgress, Some("h"), Some("me"))),
        Reservation::Won(_)
    ));
    assert!(matches!(
        judge(record(State::InProgress, Some("x"), Some("me"))),
        Reservation::Conflict { .. }
    ));
    assert!(matches!(
        judge(record(State::Done, None, None)),
        Reservation::Duplicate { .. }
    ));
    assert!(matches!(
        judge(record(State::InProgress, None, None)),
        Reservation::NeedsReconciliation { .. }
    ));
    assert!(matches!(
        judge(record(State::Other("raro".into()), Some("h"), None)),
        Reservation::NeedsReconciliation { .. }
    ));
}

#[test]
fn a_fact_at_its_refusal_limit_is_refused_whatever_copy_asks() {
    let mut free = record(State::Free, Some("h"), None);
    free.refusals = Some(3);
    assert_eq!(
        judge(free.clone()),
        Reservation::RefusalLimit { refusals: 3 }
    );
    free.refusals = Some(2);
    assert!(matches!(judge(free), Reservation::InProgress { .. }));
    // A live lease is in progress whatever the count; another payload a conflict.
    let mut live = record(State::InProgress, Some("h"), Some("other"));
    live.refusals = Some(3);
    live.lease_until = Some(Time::from_ms(10));
    assert!(matches!(judge(live), Reservation::InProgress { .. }));
    let mut other = record(State::Free, Some("x"), None);
    other.refusals = Some(3);
    assert!(matches!(judge(other), Reservation::Conflict { .. }));
}

#[test]
fn an_ended_wait_takes_the_fact_again_even_with_another_payload_but_an_awaiting_one_never() {
    let (pk, other, owner) = (
        Key::new("hecho#", "a"),
        Fingerprint::new("another payload"),
        Owner::new("me"),
    );
    let req = ReserveRequest {
        pk: &pk,
        fingerprint: &other,
        owner: &owner,
        now: Time::from_ms(100),
        lease_until: Time::from_ms(200),
        expires: Time::from_secs(20),
        max_refusals: 3,
    };
    let reserve = Write::Reserve(req);
    let mut ended = record(State::Failed, Some("h"), None);
    ended.attempt = Some(2);
    assert!(holds(&reserve, Some(&ended), Rules::ALL));
    let taken = apply(&reserve, Some(&ended));
    assert_eq!(
        (taken.state, taken.fingerprint, taken.attempt),
        (State::InProgress, Some(other.clone()), Some(2))
    );
    // Past its retention too: an awaiting record is held by what it awaits.
    let mut awaiting = record(State::Awaiting, Some("another payload"), None);
    awaiting.expires = Some(Time::from_secs(0));
    assert!(!holds(&reserve, Some(&awaiting), Rules::ALL));
    let mutant = Rules {
        awaiting_holds_the_fact: false,
        ..Rules::ALL
    };
    assert!(holds(&reserve, Some(&awaiting), mutant));
}

#[test]
fn a_copy_of_a_fact_whose_wait_is_past_its_end_is_retried_not_acknowledged() {
    let mut awaiting = record(State::Awaiting, Some("h"), None);
    awaiting.awaited = Some("tr_1".into());
    awaiting.wait_until = Some(Time::from_secs(1));
    // `judge` reserves at 0 ms: the wait still runs.
    assert_eq!(
        judge(awaiting.clone()),
        Reservation::Awaiting {
            awaited: Some("tr_1".into())
        }
    );
    awaiting.wait_until = Some(Time::from_secs(0));
    assert_eq!(judge(awaiting), Reservation::InProgress { until: None });
}

#[test]
fn ending_a_wait_early_moves_its_end_and_nothing_else() {
    let pk = Key::new("hecho#", "a");
    let mut awaiting = record(State::Awaiting, Some("h"), None);
    awaiting.awaited = Some("tr_1".into());
    awaiting.wait_until = Some(Time::from_secs(900));
    let ending = |awaited| {
        Write::Settle(crate::store::SettleRequest {
            pk: &pk,
            awaited,
            settled: Settled::Ending {
                at: Time::from_secs(100),
            },
        })
    };
    assert!(holds(&ending("tr_1"), Some(&awaiting), Rules::ALL));
    assert!(!holds(&ending("tr_2"), Some(&awaiting), Rules::ALL));
    let ended = apply(&ending("tr_1"), Some(&awaiting));
    assert_eq!(
        ended,
        Record {
            wait_until: Some(Time::from_secs(100)),
            ..awaiting
        }
    );
}

#[test]
fn a_corrected_payload_takes_only_a_record_that_ended_with_no_key_sent_unless_the_rule_is_off() {
    use crate::store::CorrectRequest;
    let (pk, fingerprint) = (Key::new("hecho#", "a"), Fingerprint::new("corrected"));
    let correct = Write::Correct(CorrectRequest {
        pk: &pk,
        fingerprint: &fingerprint,
    });
    let ended = |state: State, sent: bool| Record {
        sent: sent.then(|| Time::from_ms(1)),
        refusals: Some(3),
        ..record(state, Some("h"), None)
    };
    let cases = [
        (ended(State::Free, false), true),
        (ended(State::Failed, false), true),
        // Its key was sent: an effect under it may still happen.
        (ended(State::Free, true), false),
        (ended(State::Done, false), false),
        (ended(State::InProgress, false), false),
        (ended(State::Awaiting, false), false),
        // Already this payload: a plain reserve takes it.
        (
            Record {
                fingerprint: Some(fingerprint.clone()),
                ..ended(State::Free, false)
            },
            false,
        ),
    ];
    for (stored, takes) in cases {
        assert_eq!(
            holds(&correct, Some(&stored), Rules::ALL),
            takes,
            "{stored:?}"
        );
    }
    let taken = apply(&correct, Some(&ended(State::Free, false)));
    assert_eq!(taken.fingerprint.as_ref(), Some(&fingerprint));
    assert_eq!(
        (taken.attempt, taken.sent, taken.refusals),
        (Some(2), None, None)
    );
    assert_eq!(taken.state, State::Free);
    let mut mutant = Rules::ALL;
    mutant.correct_only_when_closed = false;
    assert!(holds(&correct, Some(&ended(State::Free, true)), mutant));
}
