//! The state machine of one record, pure (ARCHITECTURE.md, "The state machine"): the
//! machine's state plus the answer to its last step gives the next step, which is a
//! conditional store write to attempt, a provider call to make, or the record's final
//! [`Outcome`]. No I/O, clock or randomness in here: the time and the owner token come
//! in as inputs. The driver (`drivers/charge.rs`) performs each step with the real store and
//! provider; the model checker (`examples/model.rs`) performs them against a model of
//! both. What each write requires and leaves is the table's contract (`idempotent-consumer/src/table.rs`);
//! each rule can be switched off through [`Rules`], for the mutants only.

mod failures;
mod payments;
mod steps;
#[cfg(test)]
mod tests;

use payments::Looking;
pub use payments::{LOOKUP_CLOCK_MARGIN, lookup_since};
pub use steps::{Input, NoAnswer, Step, WriteKind};

use crate::contracts::store::{
    AwaitRequest, CorrectRequest, ReleaseKind, ReserveRequest, StoreError, Write, WriteOutcome,
};
use crate::domain::{Identity, Owner, Record, State};
use crate::policy::lease::Lease;
use crate::policy::outcome::{Call, Outcome, ReconcileCause, RetryCause, Shared};
use crate::policy::rules::Rules;
use crate::policy::table::{Reservation, judge};
use std::time::Duration;

use crate::contracts::payment::{PaymentError, Receipt};
use crate::domain::clock::Time;

/// The shortest wait for a payment the provider processes: SEPA and Bacs debits settle
/// within two weeks.
pub const PROCESSING_WAIT: Duration = Duration::from_secs(14 * 24 * 3600);

/// Why a record awaits a payment it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
enum Awaited {
    /// The customer must authenticate it.
    #[default]
    Customer,
    /// The provider is processing it (a bank debit): it settles by itself.
    Processing,
}

/// Where the machine is: which answer it waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Reserving,
    Looking(Looking),
    Cancelling(Looking),
    MovingKey,
    Charging,
    Completing,
    CompletingByAttempt,
    /// Handing the order to its customer (`Awaiting`).
    Awaiting,
    /// Releasing; then the record ends with this outcome.
    Releasing(Outcome),
    /// The record taking this delivery's corrected payload (`Correct`); a reserve
    /// follows.
    Correcting,
    Done(Outcome),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Reserving => "reserving",
            Self::Looking(_) => "looking",
            Self::Cancelling(_) => "cancelling",
            Self::MovingKey => "moving key",
            Self::Charging => "charging",
            Self::Completing => "completing",
            Self::CompletingByAttempt => "completing by attempt",
            Self::Awaiting => "awaiting",
            Self::Releasing(_) => "releasing",
            Self::Correcting => "correcting",
            Self::Done(_) => "done",
        }
    }
}

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

/// One record's state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine {
    /// The record's key, owner, attempt, lease end (the invocation deadline), creation
    /// once reserved, and the payment to record: shared with `resolve`.
    lease: Lease,
    started_at: Time,
    max_declines: u32,
    key_ttl: Duration,
    authentication_wait: Duration,
    processing_wait: Duration,
    rules: Rules,
    phase: Phase,
    must_reconcile: bool,
    /// Open payments cancelled in this attempt.
    cancels: u8,
    /// The outcome once the payment is recorded.
    success: Option<Outcome>,
    /// The payment the customer is asked to confirm, once the bank asked.
    awaited: Option<(String, Awaited)>,
    /// This delivery's corrected payload took the record (once a delivery).
    corrected: bool,
}

impl Machine {
    /// A record about to be reserved; the first step is [`WriteKind::Reserve`].
    pub fn new(start: Start) -> (Self, Step) {
        let machine = Self {
            lease: Lease::new(start.identity, start.owner, start.deadline, start.expires),
            started_at: start.now,
            max_declines: start.max_declines,
            key_ttl: start.key_ttl,
            authentication_wait: start.authentication_wait,
            processing_wait: start.processing_wait,
            rules: start.rules,
            phase: Phase::Reserving,
            must_reconcile: false,
            cancels: 0,
            success: None,
            awaited: None,
            corrected: false,
        };
        (machine, Step::Write(WriteKind::Reserve))
    }

