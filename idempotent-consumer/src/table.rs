//! The table's write specification: every conditional write as one value
//! ([`Write`]), the condition it must meet ([`holds`]), the item it leaves ([`apply`]),
//! and how a refused reservation is judged ([`judge`]). The DynamoDB expressions
//! ([`crate::dynamodb`]) and any other adapter implement this contract; a contract
//! suite checks an adapter against these functions, and a model checker writes its
//! table only through them.

use crate::clock::Time;
use crate::record::{Fingerprint, Owner, Record, State};
use crate::rules::Rules;
use crate::store::{ReleaseKind, ReserveRequest, Settled, Write, WriteOutcome};

/// Whether `write`'s condition holds on the stored item (`None`: absent). Comparisons
/// with a missing attribute are false, as in DynamoDB condition expressions and SQL.
pub fn holds(write: &Write<'_>, stored: Option<&Record>, rules: Rules) -> bool {
    let Some(r) = stored else {
        return matches!(write, Write::Reserve(_));
    };
    let fenced = |owner: &Owner| {
        r.state == State::InProgress && (!rules.fenced || r.owner.as_ref() == Some(owner))
    };
    match write {
        Write::Reserve(req) => {
            let held = rules.awaiting_holds_the_fact && r.state == State::Awaiting;
            let counts_as_absent = (!rules.done_is_final || r.state != State::Done)
                && r.state != State::Uncertain
                && !held
                && r.expires.is_some_and(|e| e.as_secs() < req.now.as_secs())
                && r.fingerprint.is_some();
            let same_payload = same_fact(r, req.fingerprint);
            let below_limit = r.refusals.is_none_or(|n| n < req.max_refusals);
            let free = matches!(r.state, State::Free | State::Failed)
                || (!held && r.state == State::Awaiting)
                || (r.state == State::InProgress && r.lease_until.is_some_and(|h| h < req.now));
            // A wait that ended left no effect that can happen: the producer may send
            // the fact again with other fields (another fingerprint), which it takes.
            let ended = r.state == State::Failed;
            counts_as_absent || ((same_payload || ended) && below_limit && free)
        }
        Write::Complete(req) => fenced(req.owner),
        Write::CompleteAttempt(req) => r.attempt == Some(req.attempt) && r.state != State::Done,
        Write::Release(req) => fenced(req.owner),
        Write::NextAttempt { owner, .. } => fenced(owner),
        Write::LeaseForResolve(req) => {
            r.state != State::Done
                && r.state != State::Awaiting
                && (r.state != State::InProgress || r.lease_until.is_none_or(|h| h < req.now))
                && (r.fingerprint.is_none() || same_fact(r, req.fingerprint))
        }
        Write::Await(req) => fenced(req.owner),
        Write::Settle(req) => {
            r.state == State::Awaiting
                && (!rules.settle_names_what_it_awaits || r.awaited.as_deref() == Some(req.awaited))
        }
        Write::Correct(req) => {
            matches!(r.state, State::Free | State::Failed)
                && (!rules.correct_only_when_closed || r.sent.is_none())
                && r.fingerprint.as_ref().is_some_and(|f| f != req.fingerprint)
        }
        Write::Adopt(req) => {
            (matches!(r.state, State::Free | State::Failed)
                || (r.state == State::InProgress && r.lease_until.is_some_and(|h| h < req.now)))
                && same_fact(r, req.fingerprint)
        }
    }
}

/// Whether the stored record is this payload's: the same fingerprint.
pub fn same_fact(r: &Record, fingerprint: &Fingerprint) -> bool {
    r.fingerprint.as_ref() == Some(fingerprint)
}

