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
    CompleteRequest, Estado, Key, Record, ReleaseKind, ReleaseRequest, ReserveRequest,
    ResolveLeaseRequest, StoreError, WriteOutcome,
};
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
    pub hecho_is_final: bool,
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
        hecho_is_final: true,
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
        titular: &'a str,
        now_ms: i64,
    },
    LeaseForResolve(ResolveLeaseRequest<'a>),
}

/// Whether `write`'s condition holds on the stored item (`None`: absent). Comparisons
/// with a missing attribute are false, as in DynamoDB condition expressions and SQL.
pub fn holds(write: &Write<'_>, stored: Option<&Record>, rules: Rules) -> bool {
    let Some(r) = stored else {
        return matches!(write, Write::Reserve(_));
    };
    let fenced = |titular: &str| {
        r.estado == Estado::EnCurso && (!rules.fenced || r.titular.as_deref() == Some(titular))
    };
    match write {
        Write::Reserve(req) => {
            let counts_as_absent = (!rules.hecho_is_final || r.estado != Estado::Hecho)
                && r.expira_s.is_some_and(|e| e < req.now_s())
                && r.huella.is_some();
            let same_payload = r.huella.as_deref() == Some(req.huella);
            let below_limit = r.rechazos.is_none_or(|n| n < req.max_declines);
            let free = r.estado == Estado::Libre
                || (r.estado == Estado::EnCurso
                    && r.en_curso_hasta_ms.is_some_and(|h| h < req.now_ms));
            counts_as_absent || (same_payload && below_limit && free)
        }
        Write::Complete(req) => fenced(req.titular),
        Write::CompleteAttempt(req) => r.intento == Some(req.intento) && r.estado != Estado::Hecho,
        Write::Release(req) => fenced(req.titular),
        Write::NextAttempt { titular, .. } => fenced(titular),
        Write::LeaseForResolve(req) => {
            r.estado != Estado::Hecho
                && (r.estado != Estado::EnCurso
                    || r.en_curso_hasta_ms.is_none_or(|h| h < req.now_ms))
                && r.huella.as_deref().is_none_or(|h| h == req.huella)
        }
    }
}

