//! How one record ends in the machine: what happened, and why, in the library's words
//! (an application names each end in its own, and gives it its log line). A cause
//! keeps its source error, shared by the clones of a state.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::steps::{Class, Classify, Receipt};
use crate::clock::Time;
use crate::queue::QueueError;
use crate::record::State;
use crate::store::StoreError;
use crate::table::Unsettled;

/// The end of one record. `F` is the effect's failure.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum End<F> {
    /// The effect is done under the record's key and recorded; `found`: found by a
    /// lookup (after an unknown outcome, an old key, a replayed 5xx), not answered.
    Done {
        /// What the provider returned for the effect.
        receipt: Receipt,
        /// The attempt whose key the effect was done under.
        attempt: u32,
        /// Found by a lookup, not answered.
        found: bool,
    },
    /// Already done: acknowledged with the stored receipt.
    Duplicate {
        /// The stored receipt, if the record has one.
        receipt: Option<String>,
    },
    /// Same key, other payload: never applied.
    Conflict,
    /// Another delivery holds a live lease, until then (`None`: not known).
    InProgress {
        /// When the holder's lease ends.
        until: Option<Time>,
    },
    /// Refused under this key, counted; the next attempt gets the next key.
    Refused {
        /// What refused it.
        refusal: Refusal<F>,
        /// The refused attempt.
        attempt: u32,
    },
    /// The fact has `max_refusals` refusals: not sent to the provider.
    RefusalLimit {
        /// The fact's refusals so far.
        refusals: u32,
    },
    /// Refused for good; whatever it left open cancelled, the next key is the next
    /// attempt's.
    RefusedForGood {
        /// The provider's refusal.
        failure: F,
        /// The refused attempt.
        attempt: u32,
    },
    /// Transient or unknown: the retry is safe (same key, or looked up first).
    Retry {
        /// Why the record failed.
        cause: Retry<F>,
        /// The attempt whose key the record is on (`None`: not known here).
        attempt: Option<u32>,
    },
    /// The next call could not end before the invocation deadline, so it was not
    /// started; the lease ends at the deadline and the retry goes on from there.
    Deadline {
        /// The call not started.
        before: Call,
        /// The attempt whose key the record is on (`None`: not known here).
        attempt: Option<u32>,
    },
    /// Cannot be settled by a machine: a person looks at the provider first.
    Unresolved {
        /// Why a person must look.
        cause: Unresolved,
    },
    /// The record awaits someone else's step on `reference`, until `wait_until`: no
    /// other attempt is made while it may happen.
    Awaiting {
        /// The provider's reference of what the record awaits.
        reference: String,
        /// The attempt whose key it was made under.
        attempt: u32,
        /// When the wait ends.
        wait_until: Time,
        /// Why it awaits: someone's confirmation, or the provider's processing.
        awaited: Awaited,
    },
    /// A delivery of a fact that awaits someone: nothing to do, no call made.
    AlreadyAwaiting {
        /// The reference the record awaits, if it names one.
        reference: Option<String>,
    },
    /// An awaited reference settled ([`crate::settle`]): `done` → the record is `Done`
    /// with it; otherwise the wait ended without the effect, and a later message for
    /// the fact is a new attempt.
    Settled {
        /// The settled reference.
        reference: String,
        /// Whether the record is now `Done` with it (otherwise `Failed`).
        done: bool,
    },
    /// A settlement that changes nothing here (another fact's object, a reference the
    /// record does not await, one already settled, one not final): acknowledged.
    Ignored {
        /// The reference the settlement was about.
        reference: String,
        /// Why it changes nothing.
        why: Ignored,
    },
    /// The provider says an effect is done for a fact the table does not know (its
    /// record swept, or never made here): acknowledged, and told.
    Unrecorded {
        /// The done effect's reference.
        reference: String,
    },
}

/// Why a settlement changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// The record is already done with this reference.
    AlreadyDone,
    /// The provider says the object is another fact's.
    AnotherFacts,
    /// No answer of the provider to decide on.
    AnswerMissing,
    /// The record does not await this reference.
    NotAwaited,
    /// Not final: it may still be done, and the fact waits for it.
    NotFinal,
}

/// Why an effect the provider says is done cannot be recorded as the fact's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unproven {
    /// The record awaits another reference, which may be done too.
    AwaitsAnother,
    /// The object's fields differ from the recorded fact's.
    OtherFields,
}

impl<F> End<F> {
    pub(crate) fn retry(cause: Retry<F>, attempt: Option<u32>) -> Self {
        Self::Retry { cause, attempt }
    }
}

/// Why a record awaits the reference it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Awaited {
    /// A person must confirm it (a person's authentication).
    #[default]
    Someone,
    /// The provider is processing it (a transfer that clears in days): it settles by itself.
    Processing,
}

/// What refused an attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Refusal<F> {
    /// The provider's refusal.
    Failure(F),
    /// An effect that was in flight failed (a transfer that bounced).
    FailedInFlight,
    /// A request for someone's confirmation taken as a refusal: only with the
    /// `close_open_attempts` rule off, for its mutant.
    AwaitsSomeone,
}