/// The item `write` leaves when its condition holds on `stored`.
pub fn apply(write: &Write<'_>, stored: Option<&Record>) -> Record {
    let mut r = stored
        .cloned()
        .unwrap_or_else(|| Record::new(write.pk().clone(), State::Free));
    match write {
        Write::Reserve(req) => {
            r.state = State::InProgress;
            r.owner = Some(req.owner.clone());
            r.lease_until = Some(req.lease_until);
            r.fingerprint = Some(req.fingerprint.clone());
            r.expires = Some(req.expires);
            r.created = r.created.or(Some(req.now));
            r.attempt = r.attempt.or(Some(1));
            r.sent = r.sent.or(Some(req.now));
        }
        Write::Complete(req) | Write::CompleteAttempt(req) => {
            done(&mut r, req.receipt, req.expires)
        }
        Write::Adopt(req) => done(&mut r, req.receipt, req.expires),
        Write::Correct(req) => {
            r.fingerprint = Some(req.fingerprint.clone());
            r.attempt = Some(r.attempt.unwrap_or(0) + 1);
            r.sent = None;
            r.refusals = None;
        }
        Write::Release(req) => released(&mut r, req.kind),
        Write::NextAttempt { now, .. } => {
            r.attempt = r.attempt.map(|i| i + 1);
            r.sent = Some(*now);
        }
        Write::LeaseForResolve(req) => {
            r.state = State::InProgress;
            r.owner = Some(req.owner.clone());
            r.lease_until = Some(req.lease_until);
            r.fingerprint = r.fingerprint.or_else(|| Some(req.fingerprint.clone()));
            r.attempt = r.attempt.or(Some(1));
            r.sent = r.sent.or(Some(req.now));
            r.created = r.created.or(Some(req.now));
        }
        Write::Await(req) => {
            r.state = State::Awaiting;
            r.owner = None;
            r.lease_until = None;
            r.awaited = Some(req.awaited.to_owned());
            r.wait_until = Some(req.wait_until);
            r.expires = Some(req.expires);
        }
        Write::Settle(req) => settled(&mut r, &req.settled, req.awaited),
    }
    r
}

/// A lease given back (`Free`): the key kept, or the next attempt's (a refusal
/// counted, or the count reset when a person says the cause was fixed).
fn released(r: &mut Record, kind: ReleaseKind) {
    r.state = match kind {
        ReleaseKind::Uncertain => State::Uncertain,
        _ => State::Free,
    };
    r.owner = None;
    r.lease_until = None;
    if !matches!(kind, ReleaseKind::KeepKey | ReleaseKind::Uncertain) {
        r.attempt = r.attempt.map(|i| i + 1);
        r.sent = None;
    }
    match kind {
        ReleaseKind::Refused => r.refusals = Some(r.refusals.unwrap_or(0) + 1),
        ReleaseKind::NextKey {
            reset_refusals: true,
        } => r.refusals = None,
        _ => {}
    }
}

/// How an awaited effect settled, on its record.
fn settled(r: &mut Record, settled: &Settled, awaited: &str) {
    match settled {
        // Still awaiting: only the wait's end moves (whole seconds, the attribute's
        // unit).
        Settled::Ending { at } => r.wait_until = Some(Time::from_secs(at.as_secs())),
        Settled::Done {
            expires,
            done_fingerprint,
        } => {
            r.done_fingerprint = done_fingerprint.clone();
            r.state = State::Done;
            r.receipt = Some(awaited.to_owned());
            r.expires = Some(*expires);
            r.awaited = None;
            r.wait_until = None;
            r.attempt = None;
            r.sent = None;
            r.refusals = None;
        }
        Settled::Ended => {
            r.state = State::Failed;
            r.awaited = None;
            r.wait_until = None;
            r.attempt = r.attempt.map(|i| i + 1);
            r.sent = None;
        }
    }
}

/// The smallest done record: what a redelivery, `resolve` and an audit read of a done
/// fact (key, state, receipt, fingerprint, creation, retention); the attempt, its first
/// send and the refusal count only served to apply it.
fn done(r: &mut Record, receipt: &str, expires: Time) {
    r.state = State::Done;
    r.receipt = Some(receipt.to_owned());
    r.expires = Some(expires);
    r.owner = None;
    r.lease_until = None;
    r.attempt = None;
    r.sent = None;
    r.refusals = None;
    r.awaited = None;
    r.wait_until = None;
}

/// How a reservation was judged.
// One per reservation, moved once into the machine: boxing the won record would cost
// an allocation on every reservation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// We hold the lease; the record as written.
    Won(Record),
    /// Already done: ack with the stored receipt.
    Duplicate { receipt: Option<String> },
    /// Same key, other payload: never applied as it stands. `ended`: the record is
    /// `Free` or `Failed`, so a corrected copy may take it if no effect of the fact
    /// can still happen (the `Correct` write's condition decides).
    Conflict {
        stored_fingerprint: Option<Fingerprint>,
        ended: bool,
    },
    /// Someone else holds a live lease.
    InProgress { until: Option<Time> },
    /// The fact was refused `max_refusals` times: no provider call until a person
    /// resets the count.
    RefusalLimit { refusals: u32 },
    /// A person (or `resolve`) must look at the provider first.
    NeedsReconciliation { cause: Unsettled },
    /// The fact awaits someone else's step on this reference: nothing to do until it
    /// settles (an event, the settler).
    Awaiting { awaited: Option<String> },
}

