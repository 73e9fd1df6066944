//! What a settlement and its driver say to each other: what starts it, the step it
//! asks for and the answer fed back, and the provider's object as settling reads it.

use crate::executor::NoAnswer;
use crate::machine::{Cancel, End};
use crate::queue::QueueError;
use crate::record::{Fingerprint, Record};
use crate::store::{StoreError, WriteOutcome};

/// What became of the provider's object, as the provider (or, for the mutant that
/// trusts it, an event's body) tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Now {
    /// Final: the effect is done with it.
    Done,
    /// Final: it can never be done.
    Cancelled,
    /// A confirmation attempt failed: the person may still confirm it, until it is
    /// cancelled.
    AttemptFailed,
    /// Still waiting for someone to confirm it.
    Open,
    /// In flight at the provider: it settles by itself, either way; it cannot be
    /// cancelled.
    InFlight,
}

/// The provider's answer about one object, fetched by its reference: what settling
/// reads of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seen {
    /// What became of the object.
    pub now: Now,
    /// The id of the fact the object was made for (the provider's metadata).
    pub fact_id: Option<String>,
    /// The fingerprint of the fact the object describes, when it names all its fields.
    pub fingerprint: Option<Fingerprint>,
}

/// What starts a settlement.
#[derive(Clone, Debug)]
pub enum Trigger {
    /// A provider event about `reference` (a hint: what its body claims is only read
    /// by the mutant that trusts it). The record is read first.
    Event {
        /// The object the event is about.
        reference: String,
        /// What the event's body claims became of it.
        claimed: Now,
    },
    /// The settler, with an awaiting record read from the index.
    Due(Box<Record>),
}

/// What the settlement asks for next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleStep<F> {
    /// Read the record (strongly consistent): [`SettleInput::Read`].
    Read,
    /// Fetch the object from the provider by its reference: [`SettleInput::Fetched`].
    Fetch,
    /// Cancel the object, whose wait is over: [`SettleInput::Cancelled`].
    Cancel,
    /// Write [`super::Settlement::write`]: [`SettleInput::Written`].
    Write,
    /// Tell the fact's producer that it ended without its effect:
    /// [`SettleInput::Reported`].
    Report,
    /// The settlement's end.
    Done(End<F>),
}

/// The answer to the last step.
// One per step, moved at once into the machine: boxing the record read would cost an
// allocation on every read for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SettleInput<F> {
    /// The record read (`None`: no record).
    Read(Result<Option<Record>, NoAnswer<StoreError>>),
    /// `Ok(None)`: the provider has no such object (a 404).
    Fetched(Result<Option<Seen>, NoAnswer<F>>),
    /// The cancel's answer.
    Cancelled(Result<Cancel, NoAnswer<F>>),
    /// The write's answer.
    Written(Result<WriteOutcome, NoAnswer<StoreError>>),
    /// The report's answer.
    Reported(Result<(), NoAnswer<QueueError>>),
}
