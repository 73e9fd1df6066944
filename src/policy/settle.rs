//! The settlement of a payment (ARCHITECTURE.md, "Settling a payment"), as charge-once
//! runs it: the library's settlement machine (`idempotent_consumer::settle`), pure,
//! with a payment as the object it settles: read the record, fetch the payment from
//! the provider by id, cancel it, move the wait's end, report the end, write. Its
//! decisions take the provider's answer, never what an event's body says, since anyone
//! allowed to send to the orders queue can write one. The consumer (an event in the
//! batch), the scheduled settler and the model checker (`examples/model.rs`) all drive
//! this one machine (`drivers/settle.rs`); the writes are the table's `Settle` and
//! `Adopt` (`idempotent-consumer/src/table.rs`), each conditioned on the record, so a
//! repeated event or a second settler changes nothing. This module gives it a
//! payment's words: [`Found`] and [`PaymentNow`] in, each end out as an [`Outcome`]
//! (`policy/machine/words.rs`).

use idempotent_consumer::settle as library;

use crate::contracts::payment::{Cancel, PaymentError};
use crate::contracts::queue::QueueError;
use crate::contracts::store::{StoreError, Write, WriteOutcome};
use crate::domain::clock::Time;
use crate::domain::{Key, Record};
use crate::policy::machine::{NoAnswer, outcome_of, shared};
use crate::policy::outcome::{Outcome, Shared};
use crate::policy::rules::Rules;

mod found;
pub use found::{Found, PaymentNow};

/// What starts a settlement.
#[derive(Clone, Debug)]
pub enum Trigger {
    /// A provider event about `payment_id` (a hint: what its body says of the payment
    /// is only read by the mutant that trusts it). The record is read first.
    Event {
        payment_id: String,
        claimed: PaymentNow,
    },
    /// The settler, with an awaiting record read from the index.
    Due(Box<Record>),
}

/// What the settlement asks for next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleStep {
    /// Read the record (strongly consistent): [`SettleInput::Read`].
    Read,
    /// Fetch the payment from the provider by id: [`SettleInput::Fetched`].
    Fetch,
    /// Cancel the payment, whose wait is over: [`SettleInput::Cancelled`].
    Cancel,
    /// Write [`Settlement::write`]: [`SettleInput::Written`].
    Write,
    /// Tell the shop that the order ended without a payment: [`SettleInput::Reported`].
    Report,
    Done(Outcome),
}

/// The answer to the last step.
#[derive(Debug)]
pub enum SettleInput {
    Read(Result<Option<Record>, NoAnswer<StoreError>>),
    /// `Ok(None)`: the provider has no such payment (404 `resource_missing`).
    Fetched(Result<Option<Found>, NoAnswer<PaymentError>>),
    Cancelled(Result<Cancel, NoAnswer<PaymentError>>),
    Written(Result<WriteOutcome, NoAnswer<StoreError>>),
    Reported(Result<(), NoAnswer<QueueError>>),
}

/// One settlement of one payment of one order: the library's. Pure: the record read,
/// the provider's answers and each write's outcome come in; the next step comes out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Settlement(library::Settlement);

impl Settlement {
    /// A settlement of `key`'s order started at `now`; a record it completes is kept
    /// until `paid_until`.
    pub fn new(
        key: Key,
        trigger: Trigger,
        now: Time,
        paid_until: Time,
        rules: Rules,
    ) -> (Self, SettleStep) {
        let trigger = match trigger {
            Trigger::Event {
                payment_id,
                claimed,
            } => library::Trigger::Event {
                reference: payment_id,
                claimed: claimed.now(),
            },
            Trigger::Due(record) => library::Trigger::Due(record),
        };
        let (settlement, step) = library::Settlement::new(key, trigger, now, paid_until, rules);
        (Self(settlement), step_of(step))
    }

    pub fn key(&self) -> &Key {
        self.0.key()
    }

    /// The provider's answer, already fetched (a thin event's order was read from it):
    /// after the read, the settlement decides on it without fetching again.
    pub fn prefetched(&mut self, found: Found) {
        self.0.prefetched(found.seen());
    }

    pub fn payment_id(&self) -> &str {
        self.0.reference()
    }

    /// The request of a [`SettleStep::Write`].
    pub fn write(&self) -> Option<Write<'_>> {
        self.0.write()
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: SettleInput) -> SettleStep {
        let input = match input {
            SettleInput::Read(answer) => library::SettleInput::Read(answer),
            SettleInput::Fetched(answer) => library::SettleInput::Fetched(
                answer.map(|found| found.map(Found::seen)).map_err(shared),
            ),
            SettleInput::Cancelled(answer) => {
                library::SettleInput::Cancelled(answer.map_err(shared))
            }
            SettleInput::Written(answer) => library::SettleInput::Written(answer),
            SettleInput::Reported(answer) => library::SettleInput::Reported(answer),
        };
        step_of(self.0.on(input))
    }
}

fn step_of(step: library::SettleStep<Shared<PaymentError>>) -> SettleStep {
    match step {
        library::SettleStep::Read => SettleStep::Read,
        library::SettleStep::Fetch => SettleStep::Fetch,
        library::SettleStep::Cancel => SettleStep::Cancel,
        library::SettleStep::Write => SettleStep::Write,
        library::SettleStep::Report => SettleStep::Report,
        library::SettleStep::Done(end) => SettleStep::Done(outcome_of(end)),
    }
}

/// The provider has no payment `payment_id`. It never deletes one, so a setting is
/// wrong: a fault that ends nothing, retried once it is fixed.
pub fn missing(payment_id: &str) -> Outcome {
    outcome_of(library::missing::<Shared<PaymentError>>(payment_id))
}

/// A fetch of the payment that had no answer, or a failing one.
pub fn fetch_failed(no_answer: NoAnswer<PaymentError>) -> Outcome {
    outcome_of(library::fetch_failed(shared(no_answer)))
}

#[cfg(test)]
mod tests;
