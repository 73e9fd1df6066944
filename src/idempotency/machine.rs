//! The state machine of one order (DESIGN §5): reserve, reconcile when the provider
//! may have forgotten the key, charge under `<pk>#<intento>`, then complete (fenced,
//! with the attempt fallback) or release.
//!
//! Every branch ends in an [`Outcome`]; only `Charged`, `Reconciled` and `Duplicate`
//! acknowledge the message. When in doubt the record fails: SQS retries it and the
//! retry replays the same provider key, which cannot charge twice.
//!
//! Every store and provider call is bounded, and none starts unless its timeout ends
//! before the invocation deadline less [`DEADLINE_SAFETY`]: a handler that answers
//! late loses its whole partial response, charged records included.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, warn};

use super::{
    CompleteRequest, Estado, FenceOutcome, IdempotencyStore, Key, Record, ReleaseKind,
    ReleaseRequest, ReserveOutcome, ReserveRequest, StoreError,
};
use crate::error_chain;
use crate::order::Order;
use crate::payment::{FailureKind, Lookup, PaymentError, PaymentProvider, Receipt};
use crate::telemetry::{PAYMENT_LATENCY, STORE_LATENCY, TAKEOVER};

/// The current time as ms since the Unix epoch. Injected so tests can move time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Time kept free before the invocation deadline for answering: no call may still be
/// running then.
pub const DEADLINE_SAFETY: Duration = Duration::from_millis(500);

/// A store call is started with less than its full timeout left, but not with less
/// than this: a healthy store answers in milliseconds, and `complete` is worth trying.
const MIN_STORE_BUDGET: Duration = Duration::from_millis(250);

/// What the state machine needs from the configuration.
#[derive(Clone)]
pub struct Settings {
    /// `expira` = now + this.
    pub retention: Duration,
    /// Upper bound of one provider call, enforced here as well as in the client.
    pub payment_timeout: Duration,
    /// Keys first sent longer ago than this are reconciled before reuse.
    pub provider_key_ttl: Duration,
    /// Upper bound of one store call (the SDK has the same operation timeout).
    pub store_timeout: Duration,
    /// Declines per order before deliveries stop calling the provider.
    pub max_declines: u32,
    pub clock: Clock,
}

impl Settings {
    /// The wall clock.
    pub fn system_clock() -> Clock {
        Arc::new(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0)
        })
    }

    pub fn now_ms(&self) -> i64 {
        (self.clock)()
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
    NeedsReconciliation { reason: &'static str },
}

/// Runs the reserve write and classifies a lost condition (DESIGN §5 "reserve").
pub async fn reserve(
    store: &dyn IdempotencyStore,
    req: &ReserveRequest<'_>,
) -> Result<Reservation, StoreError> {
    let outcome = timed(STORE_LATENCY, store.reserve(req)).await?;
    Ok(judge(outcome, req))
}

fn judge(outcome: ReserveOutcome, req: &ReserveRequest<'_>) -> Reservation {
    match outcome {
        ReserveOutcome::Won(record) => Reservation::Won(record),
        ReserveOutcome::Lost(Some(old)) => classify_lost(old, req),
        // The item that failed the condition is gone (TTL swept it between the write
        // and the read): nothing is known, so retry later rather than guess.
        ReserveOutcome::Lost(None) => Reservation::InProgress { until_ms: None },
    }
}

fn classify_lost(old: Record, req: &ReserveRequest<'_>) -> Reservation {
    if old.is_card_format() {
        return match old.estado {
            Estado::Hecho => Reservation::Duplicate { recibo: old.recibo },
            _ => Reservation::NeedsReconciliation {
                reason: "item written by the card's consumer is not `hecho`: it gave the \
                         provider no idempotency key, so it is never taken over",
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
            reason: "item has an unknown `estado`",
        },
    }
}

/// The end of one record. Only the first three acknowledge the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Charged {
        receipt: String,
        attempt: u32,
    },
    /// Found at the provider by reconciliation and completed with that charge.
    Reconciled {
        receipt: String,
        attempt: u32,
    },
    Duplicate {
        receipt: Option<String>,
    },
    Conflict,
    InProgress,
    Declined {
        code: String,
        decline_code: Option<String>,
        attempt: u32,
    },
    /// The order already has `max_declines` declines: not sent to the provider.
    DeclineLimit {
        declines: u32,
    },
    /// The provider refused the request for good (400, 404); the key is kept.
    Rejected {
        status: u16,
        code: Option<String>,
        attempt: u32,
    },
    /// Transient or unknown: the retry is safe (same key, or reconciled first).
    FailedRetryable {
        reason: String,
        attempt: Option<u32>,
    },
    /// The next call could not end before the invocation deadline, so it was not
    /// started; the lease ends at the deadline and the retry goes on from there.
    Deadline {
        /// The call that was not started.
        before: &'static str,
        attempt: Option<u32>,
    },
    /// Cannot be settled automatically; logged at error level.
    NeedsReconciliation {
        reason: String,
    },
    /// The body is not a valid order.
    Invalid {
        reason: String,
    },
    /// Not started: too little time was left before the invocation deadline.
    Unstarted {
        time_left_ms: u64,
    },
    /// Not started: an earlier record of the same key (or of a FIFO batch) failed.
    Skipped {
        reason: &'static str,
    },
}

