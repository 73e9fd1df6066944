//! `resolve`: a human settles a record that cannot settle itself (a DLQ'd
//! `needs_reconciliation`, a stuck lease, an order at its decline limit) by asking the
//! provider: the library's resolve machine (`idempotent_consumer::resolve`), with a
//! payment as the effect. Succeeded → `Done` with that charge; pending → nothing
//! changes (it may still succeed); not found → `Free` with the next attempt, so a
//! redrive charges once under a new key. Every write goes through a lease, so it never
//! races a consumer. This module gives it a payment's words: a lookup in, each stop out
//! as a [`ResolveError`] that tells the operator what to do.
//!
//! "Not found" moves the order to a new key only when it is certain: a lookup that
//! failed keeps the key and refuses. The provider asked is the one the function sends
//! every key to, so its certain "not found" stands.

use idempotent_consumer::resolve::{self as library, Stopped};

use crate::contracts::payment::{Cancel, Lookup, PaymentError};
use crate::contracts::store::{StoreError, Write, WriteOutcome};
use crate::domain::ForOrder;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Key, Owner, Record};
use crate::policy::machine::found;
use crate::policy::retry::breaker::Dependency;

/// What `resolve` did (`Completed` with the charge, `Released` to the next attempt,
/// `AlreadyDone`), and the writes it makes: the library's.
pub use idempotent_consumer::resolve::{Resolution, ResolveWrite};

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
    /// A record charge-once never writes: an at-most-once effect's, whose outcome is
    /// unknown (`incierto`).
    #[error(
        "the record is `incierto`: an effect whose provider cannot be asked may have happened; \
         resolve does not touch it: check the provider by hand"
    )]
    Uncertain,
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

/// The answer to the last step.
#[derive(Debug)]
pub enum ResolveInput {
    Read(Result<Option<Record>, StoreError>),
    Written(Result<WriteOutcome, StoreError>),
    Looked(Result<Lookup, PaymentError>),
    Cancelled(Result<Cancel, PaymentError>),
}

/// `resolve` as a pure machine (the library's): the record read, the provider's answer
/// and each write's outcome come in; the next step comes out. Time and the owner token
/// are inputs.
#[derive(Debug)]
pub struct Resolver(library::Resolver<PaymentError>);

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
        Self::of(
            Identity::for_order(order),
            owner,
            now,
            lease_until,
            expires,
            confirmed,
        )
    }

    /// The same, of any fact's record by its identity (a refund request's).
    pub fn of(
        identity: Identity,
        owner: Owner,
        now: Time,
        lease_until: Time,
        expires: Time,
        confirmed: Confirmed,
    ) -> (Self, ResolveStep) {
        let confirmed = library::Confirmed {
            legacy_format_checked: confirmed.legacy_format_checked,
            reset_refusals: confirmed.retry_declined,
        };
        let (resolver, step) =
            library::Resolver::new(identity, owner, now, lease_until, expires, confirmed);
        (Self(resolver), step_of(step))
    }

    pub fn key(&self) -> &Key {
        self.0.key()
    }

    /// Where a lookup of the order's payments starts: the record's creation less a
    /// margin for clocks.
    pub fn lookup_since(&self) -> Time {
        self.0.lookup_since()
    }

    /// The request of a write step.
    pub fn write(&self, kind: ResolveWrite) -> Write<'_> {
        self.0.write(kind)
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: ResolveInput) -> ResolveStep {
        let input = match input {
            ResolveInput::Read(answer) => library::ResolveInput::Read(answer),
            ResolveInput::Written(answer) => library::ResolveInput::Written(answer),
            ResolveInput::Looked(answer) => library::ResolveInput::Looked(answer.map(found)),
            ResolveInput::Cancelled(answer) => library::ResolveInput::Cancelled(answer),
        };
        step_of(self.0.on(input))
    }
}

fn step_of(step: library::ResolveStep<PaymentError>) -> ResolveStep {
    match step {
        library::ResolveStep::Read => ResolveStep::Read,
        library::ResolveStep::Write(kind) => ResolveStep::Write(kind),
        library::ResolveStep::Lookup => ResolveStep::Lookup,
        library::ResolveStep::Cancel { reference } => ResolveStep::Cancel {
            payment_id: reference,
        },
        library::ResolveStep::Done(done) => ResolveStep::Done(done.map_err(ResolveError::from)),
    }
}

/// A stop of the library's machine, as the operator reads it.
impl From<Stopped<PaymentError>> for ResolveError {
    fn from(stopped: Stopped<PaymentError>) -> Self {
        match stopped {
            Stopped::NoRecord => Self::NoRecord,
            Stopped::LiveLease { until } => Self::LiveLease { until },
            Stopped::FingerprintMismatch => Self::FingerprintMismatch,
            Stopped::LegacyFormat => Self::LegacyFormat,
            Stopped::Changed => Self::Changed,
            Stopped::Uncertain => Self::Uncertain,
            Stopped::Awaiting { reference, until } => Self::Awaiting {
                payment_id: reference,
                until,
            },
            Stopped::InFlight { reference, status } => Self::Pending {
                payment_id: reference,
                status,
            },
            Stopped::Store(e) => Self::Store(e),
            Stopped::Provider(e) => Self::Provider(e),
            Stopped::StillOpen { reference } => Self::StillOpen {
                payment_id: reference,
            },
            Stopped::Cancel { reference, source } => Self::Cancel {
                payment_id: reference,
                source,
            },
        }
    }
}

#[cfg(test)]
mod tests;
