//! The state machine of one record, pure: the machine's state plus the answer to its
//! last step gives the next step, which is a conditional store write to attempt, a
//! call of the effect (perform under the key, look up, cancel), or the record's
//! [`End`]. No I/O, clock or randomness in here: the time and the owner token come in
//! as inputs. A driver performs each step with the real store and provider, a model
//! checker against a model of both. What each write requires and leaves is the table's
//! contract ([`crate::table`]); each rule can be switched off through [`Rules`], for a
//! model's mutants only.
//!
//! The effect is any effect a provider applies under an idempotency key and can be
//! asked about: the machine reads its failures through [`Classify`], its lookups as
//! [`Found`]. With a provider that keeps each key and can be asked ([`Unknown::LookedUp`])
//! it never applies the effect twice: an unknown outcome keeps the key (the provider
//! replays it) or is looked up before a new key; an open attempt someone could still
//! confirm is cancelled (or awaited) before a new key; a success is recorded by a write
//! fenced on the lease, or by its attempt when the fence was lost. Without one, the
//! effect states which way an unknown outcome goes ([`Unknown`]).

mod end;
mod failures;
mod looking;
mod steps;
#[cfg(test)]
mod tests;

pub use end::{Awaited, Call, End, Ignored, Refusal, Retry, Shared, Unproven, Unresolved};
use looking::Looking;
pub use looking::{LOOKUP_CLOCK_MARGIN, lookup_since};
pub use steps::{Cancel, Class, Classify, Found, Input, Receipt, Step, WriteKind};

use crate::clock::Time;
use crate::executor::NoAnswer;
use crate::lease::Lease;
use crate::record::{Identity, Owner, Record, State};
use crate::rules::Rules;
use crate::store::{
    AwaitRequest, CorrectRequest, ReleaseKind, ReserveRequest, StoreError, Write, WriteOutcome,
};
use crate::table::{Reservation, judge};
use std::time::Duration;

/// Where the machine is: which answer it waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase<F> {
    Reserving,
    Looking(Looking<F>),
    Cancelling(Looking<F>),
    MovingKey,
    Performing,
    Completing,
    CompletingByAttempt,
    /// Handing the fact to someone else (`Awaiting`).
    Awaiting,
    /// Releasing; then the record ends with this end.
    Releasing(End<F>),
    /// The record taking this delivery's corrected payload (`Correct`); a reserve
    /// follows.
    Correcting,
    Done(End<F>),
}

impl<F> Phase<F> {
    fn name(&self) -> &'static str {
        match self {
            Self::Reserving => "reserving",
            Self::Looking(_) => "looking",
            Self::Cancelling(_) => "cancelling",
            Self::MovingKey => "moving key",
            Self::Performing => "performing",
            Self::Completing => "completing",
            Self::CompletingByAttempt => "completing by attempt",
            Self::Awaiting => "awaiting",
            Self::Releasing(_) => "releasing",
            Self::Correcting => "correcting",
            Self::Done(_) => "done",
        }
    }
}

/// What an unknown outcome of the effect (a timeout, a lost answer, a 5xx) means, by
/// what its provider offers: stated by the effect, never guessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Unknown {
    /// The provider keeps each idempotency key and can be asked what it did: the key
    /// is replayed (the provider answers as the first time), or looked up before a new
    /// one. Exactly once in effect.
    #[default]
    LookedUp,
    /// No key or no lookup, and a second application is acceptable (a notification):
    /// the next delivery performs it again, under the next key.
    AtLeastOnce,
    /// No key or no lookup, and a second application is not acceptable: the record
    /// becomes `Uncertain`, final for every delivery, and the fact goes to a person
    /// (the dead-letter queue) instead of being performed again.
    AtMostOnce,
}

