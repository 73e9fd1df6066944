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
    Duplicate {
        /// The stored receipt, if the record has one.
        receipt: Option<String>,
    },
    /// Same key, other payload: never applied as it stands. `ended`: the record is
    /// `Free` or `Failed`, so a corrected copy may take it if no effect of the fact
    /// can still happen (the `Correct` write's condition decides).
    Conflict {
        /// The fingerprint the record holds.
        stored_fingerprint: Option<Fingerprint>,
        /// The record is `Free` or `Failed`.
        ended: bool,
    },
    /// Someone else holds a live lease.
    InProgress {
        /// When the holder's lease ends (`None`: not known).
        until: Option<Time>,
    },
    /// The fact was refused `max_refusals` times: no provider call until a person
    /// resets the count.
    RefusalLimit {
        /// The fact's refusals so far.
        refusals: u32,
    },
    /// A person (or `resolve`) must look at the provider first.
    NeedsReconciliation {
        /// Why a person must look.
        cause: Unsettled,
    },
    /// The fact awaits someone else's step on this reference: nothing to do until it
    /// settles (an event, the settler).
    Awaiting {
        /// The reference the record awaits, if it names one.
        awaited: Option<String>,
    },
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
mod tests;
