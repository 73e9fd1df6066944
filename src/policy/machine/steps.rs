//! What the machine and its driver say to each other: the step the machine asks for,
//! and the answer the driver feeds back (a store write's, a charge's, a lookup's, a
//! cancel's, a read's), with why a call gave none.

use crate::contracts::payment::{Cancel, Lookup, PaymentError, Receipt};
use crate::contracts::store::{ReleaseKind, StoreError, WriteOutcome};
use crate::policy::outcome::Outcome;

/// Why a call gave no answer (a store or provider call of the driver): the library's.
pub use idempotent_consumer::executor::NoAnswer;

/// The kinds of write the machine asks for; [`super::Machine::write`] builds the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    Reserve,
    Complete,
    CompleteAttempt,
    Release(ReleaseKind),
    NextAttempt,
    /// The record awaits the customer's confirmation of the payment the machine holds.
    Await,
    /// The record takes this delivery's payload, corrected, as a new attempt.
    Correct,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Perform [`super::Machine::write`] for this kind; answer with [`Input::Written`].
    Write(WriteKind),
    /// Charge the order under this provider key (`<pk>#<attempt>`); answer with
    /// [`Input::Charged`].
    Charge { key: String },
    /// Look the order's payment up; answer with [`Input::Looked`].
    Lookup,
    /// Cancel the order's open payment `payment_id`; answer with [`Input::Cancelled`].
    Cancel { payment_id: String },
    /// The record's end.
    Done(Outcome),
}

/// The answer to the last step.
#[derive(Debug)]
pub enum Input {
    Written(Result<WriteOutcome, NoAnswer<StoreError>>),
    Charged(Result<Receipt, NoAnswer<PaymentError>>),
    Looked(Result<Lookup, NoAnswer<PaymentError>>),
    Cancelled(Result<Cancel, NoAnswer<PaymentError>>),
}

impl Input {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Written(_) => "written",
            Self::Charged(_) => "charged",
            Self::Looked(_) => "looked up",
            Self::Cancelled(_) => "cancelled",
        }
    }
}