impl Outcome {
    /// Whether the message is acknowledged (left out of `batchItemFailures`).
    pub fn is_ack(&self) -> bool {
        matches!(
            self,
            Self::Charged { .. } | Self::Reconciled { .. } | Self::Duplicate { .. }
        )
    }

    /// Stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Charged { .. } => "charged",
            Self::Reconciled { .. } => "reconciled",
            Self::Duplicate { .. } => "duplicate",
            Self::Conflict => "conflict",
            Self::InProgress => "in_progress",
            Self::Declined { .. } | Self::DeclineLimit { .. } => "declined",
            Self::Rejected { .. } => "rejected",
            Self::FailedRetryable { .. } => "failed_retryable",
            Self::Deadline { .. } => "deadline",
            Self::NeedsReconciliation { .. } => "needs_reconciliation",
            Self::Invalid { .. } => "invalid",
            Self::Unstarted { .. } => "unstarted",
            Self::Skipped { .. } => "skipped",
        }
    }

    fn retryable(reason: impl Into<String>, attempt: Option<u32>) -> Self {
        Self::FailedRetryable {
            reason: reason.into(),
            attempt,
        }
    }
}

/// Runs the state machine for one order against a store and a provider.
pub struct Charger<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub provider: &'a dyn PaymentProvider,
    pub settings: &'a Settings,
}

/// Everything a step needs to write under our lease.
struct Lease<'a> {
    pk: &'a Key,
    titular: &'a str,
    intento: u32,
    expira_s: i64,
    /// The invocation deadline: the lease's end, and the end of every call's budget.
    deadline_ms: i64,
}

/// Why a bounded call gave no answer.
#[derive(Debug)]
enum Cut<E> {
    /// Too little time left before the deadline: not started.
    NoTime,
    /// Started, and its timeout ended first: the outcome is unknown.
    TimedOut,
    /// It answered with an error.
    Failed(E),
}

/// At most this many provider charges per record and invocation: the first, and one
/// more after reconciliation moved to a new key.
const MAX_CHARGES_PER_RECORD: usize = 2;

