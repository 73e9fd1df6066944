//! The state machine of one record as a pure core (DESIGN §5, §10): the core's state
//! plus an input gives the next step, which is a conditional store write to attempt, a
//! provider call to make, or the record's final [`Outcome`]. No I/O, clock or
//! randomness in here: the time and the owner token come in as inputs. The async
//! driver (`machine.rs`) performs each step with the real store and provider; the
//! model checker (`examples/model.rs`) performs them against a model of both.
//!
//! The conditions every store write must meet, and what it writes, are stated once,
//! in [`holds`] and [`apply`]. The DynamoDB expressions and the SQLite SQL implement
//! them; the contract suite checks both adapters against these two functions.
//!
//! Each rule of DESIGN §4–5 can be switched off through [`Rules`], for the model
//! checker's mutants only: production always runs [`Rules::ALL`].

use super::outcome::{Call, Outcome, ReconcileCause, RetryCause, Shared};
use super::{
    CompleteRequest, Fingerprint, Key, Owner, Record, ReleaseKind, ReleaseRequest, ReserveRequest,
    ResolveLeaseRequest, State, StoreError, WriteOutcome,
};
use std::time::Duration;

use crate::clock::Time;
use crate::payment::{Lookup, PaymentError, Receipt};

/// The safety rules of DESIGN §4–5. Each exists because switching it off lets the
/// model checker find a double charge or a lost message (`make model MUTANT=…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// `complete` and `release` are fenced on the owner token.
    pub fenced: bool,
    /// An uncertain charge failure (timeout, 5xx, …) keeps the provider key.
    pub keep_key_when_uncertain: bool,
    /// `hecho` is final, whatever `expira` says.
    pub done_is_final: bool,
    /// The provider gets the idempotency key `<pk>#<intento>`.
    pub provider_key: bool,
    /// A `pending` charge found by reconciliation is live: no new key.
    pub pending_is_live: bool,
    /// A key older than the provider-key TTL is reconciled before it is reused.
    pub reconcile_old_keys: bool,
}

impl Rules {
    /// Every rule on: the only value production uses.
    pub const ALL: Self = Self {
        fenced: true,
        keep_key_when_uncertain: true,
        done_is_final: true,
        provider_key: true,
        pending_is_live: true,
        reconcile_old_keys: true,
    };
}

impl Default for Rules {
    fn default() -> Self {
        Self::ALL
    }
}

