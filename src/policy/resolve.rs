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
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Key, Owner, Record, State};
use crate::policy::lease::Lease;
use crate::policy::retry::breaker::Dependency;
use crate::policy::table::same_order;

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
            lease: Lease::new(Identity::of(order), owner, lease_until, expires),
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
        let same = same_order(&record, &self.lease.fingerprint);
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
                    reset_declines: self.confirmed.retry_declined,
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
            payment_id: record.payment.clone().unwrap_or_default(),
            until: record.wait_until,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contracts::payment::Receipt;
    use crate::domain::Fingerprint;

    fn record(state: State, until: Option<i64>) -> Record {
        let until = until.map(Time::from_ms);
        let order = order();
        Record {
            pk: Key::for_order(&order),
            state,
            created: Some(Time::from_ms(1)),
            expires: Some(Time::from_secs(10_000)),
            receipt: None,
            fingerprint: Some(Fingerprint::of(&order)),
            owner: until.map(|_| Owner::new("someone")),
            lease_until: until,
            attempt: Some(2),
            sent: Some(Time::from_ms(1)),
            declines: Some(3),
            payment: None,
            wait_until: None,
            paid_fingerprint: None,
        }
    }

    fn order() -> Order {
        Order::new("ord-r", 900, "EUR", "cus_r", "pm_card_visa").unwrap()
    }

    fn start(confirmed: Confirmed) -> Resolver {
        let (resolver, step) = Resolver::new(
            &order(),
            Owner::new("resolve-t"),
            Time::from_ms(100),
            Time::from_ms(200),
            Time::from_secs(5),
            confirmed,
        );
        assert!(matches!(step, ResolveStep::Read));
        resolver
    }

    fn leased(resolver: &mut Resolver) {
        let step = resolver.on(ResolveInput::Read(Ok(Some(record(State::Free, None)))));
        assert!(matches!(step, ResolveStep::Write(ResolveWrite::Lease)));
        let applied = WriteOutcome::Applied(record(State::InProgress, Some(200)));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(applied))),
            ResolveStep::Lookup
        ));
    }

    #[test]
    fn a_live_lease_is_refused_before_any_write() {
        let mut resolver = start(Confirmed::default());
        let live = record(State::InProgress, Some(150));
        assert!(matches!(
            resolver.on(ResolveInput::Read(Ok(Some(live)))),
            ResolveStep::Done(Err(ResolveError::LiveLease { until })) if until == Time::from_ms(150)
        ));
    }

    #[test]
    fn an_order_that_awaits_its_payment_is_refused_before_any_write_naming_it() {
        let mut resolver = start(Confirmed::default());
        let waiting = Record {
            payment: Some("pi_wait".into()),
            wait_until: Some(Time::from_secs(5_000)),
            ..record(State::Awaiting, None)
        };
        let step = resolver.on(ResolveInput::Read(Ok(Some(waiting))));
        let ResolveStep::Done(Err(refused)) = step else {
            panic!("{step:?}")
        };
        assert!(
            matches!(&refused, ResolveError::Awaiting { payment_id, .. } if payment_id == "pi_wait"),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("does not touch it"),
            "{refused}"
        );
    }

    #[test]
    fn a_succeeded_charge_completes_under_the_leased_attempt() {
        let mut resolver = start(Confirmed::default());
        leased(&mut resolver);
        let found = Lookup::Succeeded(Receipt::new("ch_r"));
        assert!(matches!(
            resolver.on(ResolveInput::Looked(Ok(found))),
            ResolveStep::Write(ResolveWrite::Complete)
        ));
        match resolver.write(ResolveWrite::Complete) {
            Write::Complete(req) => assert_eq!((req.attempt, req.receipt), (2, "ch_r")),
            other => panic!("{other:?}"),
        }
        let done = WriteOutcome::Applied(record(State::Done, None));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(done))),
            ResolveStep::Done(Ok(Resolution::Completed { attempt: 2, .. }))
        ));
    }

    #[test]
    fn a_pending_charge_keeps_the_key_and_is_refused() {
        let mut resolver = start(Confirmed::default());
        leased(&mut resolver);
        let pending = Lookup::Pending {
            payment_id: "py_1".into(),
            status: "pending".into(),
        };
        assert!(matches!(
            resolver.on(ResolveInput::Looked(Ok(pending))),
            ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
        ));
        let released = WriteOutcome::Applied(record(State::Free, None));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(released))),
            ResolveStep::Done(Err(ResolveError::Pending { .. }))
        ));
    }

    #[test]
    fn not_found_moves_to_the_next_key_resetting_declines_only_when_asked() {
        for retry_declined in [false, true] {
            let mut resolver = start(Confirmed {
                retry_declined,
                ..Confirmed::default()
            });
            leased(&mut resolver);
            assert!(matches!(
                resolver.on(ResolveInput::Looked(Ok(Lookup::NotFound))),
                ResolveStep::Write(ResolveWrite::Release(ReleaseKind::NextKey { reset_declines: r }))
                    if r == retry_declined
            ));
        }
    }

    #[test]
    fn a_lookup_that_failed_keeps_the_key_and_is_refused() {
        let mut resolver = start(Confirmed::default());
        leased(&mut resolver);
        let unreadable = Err(PaymentError::retryable(
            crate::contracts::payment::FailureKind::Connection,
        ));
        assert!(matches!(
            resolver.on(ResolveInput::Looked(unreadable)),
            ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
        ));
        let released = WriteOutcome::Applied(record(State::Free, None));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(released))),
            ResolveStep::Done(Err(ResolveError::Provider(_)))
        ));
    }

    #[test]
    fn every_write_of_resolve_is_its_own_lease_fenced_on_its_owner() {
        let mut resolver = start(Confirmed::default());
        let owner = Owner::new("resolve-t");
        match resolver.write(ResolveWrite::Lease) {
            Write::LeaseForResolve(req) => {
                assert_eq!(req.owner, &owner);
                assert_eq!(req.fingerprint, &Fingerprint::of(&order()));
                assert_eq!(req.lease_until, Time::from_ms(200));
            }
            other => panic!("{other:?}"),
        }
        leased(&mut resolver);
        match resolver.write(ResolveWrite::Release(ReleaseKind::KeepKey)) {
            Write::Release(req) => {
                assert_eq!((req.owner, req.kind), (&owner, ReleaseKind::KeepKey))
            }
            other => panic!("{other:?}"),
        }
        match resolver.write(ResolveWrite::Complete) {
            Write::Complete(req) => assert_eq!((req.owner, req.attempt), (&owner, 2)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_complete_refused_because_the_record_moved_is_a_change_to_run_again() {
        let mut resolver = start(Confirmed::default());
        leased(&mut resolver);
        let found = Lookup::Succeeded(Receipt::new("ch_r"));
        resolver.on(ResolveInput::Looked(Ok(found)));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(WriteOutcome::Refused(None)))),
            ResolveStep::Done(Err(ResolveError::Changed))
        ));
    }

    #[test]
    fn an_open_payment_is_cancelled_and_looked_up_again_and_still_open_keeps_the_key() {
        let mut resolver = start(Confirmed::default());
        leased(&mut resolver);
        let open = || Lookup::Open {
            payment_id: "pi_open".into(),
            status: "requires_payment_method".into(),
            awaits_customer: false,
        };
        assert!(matches!(
            resolver.on(ResolveInput::Looked(Ok(open()))),
            ResolveStep::Cancel { payment_id } if payment_id == "pi_open"
        ));
        assert!(matches!(
            resolver.on(ResolveInput::Cancelled(Ok(Cancel::Cancelled))),
            ResolveStep::Lookup
        ));
        assert!(matches!(
            resolver.on(ResolveInput::Looked(Ok(open()))),
            ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
        ));
        let released = WriteOutcome::Applied(record(State::Free, None));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(released))),
            ResolveStep::Done(Err(ResolveError::StillOpen { payment_id })) if payment_id == "pi_open"
        ));
    }

    #[test]
    fn another_payload_or_an_unchecked_legacy_record_is_refused_before_any_lease() {
        // Another payload: a corrected order, taken only if the table's condition says
        // nothing of the recorded one can still succeed; refused otherwise.
        let mut resolver = start(Confirmed::default());
        let other = Record {
            fingerprint: Some(Fingerprint::new("another")),
            ..record(State::Free, None)
        };
        assert!(matches!(
            resolver.on(ResolveInput::Read(Ok(Some(other.clone())))),
            ResolveStep::Write(ResolveWrite::Correct)
        ));
        assert!(matches!(
            resolver.on(ResolveInput::Written(Ok(WriteOutcome::Refused(Some(
                other
            ))))),
            ResolveStep::Done(Err(ResolveError::FingerprintMismatch))
        ));
        let mut corrected = start(Confirmed::default());
        let done_other = Record {
            fingerprint: Some(Fingerprint::new("another")),
            ..record(State::Done, None)
        };
        assert!(matches!(
            corrected.on(ResolveInput::Read(Ok(Some(done_other)))),
            ResolveStep::Done(Ok(Resolution::AlreadyDone { .. }))
        ));
        let legacy = Record {
            fingerprint: None,
            ..record(State::InProgress, None)
        };
        let mut unchecked = start(Confirmed::default());
        assert!(matches!(
            unchecked.on(ResolveInput::Read(Ok(Some(legacy.clone())))),
            ResolveStep::Done(Err(ResolveError::LegacyFormat))
        ));
        let mut checked = start(Confirmed {
            legacy_format_checked: true,
            ..Confirmed::default()
        });
        assert!(matches!(
            checked.on(ResolveInput::Read(Ok(Some(legacy)))),
            ResolveStep::Write(ResolveWrite::Lease)
        ));
    }
}