/// What one record starts from: all of it comes from outside the machine.
#[derive(Clone, Debug)]
pub struct Start {
    /// The fact's key and fingerprint.
    pub identity: Identity,
    /// The fresh random owner token of this attempt.
    pub owner: Owner,
    /// When the record starts: the reservation's time.
    pub now: Time,
    /// The invocation deadline: the lease's end.
    pub deadline: Time,
    /// `expires` written with the reservation and the completion.
    pub expires: Time,
    /// A fact refused this many times is not sent to the provider again, until a person
    /// resets the count.
    pub max_refusals: u32,
    /// Keys first sent longer ago than this are looked up before reuse (the
    /// provider's retention of its idempotency keys, less a margin).
    pub key_ttl: Duration,
    /// How long a fact awaits someone's confirmation.
    pub someone_wait: Duration,
    /// How long a fact awaits an effect the provider processes.
    pub processing_wait: Duration,
    /// What an unknown outcome means for this effect.
    pub unknown: Unknown,
    /// The safety rules: all on, but for a model's mutants.
    pub rules: Rules,
}

/// One record's state machine; `F` is the effect's failure.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Machine<F> {
    /// The record's key, owner, attempt, lease end (the invocation deadline), creation
    /// once reserved, and the receipt to record: shared with `resolve`.
    lease: Lease,
    started_at: Time,
    max_refusals: u32,
    key_ttl: Duration,
    someone_wait: Duration,
    processing_wait: Duration,
    unknown: Unknown,
    rules: Rules,
    phase: Phase<F>,
    must_reconcile: bool,
    /// Open attempts cancelled in this delivery.
    cancels: u8,
    /// The end once the effect is recorded.
    success: Option<End<F>>,
    /// The reference the record awaits, once there is one, and why.
    awaited: Option<(String, Awaited)>,
    /// This delivery's corrected payload took the record (once a delivery).
    corrected: bool,
}