/// A call of the machine, as its ends name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// The reservation (or the correction before it).
    Reserve,
    /// The move to the next attempt's key.
    NextAttempt,
    /// The effect, under the provider key.
    Perform,
    /// A lookup of the fact's effects, or a fetch of an awaited object.
    Lookup,
    /// The cancel of an open attempt.
    Cancel,
    /// The completion: `Done` with the receipt.
    Complete,
    /// The write that makes the record await a reference.
    Await,
    /// A settlement's read or write.
    Settle,
}

/// Why a record failed with a safe retry. The source error is kept whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Retry<F> {
    /// This store call timed out.
    StoreTimedOut(Call),
    /// A store call failed.
    Store {
        /// The call that failed.
        call: Call,
        /// The store's error.
        source: Shared<StoreError>,
    },
    /// A lookup (or a fetch) timed out.
    LookupTimedOut,
    /// A lookup (or a fetch) failed.
    Lookup(F),
    /// The effect timed out: its outcome is unknown.
    EffectTimedOut,
    /// The effect failed with its outcome unknown or transient.
    Effect(F),
    /// The lease was lost before the move to the next key: someone else holds the record.
    LeaseLostBeforeNextAttempt,
    /// The lease was lost before the record could await: another delivery took it over.
    LeaseLostBeforeAwaiting,
    /// The provider replayed a stored 5xx and nothing is found yet: the outcome is
    /// indeterminate (an effect may still appear), so the key is kept.
    ServerErrorUnsettled {
        /// The replayed HTTP status.
        status: u16,
    },
    /// The cancel of an open attempt timed out.
    CancelTimedOut,
    /// The cancel of an open attempt failed.
    Cancel(F),
    /// Still an open attempt after cancelling this many.
    OpenAttemptsLeft(u8),
    /// The provider has no object the record names. It never deletes one, so a
    /// setting is wrong; nothing ends, and the retry asks again once it is fixed.
    Missing {
        /// The reference the provider has no object for.
        reference: String,
    },
    /// The producer's report of an ended wait could not be sent: the record is left
    /// awaiting, so the retry reports it again.
    Report(Shared<QueueError>),
    /// A bug: the machine got an answer its phase does not expect.
    OutOfPhase {
        /// The phase the machine was in.
        phase: &'static str,
        /// The answer it got.
        answer: &'static str,
    },
}

/// Why a record cannot be settled by a machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Unresolved {
    /// The table's judgement of a refused reservation.
    Table(Unsettled),
    /// The effect answered with an object in a state the machine does not settle.
    Unexpected {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// The effect itself answered with an object in flight, not final.
    InFlightAnswer {
        /// The object's reference.
        reference: String,
        /// Its status, as the provider names it.
        status: String,
    },
    /// The provider says the key was used with other parameters.
    KeyReused {
        /// The provider key refused.
        provider_key: String,
    },
    /// Someone must confirm an attempt, but neither the answer nor a lookup names it.
    AwaitsWithoutReference,
    /// An effect done, which the record does not await, that cannot be recorded as the
    /// fact's.
    Unproven {
        /// The done effect's reference.
        reference: String,
        /// Why it cannot be recorded as the fact's.
        why: Unproven,
    },
    /// An effect of the fact was done though the fact was already done with another:
    /// applied twice (an open attempt confirmed late).
    LateConfirmation {
        /// The effect confirmed late.
        reference: String,
        /// The receipt the fact was already done with.
        receipt: String,
    },
    /// Done, but the record no longer belongs to this attempt.
    RecordMovedOn {
        /// The receipt this attempt got.
        receipt: String,
        /// This attempt.
        attempt: u32,
        /// The record's state as found (`None`: no record).
        state: Option<State>,
        /// The record's attempt as found.
        record_attempt: Option<u32>,
        /// The record's receipt as found.
        record_receipt: Option<String>,
    },
}

/// A source error shared by the clones of an end (a model checker clones and hashes
/// states). Two are equal when they read the same, cause by cause.
#[derive(Debug)]
pub struct Shared<E>(pub Arc<E>);

impl<E> Shared<E> {
    /// Shares `error` among the clones of an end.
    pub fn new(error: E) -> Self {
        Self(Arc::new(error))
    }
}

impl<E> Clone for Shared<E> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<E: std::error::Error + 'static> PartialEq for Shared<E> {
    fn eq(&self, other: &Self) -> bool {
        crate::error_chain(&*self.0) == crate::error_chain(&*other.0)
    }
}

impl<E: std::error::Error + 'static> Eq for Shared<E> {}

impl<E: std::error::Error + 'static> Hash for Shared<E> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        crate::error_chain(&*self.0).hash(state);
    }
}

impl<E: fmt::Display> fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Shared<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A shared failure reads as the failure it shares.
impl<E: Classify> Classify for Shared<E> {
    fn class(&self) -> Class {
        self.0.class()
    }
}