/// The item `write` leaves when its condition holds on `stored`.
pub fn apply(write: &Write<'_>, stored: Option<&Record>) -> Record {
    let mut r = stored.cloned().unwrap_or_else(|| Record {
        pk: pk_of(write).to_string(),
        estado: Estado::Libre,
        creado_ms: None,
        expira_s: None,
        recibo: None,
        huella: None,
        titular: None,
        en_curso_hasta_ms: None,
        intento: None,
        enviado_ms: None,
        rechazos: None,
    });
    match write {
        Write::Reserve(req) => {
            r.estado = Estado::EnCurso;
            r.titular = Some(req.titular.to_owned());
            r.en_curso_hasta_ms = Some(req.lease_until_ms);
            r.huella = Some(req.huella.to_owned());
            r.expira_s = Some(req.expira_s);
            r.creado_ms = r.creado_ms.or(Some(req.now_ms));
            r.intento = r.intento.or(Some(1));
            r.enviado_ms = r.enviado_ms.or(Some(req.now_ms));
        }
        Write::Complete(req) | Write::CompleteAttempt(req) => {
            r.estado = Estado::Hecho;
            r.recibo = Some(req.recibo.to_owned());
            r.expira_s = Some(req.expira_s);
            r.titular = None;
            r.en_curso_hasta_ms = None;
        }
        Write::Release(req) => {
            r.estado = Estado::Libre;
            r.titular = None;
            r.en_curso_hasta_ms = None;
            if req.kind != ReleaseKind::KeepKey {
                r.intento = r.intento.map(|i| i + 1);
                r.enviado_ms = None;
            }
            match req.kind {
                ReleaseKind::Declined => r.rechazos = Some(r.rechazos.unwrap_or(0) + 1),
                ReleaseKind::NextKey {
                    reset_declines: true,
                } => r.rechazos = None,
                _ => {}
            }
        }
        Write::NextAttempt { now_ms, .. } => {
            r.intento = r.intento.map(|i| i + 1);
            r.enviado_ms = Some(*now_ms);
        }
        Write::LeaseForResolve(req) => {
            r.estado = Estado::EnCurso;
            r.titular = Some(req.titular.to_owned());
            r.en_curso_hasta_ms = Some(req.lease_until_ms);
            r.huella = r.huella.or_else(|| Some(req.huella.to_owned()));
            r.intento = r.intento.or(Some(1));
            r.enviado_ms = r.enviado_ms.or(Some(req.now_ms));
            r.creado_ms = r.creado_ms.or(Some(req.now_ms));
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
    Duplicate { recibo: Option<String> },
    /// Same key, other payload: never charged.
    Conflict { stored_huella: Option<String> },
    /// Someone else holds a live lease.
    InProgress { until_ms: Option<i64> },
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
        WriteOutcome::Refused(None) => Reservation::InProgress { until_ms: None },
    }
}

fn classify_lost(old: Record, req: &ReserveRequest<'_>) -> Reservation {
    if old.is_card_format() {
        return match old.estado {
            Estado::Hecho => Reservation::Duplicate { recibo: old.recibo },
            _ => Reservation::NeedsReconciliation {
                cause: ReconcileCause::CardItemNotDone,
            },
        };
    }
    if old.huella.as_deref() != Some(req.huella) {
        return Reservation::Conflict {
            stored_huella: old.huella,
        };
    }
    let lease_live = old
        .en_curso_hasta_ms
        .is_some_and(|until| until >= req.now_ms);
    match old.estado {
        Estado::Hecho => Reservation::Duplicate { recibo: old.recibo },
        // The SDK retried a reserve that had been applied: the lease is ours.
        Estado::EnCurso if old.titular.as_deref() == Some(req.titular) => Reservation::Won(old),
        Estado::EnCurso if lease_live => Reservation::InProgress {
            until_ms: old.en_curso_hasta_ms,
        },
        Estado::EnCurso | Estado::Libre if old.declines() >= req.max_declines => {
            Reservation::DeclineLimit {
                declines: old.declines(),
            }
        }
        Estado::EnCurso | Estado::Libre => Reservation::InProgress {
            until_ms: old.en_curso_hasta_ms,
        },
        Estado::Other(_) => Reservation::NeedsReconciliation {
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
    pub huella: String,
    /// The fresh random owner token of this attempt.
    pub titular: String,
    pub now_ms: i64,
    /// The invocation deadline: the lease's end.
    pub deadline_ms: i64,
    /// `expira` written with the reservation and the completion.
    pub expira_s: i64,
    pub max_declines: u32,
    /// Keys first sent longer ago than this are reconciled before reuse.
    pub key_ttl_ms: i64,
    pub rules: Rules,
}

/// One record's state machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Core {
    key: Key,
    huella: String,
    titular: String,
    started_ms: i64,
    deadline_ms: i64,
    expira_s: i64,
    max_declines: u32,
    key_ttl_ms: i64,
    rules: Rules,
    phase: Phase,
    intento: u32,
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
            huella: start.huella,
            titular: start.titular,
            started_ms: start.now_ms,
            deadline_ms: start.deadline_ms,
            expira_s: start.expira_s,
            max_declines: start.max_declines,
            key_ttl_ms: start.key_ttl_ms,
            rules: start.rules,
            phase: Phase::Reserving,
            intento: 1,
            must_reconcile: false,
            receipt: None,
            success: None,
        };
        (core, Step::Write(WriteKind::Reserve))
    }

    /// The attempt whose key the core is on.
    pub fn attempt(&self) -> u32 {
        self.intento
    }

    /// The reservation request (its time is the record's start).
    fn reserve_request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            pk: &self.key,
            huella: &self.huella,
            titular: &self.titular,
            now_ms: self.started_ms,
            lease_until_ms: self.deadline_ms,
            expira_s: self.expira_s,
            max_declines: self.max_declines,
        }
    }

    /// The request of a write step; `now_ms` is the time it is sent.
    pub fn write(&self, kind: WriteKind, now_ms: i64) -> Write<'_> {
        let complete = CompleteRequest {
            pk: &self.key,
            titular: &self.titular,
            intento: self.intento,
            recibo: self.receipt.as_deref().unwrap_or(""),
            expira_s: self.expira_s,
        };
        match kind {
            WriteKind::Reserve => Write::Reserve(self.reserve_request()),
            WriteKind::Complete => Write::Complete(complete),
            WriteKind::CompleteAttempt => Write::CompleteAttempt(complete),
            WriteKind::Release(kind) => Write::Release(ReleaseRequest {
                pk: &self.key,
                titular: &self.titular,
                kind,
            }),
            WriteKind::NextAttempt => Write::NextAttempt {
                pk: &self.key,
                titular: &self.titular,
                now_ms,
            },
        }
    }

    /// Feeds the answer to the last step; returns the next one.
    pub fn on(&mut self, input: Input) -> Step {
        let phase = std::mem::replace(&mut self.phase, Phase::Done(Outcome::InProgress));
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
                        self.intento = record.attempt();
                        let age = self
                            .started_ms
                            .saturating_sub(record.enviado_ms.unwrap_or(self.started_ms));
                        self.must_reconcile =
                            self.rules.reconcile_old_keys && age > self.key_ttl_ms;
                        self.charge_or_look()
                    }
                    Reservation::Duplicate { recibo } => {
                        Step::Done(Outcome::Duplicate { receipt: recibo })
                    }
                    Reservation::Conflict { .. } => Step::Done(Outcome::Conflict),
                    Reservation::InProgress { .. } => Step::Done(Outcome::InProgress),
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
                    attempt: self.intento,
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
                attempt: Some(self.intento),
            }),
            (Phase::Looking, Input::Looked(Err(Cut::TimedOut))) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::LookupTimedOut, Some(self.intento)),
            ),
            (Phase::Looking, Input::Looked(Err(Cut::Failed(e)))) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::Lookup(Shared::new(e)), Some(self.intento)),
            ),

            (Phase::MovingKey, Input::Written(Ok(WriteOutcome::Applied(record)))) => {
                self.intento = record.attempt();
                self.phase = Phase::Charging;
                self.charge_step()
            }
            (Phase::MovingKey, Input::Written(Ok(WriteOutcome::Refused(_)))) => Step::Done(
                Outcome::retryable(RetryCause::LeaseLostBeforeNextAttempt, Some(self.intento)),
            ),
            (Phase::MovingKey, Input::Written(Err(cut @ Cut::Failed(_)))) => {
                let outcome = store_cut(Call::NextAttempt, cut, Some(self.intento));
                self.release(ReleaseKind::KeepKey, outcome)
            }
            (Phase::MovingKey, Input::Written(Err(cut))) => {
                Step::Done(store_cut(Call::NextAttempt, cut, Some(self.intento)))
            }

            (Phase::Charging, Input::Charged(Ok(receipt))) => {
                let success = Outcome::Charged {
                    receipt: receipt.id.clone(),
                    attempt: self.intento,
                };
                self.complete(receipt, success)
            }
            (Phase::Charging, Input::Charged(Err(Cut::NoTime))) => Step::Done(Outcome::Deadline {
                before: Call::Charge,
                attempt: Some(self.intento),
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
                        attempt: self.intento,
                        state: old.as_ref().map(|r| r.estado.as_str().to_owned()),
                        record_attempt: old.as_ref().and_then(|r| r.intento),
                        record_receipt: old.and_then(|r| r.recibo),
                    },
                }),
            },
            // A store error fails the record: a charge whose receipt is not stored is
            // never acknowledged; the retry replays the same key.
            (Phase::Completing | Phase::CompletingByAttempt, Input::Written(Err(cut))) => {
                Step::Done(store_cut(Call::Complete, cut, Some(self.intento)))
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
                Some(self.intento),
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
                .then(|| self.key.provider_key(self.intento)),
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
        record.estado == Estado::Hecho && record.recibo.as_deref() == self.receipt.as_deref()
    }

    fn release(&mut self, kind: ReleaseKind, then: Outcome) -> Step {
        self.phase = Phase::Releasing(then);
        Step::Write(WriteKind::Release(kind))
    }

    fn after_failed_charge(&mut self, e: PaymentError) -> Step {
        let attempt = self.intento;
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

    fn record(estado: Estado, huella: Option<&str>, titular: Option<&str>) -> Record {
        Record {
            pk: "cobro#a".into(),
            estado,
            creado_ms: Some(1),
            expira_s: Some(10),
            recibo: Some("ch_1".into()),
            huella: huella.map(str::to_owned),
            titular: titular.map(str::to_owned),
            en_curso_hasta_ms: Some(5),
            intento: Some(1),
            enviado_ms: Some(1),
            rechazos: None,
        }
    }

    fn judge(old: Record) -> Reservation {
        let pk = Key::for_order_id("a");
        let req = ReserveRequest {
            pk: &pk,
            huella: "h",
            titular: "me",
            now_ms: 0,
            lease_until_ms: 1,
            expira_s: 2,
            max_declines: 3,
        };
        classify_lost(old, &req)
    }

    #[test]
    fn lost_reserve_is_classified_per_design() {
        assert_eq!(
            judge(record(Estado::Hecho, Some("h"), None)),
            Reservation::Duplicate {
                recibo: Some("ch_1".into())
            }
        );
        assert!(matches!(
            judge(record(Estado::Hecho, Some("x"), None)),
            Reservation::Conflict { .. }
        ));
        assert!(matches!(
            judge(record(Estado::EnCurso, Some("h"), Some("other"))),
            Reservation::InProgress { .. }
        ));
        assert!(matches!(
            judge(record(Estado::EnCurso, Some("h"), Some("me"))),
            Reservation::Won(_)
        ));
        assert!(matches!(
            judge(record(Estado::EnCurso, Some("x"), Some("me"))),
            Reservation::Conflict { .. }
        ));
        assert!(matches!(
            judge(record(Estado::Hecho, None, None)),
            Reservation::Duplicate { .. }
        ));
        assert!(matches!(
            judge(record(Estado::EnCurso, None, None)),
            Reservation::NeedsReconciliation { .. }
        ));
        assert!(matches!(
            judge(record(Estado::Other("raro".into()), Some("h"), None)),
            Reservation::NeedsReconciliation { .. }
        ));
    }

    #[test]
    fn an_order_at_its_decline_limit_is_refused_whatever_copy_asks() {
        let mut libre = record(Estado::Libre, Some("h"), None);
        libre.rechazos = Some(3);
        assert_eq!(
            judge(libre.clone()),
            Reservation::DeclineLimit { declines: 3 }
        );
        libre.rechazos = Some(2);
        assert!(matches!(judge(libre), Reservation::InProgress { .. }));
        // A live lease is in progress whatever the count; another payload a conflict.
        let mut live = record(Estado::EnCurso, Some("h"), Some("other"));
        live.rechazos = Some(3);
        live.en_curso_hasta_ms = Some(10);
        assert!(matches!(judge(live), Reservation::InProgress { .. }));
        let mut other = record(Estado::Libre, Some("x"), None);
        other.rechazos = Some(3);
        assert!(matches!(judge(other), Reservation::Conflict { .. }));
    }
}
