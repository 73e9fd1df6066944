//! `resolve`: a person settles a record that cannot settle itself (a dead-lettered
//! record that needs a person, a stuck lease, a fact at its refusal limit) by asking
//! the provider. Done → `Done` with that effect; in flight → nothing changes (it may
//! still be done); nothing found → `Free` with the next attempt, so a redrive applies
//! it once under a new key. Every write goes through a lease, so it never races a
//! consumer.
//!
//! "Nothing found" moves the fact to a new key only when it is certain: a lookup that
//! failed keeps the key and refuses. The provider asked is the one the consumer sends
//! every key to, so its certain "nothing" stands.

use crate::clock::Time;
use crate::lease::Lease;
use crate::machine::{Cancel, Found, lookup_since};
use crate::record::{Identity, Key, Owner, Record, State};
use crate::store::{
    CorrectRequest, ReleaseKind, ResolveLeaseRequest, StoreError, Write, WriteOutcome,
};
use crate::table::same_fact;

#[cfg(test)]
mod tests;

/// What `resolve` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The provider has the effect: the record is now `Done` with it.
    Completed {
        /// The provider's reference of the effect, now the receipt.
        receipt: String,
        /// The attempt the record was on.
        attempt: u32,
    },
    /// The provider has nothing: the record is `Free` with the next attempt.
    Released {
        /// The attempt the record is now on.
        next_attempt: u32,
    },
    /// Already `Done`: nothing to do.
    AlreadyDone {
        /// The stored receipt, if the record has one.
        receipt: Option<String>,
    },
}

/// Why `resolve` did nothing (or stopped); `F` is the effect's failure.
#[derive(Debug)]
pub enum Stopped<F> {
    /// The table has no record of the fact.
    NoRecord,
    /// A live lease is held until then.
    LiveLease {
        /// When the lease ends.
        until: Time,
    },
    /// The payload given does not match the recorded fingerprint, and an effect of the
    /// recorded fact may still happen.
    FingerprintMismatch,
    /// Written by the legacy consumer, which gave the provider no key: a person checks
    /// the provider by hand first.
    LegacyFormat,
    /// The record changed while resolving.
    Changed,
    /// An at-most-once effect whose outcome is unknown (`Uncertain`): never touched, as
    /// its provider cannot say whether it happened.
    Uncertain,
    /// The fact awaits `reference`, which may still be done: never touched.
    Awaiting {
        /// The awaited reference.
        reference: String,
        /// When the wait ends, if the record says.
        until: Option<Time>,
    },
    /// The provider holds the effect in flight: no new key while it may be done.
    InFlight {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// A read or a write failed.
    Store(StoreError),
    /// The lookup failed: the key is kept.
    Provider(F),
    /// Still open after it was cancelled.
    StillOpen {
        /// The attempt still open.
        reference: String,
    },
    /// Cancelling the open attempt failed.
    Cancel {
        /// The open attempt.
        reference: String,
        /// The provider's failure.
        source: F,
    },
}

/// What a person confirmed before running `resolve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// A legacy-format record's fact was checked at the provider by hand.
    pub legacy_format_checked: bool,
    /// The cause of the fact's refusals is fixed: reset its count, so the next delivery
    /// may try again.
    pub reset_refusals: bool,
}

/// What the resolve machine asks for next.
#[derive(Debug)]
pub enum ResolveStep<F> {
    /// Read the record (strongly consistent); answer with [`ResolveInput::Read`].
    Read,
    /// Perform [`Resolver::write`] for this kind; answer with [`ResolveInput::Written`].
    Write(ResolveWrite),
    /// Look the fact's effect up; answer with [`ResolveInput::Looked`].
    Lookup,
    /// Cancel the fact's open attempt before a new key may make another; answer with
    /// [`ResolveInput::Cancelled`].
    Cancel {
        /// The open attempt's reference.
        reference: String,
    },
    /// The end: what `resolve` did, or why it stopped.
    Done(Result<Resolution, Stopped<F>>),
}

/// The writes `resolve` makes, each under its own lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveWrite {
    /// The corrected payload takes a record that ended without its effect.
    Correct,
    /// Lease the record for `resolve`.
    Lease,
    /// Record the effect found: `Done` with its receipt.
    Complete,
    /// Give the lease back, the key as the kind says.
    Release(ReleaseKind),
}

