//! `resolve`: a human settles a record that cannot settle itself (a DLQ'd
//! `needs_reconciliation`, a stuck lease, an order at its decline limit) by asking the
//! provider. Succeeded → `Done` with that charge; pending → nothing changes (it may
//! still succeed); not found → `Free` with the next attempt, so a redrive charges
//! once under a new key. Every write goes through a lease, so it never races a
//! consumer.
//!
//! "Not found" moves the order to a new key only when it is certain: a lookup that
//! failed keeps the key and refuses. The provider asked is the one the function sends
//! every key to, so its certain "not found" stands.

use crate::contracts::payment::{Cancel, Lookup, PaymentError};
use crate::contracts::store::{
    CorrectRequest, ReleaseKind, ResolveLeaseRequest, StoreError, Write, WriteOutcome,
};
use crate::domain::ForOrder;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Key, Owner, Record, State};
use crate::policy::lease::Lease;
use crate::policy::retry::breaker::Dependency;
use crate::policy::table::same_fact;

/// What `resolve` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The provider has the charge: the record is now `Done` with it.
    Completed { receipt: String, attempt: u32 },
    /// The provider has no charge: the record is `Free` with the next attempt.
    Released { next_attempt: u32 },
    /// Already `Done`: nothing to do.
    AlreadyDone { receipt: Option<String> },
}

/// Why `resolve` did nothing (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no record for this order: nothing to resolve")]
    NoRecord,
    #[error("a live lease is held until {} ms epoch: wait for it to end", until.as_ms())]
    LiveLease { until: Time },
    #[error(
        "the order given does not match the recorded fingerprint, and a payment of the \
         recorded order may still succeed (its key was sent, or it is paid, leased or \
         awaited): a corrected order is taken only once the order ended without a payment"
    )]
    FingerprintMismatch,
    #[error(
        "the record was written by the legacy consumer, which gave the provider no key, so \
         its payment cannot be found by order id: check the provider by hand, then pass \
         --legacy-format-checked"
    )]
    LegacyFormat,
    #[error("the record changed while resolving; run resolve again")]
    Changed,
    /// The order awaits its payment (its customer's confirmation, or a payment the
    /// provider processes): `resolve` never touches it, since that payment may still
    /// succeed.
    #[error(
        "the order awaits payment {payment_id} until {} ms epoch (its customer's \
         confirmation, or the provider's processing): resolve does not touch it, since \
         that payment may still succeed; its event or the settler settles it. To give up \
         on it, cancel the PaymentIntent at the provider",
        until.map_or(0, Time::as_ms)
    )]
    Awaiting {
        payment_id: String,
        until: Option<Time>,
    },
    #[error(
        "the provider holds payment {payment_id} for this order in status `{status}`: it may \
         still succeed, so no new key is allowed; run resolve again once it is final"
    )]
    Pending { payment_id: String, status: String },
    /// This process's breaker for a dependency is open (it failed again and again):
    /// nothing was read, written or asked.
    #[error(
        "resolve did not start: the {} failed again and again in this process; nothing was \
         done; run resolve again later",
        match dependency { Dependency::Store => "store", Dependency::Provider => "provider" }
    )]
    Deferred { dependency: Dependency },
    #[error("store")]
    Store(#[from] StoreError),
    #[error("provider lookup")]
    Provider(#[source] PaymentError),
    #[error(
        "payment {payment_id} of this order is still open after it was cancelled: settle it \
         at the provider, then run resolve again"
    )]
    StillOpen { payment_id: String },
    #[error("cancelling open payment {payment_id}")]
    Cancel {
        payment_id: String,
        #[source]
        source: PaymentError,
    },
    /// The next call would not end before resolve's own lease does: it stops there, so
    /// that nothing it writes can follow another owner's takeover.
    #[error(
        "resolve stopped before its {step}: its lease ends in {left_ms} ms and the call \
         needs {needs_ms} ms; nothing past that point was done; run resolve again"
    )]
    LeaseEnding {
        step: &'static str,
        left_ms: u64,
        needs_ms: u64,
    },
    /// A call outlasted what was left of the lease and was cut short: what it did is
    /// unknown, and the next resolve reads and looks up again.
    #[error(
        "resolve stopped during its {step}: its lease ended before the call answered; \
         whether the call took effect is unknown, and the next resolve looks again; run \
         resolve again"
    )]
    LeaseEnded { step: &'static str },
}

