//! The settlement of a payment (ARCHITECTURE.md, "Settling a payment"), as a pure
//! machine beside the record's (`policy/machine/`) and `resolve`'s: read the record,
//! fetch the payment from the provider by id, cancel it, move the wait's end, report
//! the end, write. Its decisions take the provider's answer, never what an event's
//! body says, since anyone allowed to send to the orders queue can write one. The
//! consumer (an event in the batch), the scheduled settler and the model checker
//! (`examples/model.rs`) all drive this one machine (`drivers/settle.rs`); the writes
//! are the table's `Settle` and `Adopt` (`idempotent-consumer/src/table.rs`), each conditioned on the
//! record, so a repeated event or a second settler changes nothing.

use crate::contracts::payment::{Cancel, PaymentError};
use crate::contracts::queue::QueueError;
use crate::contracts::store::{
    AdoptRequest, SettleRequest, Settled, StoreError, Write, WriteOutcome,
};
use crate::domain::OrderKey;
use crate::domain::clock::Time;
use crate::domain::{Fingerprint, Key, Record, State};
use crate::policy::machine::NoAnswer;
use crate::policy::outcome::{Call, Outcome, ReconcileCause, RetryCause, Shared};
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

/// The write a settlement makes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Writing {
    Settle(Settled),
    Adopt(Fingerprint),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Reading,
    Fetching,
    Cancelling,
    Reporting,
    Writing(Writing),
    Done,
}

/// A refused write is judged again against the record that refused it, at most this
/// many times (each refusal means the record changed under the settlement).
const MOST_REFUSALS: u8 = 2;