/// One conditional write to the idempotency table.
#[derive(Clone, Debug)]
pub enum Write<'a> {
    Reserve(ReserveRequest<'a>),
    Complete(CompleteRequest<'a>),
    CompleteAttempt(CompleteRequest<'a>),
    Release(ReleaseRequest<'a>),
    NextAttempt {
        pk: &'a Key,
        owner: &'a Owner,
        now: Time,
    },
    LeaseForResolve(ResolveLeaseRequest<'a>),
}

/// Whether `write`'s condition holds on the stored item (`None`: absent). Comparisons
/// with a missing attribute are false, as in DynamoDB condition expressions and SQL.
pub fn holds(write: &Write<'_>, stored: Option<&Record>, rules: Rules) -> bool {
    let Some(r) = stored else {
        return matches!(write, Write::Reserve(_));
    };
    let fenced = |owner: &Owner| {
        r.state == State::InProgress && (!rules.fenced || r.owner.as_ref() == Some(owner))
    };
    match write {
        Write::Reserve(req) => {
            let counts_as_absent = (!rules.done_is_final || r.state != State::Done)
                && r.expires.is_some_and(|e| e.as_secs() < req.now.as_secs())
                && r.fingerprint.is_some();
            let same_payload = r.fingerprint.as_ref() == Some(req.fingerprint);
            let below_limit = r.declines.is_none_or(|n| n < req.max_declines);
            let free = r.state == State::Free
                || (r.state == State::InProgress && r.lease_until.is_some_and(|h| h < req.now));
            counts_as_absent || (same_payload && below_limit && free)
        }
        Write::Complete(req) => fenced(req.owner),
        Write::CompleteAttempt(req) => r.attempt == Some(req.attempt) && r.state != State::Done,
        Write::Release(req) => fenced(req.owner),
        Write::NextAttempt { owner, .. } => fenced(owner),
        Write::LeaseForResolve(req) => {
            r.state != State::Done
                && (r.state != State::InProgress || r.lease_until.is_none_or(|h| h < req.now))
                && r.fingerprint.as_ref().is_none_or(|h| h == req.fingerprint)
        }
    }
}

/// The item `write` leaves when its condition holds on `stored`.
pub fn apply(write: &Write<'_>, stored: Option<&Record>) -> Record {
    let mut r = stored
        .cloned()
        .unwrap_or_else(|| Record::new(pk_of(write).clone(), State::Free));
    match write {
        Write::Reserve(req) => {
            r.state = State::InProgress;
            r.owner = Some(req.owner.clone());
            r.lease_until = Some(req.lease_until);
            r.fingerprint = Some(req.fingerprint.clone());
            r.expires = Some(req.expires);
            r.created = r.created.or(Some(req.now));
            r.attempt = r.attempt.or(Some(1));
            r.sent = r.sent.or(Some(req.now));
        }
        Write::Complete(req) | Write::CompleteAttempt(req) => {
            r.state = State::Done;
            r.receipt = Some(req.receipt.to_owned());
            r.expires = Some(req.expires);
            r.owner = None;
            r.lease_until = None;
        }
        Write::Release(req) => {
            r.state = State::Free;
            r.owner = None;
            r.lease_until = None;
            if req.kind != ReleaseKind::KeepKey {
                r.attempt = r.attempt.map(|i| i + 1);
                r.sent = None;
            }
            match req.kind {
                ReleaseKind::Declined => r.declines = Some(r.declines.unwrap_or(0) + 1),
                ReleaseKind::NextKey {
                    reset_declines: true,
                } => r.declines = None,
                _ => {}
            }
        }
        Write::NextAttempt { now, .. } => {
            r.attempt = r.attempt.map(|i| i + 1);
            r.sent = Some(*now);
        }
        Write::LeaseForResolve(req) => {
            r.state = State::InProgress;
            r.owner = Some(req.owner.clone());
            r.lease_until = Some(req.lease_until);
            r.fingerprint = r.fingerprint.or_else(|| Some(req.fingerprint.clone()));
            r.attempt = r.attempt.or(Some(1));
            r.sent = r.sent.or(Some(req.now));
            r.created = r.created.or(Some(req.now));
        }
    }
    r
}

fn pk_of<'a>(write: &Write<'a>) -> &'a Key {
    match write {
        Write::Reserve(r) => r.pk,
        Write::Complete(r) | Write::CompleteAttempt(r) => r.pk,
        Write::Release(r) => r.pk,
        Write::NextAttempt { pk, .. } => pk,
        Write::LeaseForResolve(r) => r.pk,
    }
}

/// Why a call gave no answer (a store or provider call of the driver).
#[derive(Debug)]
pub enum Cut<E> {
    /// Too little time left before the deadline: not started.
    NoTime,
    /// Started, and its timeout ended first: the outcome is unknown.
    TimedOut,
    /// It answered with an error.
    Failed(E),
}

/// The kinds of write the core asks for; [`Core::write`] builds the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    Reserve,
    Complete,
    CompleteAttempt,
    Release(ReleaseKind),
    NextAttempt,
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Perform [`Core::write`] for this kind; answer with [`Input::Written`].
    Write(WriteKind),
    /// Charge the order under this provider key (`None`: only under a mutant);
    /// answer with [`Input::Charged`].
    Charge { key: Option<String> },
    /// Look the order's charge up; answer with [`Input::Looked`].
    Lookup,
    /// The record's end.
    Done(Outcome),
}

/// The answer to the last step.
#[derive(Debug)]
pub enum Input {
    Written(Result<WriteOutcome, Cut<StoreError>>),
    Charged(Result<Receipt, Cut<PaymentError>>),
    Looked(Result<Lookup, Cut<PaymentError>>),
}

impl Input {
    fn name(&self) -> &'static str {
        match self {
            Self::Written(_) => "written",
            Self::Charged(_) => "charged",
            Self::Looked(_) => "looked up",
        }
    }
}

/// How a reservation was judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// We hold the lease; the record as written.
    Won(Record),
    /// Already charged: ack with the stored receipt.
    Duplicate { receipt: Option<String> },
    /// Same key, other payload: never charged.
    Conflict {
        stored_fingerprint: Option<Fingerprint>,
    },
    /// Someone else holds a live lease.
    InProgress { until: Option<Time> },
    /// The order was declined `max_declines` times: no provider call until a human
    /// resets the count (`resolve --retry-declined`).
    DeclineLimit { declines: u32 },
    /// A human (or `resolve`) must look at the provider first.
    NeedsReconciliation { cause: ReconcileCause },
}