/// What a human confirmed before running `resolve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// A legacy-format record's order was checked at the provider by hand.
    pub legacy_format_checked: bool,
    /// The customer fixed their card: reset the order's decline count, so the next
    /// delivery may try the card again.
    pub retry_declined: bool,
}

/// What the resolve machine asks for next.
#[derive(Debug)]
pub enum ResolveStep {
    /// Read the record (strongly consistent); answer with [`ResolveInput::Read`].
    Read,
    /// Perform [`Resolver::write`] for this kind; answer with [`ResolveInput::Written`].
    Write(ResolveWrite),
    /// Look the order's charge up; answer with [`ResolveInput::Looked`].
    Lookup,
    /// Cancel the order's open payment before a new key may make another; answer
    /// with [`ResolveInput::Cancelled`].
    Cancel {
        payment_id: String,
    },
    Done(Result<Resolution, ResolveError>),
}

/// The writes `resolve` makes, each under its own lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveWrite {
    /// The corrected order takes a record that ended without a payment.
    Correct,
    Lease,
    Complete,
    Release(ReleaseKind),
}

/// The answer to the last step.
#[derive(Debug)]
pub enum ResolveInput {
    Read(Result<Option<Record>, StoreError>),
    Written(Result<WriteOutcome, StoreError>),
    Looked(Result<Lookup, PaymentError>),
    Cancelled(Result<Cancel, PaymentError>),
}

#[derive(Debug)]
enum Phase {
    Reading,
    /// The corrected order taking the record; then the lease.
    Correcting,
    Leasing,
    Looking,
    /// Cancelling an open payment; then looking again (once).
    Cancelling {
        payment_id: String,
    },
    /// Looking again after a cancel: an open payment now is refused.
    LookingAgain,
    Completing,
    /// Releasing the key (`NotFound`): the answer is the resolution.
    ReleasingToNextKey,
    /// Releasing after a lookup that settled nothing; then this error.
    ReleasingThen(ResolveError),
    Done,
}

/// `resolve` as a pure machine: the record read, the provider's answer and each write's
/// outcome come in; the next step comes out. Time and the owner token are inputs.
#[derive(Debug)]
pub struct Resolver {
    /// The record's key, owner, attempt, lease end, creation once leased, and the
    /// charge to record: shared with the record's machine.
    lease: Lease,
    now: Time,
    confirmed: Confirmed,
    phase: Phase,
}

impl Resolver {
    /// A resolution of `order` started at `now` by `owner`, whose lease ends at
    /// `lease_until`; the first step is [`ResolveStep::Read`].
    pub fn new(
        order: &Order,
        owner: Owner,
        now: Time,
        lease_until: Time,
        expires: Time,
        confirmed: Confirmed,
    ) -> (Self, ResolveStep) {
        let resolver = Self {
            lease: Lease::new(Identity::for_order(order), owner, lease_until, expires),
            now,
            confirmed,
            phase: Phase::Reading,
        };
        (resolver, ResolveStep::Read)
    }

    pub fn key(&self) -> &Key {
        &self.lease.key
    }