    /// The attempt whose key the machine is on.
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    /// Where a lookup of the order's payments starts (the record's creation, less a
    /// margin for clocks): a customer's older payments are never read.
    pub fn lookup_since(&self) -> Time {
        lookup_since(self.lease.created)
    }

    /// The reservation request (its time is the record's start).
    fn reserve_request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            pk: &self.lease.key,
            fingerprint: &self.lease.fingerprint,
            owner: &self.lease.owner,
            now: self.started_at,
            lease_until: self.lease.until,
            expires: self.lease.expires,
            max_refusals: self.max_declines,
        }
    }

    /// The request of a write step; `now` is the time it is sent.
    pub fn write(&self, kind: WriteKind, now: Time) -> Write<'_> {
        match kind {
            WriteKind::Reserve => Write::Reserve(self.reserve_request()),
            WriteKind::Complete => Write::Complete(self.lease.complete_request()),
            WriteKind::CompleteAttempt => Write::CompleteAttempt(self.lease.complete_request()),
            WriteKind::Release(kind) => Write::Release(self.lease.release_request(kind)),
            WriteKind::NextAttempt => Write::NextAttempt {
                pk: &self.lease.key,
                owner: &self.lease.owner,
                now,
            },
            WriteKind::Correct => Write::Correct(CorrectRequest {
                pk: &self.lease.key,
                fingerprint: &self.lease.fingerprint,
            }),
            WriteKind::Await => Write::Await(AwaitRequest {
                pk: &self.lease.key,
                owner: &self.lease.owner,
                awaited: self.awaited.as_ref().map_or("", |(id, _)| id.as_str()),
                wait_until: self.wait_until(),
                expires: Time::from_secs(
                    self.lease.expires.as_secs() + self.wait().as_secs() as i64,
                ),
            }),
        }
    }

    /// When the wait for the customer ends: from the record's start, in whole seconds.
    fn wait_until(&self) -> Time {
        Time::from_secs((self.started_at + self.wait()).as_secs())
    }

    /// How long the record awaits its payment: `AUTHENTICATION_WAIT` for a customer;
    /// for a payment the provider processes, its own wait (bank debits settle in days,
    /// and copies of the order are retried once the wait has passed).
    fn wait(&self) -> Duration {
        match self.awaited {
            Some((_, Awaited::Processing)) => self.processing_wait,
            _ => self.authentication_wait,
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: Input) -> Step {
        let phase = std::mem::replace(
            &mut self.phase,
            Phase::Done(Outcome::InProgress { until: None }),
        );
        let step = self.next(phase, input);
        if let Step::Done(outcome) = &step {
            self.phase = Phase::Done(outcome.clone());
        }
        step
    }

    /// One method per phase; an answer its phase does not expect is a bug, and fails
    /// the record with a safe retry.
    fn next(&mut self, phase: Phase, input: Input) -> Step {
        match (phase, input) {
            (Phase::Reserving, Input::Written(answer)) => self.on_reserved(answer),
            (Phase::Looking(why), Input::Looked(answer)) => self.on_looked(why, answer),
            (Phase::Cancelling(why), Input::Cancelled(answer)) => self.on_cancelled(why, answer),
            (Phase::MovingKey, Input::Written(answer)) => self.on_moved_key(answer),
            (Phase::Charging, Input::Charged(answer)) => self.on_charged(answer),
            (Phase::Completing, Input::Written(answer)) => self.on_completed(answer, false),
            (Phase::CompletingByAttempt, Input::Written(answer)) => self.on_completed(answer, true),
            (Phase::Awaiting, Input::Written(answer)) => self.on_awaiting(answer),
            (Phase::Correcting, Input::Written(answer)) => self.on_corrected(answer),
            // A failed or skipped release is never fatal: the lease ends at the
            // deadline anyway, and the record already fails.
            (Phase::Releasing(outcome), Input::Written(_)) => Step::Done(outcome),
            (Phase::Done(outcome), _) => Step::Done(outcome),
            (phase, input) => Step::Done(Outcome::retryable(
                RetryCause::OutOfPhase {
                    phase: phase.name(),
                    answer: input.name(),
                },
                Some(self.lease.attempt),
            )),
        }
    }

    /// Reserve: won → charge (or reconcile an old key first); lost → judged.
    fn on_reserved(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step {
        let answer = match answer {
            Ok(answer) => answer,
            Err(no_answer) => return Step::Done(store_no_answer(Call::Reserve, no_answer, None)),
        };
        let req = self.reserve_request();
        let outcome = match judge(answer, &req) {
            Reservation::Won(record) => {
                self.lease.granted(&record);
                let age = record
                    .sent
                    .unwrap_or(self.started_at)
                    .until(self.started_at);
                self.must_reconcile = self.rules.reconcile_old_keys && age > self.key_ttl;
                return self.charge_or_look();
            }
            Reservation::Duplicate { receipt } => Outcome::Duplicate { receipt },
            // The order may have ended without a payment: a corrected copy takes it, if
            // the table's condition says no payment of it can still succeed.
            Reservation::Conflict { ended: true, .. } if !self.corrected => {
                self.corrected = true;
                self.phase = Phase::Correcting;
                return Step::Write(WriteKind::Correct);
            }
            Reservation::Conflict { .. } => Outcome::Conflict,
            Reservation::InProgress { until } => Outcome::InProgress { until },
            Reservation::RefusalLimit { refusals: declines } => Outcome::DeclineLimit { declines },
            Reservation::NeedsReconciliation { cause } => Outcome::NeedsReconciliation {
                cause: cause.into(),
            },
            Reservation::Awaiting { awaited } => Outcome::AwaitingCustomer {
                payment_id: awaited,
            },
        };
        Step::Done(outcome)
    }

    /// The corrected payload took the record (its next key): reserve it. Refused: a
    /// payment of the order may still succeed, so this payload is a conflict.
    fn on_corrected(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step {
        match answer {
            Ok(WriteOutcome::Applied(_)) => {
                self.phase = Phase::Reserving;
                Step::Write(WriteKind::Reserve)
            }
            Ok(WriteOutcome::Refused(_)) => Step::Done(Outcome::Conflict),
            Err(no_answer) => Step::Done(store_no_answer(Call::Reserve, no_answer, None)),
        }
    }

    /// The move to the next attempt's key, after reconciliation found nothing.
    fn on_moved_key(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(WriteOutcome::Applied(record)) => {
                self.lease.attempt = record.attempt();
                self.phase = Phase::Charging;
                self.charge_step()
            }
            Ok(WriteOutcome::Refused(_)) => Step::Done(Outcome::retryable(
                RetryCause::LeaseLostBeforeNextAttempt,
                attempt,
            )),
            Err(failed @ NoAnswer::Failed(_)) => {
                let outcome = store_no_answer(Call::NextAttempt, failed, attempt);
                self.release(ReleaseKind::KeepKey, outcome)
            }
            Err(no_answer) => Step::Done(store_no_answer(Call::NextAttempt, no_answer, attempt)),
        }
    }

    /// The charge: a receipt → complete; a replayed 5xx or a payment in flight → look
    /// it up, the key kept; anything else → release, the key moved only after a
    /// decline.
    fn on_charged(&mut self, answer: Result<Receipt, NoAnswer<PaymentError>>) -> Step {
        match answer {
            Ok(receipt) => {
                let success = Outcome::Charged {
                    receipt: receipt.id.clone(),
                    charge: receipt.charge.clone(),
                    attempt: self.lease.attempt,
                };
                self.complete(receipt, success)
            }
            Err(NoAnswer::NoTime) => Step::Done(Outcome::Deadline {
                before: Call::Charge,
                attempt: Some(self.lease.attempt),
            }),
            Err(NoAnswer::TimedOut) => self.after_uncertain_charge(RetryCause::ChargeTimedOut),
            // The original outcome is unknown and may still become a payment: look
            // it up, and keep the key whatever the lookup finds not.
            Err(NoAnswer::Failed(PaymentError::ReplayedServerError { status }))
                if self.rules.keep_key_after_server_error =>
            {
                self.phase = Phase::Looking(Looking::AfterServerError(status));
                Step::Lookup
            }
            // The mutant: reconcile as for a forgotten key, then a new key.
            Err(NoAnswer::Failed(PaymentError::ReplayedServerError { .. }))
                if !self.must_reconcile =>
            {
                self.must_reconcile = true;
                self.charge_or_look()
            }
            // A replay answers `processing` for as long as the provider keeps the key:
            // what the payment is now is the provider's current word.
            Err(NoAnswer::Failed(PaymentError::Pending { .. })) if self.rules.pending_is_live => {
                self.phase = Phase::Looking(Looking::InFlight);
                Step::Lookup
            }
            Err(NoAnswer::Failed(e)) => self.after_failed_charge(e),
        }
    }

    /// `complete`, fenced; when the fence is lost, by attempt (`by_attempt`): the
    /// charge is a fact about this attempt's key. A store error fails the record: a
    /// charge whose receipt is not stored is never acknowledged; the retry replays the
    /// same key.
    fn on_completed(
        &mut self,
        answer: Result<WriteOutcome, NoAnswer<StoreError>>,
        by_attempt: bool,
    ) -> Step {
        let answer = match answer {
            Ok(answer) => answer,
            Err(no_answer) => {
                return Step::Done(store_no_answer(
                    Call::Complete,
                    no_answer,
                    Some(self.lease.attempt),
                ));
            }
        };
        match answer {
            WriteOutcome::Applied(_) => Step::Done(self.take_success()),
            WriteOutcome::Refused(Some(old)) if self.is_done_with(&old) => {
                Step::Done(self.take_success())
            }
            WriteOutcome::Refused(_) if !by_attempt => {
                self.phase = Phase::CompletingByAttempt;
                Step::Write(WriteKind::CompleteAttempt)
            }
            WriteOutcome::Refused(old) => Step::Done(Outcome::NeedsReconciliation {
                cause: ReconcileCause::RecordMovedOn {
                    receipt: self.lease.receipt.clone().unwrap_or_default(),
                    attempt: self.lease.attempt,
                    state: old.as_ref().map(|r| r.state.clone()),
                    record_attempt: old.as_ref().and_then(|r| r.attempt),
                    record_receipt: old.and_then(|r| r.receipt),
                },
            }),
        }
    }

    fn charge_or_look(&mut self) -> Step {
        if self.must_reconcile {
            self.phase = Phase::Looking(Looking::Reconcile);
            Step::Lookup
        } else {
            self.phase = Phase::Charging;
            self.charge_step()
        }
    }

    fn charge_step(&self) -> Step {
        Step::Charge {
            key: self.lease.provider_key(),
        }
    }

    fn complete(&mut self, receipt: Receipt, success: Outcome) -> Step {
        self.lease.receipt = Some(receipt.id);
        self.success = Some(success);
        self.phase = Phase::Completing;
        Step::Write(WriteKind::Complete)
    }

    fn take_success(&mut self) -> Outcome {
        self.success.take().unwrap_or_else(|| {
            let cause = RetryCause::OutOfPhase {
                phase: "completed",
                answer: "no success to report",
            };
            Outcome::retryable(cause, None)
        })
    }

    fn is_done_with(&self, record: &Record) -> bool {
        record.state == State::Done && record.receipt.as_deref() == self.lease.receipt.as_deref()
    }

    fn release(&mut self, kind: ReleaseKind, then: Outcome) -> Step {
        self.phase = Phase::Releasing(then);
        Step::Write(WriteKind::Release(kind))
    }
}

/// The outcome of a store call that gave no answer. A charge made before it is safe:
/// the retry replays the same key.
fn store_no_answer(call: Call, no_answer: NoAnswer<StoreError>, attempt: Option<u32>) -> Outcome {
    match no_answer {
        NoAnswer::NoTime => Outcome::Deadline {
            before: call,
            attempt,
        },
        NoAnswer::TimedOut => Outcome::retryable(RetryCause::StoreTimedOut(call), attempt),
        NoAnswer::Failed(source) => Outcome::retryable(
            RetryCause::Store {
                call,
                source: Shared::new(source),
            },
            attempt,
        ),
    }
}