/// One settlement of one payment of one order. Pure: the record read, the provider's
/// answers and each write's outcome come in; the next step comes out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Settlement {
    key: Key,
    payment_id: String,
    /// What the event claims (the settler claims nothing).
    claimed: Option<PaymentNow>,
    record: Option<Record>,
    found: Option<Found>,
    now: Time,
    /// `expires` of a record completed now.
    paid_until: Time,
    rules: Rules,
    phase: Phase,
    /// A refused cancel: the payment was fetched again (once).
    looked_again: bool,
    refusals: u8,
}

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
        let (payment_id, claimed, record) = match trigger {
            Trigger::Event {
                payment_id,
                claimed,
            } => (payment_id, Some(claimed), None),
            Trigger::Due(record) => (
                record.awaited.clone().unwrap_or_default(),
                None,
                Some(*record),
            ),
        };
        let mut settlement = Self {
            key,
            payment_id,
            claimed,
            record,
            found: None,
            now,
            paid_until,
            rules,
            phase: Phase::Done,
            looked_again: false,
            refusals: 0,
        };
        let step = if settlement.claimed.is_some() {
            settlement.phase = Phase::Reading;
            SettleStep::Read
        } else {
            settlement.fetch()
        };
        (settlement, step)
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The provider's answer, already fetched (a thin event's order was read from it):
    /// after the read, the settlement decides on it without fetching again.
    pub fn prefetched(&mut self, found: Found) {
        self.found = Some(found);
    }

    pub fn payment_id(&self) -> &str {
        &self.payment_id
    }

    /// The request of a [`SettleStep::Write`].
    pub fn write(&self) -> Option<Write<'_>> {
        match &self.phase {
            Phase::Writing(Writing::Settle(settled)) => Some(Write::Settle(SettleRequest {
                pk: &self.key,
                awaited: &self.payment_id,
                settled: settled.clone(),
            })),
            Phase::Writing(Writing::Adopt(fingerprint)) => Some(Write::Adopt(AdoptRequest {
                pk: &self.key,
                receipt: &self.payment_id,
                fingerprint,
                now: self.now,
                expires: self.paid_until,
            })),
            _ => None,
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: SettleInput) -> SettleStep {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, input) {
            (Phase::Reading, SettleInput::Read(Ok(record))) => self.on_read(record),
            (Phase::Fetching, SettleInput::Fetched(Ok(Some(found)))) => {
                if found.order_id.as_deref() != Some(self.key.order_id()) {
                    return self.ignored("the provider says the payment is not this order's");
                }
                self.found = Some(found);
                self.decide()
            }
            (Phase::Fetching, SettleInput::Fetched(Ok(None))) => self.on_missing(),
            (Phase::Cancelling, SettleInput::Cancelled(Ok(Cancel::Cancelled))) => {
                if let Some(found) = &mut self.found {
                    found.status = PaymentNow::Canceled;
                }
                self.decide()
            }
            (Phase::Cancelling, SettleInput::Cancelled(Ok(Cancel::NotCancellable))) => {
                // It may have succeeded meanwhile: look again, once.
                self.looked_again = true;
                self.fetch()
            }
            (Phase::Reporting, SettleInput::Reported(Ok(()))) => {
                self.phase = Phase::Writing(Writing::Settle(Settled::Ended));
                SettleStep::Write
            }
            (Phase::Writing(writing), SettleInput::Written(Ok(WriteOutcome::Applied(record)))) => {
                self.record = Some(record);
                self.on_applied(&writing)
            }
            (Phase::Writing(_), SettleInput::Written(Ok(WriteOutcome::Refused(record)))) => {
                // The record changed under the settlement: judged again by what it is.
                self.record = record;
                self.refusals += 1;
                if self.refusals > MOST_REFUSALS {
                    return SettleStep::Done(Outcome::InProgress { until: None });
                }
                self.decide()
            }
            (
                Phase::Reading | Phase::Writing(_),
                SettleInput::Read(Err(e)) | SettleInput::Written(Err(e)),
            ) => SettleStep::Done(store_failed(e)),
            (Phase::Fetching, SettleInput::Fetched(Err(e))) => SettleStep::Done(fetch_failed(e)),
            (Phase::Cancelling, SettleInput::Cancelled(Err(e))) => SettleStep::Done(match e {
                NoAnswer::NoTime => deadline(Call::Cancel),
                NoAnswer::TimedOut => Outcome::retryable(RetryCause::CancelTimedOut, None),
                NoAnswer::Failed(e) => Outcome::retryable(RetryCause::Cancel(Shared::new(e)), None),
            }),
            (Phase::Reporting, SettleInput::Reported(Err(e))) => {
                // The record still awaits, its end at now: the retry reports again.
                let e = match e {
                    NoAnswer::NoTime => return SettleStep::Done(deadline(Call::Settle)),
                    NoAnswer::TimedOut => QueueError::TimedOut,
                    NoAnswer::Failed(e) => e,
                };
                SettleStep::Done(Outcome::retryable(RetryCause::Report(Shared::new(e)), None))
            }
            (phase, input) => SettleStep::Done(Outcome::retryable(
                RetryCause::OutOfPhase {
                    phase: phase.name(),
                    answer: input.name(),
                },
                None,
            )),
        }
    }

    /// The record read: done with this payment already (no call), else the payment
    /// fetched from the provider (or, for the mutant that believes events, the event's
    /// claim taken as the answer).
    fn on_read(&mut self, record: Option<Record>) -> SettleStep {
        self.record = record;
        let done_with_it = self.record.as_ref().is_some_and(|r| {
            r.state == State::Done && r.receipt.as_deref() == Some(&self.payment_id)
        });
        if done_with_it {
            // Already the receipt: no call.
            return self.ignored("the order is already done with this payment");
        }
        if self.rules.event_is_a_hint {
            match self.found.take() {
                Some(found) => {
                    self.phase = Phase::Fetching;
                    self.on(SettleInput::Fetched(Ok(Some(found))))
                }
                None => self.fetch(),
            }
        } else {
            // The mutant: the event's body is believed.
            self.found = self.claimed.map(|status| Found {
                status,
                order_id: Some(self.key.order_id().to_owned()),
                fingerprint: self.record.as_ref().and_then(|r| r.fingerprint.clone()),
            });
            self.decide()
        }
    }

    /// The provider does not have the payment (404): a fault that ends nothing (or,
    /// for the mutant, "gone" read as cancelled).
    fn on_missing(&mut self) -> SettleStep {
        if self.rules.missing_is_a_fault {
            return SettleStep::Done(missing(&self.payment_id));
        }
        self.found = Some(Found {
            status: PaymentNow::Canceled,
            order_id: Some(self.key.order_id().to_owned()),
            fingerprint: None,
        });
        self.decide()
    }

    /// A write applied: the wait's end moved to now (report, then end it), or the
    /// settlement's end.
    fn on_applied(&mut self, writing: &Writing) -> SettleStep {
        match writing {
            Writing::Settle(Settled::Ending { .. }) => {
                self.phase = Phase::Reporting;
                SettleStep::Report
            }
            Writing::Settle(Settled::Ended) => SettleStep::Done(Outcome::Settled {
                payment_id: self.payment_id.clone(),
                paid: false,
            }),
            Writing::Settle(Settled::Done { .. }) | Writing::Adopt(_) => {
                SettleStep::Done(Outcome::Settled {
                    payment_id: self.payment_id.clone(),
                    paid: true,
                })
            }
        }
    }

    fn fetch(&mut self) -> SettleStep {
        self.phase = Phase::Fetching;
        SettleStep::Fetch
    }

    fn ignored(&mut self, why: &'static str) -> SettleStep {
        self.phase = Phase::Done;
        SettleStep::Done(Outcome::EventIgnored {
            payment_id: self.payment_id.clone(),
            why,
        })
    }

    fn settle(&mut self, settled: Settled) -> SettleStep {
        self.phase = Phase::Writing(Writing::Settle(settled));
        SettleStep::Write
    }

    /// What the provider's answer means for the record as it stands.
    fn decide(&mut self) -> SettleStep {
        let Some(found) = self.found.clone() else {
            return self.ignored("the provider's answer is missing");
        };
        let record = self.record.clone();
        let awaits_it = record.as_ref().is_some_and(|r| {
            r.state == State::Awaiting
                && (!self.rules.settle_names_what_it_awaits
                    || r.awaited.as_deref() == Some(&self.payment_id))
        });
        match found.status {
            PaymentNow::Succeeded if awaits_it => {
                // Paid as the order said, or (the customer chose another card) with
                // what was paid kept beside the order's fingerprint.
                let order = record.as_ref().and_then(|r| r.fingerprint.as_ref());
                let paid = found.fingerprint.clone().filter(|f| Some(f) != order);
                self.settle(Settled::Done {
                    expires: self.paid_until,
                    done_fingerprint: paid,
                })
            }
            PaymentNow::Succeeded => self.money_taken(record.as_ref(), &found),
            PaymentNow::Canceled if awaits_it => self.end(record.as_ref()),
            PaymentNow::Canceled => self.ignored("the order does not await this payment"),
            // Open, or its attempt failed: the customer may still confirm it. Past the
            // wait's end the settler cancels it first; nothing else ends a wait.
            PaymentNow::Open | PaymentNow::AttemptFailed
                if awaits_it && !self.looked_again && self.past_end(record.as_ref()) =>
            {
                if self.rules.wait_ends_only_when_cancelled {
                    self.phase = Phase::Cancelling;
                    SettleStep::Cancel
                } else {
                    // The mutant: the wait ends with its payment still open.
                    self.end(record.as_ref())
                }
            }
            PaymentNow::AttemptFailed if awaits_it && !self.rules.wait_ends_only_when_cancelled => {
                // The mutant: a failed attempt ends the wait.
                self.end(record.as_ref())
            }
            PaymentNow::Open | PaymentNow::AttemptFailed | PaymentNow::Processing => {
                self.ignored("not final: the payment may still succeed, and the order waits for it")
            }
        }
    }

    /// Whether the settler runs past the record's end of the wait (an event never
    /// cancels: only the settler, which claims nothing, ends a wait by its clock).
    fn past_end(&self, record: Option<&Record>) -> bool {
        self.claimed.is_none()
            && record
                .and_then(|r| r.wait_until)
                .is_some_and(|end| self.now.as_secs() >= end.as_secs())
    }

    /// The wait ends: its end moved to now first (when later), so a copy of the order
    /// sent meanwhile is retried, not acknowledged; then reported; then written.
    fn end(&mut self, record: Option<&Record>) -> SettleStep {
        let ends_later = record
            .and_then(|r| r.wait_until)
            .is_some_and(|end| end.as_secs() > self.now.as_secs());
        if ends_later {
            self.settle(Settled::Ending { at: self.now })
        } else {
            self.phase = Phase::Reporting;
            SettleStep::Report
        }
    }

    /// A payment the provider says succeeded, which the record does not await: the
    /// record completes with it when it is provably this order's and nothing else paid
    /// the order; otherwise a person looks. Never acknowledged as nothing.
    fn money_taken(&mut self, record: Option<&Record>, found: &Found) -> SettleStep {
        let reconcile = |why: &'static str, payment_id: &str| {
            SettleStep::Done(Outcome::NeedsReconciliation {
                cause: ReconcileCause::UnprovenPayment {
                    payment_id: payment_id.to_owned(),
                    why,
                },
            })
        };
        let Some(record) = record else {
            self.phase = Phase::Done;
            return SettleStep::Done(Outcome::PaymentUnrecorded {
                payment_id: self.payment_id.clone(),
            });
        };
        if !self.rules.effect_found_is_recorded {
            // The mutant: Stripe's own success acknowledged as nothing.
            return self.ignored("the order does not await this payment");
        }
        match record.state {
            // Recorded meanwhile (another delivery, the event or the settler): settled.
            State::Done if record.receipt.as_deref() == Some(&self.payment_id) => {
                self.ignored("the order is already done with this payment")
            }
            State::Done => SettleStep::Done(Outcome::NeedsReconciliation {
                cause: ReconcileCause::LateConfirmation {
                    payment_id: self.payment_id.clone(),
                    receipt: record.receipt.clone().unwrap_or_default(),
                },
            }),
            State::InProgress if record.lease_until.is_none_or(|h| h >= self.now) => {
                SettleStep::Done(Outcome::InProgress {
                    until: record.lease_until,
                })
            }
            State::Awaiting => reconcile(
                "the order awaits another payment, which may succeed too",
                &self.payment_id,
            ),
            State::Other(_) => SettleStep::Done(Outcome::NeedsReconciliation {
                cause: ReconcileCause::UnknownState,
            }),
            State::Free | State::Failed | State::InProgress => match &found.fingerprint {
                Some(fingerprint) if record.fingerprint.as_ref() == Some(fingerprint) => {
                    self.phase = Phase::Writing(Writing::Adopt(fingerprint.clone()));
                    SettleStep::Write
                }
                _ => reconcile(
                    "its amount, currency, customer or payment method differ from the \
                         recorded order's",
                    &self.payment_id,
                ),
            },
        }
    }
}

