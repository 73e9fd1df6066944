//! The SQS batch (DESIGN §6): parse every record, group by key, run groups
//! concurrently (bounded) and records of a group in message order, stop a group after
//! its first non-success, keep FIFO batches strictly in order, respect the deadline
//! margin, isolate panics, and answer with a partial batch response.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::{FutureExt, StreamExt};
use lambda_runtime::LambdaEvent;
use tracing::{Instrument, error, info, info_span, warn};

use crate::idempotency::{Charger, IdempotencyStore, Key, Outcome, Settings};
use crate::order::Order;
use crate::payment::PaymentProvider;

/// The batch cannot be judged at all: the whole batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("record {index} has no messageId, so no partial failure can name it")]
    MissingMessageId { index: usize },
}

/// How a batch is run (DESIGN §6–7).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Key groups processed at once.
    pub max_concurrency: usize,
    /// No record starts with less time left than this.
    pub deadline_margin: Duration,
    /// The deadline given to a batch whose invocation has none usable (outside
    /// Lambda, or an emulator that sends no epoch deadline).
    pub invoke_deadline: Duration,
}

/// The consumer: clients and settings built once at cold start, shared by every
/// invocation.
pub struct Consumer {
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn PaymentProvider>,
    settings: Settings,
    limits: Limits,
}

/// 2001-09-09 in ms: any real invocation deadline is far later. Smaller values come
/// from emulators that send a duration instead of an epoch (`cargo lambda watch`
/// sends 600000).
const PLAUSIBLE_DEADLINE_MS: i64 = 1_000_000_000_000;

/// One record after parsing.
struct Parsed<'a> {
    message_id: &'a str,
    order: Result<Order, String>,
}

impl Consumer {
    pub fn new(
        store: Arc<dyn IdempotencyStore>,
        provider: Arc<dyn PaymentProvider>,
        settings: Settings,
        limits: Limits,
    ) -> Self {
        let limits = Limits {
            max_concurrency: limits.max_concurrency.max(1),
            ..limits
        };
        Self {
            store,
            provider,
            settings,
            limits,
        }
    }