/// The answer to the last step.
// One per step, moved at once into the machine: boxing the record would cost an
// allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ResolveInput<F> {
    /// The record read (`None`: no record).
    Read(Result<Option<Record>, StoreError>),
    /// A write's answer.
    Written(Result<WriteOutcome, StoreError>),
    /// A lookup's answer.
    Looked(Result<Found, F>),
    /// A cancel's answer.
    Cancelled(Result<Cancel, F>),
}

#[derive(Debug)]
enum Phase<F> {
    Reading,
    /// The corrected payload taking the record; then the lease.
    Correcting,
    Leasing,
    Looking,
    /// Cancelling an open attempt; then looking again (once).
    Cancelling {
        reference: String,
    },
    /// Looking again after a cancel: an open attempt now is refused.
    LookingAgain,
    Completing,
    /// Releasing the key (nothing found): the answer is the resolution.
    ReleasingToNextKey,
    /// Releasing after a lookup that settled nothing; then this stop.
    ReleasingThen(Stopped<F>),
    Done,
}

/// `resolve` as a pure machine: the record read, the provider's answer and each write's
/// outcome come in; the next step comes out. Time and the owner token are inputs.
#[derive(Debug)]
pub struct Resolver<F> {
    /// The record's key, owner, attempt, lease end, creation once leased, and the
    /// receipt to record: shared with the record's machine.
    lease: Lease,
    now: Time,
    confirmed: Confirmed,
    phase: Phase<F>,
}

impl<F> Resolver<F> {
    /// A resolution of `identity`'s record started at `now` by `owner`, whose lease
    /// ends at `lease_until`; the first step is [`ResolveStep::Read`].
    pub fn new(
        identity: Identity,
        owner: Owner,
        now: Time,
        lease_until: Time,
        expires: Time,
        confirmed: Confirmed,
    ) -> (Self, ResolveStep<F>) {
        let resolver = Self {
            lease: Lease::new(identity, owner, lease_until, expires),
            now,
            confirmed,
            phase: Phase::Reading,
        };
        (resolver, ResolveStep::Read)
    }

    /// The record's key.
    pub fn key(&self) -> &Key {
        &self.lease.key
    }

    /// Where a lookup of the fact's effects starts: the record's creation less a
    /// margin for clocks ([`crate::machine::LOOKUP_CLOCK_MARGIN`]).
    pub fn lookup_since(&self) -> Time {
        lookup_since(self.lease.created)
    }