impl Charger<'_> {
    /// Processes one valid order. `deadline_ms` is the invocation deadline; the lease
    /// ends there and no call runs past it.
    pub async fn process(&self, order: &Order, deadline_ms: i64) -> Outcome {
        let pk = order.key();
        let huella = order.fingerprint();
        let titular = uuid::Uuid::new_v4().to_string();
        let now_ms = self.settings.now_ms();
        let expira_s = self.expira_s(now_ms);
        let req = ReserveRequest {
            pk: &pk,
            huella: &huella,
            titular: &titular,
            now_ms,
            lease_until_ms: deadline_ms,
            expira_s,
            max_declines: self.settings.max_declines,
        };
        let reserved = self
            .store_call(deadline_ms, self.store.reserve(&req))
            .await
            .map(|outcome| judge(outcome, &req));
        let record = match reserved {
            Ok(Reservation::Won(record)) => record,
            Ok(Reservation::Duplicate { recibo }) => return Outcome::Duplicate { receipt: recibo },
            Ok(Reservation::Conflict { .. }) => return Outcome::Conflict,
            Ok(Reservation::InProgress { .. }) => return Outcome::InProgress,
            Ok(Reservation::DeclineLimit { declines }) => {
                return Outcome::DeclineLimit { declines };
            }
            Ok(Reservation::NeedsReconciliation { reason }) => {
                return Outcome::NeedsReconciliation {
                    reason: reason.to_owned(),
                };
            }
            Err(cut) => return store_cut("reserve", cut, None),
        };
        if record.creado_ms.is_some_and(|creado| creado < now_ms) {
            // A retry reserved a record left `libre` or with an expired lease.
            metrics::counter!(TAKEOVER).increment(1);
        }
        let mut lease = Lease {
            pk: &pk,
            titular: &titular,
            intento: record.attempt(),
            expira_s,
            deadline_ms,
        };

        let key_age_ms = now_ms.saturating_sub(record.enviado_ms.unwrap_or(now_ms));
        let ttl_ms = i64::try_from(self.settings.provider_key_ttl.as_millis()).unwrap_or(i64::MAX);
        let mut must_reconcile = key_age_ms > ttl_ms;

        for _ in 0..MAX_CHARGES_PER_RECORD {
            if must_reconcile {
                match self.reconcile(order, &mut lease).await {
                    Ok(Some(receipt)) => {
                        return self
                            .complete(
                                &lease,
                                &receipt,
                                Outcome::Reconciled {
                                    receipt: receipt.id.clone(),
                                    attempt: lease.intento,
                                },
                            )
                            .await;
                    }
                    Ok(None) => {}
                    Err(outcome) => return outcome,
                }
            }
            let key = lease.pk.provider_key(lease.intento);
            match self
                .provider_call(deadline_ms, self.provider.charge(order, &key))
                .await
            {
                Ok(receipt) => {
                    let outcome = Outcome::Charged {
                        receipt: receipt.id.clone(),
                        attempt: lease.intento,
                    };
                    return self.complete(&lease, &receipt, outcome).await;
                }
                Err(Cut::NoTime) => {
                    return Outcome::Deadline {
                        before: "charge",
                        attempt: Some(lease.intento),
                    };
                }
                Err(Cut::TimedOut) => {
                    return self
                        .after_failed_charge(&lease, PaymentError::retryable(FailureKind::Timeout))
                        .await;
                }
                Err(Cut::Failed(PaymentError::ReplayedServerError { status }))
                    if !must_reconcile =>
                {
                    warn!(
                        status,
                        attempt = lease.intento,
                        "provider replayed a server error; reconciling"
                    );
                    must_reconcile = true;
                }
                Err(Cut::Failed(e)) => return self.after_failed_charge(&lease, e).await,
            }
        }
        // Reconciled, moved to a new key, and the new key still replayed a server
        // error: the provider is misbehaving. Keep the key, retry later.
        self.release(&lease, ReleaseKind::KeepKey).await;
        Outcome::retryable(
            "provider replayed a server error after reconciliation",
            Some(lease.intento),
        )
    }

    fn expira_s(&self, now_ms: i64) -> i64 {
        let retention_s = i64::try_from(self.settings.retention.as_secs()).unwrap_or(i64::MAX);
        now_ms.div_euclid(1000).saturating_add(retention_s)
    }

    /// Time left for a call before `deadline_ms` less the safety margin.
    fn time_left(&self, deadline_ms: i64) -> Duration {
        let safety_ms = i64::try_from(DEADLINE_SAFETY.as_millis()).unwrap_or(i64::MAX);
        let left = deadline_ms
            .saturating_sub(safety_ms)
            .saturating_sub(self.settings.now_ms());
        Duration::from_millis(u64::try_from(left).unwrap_or(0))
    }

    /// A provider call, only with its full timeout left: one cut short would leave a
    /// charge's outcome unknown for nothing.
    async fn provider_call<T>(
        &self,
        deadline_ms: i64,
        call: impl Future<Output = Result<T, PaymentError>>,
    ) -> Result<T, Cut<PaymentError>> {
        let timeout = self.settings.payment_timeout;
        if self.time_left(deadline_ms) < timeout {
            return Err(Cut::NoTime);
        }
        bounded(timeout, PAYMENT_LATENCY, call).await
    }

    /// A store call, with its timeout cut to the time left (a store answers in
    /// milliseconds; recording a charge is worth a short try).
    async fn store_call<T>(
        &self,
        deadline_ms: i64,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Cut<StoreError>> {
        let timeout = self.settings.store_timeout.min(self.time_left(deadline_ms));
        if timeout < MIN_STORE_BUDGET {
            return Err(Cut::NoTime);
        }
        bounded(timeout, STORE_LATENCY, call).await
    }

    /// Looks the order's charge up. `Ok(Some)` = found; `Ok(None)` = not found and the
    /// lease moved to the next attempt; `Err` = the record's final outcome.
    async fn reconcile(
        &self,
        order: &Order,
        lease: &mut Lease<'_>,
    ) -> Result<Option<Receipt>, Outcome> {
        let found = self
            .provider_call(lease.deadline_ms, self.provider.find_charge(order))
            .await;
        match found {
            Ok(Lookup::Succeeded(receipt)) => return Ok(Some(receipt)),
            Ok(Lookup::NotFound) => {}
            Ok(Lookup::Pending { charge_id, status }) => {
                // A live charge may still succeed: a new key now could charge twice.
                self.release(lease, ReleaseKind::KeepKey).await;
                return Err(Outcome::NeedsReconciliation {
                    reason: format!(
                        "the provider holds charge {charge_id} for this order in status \
                         `{status}`; no new key is sent while it may succeed: settle it with \
                         `resolve` once it is final"
                    ),
                });
            }
            Err(Cut::NoTime) => {
                return Err(Outcome::Deadline {
                    before: "reconciliation lookup",
                    attempt: Some(lease.intento),
                });
            }
            Err(Cut::TimedOut) => {
                self.release(lease, ReleaseKind::KeepKey).await;
                return Err(Outcome::retryable(
                    "reconciliation lookup timed out",
                    Some(lease.intento),
                ));
            }
            Err(Cut::Failed(e)) => {
                self.release(lease, ReleaseKind::KeepKey).await;
                return Err(Outcome::retryable(
                    format!("reconciliation lookup: {}", error_chain(&e)),
                    Some(lease.intento),
                ));
            }
        }
        // Not found: the next key is only worth taking if it can be sent in time.
        if self.time_left(lease.deadline_ms) < self.settings.payment_timeout {
            return Err(Outcome::Deadline {
                before: "charge",
                attempt: Some(lease.intento),
            });
        }
        let now_ms = self.settings.now_ms();
        let moved = self
            .store_call(
                lease.deadline_ms,
                self.store.next_attempt(lease.pk, lease.titular, now_ms),
            )
            .await;
        match moved {
            Ok(FenceOutcome::Applied(record)) => {
                lease.intento = record.attempt();
                Ok(None)
            }
            Ok(FenceOutcome::Refused(_)) => Err(Outcome::retryable(
                "lease lost before moving to the next attempt",
                Some(lease.intento),
            )),
            Err(cut) => {
                if matches!(cut, Cut::Failed(_)) {
                    self.release(lease, ReleaseKind::KeepKey).await;
                }
                Err(store_cut("next attempt", cut, Some(lease.intento)))
            }
        }
    }

    async fn after_failed_charge(&self, lease: &Lease<'_>, e: PaymentError) -> Outcome {
        match e {
            PaymentError::Declined { code, decline_code } => {
                self.release(lease, ReleaseKind::Declined).await;
                Outcome::Declined {
                    code,
                    decline_code,
                    attempt: lease.intento,
                }
            }
            PaymentError::Rejected { status, code } => {
                self.release(lease, ReleaseKind::KeepKey).await;
                Outcome::Rejected {
                    status,
                    code,
                    attempt: lease.intento,
                }
            }
            PaymentError::KeyReused => {
                self.release(lease, ReleaseKind::KeepKey).await;
                Outcome::NeedsReconciliation {
                    reason: format!(
                        "provider says key {} was used with other parameters",
                        lease.pk.provider_key(lease.intento)
                    ),
                }
            }
            other => {
                self.release(lease, ReleaseKind::KeepKey).await;
                Outcome::retryable(
                    format!("charge: {}", error_chain(&other)),
                    Some(lease.intento),
                )
            }
        }
    }

    /// Fenced complete, then the attempt fallback. A store error fails the record:
    /// a charge whose receipt is not stored is never acknowledged.
    async fn complete(&self, lease: &Lease<'_>, receipt: &Receipt, success: Outcome) -> Outcome {
        let req = CompleteRequest {
            pk: lease.pk,
            titular: lease.titular,
            intento: lease.intento,
            recibo: &receipt.id,
            expira_s: lease.expira_s,
        };
        let not_stored = |cut| store_cut("complete", cut, Some(lease.intento));
        match self
            .store_call(lease.deadline_ms, self.store.complete(&req))
            .await
        {
            Ok(FenceOutcome::Applied(_)) => return success,
            Ok(FenceOutcome::Refused(Some(old))) if is_done_with(&old, &receipt.id) => {
                return success;
            }
            Ok(FenceOutcome::Refused(_)) => {
                warn!(
                    attempt = lease.intento,
                    "lease lost before complete; completing by attempt"
                );
            }
            Err(cut) => return not_stored(cut),
        }
        match self
            .store_call(lease.deadline_ms, self.store.complete_attempt(&req))
            .await
        {
            Ok(FenceOutcome::Applied(_)) => success,
            Ok(FenceOutcome::Refused(Some(old))) if is_done_with(&old, &receipt.id) => success,
            Ok(FenceOutcome::Refused(old)) => {
                let reason = format!(
                    "charged {} under attempt {} but the record moved on (estado {:?}, intento {:?}, recibo {:?})",
                    receipt.id,
                    lease.intento,
                    old.as_ref().map(|r| r.estado.as_str().to_owned()),
                    old.as_ref().and_then(|r| r.intento),
                    old.as_ref().and_then(|r| r.recibo.clone()),
                );
                error!(%reason, "charge could not be recorded");
                Outcome::NeedsReconciliation { reason }
            }
            Err(cut) => not_stored(cut),
        }
    }

    /// Gives the lease back. A failed or skipped release is logged, never fatal: the
    /// lease ends at the invocation deadline anyway, and the record already fails.
    async fn release(&self, lease: &Lease<'_>, kind: ReleaseKind) {
        let req = ReleaseRequest {
            pk: lease.pk,
            titular: lease.titular,
            kind,
        };
        match self
            .store_call(lease.deadline_ms, self.store.release(&req))
            .await
        {
            Ok(FenceOutcome::Applied(_)) => {}
            Ok(FenceOutcome::Refused(_)) => warn!("release refused: the lease is no longer ours"),
            Err(Cut::NoTime) => {
                warn!("release not started: too close to the deadline, where the lease ends")
            }
            Err(Cut::TimedOut) => warn!("release timed out; the lease ends at its deadline"),
            Err(Cut::Failed(e)) => {
                warn!(error = %error_chain(&e), "release failed; the lease ends at its deadline")
            }
        }
    }
}

