//! What the machine and its driver say to each other, in a payment's words: the step
//! the machine asks for, and the answer the driver feeds back (a store write's, a
//! charge's, a lookup's, a cancel's), with why a call gave none.

use crate::contracts::payment::{Cancel, Lookup, PaymentError, Receipt};
use crate::contracts::store::{StoreError, WriteOutcome};
use crate::policy::outcome::Outcome;

/// Why a call gave no answer (a store or provider call of the driver): the library's.
pub use idempotent_consumer::executor::NoAnswer;
/// The kinds of write the machine asks for: the library's.
pub use idempotent_consumer::machine::WriteKind;

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