/// Why a refused reservation needs a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsettled {
    /// An item of the legacy consumer that is not done: it gave the provider no
    /// idempotency key, so it is never taken over.
    LegacyItemNotDone,
    /// An item whose state no consumer of this library writes.
    UnknownState,
    /// An at-most-once effect whose outcome is unknown: never performed again.
    UncertainOutcome,
}

/// Judges the answer to a reserve.
pub fn judge(answer: WriteOutcome, req: &ReserveRequest<'_>) -> Reservation {
    match answer {
        WriteOutcome::Applied(record) => Reservation::Won(record),
        WriteOutcome::Refused(Some(old)) => classify_lost(old, req),
        // The item that failed the condition is gone (TTL swept it between the write
        // and the read): nothing is known, so retry later rather than guess.
        WriteOutcome::Refused(None) => Reservation::InProgress { until: None },
    }
}

fn classify_lost(old: Record, req: &ReserveRequest<'_>) -> Reservation {
    if old.is_legacy_format() {
        return match old.state {
            State::Done => Reservation::Duplicate {
                receipt: old.receipt,
            },
            _ => Reservation::NeedsReconciliation {
                cause: Unsettled::LegacyItemNotDone,
            },
        };
    }
    if !same_fact(&old, req.fingerprint) && old.state != State::Failed {
        return Reservation::Conflict {
            ended: matches!(old.state, State::Free | State::Failed),
            stored_fingerprint: old.fingerprint,
        };
    }
    let lease_live = old.lease_until.is_some_and(|until| until >= req.now);
    match old.state {
        State::Done => Reservation::Duplicate {
            receipt: old.receipt,
        },
        // The SDK retried a reserve that had been applied: the lease is ours.
        State::InProgress if old.owner.as_ref() == Some(req.owner) => Reservation::Won(old),
        State::InProgress if lease_live => Reservation::InProgress {
            until: old.lease_until,
        },
        // Past its end the wait is being ended (its attempt cancelled, the producer
        // told): a copy sent now is retried, and once the record says `Failed` it is a
        // new attempt; acknowledged, it would be lost.
        State::Awaiting
            if old
                .wait_until
                .is_some_and(|end| end.as_secs() <= req.now.as_secs()) =>
        {
            Reservation::InProgress { until: None }
        }
        State::Awaiting => Reservation::Awaiting {
            awaited: old.awaited,
        },
        State::InProgress | State::Free | State::Failed if old.refusals() >= req.max_refusals => {
            Reservation::RefusalLimit {
                refusals: old.refusals(),
            }
        }
        State::InProgress | State::Free | State::Failed => Reservation::InProgress {
            until: old.lease_until,
        },
        State::Uncertain => Reservation::NeedsReconciliation {
            cause: Unsettled::UncertainOutcome,
        },
        State::Other(_) => Reservation::NeedsReconciliation {
            cause: Unsettled::UnknownState,
        },
    }
}

#[cfg(test)]
mod tests {
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
        awaiting.awaited = Some("pi_1".into());
        awaiting.wait_until = Some(Time::from_secs(1));
        // `judge` reserves at 0 ms: the wait still runs.
        assert_eq!(
            judge(awaiting.clone()),
            Reservation::Awaiting {
                awaited: Some("pi_1".into())
            }
        );
        awaiting.wait_until = Some(Time::from_secs(0));
        assert_eq!(judge(awaiting), Reservation::InProgress { until: None });
    }

    #[test]
    fn ending_a_wait_early_moves_its_end_and_nothing_else() {
        let pk = Key::new("hecho#", "a");
        let mut awaiting = record(State::Awaiting, Some("h"), None);
        awaiting.awaited = Some("pi_1".into());
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
        assert!(holds(&ending("pi_1"), Some(&awaiting), Rules::ALL));
        assert!(!holds(&ending("pi_2"), Some(&awaiting), Rules::ALL));
        let ended = apply(&ending("pi_1"), Some(&awaiting));
        assert_eq!(
            ended,
            Record {
                wait_until: Some(Time::from_secs(100)),
                ..awaiting
            }
        );
    }

    #[test]
    fn a_corrected_payload_takes_only_a_record_that_ended_with_no_key_sent_unless_the_rule_is_off()
    {
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
}