/// Judges the answer to a reserve (DESIGN §5 "reserve").
pub fn judge(answer: WriteOutcome, req: &ReserveRequest<'_>) -> Reservation {
    match answer {
        WriteOutcome::Applied(record) => Reservation::Won(record),
        WriteOutcome::Refused(Some(old)) => classify_lost(old, req),
        // The item that failed the condition is gone (TTL swept it between the write
        // and the read): nothing is known, so retry later rather than guess.
        WriteOutcome::Refused(None) => Reservation::InProgress { until: None },
    }
}

fn classify_lost(old: Record, req: &ReserveRequest<'_>) -> Reservation {
    if old.is_card_format() {
        return match old.state {
            State::Done => Reservation::Duplicate {
                receipt: old.receipt,
            },
            _ => Reservation::NeedsReconciliation {
                cause: ReconcileCause::CardItemNotDone,
            },
        };
    }
    if old.fingerprint.as_ref() != Some(req.fingerprint) {
        return Reservation::Conflict {
            stored_fingerprint: old.fingerprint,
        };
    }
    let lease_live = old.lease_until.is_some_and(|until| until >= req.now);
    match old.state {
        State::Done => Reservation::Duplicate {
            receipt: old.receipt,
        },
        // The SDK retried a reserve that had been applied: the lease is ours.
        State::InProgress if old.owner.as_ref() == Some(req.owner) => Reservation::Won(old),
        State::InProgress if lease_live => Reservation::InProgress {
            until: old.lease_until,
        },
        State::InProgress | State::Free if old.declines() >= req.max_declines => {
            Reservation::DeclineLimit {
                declines: old.declines(),
            }
        }
        State::InProgress | State::Free => Reservation::InProgress {
            until: old.lease_until,
        },
        State::Other(_) => Reservation::NeedsReconciliation {
            cause: ReconcileCause::UnknownState,
        },
    }
}

/// Where the core is: which answer it waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Reserving,
    Looking,
    MovingKey,
    Charging,
    Completing,
    CompletingByAttempt,
    /// Releasing; then the record ends with this outcome.
    Releasing(Outcome),
    Done(Outcome),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Reserving => "reserving",
            Self::Looking => "looking",
            Self::MovingKey => "moving key",
            Self::Charging => "charging",
            Self::Completing => "completing",
            Self::CompletingByAttempt => "completing by attempt",
            Self::Releasing(_) => "releasing",
            Self::Done(_) => "done",
        }
    }
}

/// What one record starts from: all of it comes from outside the core.
#[derive(Clone, Debug)]
pub struct Start {
    pub key: Key,
    pub fingerprint: Fingerprint,
    /// The fresh random owner token of this attempt.
    pub owner: Owner,
    pub now: Time,
    /// The invocation deadline: the lease's end.
    pub deadline: Time,
    /// `expira` written with the reservation and the completion.
    pub expires: Time,
    pub max_declines: u32,
    /// Keys first sent longer ago than this are reconciled before reuse.
    pub key_ttl: Duration,
    pub rules: Rules,
}

/// One record's state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Core {
    key: Key,
    fingerprint: Fingerprint,
    owner: Owner,
    started_at: Time,
    deadline: Time,
    expires: Time,
    max_declines: u32,
    key_ttl: Duration,
    rules: Rules,
    phase: Phase,
    attempt: u32,
    must_reconcile: bool,
    /// The charge to record, and the outcome once it is recorded.
    receipt: Option<String>,
    success: Option<Outcome>,
}

impl Core {
    /// A record about to be reserved; the first step is [`WriteKind::Reserve`].
    pub fn new(start: Start) -> (Self, Step) {
        let core = Self {
            key: start.key,
            fingerprint: start.fingerprint,
            owner: start.owner,
            started_at: start.now,
            deadline: start.deadline,
            expires: start.expires,
            max_declines: start.max_declines,
            key_ttl: start.key_ttl,
            rules: start.rules,
            phase: Phase::Reserving,
            attempt: 1,
            must_reconcile: false,
            receipt: None,
            success: None,
        };
        (core, Step::Write(WriteKind::Reserve))
    }