    /// The request of a write step.
    pub fn write(&self, kind: ResolveWrite) -> Write<'_> {
        match kind {
            ResolveWrite::Correct => Write::Correct(CorrectRequest {
                pk: &self.lease.key,
                fingerprint: &self.lease.fingerprint,
            }),
            ResolveWrite::Lease => Write::LeaseForResolve(ResolveLeaseRequest {
                pk: &self.lease.key,
                fingerprint: &self.lease.fingerprint,
                owner: &self.lease.owner,
                now: self.now,
                lease_until: self.lease.until,
            }),
            ResolveWrite::Complete => Write::Complete(self.lease.complete_request()),
            ResolveWrite::Release(kind) => Write::Release(self.lease.release_request(kind)),
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: ResolveInput<F>) -> ResolveStep<F> {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, input) {
            (_, ResolveInput::Read(Err(e)) | ResolveInput::Written(Err(e))) => {
                ResolveStep::Done(Err(Stopped::Store(e)))
            }
            (Phase::Reading, ResolveInput::Read(Ok(record))) => self.on_read(record),
            (Phase::Correcting, ResolveInput::Written(Ok(WriteOutcome::Applied(_)))) => {
                self.phase = Phase::Leasing;
                ResolveStep::Write(ResolveWrite::Lease)
            }
            (Phase::Correcting, ResolveInput::Written(Ok(WriteOutcome::Refused(_)))) => {
                ResolveStep::Done(Err(Stopped::FingerprintMismatch))
            }
            (Phase::Leasing, ResolveInput::Written(Ok(WriteOutcome::Applied(record)))) => {
                self.lease.granted(&record);
                self.phase = Phase::Looking;
                ResolveStep::Lookup
            }
            (Phase::Looking, ResolveInput::Looked(found)) => self.on_looked(found, true),
            (Phase::LookingAgain, ResolveInput::Looked(found)) => self.on_looked(found, false),
            (Phase::Cancelling { reference }, ResolveInput::Cancelled(answer)) => match answer {
                Ok(_) => {
                    self.phase = Phase::LookingAgain;
                    ResolveStep::Lookup
                }
                Err(source) => {
                    self.release(ReleaseKind::KeepKey, Stopped::Cancel { reference, source })
                }
            },
            (Phase::Completing, ResolveInput::Written(Ok(WriteOutcome::Applied(_)))) => {
                ResolveStep::Done(Ok(Resolution::Completed {
                    receipt: self.lease.receipt.take().unwrap_or_default(),
                    attempt: self.lease.attempt,
                }))
            }
            (Phase::ReleasingToNextKey, ResolveInput::Written(Ok(WriteOutcome::Applied(r)))) => {
                ResolveStep::Done(Ok(Resolution::Released {
                    next_attempt: r.attempt(),
                }))
            }
            (Phase::ReleasingThen(stopped), ResolveInput::Written(Ok(_))) => {
                ResolveStep::Done(Err(stopped))
            }
            // A lease or a fenced write refused: someone else moved the record.
            _ => ResolveStep::Done(Err(Stopped::Changed)),
        }
    }

    /// The record as read: settled already, refused, or leased.
    fn on_read(&mut self, record: Option<Record>) -> ResolveStep<F> {
        let Some(record) = record else {
            return ResolveStep::Done(Err(Stopped::NoRecord));
        };
        if record.state == State::Done {
            return ResolveStep::Done(Ok(Resolution::AlreadyDone {
                receipt: record.receipt,
            }));
        }
        let same = same_fact(&record, &self.lease.fingerprint);
        // The payload given is a corrected one: it takes the record if no effect of the
        // recorded fact can still happen (the write's condition decides).
        if !same
            && record.fingerprint.is_some()
            && matches!(record.state, State::Free | State::Failed)
        {
            self.phase = Phase::Correcting;
            return ResolveStep::Write(ResolveWrite::Correct);
        }
        if let Err(refused) = check(&record, same, self.now, self.confirmed) {
            return ResolveStep::Done(Err(refused));
        }
        self.phase = Phase::Leasing;
        ResolveStep::Write(ResolveWrite::Lease)
    }

    /// The provider's answer: done → complete; in flight → keep the key; open → cancel
    /// it (so nobody can confirm it later) and look again; nothing → the next key.
    fn on_looked(&mut self, found: Result<Found, F>, may_cancel: bool) -> ResolveStep<F> {
        match found {
            Ok(Found::Open { reference, .. }) if may_cancel => {
                self.phase = Phase::Cancelling {
                    reference: reference.clone(),
                };
                ResolveStep::Cancel { reference }
            }
            Ok(Found::Open { reference, .. }) => {
                self.release(ReleaseKind::KeepKey, Stopped::StillOpen { reference })
            }
            Err(e) => self.release(ReleaseKind::KeepKey, Stopped::Provider(e)),
            // It may still be done: no new key while it is live.
            Ok(Found::InFlight { reference, status }) => self.release(
                ReleaseKind::KeepKey,
                Stopped::InFlight { reference, status },
            ),
            Ok(Found::Done(receipt)) => {
                self.lease.receipt = Some(receipt.id);
                self.phase = Phase::Completing;
                ResolveStep::Write(ResolveWrite::Complete)
            }
            Ok(Found::Nothing) => {
                self.phase = Phase::ReleasingToNextKey;
                ResolveStep::Write(ResolveWrite::Release(ReleaseKind::NextKey {
                    reset_refusals: self.confirmed.reset_refusals,
                }))
            }
        }
    }

    fn release(&mut self, kind: ReleaseKind, then: Stopped<F>) -> ResolveStep<F> {
        self.phase = Phase::ReleasingThen(then);
        ResolveStep::Write(ResolveWrite::Release(kind))
    }
}

/// Refuses what a person must look at first.
fn check<F>(
    record: &Record,
    same_fact: bool,
    now: Time,
    confirmed: Confirmed,
) -> Result<(), Stopped<F>> {
    if record.fingerprint.is_some() && !same_fact {
        return Err(Stopped::FingerprintMismatch);
    }
    if record.is_legacy_format() && !confirmed.legacy_format_checked {
        return Err(Stopped::LegacyFormat);
    }
    match (&record.state, record.lease_until) {
        (State::InProgress, Some(until)) if until >= now => Err(Stopped::LiveLease { until }),
        // Its effect may have happened and its provider cannot be asked: only a person
        // who checked by hand may settle it, never a lookup that finds nothing.
        (State::Uncertain, _) => Err(Stopped::Uncertain),
        (State::Awaiting, _) => Err(Stopped::Awaiting {
            reference: record.awaited.clone().unwrap_or_default(),
            until: record.wait_until,
        }),
        _ => Ok(()),
    }
}
