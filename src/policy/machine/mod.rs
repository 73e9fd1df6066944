//! The state machine of one record, as charge-once runs it (ARCHITECTURE.md, "The
//! state machine"): the library's machine (`idempotent_consumer::machine`), pure, with
//! a payment as its effect. The driver (`drivers/charge.rs`) performs each step with
//! the real store and provider; the model checker (`examples/model.rs`) performs them
//! against a model of both. This module gives the machine its words: a payment's
//! answers in (`words.rs`: how a `PaymentError` classifies, a lookup, a receipt), and
//! each end out as the record's [`Outcome`](crate::policy::outcome::Outcome).

mod steps;
#[cfg(test)]
mod tests;
mod words;

pub use idempotent_consumer::machine::{LOOKUP_CLOCK_MARGIN, lookup_since};
pub use steps::{Input, NoAnswer, Step, WriteKind};
pub use words::{found, outcome_of, receipt, shared};

use idempotent_consumer::machine as library;
use std::time::Duration;

use crate::contracts::payment::PaymentError;
use crate::contracts::store::Write;
use crate::domain::clock::Time;
use crate::domain::{Identity, Owner};
use crate::policy::outcome::Shared;
use crate::policy::rules::Rules;

/// The shortest wait for a payment the provider processes: SEPA and Bacs debits settle
/// within two weeks.
pub const PROCESSING_WAIT: Duration = Duration::from_secs(14 * 24 * 3600);

/// What one record starts from: all of it comes from outside the machine.
#[derive(Clone, Debug)]
pub struct Start {
    /// The order's key and fingerprints.
    pub identity: Identity,
    /// The fresh random owner token of this attempt.
    pub owner: Owner,
    pub now: Time,
    /// The invocation deadline: the lease's end.
    pub deadline: Time,
    /// `expires` written with the reservation and the completion.
    pub expires: Time,
    pub max_declines: u32,
    /// Keys first sent longer ago than this are reconciled before reuse.
    pub key_ttl: Duration,
    /// How long an order awaits its customer's authentication (`AUTHENTICATION_WAIT`).
    pub authentication_wait: Duration,
    /// How long an order awaits a payment the provider processes (the drivers: the
    /// longer of `AUTHENTICATION_WAIT` and [`PROCESSING_WAIT`]).
    pub processing_wait: Duration,
    pub rules: Rules,
}

/// One record's state machine: the library's, its effect a payment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine(library::Machine<Shared<PaymentError>>);

impl Machine {
    /// A record about to be reserved; the first step is [`WriteKind::Reserve`].
    pub fn new(start: Start) -> (Self, Step) {
        let (machine, step) = library::Machine::new(library::Start {
            identity: start.identity,
            owner: start.owner,
            now: start.now,
            deadline: start.deadline,
            expires: start.expires,
            max_refusals: start.max_declines,
            key_ttl: start.key_ttl,
            someone_wait: start.authentication_wait,
            processing_wait: start.processing_wait,
            // Stripe keeps each idempotency key for 24 hours (replayed as the first
            // answer) and lists an order's PaymentIntents: an unknown outcome is looked up.
            unknown: library::Unknown::LookedUp,
            rules: start.rules,
        });
        (Self(machine), words::step(step))
    }

    /// The attempt whose key the machine is on.
    pub fn attempt(&self) -> u32 {
        self.0.attempt()
    }

    /// Where a lookup of the order's payments starts (the record's creation, less a
    /// margin for clocks): a customer's older payments are never read.
    pub fn lookup_since(&self) -> Time {
        self.0.lookup_since()
    }

    /// The request of a write step; `now` is the time it is sent.
    pub fn write(&self, kind: WriteKind, now: Time) -> Write<'_> {
        self.0.write(kind, now)
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: Input) -> Step {
        words::step(self.0.on(words::input(input)))
    }
}