    /// The attempt whose key the core is on.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The reservation request (its time is the record's start).
    fn reserve_request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            pk: &self.key,
            fingerprint: &self.fingerprint,
            owner: &self.owner,
            now: self.started_at,
            lease_until: self.deadline,
            expires: self.expires,
            max_declines: self.max_declines,
        }
    }

    /// The request of a write step; `now` is the time it is sent.
    pub fn write(&self, kind: WriteKind, now: Time) -> Write<'_> {
        let complete = CompleteRequest {
            pk: &self.key,
            owner: &self.owner,
            attempt: self.attempt,
            receipt: self.receipt.as_deref().unwrap_or(""),
            expires: self.expires,
        };
        match kind {
            WriteKind::Reserve => Write::Reserve(self.reserve_request()),
            WriteKind::Complete => Write::Complete(complete),
            WriteKind::CompleteAttempt => Write::CompleteAttempt(complete),
            WriteKind::Release(kind) => Write::Release(ReleaseRequest {
                pk: &self.key,
                owner: &self.owner,
                kind,
            }),
            WriteKind::NextAttempt => Write::NextAttempt {
                pk: &self.key,
                owner: &self.owner,
                now,
            },
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

    fn next(&mut self, phase: Phase, input: Input) -> Step {
        match (phase, input) {
            (Phase::Reserving, Input::Written(Ok(answer))) => {
                let req = self.reserve_request();
                match judge(answer, &req) {
                    Reservation::Won(record) => {
                        self.attempt = record.attempt();
                        let age = record
                            .sent
                            .unwrap_or(self.started_at)
                            .until(self.started_at);
                        self.must_reconcile = self.rules.reconcile_old_keys && age > self.key_ttl;
                        self.charge_or_look()
                    }
                    Reservation::Duplicate { receipt } => {
                        Step::Done(Outcome::Duplicate { receipt })
                    }
                    Reservation::Conflict { .. } => Step::Done(Outcome::Conflict),
                    Reservation::InProgress { until } => Step::Done(Outcome::InProgress { until }),
                    Reservation::DeclineLimit { declines } => {
                        Step::Done(Outcome::DeclineLimit { declines })
                    }
                    Reservation::NeedsReconciliation { cause } => {
                        Step::Done(Outcome::NeedsReconciliation { cause })
                    }
                }
            }
            (Phase::Reserving, Input::Written(Err(cut))) => {
                Step::Done(store_cut(Call::Reserve, cut, None))
            }

            (Phase::Looking, Input::Looked(Ok(Lookup::Succeeded(receipt)))) => {
                let success = Outcome::Reconciled {
                    receipt: receipt.id.clone(),
                    attempt: self.attempt,
                };
                self.complete(receipt, success)
            }
            (Phase::Looking, Input::Looked(Ok(Lookup::Pending { charge_id, status })))
                if self.rules.pending_is_live =>
            {
                // A live charge may still succeed: a new key now could charge twice.
                self.release(
                    ReleaseKind::KeepKey,
                    Outcome::NeedsReconciliation {
                        cause: ReconcileCause::PendingAtProvider { charge_id, status },
                    },
                )
            }
            (Phase::Looking, Input::Looked(Ok(Lookup::NotFound | Lookup::Pending { .. }))) => {
                self.phase = Phase::MovingKey;
                Step::Write(WriteKind::NextAttempt)
            }
            (Phase::Looking, Input::Looked(Err(Cut::NoTime))) => Step::Done(Outcome::Deadline {
                before: Call::Lookup,
                attempt: Some(self.attempt),
            }),
            (Phase::Looking, Input::Looked(Err(Cut::TimedOut))) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::LookupTimedOut, Some(self.attempt)),
            ),
            (Phase::Looking, Input::Looked(Err(Cut::Failed(e)))) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::Lookup(Shared::new(e)), Some(self.attempt)),
            ),

            (Phase::MovingKey, Input::Written(Ok(WriteOutcome::Applied(record)))) => {
                self.attempt = record.attempt();
                self.phase = Phase::Charging;
                self.charge_step()
            }
            (Phase::MovingKey, Input::Written(Ok(WriteOutcome::Refused(_)))) => Step::Done(
                Outcome::retryable(RetryCause::LeaseLostBeforeNextAttempt, Some(self.attempt)),
            ),
            (Phase::MovingKey, Input::Written(Err(cut @ Cut::Failed(_)))) => {
                let outcome = store_cut(Call::NextAttempt, cut, Some(self.attempt));
                self.release(ReleaseKind::KeepKey, outcome)
            }
            (Phase::MovingKey, Input::Written(Err(cut))) => {
                Step::Done(store_cut(Call::NextAttempt, cut, Some(self.attempt)))
            }

            (Phase::Charging, Input::Charged(Ok(receipt))) => {
                let success = Outcome::Charged {
                    receipt: receipt.id.clone(),
                    attempt: self.attempt,
                };
                self.complete(receipt, success)
            }
            (Phase::Charging, Input::Charged(Err(Cut::NoTime))) => Step::Done(Outcome::Deadline {
                before: Call::Charge,
                attempt: Some(self.attempt),
            }),
            (Phase::Charging, Input::Charged(Err(Cut::TimedOut))) => self.after_failed_charge(
                PaymentError::retryable(crate::payment::FailureKind::Timeout),
            ),
            (
                Phase::Charging,
                Input::Charged(Err(Cut::Failed(PaymentError::ReplayedServerError { .. }))),
            ) if !self.must_reconcile => {
                // The original outcome is unknown: look it up before anything else.
                self.must_reconcile = true;
                self.charge_or_look()
            }
            (Phase::Charging, Input::Charged(Err(Cut::Failed(e)))) => self.after_failed_charge(e),

            (Phase::Completing, Input::Written(Ok(answer))) => match answer {
                WriteOutcome::Applied(_) => Step::Done(self.take_success()),
                WriteOutcome::Refused(Some(old)) if self.is_done_with(&old) => {
                    Step::Done(self.take_success())
                }
                // The fence is lost, but the charge is a fact about this attempt's key.
                WriteOutcome::Refused(_) => {
                    self.phase = Phase::CompletingByAttempt;
                    Step::Write(WriteKind::CompleteAttempt)
                }
            },
            (Phase::CompletingByAttempt, Input::Written(Ok(answer))) => match answer {
                WriteOutcome::Applied(_) => Step::Done(self.take_success()),
                WriteOutcome::Refused(Some(old)) if self.is_done_with(&old) => {
                    Step::Done(self.take_success())
                }
                WriteOutcome::Refused(old) => Step::Done(Outcome::NeedsReconciliation {
                    cause: ReconcileCause::RecordMovedOn {
                        receipt: self.receipt.clone().unwrap_or_default(),
                        attempt: self.attempt,
                        state: old
                            .as_ref()
                            .map(|r| super::schema::state_value(&r.state).to_owned()),
                        record_attempt: old.as_ref().and_then(|r| r.attempt),
                        record_receipt: old.and_then(|r| r.receipt),
                    },
                }),
            },
            // A store error fails the record: a charge whose receipt is not stored is
            // never acknowledged; the retry replays the same key.
            (Phase::Completing | Phase::CompletingByAttempt, Input::Written(Err(cut))) => {
                Step::Done(store_cut(Call::Complete, cut, Some(self.attempt)))
            }

            // A failed or skipped release is never fatal: the lease ends at the
            // deadline anyway, and the record already fails.
            (Phase::Releasing(outcome), Input::Written(_)) => Step::Done(outcome),

            (Phase::Done(outcome), _) => Step::Done(outcome),
            (phase, input) => Step::Done(Outcome::retryable(
                RetryCause::OutOfPhase {
                    phase: phase.name(),
                    answer: input.name(),
                },
                Some(self.attempt),
            )),
        }
    }

    fn charge_or_look(&mut self) -> Step {
        if self.must_reconcile {
            self.phase = Phase::Looking;
            Step::Lookup
        } else {
            self.phase = Phase::Charging;
            self.charge_step()
        }
    }

    fn charge_step(&self) -> Step {
        Step::Charge {
            key: self
                .rules
                .provider_key
                .then(|| self.key.provider_key(self.attempt)),
        }
    }

    fn complete(&mut self, receipt: Receipt, success: Outcome) -> Step {
        self.receipt = Some(receipt.id);
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
        record.state == State::Done && record.receipt.as_deref() == self.receipt.as_deref()
    }

    fn release(&mut self, kind: ReleaseKind, then: Outcome) -> Step {
        self.phase = Phase::Releasing(then);
        Step::Write(WriteKind::Release(kind))
    }

    fn after_failed_charge(&mut self, e: PaymentError) -> Step {
        let attempt = self.attempt;
        match e {
            PaymentError::Declined { code, decline_code } => self.release(
                ReleaseKind::Declined,
                Outcome::Declined {
                    code,
                    decline_code,
                    attempt,
                },
            ),
            PaymentError::Rejected { status, code } => self.release(
                ReleaseKind::KeepKey,
                Outcome::Rejected {
                    status,
                    code,
                    attempt,
                },
            ),
            PaymentError::Pending { charge_id, status } if self.rules.pending_is_live => self
                .release(
                    ReleaseKind::KeepKey,
                    Outcome::NeedsReconciliation {
                        cause: ReconcileCause::PendingAnswer { charge_id, status },
                    },
                ),
            PaymentError::KeyReused => self.release(
                ReleaseKind::KeepKey,
                Outcome::NeedsReconciliation {
                    cause: ReconcileCause::KeyReused {
                        provider_key: self.key.provider_key(attempt),
                    },
                },
            ),
            other => {
                // Uncertain: the provider may hold a charge under this key, so the
                // next attempt must replay it.
                let kind = if self.rules.keep_key_when_uncertain {
                    ReleaseKind::KeepKey
                } else {
                    ReleaseKind::NextKey {
                        reset_declines: false,
                    }
                };
                self.release(
                    kind,
                    Outcome::retryable(RetryCause::Charge(Shared::new(other)), Some(attempt)),
                )
            }
        }
    }
}