    /// Where a lookup of the order's payments starts: the record's creation less a
    /// margin for clocks (`policy/machine/payments.rs`).
    pub fn lookup_since(&self) -> Time {
        crate::policy::machine::lookup_since(self.lease.created)
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
    pub fn on(&mut self, input: ResolveInput) -> ResolveStep {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, input) {
            (_, ResolveInput::Read(Err(e)) | ResolveInput::Written(Err(e))) => {
                ResolveStep::Done(Err(ResolveError::Store(e)))
            }
            (Phase::Reading, ResolveInput::Read(Ok(record))) => self.on_read(record),
            (Phase::Correcting, ResolveInput::Written(Ok(WriteOutcome::Applied(_)))) => {
                self.phase = Phase::Leasing;
                ResolveStep::Write(ResolveWrite::Lease)
            }
            (Phase::Correcting, ResolveInput::Written(Ok(WriteOutcome::Refused(_)))) => {
                ResolveStep::Done(Err(ResolveError::FingerprintMismatch))
            }
            (Phase::Leasing, ResolveInput::Written(Ok(WriteOutcome::Applied(record)))) => {
                self.lease.granted(&record);
                self.phase = Phase::Looking;
                ResolveStep::Lookup
            }
            (Phase::Looking, ResolveInput::Looked(found)) => self.on_looked(found, true),
            (Phase::LookingAgain, ResolveInput::Looked(found)) => self.on_looked(found, false),
            (Phase::Cancelling { payment_id }, ResolveInput::Cancelled(answer)) => match answer {
                Ok(_) => {
                    self.phase = Phase::LookingAgain;
                    ResolveStep::Lookup
                }
                Err(source) => self.release(
                    ReleaseKind::KeepKey,
                    ResolveError::Cancel { payment_id, source },
                ),
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
            (Phase::ReleasingThen(error), ResolveInput::Written(Ok(_))) => {
                ResolveStep::Done(Err(error))
            }
            // A lease or a fenced write refused: someone else moved the record.
            _ => ResolveStep::Done(Err(ResolveError::Changed)),
        }
    }

    /// The record as read: settled already, refused, or leased.
    fn on_read(&mut self, record: Option<Record>) -> ResolveStep {
        let Some(record) = record else {
            return ResolveStep::Done(Err(ResolveError::NoRecord));
        };
        if record.state == State::Done {
            return ResolveStep::Done(Ok(Resolution::AlreadyDone {
                receipt: record.receipt,
            }));
        }
        let legacy_format_checked = self.confirmed.legacy_format_checked;
        let same = same_fact(&record, &self.lease.fingerprint);
        // The order given is a corrected one: it takes the record if no payment of the
        // recorded order can still succeed (the write's condition decides).
        if !same
            && record.fingerprint.is_some()
            && matches!(record.state, State::Free | State::Failed)
        {
            self.phase = Phase::Correcting;
            return ResolveStep::Write(ResolveWrite::Correct);
        }
        if let Err(refused) = check(&record, same, self.now, legacy_format_checked) {
            return ResolveStep::Done(Err(refused));
        }
        self.phase = Phase::Leasing;
        ResolveStep::Write(ResolveWrite::Lease)
    }

    /// The provider's answer: succeeded → complete; pending → keep the key; open →
    /// cancel it (so nobody can confirm it later) and look again; not found → the next
    /// key.
    fn on_looked(&mut self, found: Result<Lookup, PaymentError>, may_cancel: bool) -> ResolveStep {
        match found {
            Ok(Lookup::Open { payment_id, .. }) if may_cancel => {
                self.phase = Phase::Cancelling {
                    payment_id: payment_id.clone(),
                };
                ResolveStep::Cancel { payment_id }
            }
            Ok(Lookup::Open { payment_id, .. }) => {
                self.release(ReleaseKind::KeepKey, ResolveError::StillOpen { payment_id })
            }
            Err(e) => self.release(ReleaseKind::KeepKey, ResolveError::Provider(e)),
            // It may still succeed: no new key while it is live.
            Ok(Lookup::Pending { payment_id, status }) => self.release(
                ReleaseKind::KeepKey,
                ResolveError::Pending { payment_id, status },
            ),
            Ok(Lookup::Succeeded(receipt)) => {
                self.lease.receipt = Some(receipt.id);
                self.phase = Phase::Completing;
                ResolveStep::Write(ResolveWrite::Complete)
            }
            Ok(Lookup::NotFound) => {
                self.phase = Phase::ReleasingToNextKey;
                ResolveStep::Write(ResolveWrite::Release(ReleaseKind::NextKey {
                    reset_refusals: self.confirmed.retry_declined,
                }))
            }
        }
    }

    fn release(&mut self, kind: ReleaseKind, then: ResolveError) -> ResolveStep {
        self.phase = Phase::ReleasingThen(then);
        ResolveStep::Write(ResolveWrite::Release(kind))
    }
}

/// Refuses what a human must look at first.
fn check(
    record: &Record,
    same_order: bool,
    now: Time,
    legacy_format_checked: bool,
) -> Result<(), ResolveError> {
    if record.fingerprint.is_some() && !same_order {
        return Err(ResolveError::FingerprintMismatch);
    }
    if record.is_legacy_format() && !legacy_format_checked {
        return Err(ResolveError::LegacyFormat);
    }
    match (&record.state, record.lease_until) {
        (State::InProgress, Some(until)) if until >= now => Err(ResolveError::LiveLease { until }),
        (State::Awaiting, _) => Err(ResolveError::Awaiting {
            payment_id: record.awaited.clone().unwrap_or_default(),
            until: record.wait_until,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