/// The outcome of a store call that gave no answer. A charge made before it is safe:
/// the retry replays the same key.
fn store_cut(step: &'static str, cut: Cut<StoreError>, attempt: Option<u32>) -> Outcome {
    match cut {
        Cut::NoTime => Outcome::Deadline {
            before: step,
            attempt,
        },
        Cut::TimedOut => Outcome::retryable(format!("{step}: the store timed out"), attempt),
        Cut::Failed(e) => Outcome::retryable(format!("{step}: {}", error_chain(&e)), attempt),
    }
}

/// Runs `call` for at most `timeout`, its latency recorded in `metric`.
async fn bounded<T, E>(
    timeout: Duration,
    metric: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, Cut<E>> {
    match tokio::time::timeout(timeout, timed(metric, call)).await {
        Ok(result) => result.map_err(Cut::Failed),
        Err(_elapsed) => Err(Cut::TimedOut),
    }
}

/// Runs `fut`, recording how long it took in the histogram `metric` (ms).
async fn timed<T>(metric: &'static str, fut: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = fut.await;
    metrics::histogram!(metric).record(started.elapsed().as_secs_f64() * 1000.0);
    out
}

fn is_done_with(record: &Record, recibo: &str) -> bool {
    record.estado == Estado::Hecho && record.recibo.as_deref() == Some(recibo)
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

    #[test]
    fn only_effects_and_duplicates_acknowledge_the_message() {
        assert!(
            Outcome::Charged {
                receipt: "c".into(),
                attempt: 1
            }
            .is_ack()
        );
        assert!(Outcome::Duplicate { receipt: None }.is_ack());
        assert!(
            Outcome::Reconciled {
                receipt: "c".into(),
                attempt: 2
            }
            .is_ack()
        );
        for failed in [
            Outcome::Conflict,
            Outcome::InProgress,
            Outcome::Unstarted { time_left_ms: 0 },
            Outcome::Skipped { reason: "x" },
            Outcome::retryable("x", None),
            Outcome::NeedsReconciliation { reason: "x".into() },
            Outcome::Invalid { reason: "x".into() },
            Outcome::DeclineLimit { declines: 3 },
            Outcome::Rejected {
                status: 404,
                code: None,
                attempt: 1,
            },
            Outcome::Deadline {
                before: "charge",
                attempt: Some(1),
            },
        ] {
            assert!(!failed.is_ack(), "{failed:?}");
        }
    }
}