/// The outcome of a store call that gave no answer. A charge made before it is safe:
/// the retry replays the same key.
fn store_cut(call: Call, cut: Cut<StoreError>, attempt: Option<u32>) -> Outcome {
    match cut {
        Cut::NoTime => Outcome::Deadline {
            before: call,
            attempt,
        },
        Cut::TimedOut => Outcome::retryable(RetryCause::StoreTimedOut(call), attempt),
        Cut::Failed(source) => Outcome::retryable(
            RetryCause::Store {
                call,
                source: Shared::new(source),
            },
            attempt,
        ),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State, fingerprint: Option<&str>, owner: Option<&str>) -> Record {
        Record {
            pk: Key::for_order_id("a"),
            state,
            created: Some(Time::from_ms(1)),
            expires: Some(Time::from_secs(10)),
            receipt: Some("ch_1".into()),
            fingerprint: fingerprint.map(Fingerprint::new),
            owner: owner.map(Owner::new),
            lease_until: Some(Time::from_ms(5)),
            attempt: Some(1),
            sent: Some(Time::from_ms(1)),
            declines: None,
        }
    }

    fn judge(old: Record) -> Reservation {
        let (pk, fingerprint, owner) = (
            Key::for_order_id("a"),
            Fingerprint::new("h"),
            Owner::new("me"),
        );
        let req = ReserveRequest {
            pk: &pk,
            fingerprint: &fingerprint,
            owner: &owner,
            now: Time::from_ms(0),
            lease_until: Time::from_ms(1),
            expires: Time::from_secs(2),
            max_declines: 3,
        };
        classify_lost(old, &req)
    }

    #[test]
    fn lost_reserve_is_classified_per_design() {
        assert_eq!(
            judge(record(State::Done, Some("h"), None)),
            Reservation::Duplicate {
                receipt: Some("ch_1".into())
            }
        );
        assert!(matches!(
            judge(record(State::Done, Some("x"), None)),
            Reservation::Conflict { .. }
        ));
        assert!(matches!(
            judge(record(State::InProgress, Some("h"), Some("other"))),
            Reservation::InProgress { .. }
        ));
        assert!(matches!(
            judge(record(State::InProgress, Some("h"), Some("me"))),
            Reservation::Won(_)
        ));
        assert!(matches!(
            judge(record(State::InProgress, Some("x"), Some("me"))),
            Reservation::Conflict { .. }
        ));
        assert!(matches!(
            judge(record(State::Done, None, None)),
            Reservation::Duplicate { .. }
        ));
        assert!(matches!(
            judge(record(State::InProgress, None, None)),
            Reservation::NeedsReconciliation { .. }
        ));
        assert!(matches!(
            judge(record(State::Other("raro".into()), Some("h"), None)),
            Reservation::NeedsReconciliation { .. }
        ));
    }

    #[test]
    fn an_order_at_its_decline_limit_is_refused_whatever_copy_asks() {
        let mut free = record(State::Free, Some("h"), None);
        free.declines = Some(3);
        assert_eq!(
            judge(free.clone()),
            Reservation::DeclineLimit { declines: 3 }
        );
        free.declines = Some(2);
        assert!(matches!(judge(free), Reservation::InProgress { .. }));
        // A live lease is in progress whatever the count; another payload a conflict.
        let mut live = record(State::InProgress, Some("h"), Some("other"));
        live.declines = Some(3);
        live.lease_until = Some(Time::from_ms(10));
        assert!(matches!(judge(live), Reservation::InProgress { .. }));
        let mut other = record(State::Free, Some("x"), None);
        other.declines = Some(3);
        assert!(matches!(judge(other), Reservation::Conflict { .. }));
    }
}
