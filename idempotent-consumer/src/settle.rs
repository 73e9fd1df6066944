//! The settlement of an awaited effect, as a pure machine beside the record's
//! ([`crate::machine`]): read the record, fetch the provider's object by its reference,
//! cancel it, move the wait's end, report the end, write. Its decisions take the
//! provider's answer, never what an event's body says, since anyone allowed to send to
//! the queue can write one. A consumer's event path, a scheduled settler and a model
//! checker all drive this one machine; the writes are the table's `Settle` and `Adopt`
//! ([`crate::table`]), each conditioned on the record, so a repeated event or a second
//! settler changes nothing.

use crate::clock::Time;
use crate::executor::NoAnswer;
use crate::machine::{Call, Cancel, End, Ignored, Retry, Shared, Unproven, Unresolved};
use crate::queue::QueueError;
use crate::record::{Fingerprint, Key, Record, State};
use crate::rules::Rules;
use crate::store::{AdoptRequest, SettleRequest, Settled, StoreError, Write, WriteOutcome};

mod steps;
#[cfg(test)]
mod tests;

pub use steps::{Now, Seen, SettleInput, SettleStep, Trigger};

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

/// One settlement of one reference of one fact. Pure: the record read, the provider's
/// answers and each write's outcome come in; the next step comes out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Settlement {
    key: Key,
    reference: String,
    /// What the event claims (the settler claims nothing).
    claimed: Option<Now>,
    record: Option<Record>,
    seen: Option<Seen>,
    now: Time,
    /// `expires` of a record completed now.
    done_until: Time,
    rules: Rules,
    phase: Phase,
    /// A refused cancel: the object was fetched again (once).
    looked_again: bool,
    refusals: u8,
}

