//! What the machine and its driver say to each other: the step the machine asks for,
//! and the answer the driver feeds back (a store write's, the effect's, a lookup's, a
//! cancel's), with why a call gave none; and what the effect's answers are, in the
//! machine's words.

use super::End;
use crate::executor::NoAnswer;
use crate::store::{ReleaseKind, StoreError, WriteOutcome};

/// The kinds of write the machine asks for; [`super::Machine::write`] builds the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// Reserve the record for this delivery's lease.
    Reserve,
    /// Record the effect: `Done` with its receipt, fenced on the lease.
    Complete,
    /// Record the effect by its attempt, once the lease's fence is lost.
    CompleteAttempt,
    /// Give the lease back, the key as the kind says.
    Release(ReleaseKind),
    /// Move to the next attempt's key, holding the lease.
    NextAttempt,
    /// The record awaits someone else's step on the reference the machine holds.
    Await,
    /// The record takes this delivery's payload, corrected, as a new attempt.
    Correct,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step<F> {
    /// Perform [`super::Machine::write`] for this kind; answer with [`Input::Written`].
    Write(WriteKind),
    /// Perform the effect under this provider key (`<pk>#<attempt>`); answer with
    /// [`Input::Performed`].
    Perform {
        /// The provider key.
        key: String,
    },
    /// Look the fact's effects up at the provider; answer with [`Input::Looked`].
    Lookup,
    /// Cancel the fact's open attempt `reference`; answer with [`Input::Cancelled`].
    Cancel {
        /// The open attempt's reference.
        reference: String,
    },
    /// The record's end.
    Done(End<F>),
}

/// The answer to the last step. `F` is the effect's failure, as [`Classify`] reads it.
// One per step, moved at once into the machine: boxing the written record would cost
// an allocation on every write for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input<F> {
    /// A store write's answer.
    Written(Result<WriteOutcome, NoAnswer<StoreError>>),
    /// The effect's answer.
    Performed(Result<Receipt, NoAnswer<F>>),
    /// A lookup's answer.
    Looked(Result<Found, NoAnswer<F>>),
    /// A cancel's answer.
    Cancelled(Result<Cancel, NoAnswer<F>>),
}

impl<F> Input<F> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Written(_) => "written",
            Self::Performed(_) => "performed",
            Self::Looked(_) => "looked up",
            Self::Cancelled(_) => "cancelled",
        }
    }
}

/// What the provider returns for an effect done.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// The provider's reference of the effect, stored as the record's receipt.
    pub id: String,
    /// A detail the effect's log line names (never stored).
    pub detail: Option<String>,
}

/// What a lookup of a fact's effects found at the provider. An object done wins, then
/// one in flight, then an open one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Found {
    /// The effect is done: complete with it.
    Done(Receipt),
    /// In flight: it may yet be done by itself, so no new key may be sent.
    InFlight {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// An attempt someone may still confirm: it can be done later, so no new key while
    /// it is open. It is cancelled first, or waited for when it awaits someone.
    Open {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
        /// Only someone else (a person) can confirm it; never cancelled by the machine.
        awaits_someone: bool,
    },
    /// Nothing live: a new key cannot apply the effect twice.
    Nothing,
}

/// What a cancel of an open attempt did.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cancel {
    /// Cancelled: nobody can confirm it any more.
    Cancelled,
    /// It can no longer be cancelled (done, in flight, or cancelled already): look
    /// again.
    NotCancellable,
}

/// How a failure of the effect reads to the machine: what it means for the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Refused under this key, nothing done, and counted: a new key may do better (a
    /// refusal a new attempt may overcome). The refusal may leave `open` an attempt someone could still
    /// confirm: it is cancelled before the next key.
    Refused {
        /// The attempt the refusal left open, if any.
        open: Option<String>,
    },
    /// Someone else must act on `reference` (a person's confirmation): the record
    /// awaits it.
    AwaitsSomeone {
        /// What someone must act on, when the answer names it.
        reference: Option<String>,
    },
    /// Refused for good: the same request is refused again until someone fixes the
    /// fact or the provider's data.
    RefusedForGood,
    /// The provider refused the key: used before with other parameters.
    KeyReused,
    /// The answer names an object in a state the machine does not settle by itself.
    Unexpected {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// The provider holds the effect in flight, not final.
    InFlight {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// The provider replayed a stored 5xx for this key: the original outcome is
    /// unknown, and may still become an effect.
    ReplayedServerError {
        /// The replayed HTTP status.
        status: u16,
    },
    /// Anything else: unknown or transient; the next attempt replays the same key.
    Unknown,
}

/// An effect's failure, as its provider classifies it.
pub trait Classify {
    /// What this failure means for the key.
    fn class(&self) -> Class;
}