    /// The Lambda handler: the invocation deadline comes from the context.
    pub async fn handle_lambda_event(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, BatchError> {
        let sent = i64::try_from(event.context.deadline).unwrap_or(i64::MAX);
        let deadline_ms = if sent < PLAUSIBLE_DEADLINE_MS {
            let fallback = self.default_deadline_ms();
            warn!(
                sent,
                fallback,
                "the invocation deadline is not an epoch time (an emulator?); using INVOKE_DEADLINE"
            );
            fallback
        } else {
            sent
        };
        self.handle(&event.payload, deadline_ms).await
    }

    /// Now + `invoke_deadline`: the deadline of a batch run outside Lambda.
    pub fn default_deadline_ms(&self) -> i64 {
        let span = i64::try_from(self.limits.invoke_deadline.as_millis()).unwrap_or(i64::MAX);
        self.settings.now_ms().saturating_add(span)
    }

    /// Processes a batch whose invocation ends at `deadline_ms` (ms epoch).
    pub async fn handle(
        &self,
        event: &SqsEvent,
        deadline_ms: i64,
    ) -> Result<SqsBatchResponse, BatchError> {
        let parsed = parse_records(&event.records)?;
        let fifo = event.records.iter().any(is_fifo);
        let mut outcomes: Vec<Option<Outcome>> = vec![None; parsed.len()];
        if fifo {
            self.run_fifo(&parsed, deadline_ms, &mut outcomes).await;
        } else {
            self.run_grouped(&parsed, deadline_ms, &mut outcomes).await;
        }
        let mut response = SqsBatchResponse::default();
        let mut listed = HashSet::new();
        for (record, outcome) in parsed.iter().zip(outcomes) {
            // A record without an outcome is a bug; failing it loses nothing. SQS can
            // hand one message twice in a batch: it is listed once.
            if !outcome.is_some_and(|o| o.is_ack()) && listed.insert(record.message_id) {
                response.add_failure(record.message_id);
            }
        }
        Ok(response)
    }

    /// FIFO: strictly in order; from the first failure on, every later record fails.
    async fn run_fifo(&self, parsed: &[Parsed<'_>], deadline_ms: i64, out: &mut [Option<Outcome>]) {
        let why = "an earlier record of this FIFO batch failed";
        for (i, outcome) in self
            .run_in_order(parsed, 0..parsed.len(), deadline_ms, why)
            .await
        {
            out[i] = Some(outcome);
        }
    }

    /// Standard queues: invalid records fail on their own; valid ones are grouped by
    /// key, groups run concurrently, each group in message order.
    async fn run_grouped(
        &self,
        parsed: &[Parsed<'_>],
        deadline_ms: i64,
        out: &mut [Option<Outcome>],
    ) {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of: HashMap<Key, usize> = HashMap::new();
        for (i, record) in parsed.iter().enumerate() {
            match &record.order {
                Err(reason) => out[i] = Some(invalid(record.message_id, reason)),
                Ok(order) => {
                    let g = *group_of.entry(order.key()).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[g].push(i);
                }
            }
        }
        let why = "an earlier record of the same order failed in this batch";
        let results: Vec<Vec<(usize, Outcome)>> = futures::stream::iter(groups)
            .map(|members| self.run_in_order(parsed, members, deadline_ms, why))
            .buffer_unordered(self.limits.max_concurrency)
            .collect()
            .await;
        for (i, outcome) in results.into_iter().flatten() {
            out[i] = Some(outcome);
        }
    }

    /// Runs `members` one after another; after the first non-success the rest fail
    /// without any store or provider call.
    async fn run_in_order(
        &self,
        parsed: &[Parsed<'_>],
        members: impl IntoIterator<Item = usize>,
        deadline_ms: i64,
        why_skipped: &'static str,
    ) -> Vec<(usize, Outcome)> {
        let mut results = Vec::new();
        let mut stopped = false;
        for i in members {
            let outcome = if stopped {
                skip(&parsed[i], why_skipped)
            } else {
                self.run_record(&parsed[i], deadline_ms).await
            };
            stopped = !outcome.is_ack();
            results.push((i, outcome));
        }
        results
    }

    /// One record inside its span, with one log line for its outcome.
    async fn run_record(&self, record: &Parsed<'_>, deadline_ms: i64) -> Outcome {
        let order = match &record.order {
            Ok(order) => order,
            Err(reason) => return invalid(record.message_id, reason),
        };
        let key = order.key();
        let span = info_span!("record", message_id = record.message_id, key = key.as_str());
        async move {
            let started = Instant::now();
            let time_left = self.time_left(deadline_ms);
            let outcome = if time_left < self.limits.deadline_margin {
                Outcome::Unstarted {
                    time_left_ms: u64::try_from(time_left.as_millis()).unwrap_or(u64::MAX),
                }
            } else {
                let charger = Charger {
                    store: self.store.as_ref(),
                    provider: self.provider.as_ref(),
                    settings: &self.settings,
                };
                // Release builds keep `panic = "unwind"`, so a panic in one record is
                // caught here and fails that record only.
                match AssertUnwindSafe(charger.process(order, deadline_ms))
                    .catch_unwind()
                    .await
                {
                    Ok(outcome) => outcome,
                    Err(_panic) => Outcome::FailedRetryable {
                        reason:
                            "panicked while processing; the lease ends at the invocation deadline"
                                .to_owned(),
                        attempt: None,
                    },
                }
            };
            log_outcome(&outcome, started.elapsed());
            outcome
        }
        .instrument(span)
        .await
    }

    fn time_left(&self, deadline_ms: i64) -> Duration {
        let left = deadline_ms.saturating_sub(self.settings.now_ms());
        Duration::from_millis(u64::try_from(left).unwrap_or(0))
    }
}

/// An invalid record needs no I/O: it fails with its reason.
fn invalid(message_id: &str, reason: &str) -> Outcome {
    let span = info_span!("record", message_id, key = tracing::field::Empty);
    let _entered = span.enter();
    let outcome = Outcome::Invalid {
        reason: reason.to_owned(),
    };
    log_outcome(&outcome, Duration::ZERO);
    outcome
}

fn skip(record: &Parsed<'_>, why: &'static str) -> Outcome {
    let key = record
        .order
        .as_ref()
        .map(|o| o.key().to_string())
        .unwrap_or_default();
    let span = info_span!("record", message_id = record.message_id, key = key.as_str());
    let _entered = span.enter();
    let outcome = Outcome::Skipped { reason: why };
    log_outcome(&outcome, Duration::ZERO);
    outcome
}

/// One line per record outcome, at a level that says who must act.
fn log_outcome(outcome: &Outcome, elapsed: Duration) {
    let latency_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let name = outcome.name();
    crate::telemetry::count_outcome(name);
    match outcome {
        Outcome::Charged { receipt, attempt } | Outcome::Reconciled { receipt, attempt } => {
            info!(outcome = name, receipt = %receipt, attempt, latency_ms, "record done");
        }
        Outcome::Duplicate { receipt } => {
            info!(
                outcome = name,
                receipt = receipt.as_deref().unwrap_or(""),
                latency_ms,
                "record done"
            );
        }
        Outcome::Declined {
            code,
            decline_code,
            attempt,
        } => warn!(
            outcome = name,
            code = %code,
            decline_code = decline_code.as_deref().unwrap_or(""),
            attempt,
            latency_ms,
            reason = "payment declined; the next delivery uses the next attempt's key",
            "record failed"
        ),
        Outcome::DeclineLimit { declines } => warn!(
            outcome = name,
            declines,
            latency_ms,
            reason = "decline limit reached (MAX_DECLINES): not sent to the provider; after \
                      the customer fixed the card, `resolve --retry-declined` lets it try again",
            "record failed"
        ),
        Outcome::Rejected {
            status,
            code,
            attempt,
        } => error!(
            outcome = name,
            status,
            code = code.as_deref().unwrap_or(""),
            attempt,
            latency_ms,
            reason = "the provider rejected the charge for good; fix the order or the \
                      provider's data, then redrive (the key is kept)",
            "record failed"
        ),
        Outcome::FailedRetryable { reason, attempt } => {
            warn!(outcome = name, reason = %reason, attempt, latency_ms, "record failed");
        }
        Outcome::Deadline { before, attempt } => warn!(
            outcome = name,
            before,
            attempt,
            latency_ms,
            reason = "too little time left before the invocation deadline to start the next \
                      call; the lease ends at the deadline and the retry goes on",
            "record failed"
        ),
        Outcome::InProgress => warn!(
            outcome = name,
            reason = "another delivery holds a live lease on this order",
            latency_ms,
            "record failed"
        ),
        Outcome::Unstarted { time_left_ms } => warn!(
            outcome = name,
            time_left_ms,
            reason = "too little time left before the invocation deadline",
            "record failed"
        ),
        Outcome::Skipped { reason } => info!(outcome = name, reason, "record not started"),
        Outcome::Invalid { reason } => warn!(outcome = name, reason = %reason, "record failed"),
        Outcome::Conflict => error!(
            outcome = name,
            reason = "same order id with a different payload; not charged",
            latency_ms,
            "record failed"
        ),
        Outcome::NeedsReconciliation { reason } => {
            error!(outcome = name, reason = %reason, latency_ms, "record failed");
        }
    }
}

fn parse_records(records: &[SqsMessage]) -> Result<Vec<Parsed<'_>>, BatchError> {
    records
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let message_id = message
                .message_id
                .as_deref()
                .filter(|id| !id.is_empty())
                .ok_or(BatchError::MissingMessageId { index })?;
            let order = match message.body.as_deref() {
                None => Err("record has no body".to_owned()),
                Some(body) => Order::parse(body).map_err(|e| crate::error_chain(&e)),
            };
            Ok(Parsed { message_id, order })
        })
        .collect()
}

fn is_fifo(message: &SqsMessage) -> bool {
    message
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"))
}