impl Settlement {
    /// A settlement of `key`'s fact started at `now`; a record it completes is kept
    /// until `done_until`.
    pub fn new<F>(
        key: Key,
        trigger: Trigger,
        now: Time,
        done_until: Time,
        rules: Rules,
    ) -> (Self, SettleStep<F>) {
        let (reference, claimed, record) = match trigger {
            Trigger::Event { reference, claimed } => (reference, Some(claimed), None),
            Trigger::Due(record) => (
                record.awaited.clone().unwrap_or_default(),
                None,
                Some(*record),
            ),
        };
        let mut settlement = Self {
            key,
            reference,
            claimed,
            record,
            seen: None,
            now,
            done_until,
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

    /// The key of the fact settled.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The provider's answer, already fetched (a thin event's fact was read from it):
    /// after the read, the settlement decides on it without fetching again.
    pub fn prefetched(&mut self, seen: Seen) {
        self.seen = Some(seen);
    }

    /// The reference settled.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The request of a [`SettleStep::Write`].
    pub fn write(&self) -> Option<Write<'_>> {
        match &self.phase {
            Phase::Writing(Writing::Settle(settled)) => Some(Write::Settle(SettleRequest {
                pk: &self.key,
                awaited: &self.reference,
                settled: settled.clone(),
            })),
            Phase::Writing(Writing::Adopt(fingerprint)) => Some(Write::Adopt(AdoptRequest {
                pk: &self.key,
                receipt: &self.reference,
                fingerprint,
                now: self.now,
                expires: self.done_until,
            })),
            _ => None,
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on<F>(&mut self, input: SettleInput<F>) -> SettleStep<F> {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, input) {
            (Phase::Reading, SettleInput::Read(Ok(record))) => self.on_read(record),
            (Phase::Fetching, SettleInput::Fetched(Ok(Some(seen)))) => {
                if seen.fact_id.as_deref() != Some(self.key.id()) {
                    return self.ignored(Ignored::AnotherFacts);
                }
                self.seen = Some(seen);
                self.decide()
            }
            (Phase::Fetching, SettleInput::Fetched(Ok(None))) => self.on_missing(),
            (Phase::Cancelling, SettleInput::Cancelled(Ok(Cancel::Cancelled))) => {
                if let Some(seen) = &mut self.seen {
                    seen.now = Now::Cancelled;
                }
                self.decide()
            }
            (Phase::Cancelling, SettleInput::Cancelled(Ok(Cancel::NotCancellable))) => {
                // It may have been done meanwhile: look again, once.
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
                    return SettleStep::Done(End::InProgress { until: None });
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
                NoAnswer::TimedOut => End::retry(Retry::CancelTimedOut, None),
                NoAnswer::Failed(e) => End::retry(Retry::Cancel(e), None),
            }),
            (Phase::Reporting, SettleInput::Reported(Err(e))) => {
                // The record still awaits, its end at now: the retry reports again.
                let e = match e {
                    NoAnswer::NoTime => return SettleStep::Done(deadline(Call::Settle)),
                    NoAnswer::TimedOut => QueueError::TimedOut,
                    NoAnswer::Failed(e) => e,
                };
                SettleStep::Done(End::retry(Retry::Report(Shared::new(e)), None))
            }
            (phase, input) => SettleStep::Done(End::retry(
                Retry::OutOfPhase {
                    phase: phase.name(),
                    answer: input.name(),
                },
                None,
            )),
        }
    }

    /// The record read: done with this reference already (no call), else the object
    /// fetched from the provider (or, for the mutant that believes events, the event's
    /// claim taken as the answer).
    fn on_read<F>(&mut self, record: Option<Record>) -> SettleStep<F> {
        self.record = record;
        let done_with_it = self.record.as_ref().is_some_and(|r| {
            r.state == State::Done && r.receipt.as_deref() == Some(&self.reference)
        });
        if done_with_it {
            // Already the receipt: no call.
            return self.ignored(Ignored::AlreadyDone);
        }
        if self.rules.event_is_a_hint {
            match self.seen.take() {
                Some(seen) => {
                    self.phase = Phase::Fetching;
                    self.on(SettleInput::Fetched(Ok(Some(seen))))
                }
                None => self.fetch(),
            }
        } else {
            // The mutant: the event's body is believed.
            self.seen = self.claimed.map(|now| Seen {
                now,
                fact_id: Some(self.key.id().to_owned()),
                fingerprint: self.record.as_ref().and_then(|r| r.fingerprint.clone()),
            });
            self.decide()
        }
    }

    /// The provider does not have the object (404): a fault that ends nothing (or,
    /// for the mutant, "gone" read as cancelled).
    fn on_missing<F>(&mut self) -> SettleStep<F> {
        if self.rules.missing_is_a_fault {
            return SettleStep::Done(missing(&self.reference));
        }
        self.seen = Some(Seen {
            now: Now::Cancelled,
            fact_id: Some(self.key.id().to_owned()),
            fingerprint: None,
        });
        self.decide()
    }

    /// A write applied: the wait's end moved to now (report, then end it), or the
    /// settlement's end.
    fn on_applied<F>(&mut self, writing: &Writing) -> SettleStep<F> {
        match writing {
            Writing::Settle(Settled::Ending { .. }) => {
                self.phase = Phase::Reporting;
                SettleStep::Report
            }
            Writing::Settle(Settled::Ended) => SettleStep::Done(End::Settled {
                reference: self.reference.clone(),
                done: false,
            }),
            Writing::Settle(Settled::Done { .. }) | Writing::Adopt(_) => {
                SettleStep::Done(End::Settled {
                    reference: self.reference.clone(),
                    done: true,
                })
            }
        }
    }

    fn fetch<F>(&mut self) -> SettleStep<F> {
        self.phase = Phase::Fetching;
        SettleStep::Fetch
    }

    fn ignored<F>(&mut self, why: Ignored) -> SettleStep<F> {
        self.phase = Phase::Done;
        SettleStep::Done(End::Ignored {
            reference: self.reference.clone(),
            why,
        })
    }

    fn settle<F>(&mut self, settled: Settled) -> SettleStep<F> {
        self.phase = Phase::Writing(Writing::Settle(settled));
        SettleStep::Write
    }

    /// What the provider's answer means for the record as it stands.
    fn decide<F>(&mut self) -> SettleStep<F> {
        let Some(seen) = self.seen.clone() else {
            return self.ignored(Ignored::AnswerMissing);
        };
        let record = self.record.clone();
        let awaits_it = record.as_ref().is_some_and(|r| {
            r.state == State::Awaiting
                && (!self.rules.settle_names_what_it_awaits
                    || r.awaited.as_deref() == Some(&self.reference))
        });
        match seen.now {
            Now::Done if awaits_it => {
                // Done as the fact said, or (the person chose other fields) with what
                // was done kept beside the fact's fingerprint.
                let fact = record.as_ref().and_then(|r| r.fingerprint.as_ref());
                let other = seen.fingerprint.clone().filter(|f| Some(f) != fact);
                self.settle(Settled::Done {
                    expires: self.done_until,
                    done_fingerprint: other,
                })
            }
            Now::Done => self.done_unawaited(record.as_ref(), &seen),
            Now::Cancelled if awaits_it => self.end(record.as_ref()),
            Now::Cancelled => self.ignored(Ignored::NotAwaited),
            // Open, or its attempt failed: the person may still confirm it. Past the
            // wait's end the settler cancels it first; nothing else ends a wait.
            Now::Open | Now::AttemptFailed
                if awaits_it && !self.looked_again && self.past_end(record.as_ref()) =>
            {
                if self.rules.wait_ends_only_when_cancelled {
                    self.phase = Phase::Cancelling;
                    SettleStep::Cancel
                } else {
                    // The mutant: the wait ends with its object still open.
                    self.end(record.as_ref())
                }
            }
            Now::AttemptFailed if awaits_it && !self.rules.wait_ends_only_when_cancelled => {
                // The mutant: a failed attempt ends the wait.
                self.end(record.as_ref())
            }
            Now::Open | Now::AttemptFailed | Now::InFlight => self.ignored(Ignored::NotFinal),
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

    /// The wait ends: its end moved to now first (when later), so a copy of the fact
    /// sent meanwhile is retried, not acknowledged; then reported; then written.
    fn end<F>(&mut self, record: Option<&Record>) -> SettleStep<F> {
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

    /// An effect the provider says is done, which the record does not await: the
    /// record completes with it when it is provably this fact's and nothing else did
    /// the fact's effect; otherwise a person looks. Never acknowledged as nothing.
    fn done_unawaited<F>(&mut self, record: Option<&Record>, seen: &Seen) -> SettleStep<F> {
        let unproven = |why: Unproven, reference: &str| {
            SettleStep::Done(End::Unresolved {
                cause: Unresolved::Unproven {
                    reference: reference.to_owned(),
                    why,
                },
            })
        };
        let Some(record) = record else {
            self.phase = Phase::Done;
            return SettleStep::Done(End::Unrecorded {
                reference: self.reference.clone(),
            });
        };
        if !self.rules.effect_found_is_recorded {
            // The mutant: the provider's own success acknowledged as nothing.
            return self.ignored(Ignored::NotAwaited);
        }
        match record.state {
            // Recorded meanwhile (another delivery, the event or the settler): settled.
            State::Done if record.receipt.as_deref() == Some(&self.reference) => {
                self.ignored(Ignored::AlreadyDone)
            }
            State::Done => SettleStep::Done(End::Unresolved {
                cause: Unresolved::LateConfirmation {
                    reference: self.reference.clone(),
                    receipt: record.receipt.clone().unwrap_or_default(),
                },
            }),
            State::InProgress if record.lease_until.is_none_or(|h| h >= self.now) => {
                SettleStep::Done(End::InProgress {
                    until: record.lease_until,
                })
            }
            State::Awaiting => unproven(Unproven::AwaitsAnother, &self.reference),
            State::Uncertain => SettleStep::Done(End::Unresolved {
                cause: Unresolved::Table(crate::table::Unsettled::UncertainOutcome),
            }),
            State::Other(_) => SettleStep::Done(End::Unresolved {
                cause: Unresolved::Table(crate::table::Unsettled::UnknownState),
            }),
            State::Free | State::Failed | State::InProgress => match &seen.fingerprint {
                Some(fingerprint) if record.fingerprint.as_ref() == Some(fingerprint) => {
                    self.phase = Phase::Writing(Writing::Adopt(fingerprint.clone()));
                    SettleStep::Write
                }
                _ => unproven(Unproven::OtherFields, &self.reference),
            },
        }
    }
}

/// The provider has no object `reference`. It never deletes one, so a setting is
/// wrong: a fault that ends nothing, retried once it is fixed.
pub fn missing<F>(reference: &str) -> End<F> {
    End::retry(
        Retry::Missing {
            reference: reference.to_owned(),
        },
        None,
    )
}

/// A fetch of the object that had no answer, or a failing one.
pub fn fetch_failed<F>(no_answer: NoAnswer<F>) -> End<F> {
    match no_answer {
        NoAnswer::NoTime => deadline(Call::Lookup),
        NoAnswer::TimedOut => End::retry(Retry::LookupTimedOut, None),
        NoAnswer::Failed(e) => End::retry(Retry::Lookup(e), None),
    }
}

fn deadline<F>(before: Call) -> End<F> {
    End::Deadline {
        before,
        attempt: None,
    }
}

fn store_failed<F>(no_answer: NoAnswer<StoreError>) -> End<F> {
    match no_answer {
        NoAnswer::NoTime => deadline(Call::Settle),
        NoAnswer::TimedOut => End::retry(Retry::StoreTimedOut(Call::Settle), None),
        NoAnswer::Failed(source) => End::retry(
            Retry::Store {
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

impl<F> SettleInput<F> {
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