/// The provider has no payment `payment_id`. It never deletes one, so a setting is
/// wrong: a fault that ends nothing, retried once it is fixed.
pub fn missing(payment_id: &str) -> Outcome {
    Outcome::retryable(
        RetryCause::PaymentMissing {
            payment_id: payment_id.to_owned(),
        },
        None,
    )
}

/// A fetch of the payment that had no answer, or a failing one.
pub fn fetch_failed(no_answer: NoAnswer<PaymentError>) -> Outcome {
    match no_answer {
        NoAnswer::NoTime => deadline(Call::Lookup),
        NoAnswer::TimedOut => Outcome::retryable(RetryCause::LookupTimedOut, None),
        NoAnswer::Failed(e) => Outcome::retryable(RetryCause::Lookup(Shared::new(e)), None),
    }
}

fn deadline(before: Call) -> Outcome {
    Outcome::Deadline {
        before,
        attempt: None,
    }
}

fn store_failed(no_answer: NoAnswer<StoreError>) -> Outcome {
    match no_answer {
        NoAnswer::NoTime => deadline(Call::Settle),
        NoAnswer::TimedOut => Outcome::retryable(RetryCause::StoreTimedOut(Call::Settle), None),
        NoAnswer::Failed(source) => Outcome::retryable(
            RetryCause::Store {
                call: Call::Settle,
                source: Shared::new(source),
            },
            None,
        ),
    }
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Reading => "reading",
            Self::Fetching => "fetching",
            Self::Cancelling => "cancelling",
            Self::Reporting => "reporting",
            Self::Writing(_) => "writing",
            Self::Done => "done",
        }
    }
}

impl SettleInput {
    fn name(&self) -> &'static str {
        match self {
            Self::Read(_) => "read",
            Self::Fetched(_) => "fetched",
            Self::Cancelled(_) => "cancelled",
            Self::Written(_) => "written",
            Self::Reported(_) => "reported",
        }
    }
}

#[cfg(test)]
mod tests;