impl<F: Classify + Clone> Machine<F> {
    /// A record about to be reserved; the first step is [`WriteKind::Reserve`].
    pub fn new(start: Start) -> (Self, Step<F>) {
        let machine = Self {
            lease: Lease::new(start.identity, start.owner, start.deadline, start.expires),
            started_at: start.now,
            max_refusals: start.max_refusals,
            key_ttl: start.key_ttl,
            someone_wait: start.someone_wait,
            processing_wait: start.processing_wait,
            unknown: start.unknown,
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

    /// Where a lookup of the fact's effects starts (the record's creation, less a
    /// margin for clocks): older objects of the provider are never read.
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
            max_refusals: self.max_refusals,
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

    /// When the wait ends: from the record's start, in whole seconds.
    fn wait_until(&self) -> Time {
        Time::from_secs((self.started_at + self.wait()).as_secs())
    }

    /// How long the record awaits: someone's confirmation, or an effect the provider
    /// processes (a transfer clears in days, and copies of the fact are retried once
    /// the wait has passed).
    fn wait(&self) -> Duration {
        match self.awaited {
            Some((_, Awaited::Processing)) => self.processing_wait,
            _ => self.someone_wait,
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: Input<F>) -> Step<F> {
        let phase = std::mem::replace(
            &mut self.phase,
            Phase::Done(End::InProgress { until: None }),
        );
        let step = self.next(phase, input);
        if let Step::Done(end) = &step {
            self.phase = Phase::Done(end.clone());
        }
        step
    }

    /// One method per phase; an answer its phase does not expect is a bug, and fails
    /// the record with a safe retry.
    fn next(&mut self, phase: Phase<F>, input: Input<F>) -> Step<F> {
        match (phase, input) {
            (Phase::Reserving, Input::Written(answer)) => self.on_reserved(answer),
            (Phase::Looking(why), Input::Looked(answer)) => self.on_looked(why, answer),
            (Phase::Cancelling(why), Input::Cancelled(answer)) => self.on_cancelled(why, answer),
            (Phase::MovingKey, Input::Written(answer)) => self.on_moved_key(answer),
            (Phase::Performing, Input::Performed(answer)) => self.on_performed(answer),
            (Phase::Completing, Input::Written(answer)) => self.on_completed(answer, false),
            (Phase::CompletingByAttempt, Input::Written(answer)) => self.on_completed(answer, true),
            (Phase::Awaiting, Input::Written(answer)) => self.on_awaiting(answer),
            (Phase::Correcting, Input::Written(answer)) => self.on_corrected(answer),
            // A failed or skipped release is never fatal: the lease ends at the
            // deadline anyway, and the record already fails.
            (Phase::Releasing(end), Input::Written(_)) => Step::Done(end),
            (Phase::Done(end), _) => Step::Done(end),
            (phase, input) => Step::Done(End::retry(
                Retry::OutOfPhase {
                    phase: phase.name(),
                    answer: input.name(),
                },
                Some(self.lease.attempt),
            )),
        }
    }

    /// Reserve: won → perform (or look up an old key first); lost → judged.
    fn on_reserved(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step<F> {
        let answer = match answer {
            Ok(answer) => answer,
            Err(no_answer) => return Step::Done(store_no_answer(Call::Reserve, no_answer, None)),
        };
        let req = self.reserve_request();
        let end = match judge(answer, &req) {
            Reservation::Won(record) => {
                self.lease.granted(&record);
                let age = record
                    .sent
                    .unwrap_or(self.started_at)
                    .until(self.started_at);
                // A key sent before this delivery: an earlier one may have performed
                // the effect and died before recording it. At most once, it is never
                // performed again.
                if self.unknown == Unknown::AtMostOnce && age > Duration::ZERO {
                    return self.uncertain();
                }
                self.must_reconcile =
                    self.rules.reconcile_old_keys && self.looks_up() && age > self.key_ttl;
                return self.perform_or_look();
            }
            Reservation::Duplicate { receipt } => End::Duplicate { receipt },
            // The fact may have ended without its effect: a corrected copy takes it, if
            // the table's condition says no effect of it can still happen.
            Reservation::Conflict { ended: true, .. } if !self.corrected => {
                self.corrected = true;
                self.phase = Phase::Correcting;
                return Step::Write(WriteKind::Correct);
            }
            Reservation::Conflict { .. } => End::Conflict,
            Reservation::InProgress { until } => End::InProgress { until },
            Reservation::RefusalLimit { refusals } => End::RefusalLimit { refusals },
            Reservation::NeedsReconciliation { cause } => End::Unresolved {
                cause: Unresolved::Table(cause),
            },
            Reservation::Awaiting { awaited } => End::AlreadyAwaiting { reference: awaited },
        };
        Step::Done(end)
    }

    /// The corrected payload took the record (its next key): reserve it. Refused: an
    /// effect of the fact may still happen, so this payload is a conflict.
    fn on_corrected(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step<F> {
        match answer {
            Ok(WriteOutcome::Applied(_)) => {
                self.phase = Phase::Reserving;
                Step::Write(WriteKind::Reserve)
            }
            Ok(WriteOutcome::Refused(_)) => Step::Done(End::Conflict),
            Err(no_answer) => Step::Done(store_no_answer(Call::Reserve, no_answer, None)),
        }
    }

    /// The move to the next attempt's key, after a lookup found nothing.
    fn on_moved_key(&mut self, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step<F> {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(WriteOutcome::Applied(record)) => {
                self.lease.attempt = record.attempt();
                self.phase = Phase::Performing;
                self.perform_step()
            }
            Ok(WriteOutcome::Refused(_)) => {
                Step::Done(End::retry(Retry::LeaseLostBeforeNextAttempt, attempt))
            }
            Err(failed @ NoAnswer::Failed(_)) => {
                let end = store_no_answer(Call::NextAttempt, failed, attempt);
                self.release(ReleaseKind::KeepKey, end)
            }
            Err(no_answer) => Step::Done(store_no_answer(Call::NextAttempt, no_answer, attempt)),
        }
    }

    /// The effect: a receipt → complete; a replayed 5xx or an effect in flight → look
    /// it up, the key kept; anything else → release, the key moved only after a
    /// refusal.
    fn on_performed(&mut self, answer: Result<Receipt, NoAnswer<F>>) -> Step<F> {
        let failure = match answer {
            Ok(receipt) => {
                let success = End::Done {
                    receipt: receipt.clone(),
                    attempt: self.lease.attempt,
                    found: false,
                };
                return self.complete(receipt, success);
            }
            Err(NoAnswer::NoTime) => {
                return Step::Done(End::Deadline {
                    before: Call::Perform,
                    attempt: Some(self.lease.attempt),
                });
            }
            Err(NoAnswer::TimedOut) => return self.after_uncertain(Retry::EffectTimedOut),
            Err(NoAnswer::Failed(failure)) => failure,
        };
        if !self.looks_up() {
            return self.after_failure(failure);
        }
        match failure.class() {
            // The original outcome is unknown and may still become an effect: look
            // it up, and keep the key whatever the lookup finds not.
            Class::ReplayedServerError { status } if self.rules.keep_key_after_server_error => {
                self.phase = Phase::Looking(Looking::AfterServerError(status));
                Step::Lookup
            }
            // The mutant: look up as for a forgotten key, then a new key.
            Class::ReplayedServerError { .. } if !self.must_reconcile => {
                self.must_reconcile = true;
                self.perform_or_look()
            }
            // A replay answers "in flight" for as long as the provider keeps the key:
            // what the effect is now is the provider's current word.
            Class::InFlight { .. } if self.rules.pending_is_live => {
                self.phase = Phase::Looking(Looking::InFlight);
                Step::Lookup
            }
            _ => self.after_failure(failure),
        }
    }

    /// `complete`, fenced; when the fence is lost, by attempt (`by_attempt`): the
    /// effect is a fact about this attempt's key. A store error fails the record: an
    /// effect whose receipt is not stored is never acknowledged; the retry replays the
    /// same key.
    fn on_completed(
        &mut self,
        answer: Result<WriteOutcome, NoAnswer<StoreError>>,
        by_attempt: bool,
    ) -> Step<F> {
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
            WriteOutcome::Refused(old) => Step::Done(End::Unresolved {
                cause: Unresolved::RecordMovedOn {
                    receipt: self.lease.receipt.clone().unwrap_or_default(),
                    attempt: self.lease.attempt,
                    state: old.as_ref().map(|r| r.state.clone()),
                    record_attempt: old.as_ref().and_then(|r| r.attempt),
                    record_receipt: old.and_then(|r| r.receipt),
                },
            }),
        }
    }

    /// Whether the provider keeps the key and can be asked what it did.
    fn looks_up(&self) -> bool {
        self.unknown == Unknown::LookedUp
    }

    fn perform_or_look(&mut self) -> Step<F> {
        if self.must_reconcile {
            self.phase = Phase::Looking(Looking::Reconcile);
            Step::Lookup
        } else {
            self.phase = Phase::Performing;
            self.perform_step()
        }
    }

    fn perform_step(&self) -> Step<F> {
        Step::Perform {
            key: self.lease.provider_key(),
        }
    }

    fn complete(&mut self, receipt: Receipt, success: End<F>) -> Step<F> {
        self.lease.receipt = Some(receipt.id);
        self.success = Some(success);
        self.phase = Phase::Completing;
        Step::Write(WriteKind::Complete)
    }

    fn take_success(&mut self) -> End<F> {
        self.success.take().unwrap_or_else(|| {
            let cause = Retry::OutOfPhase {
                phase: "completed",
                answer: "no success to report",
            };
            End::retry(cause, None)
        })
    }

    fn is_done_with(&self, record: &Record) -> bool {
        record.state == State::Done && record.receipt.as_deref() == self.lease.receipt.as_deref()
    }

    fn release(&mut self, kind: ReleaseKind, then: End<F>) -> Step<F> {
        self.phase = Phase::Releasing(then);
        Step::Write(WriteKind::Release(kind))
    }
}

/// The end of a store call that gave no answer. An effect performed before it is
/// safe: the retry replays the same key.
fn store_no_answer<F>(call: Call, no_answer: NoAnswer<StoreError>, attempt: Option<u32>) -> End<F> {
    match no_answer {
        NoAnswer::NoTime => End::Deadline {
            before: call,
            attempt,
        },
        NoAnswer::TimedOut => End::retry(Retry::StoreTimedOut(call), attempt),
        NoAnswer::Failed(source) => End::retry(
            Retry::Store {
                call,
                source: Shared::new(source),
            },
            attempt,
        ),
    }
}
