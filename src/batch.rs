//! The SQS batch (DESIGN §6): parse every record, group by key, run groups
//! concurrently (bounded) and records of a group in message order, stop a group after
//! its first non-success, keep FIFO batches strictly in order, respect the deadline
//! margin, isolate panics, and answer with a partial batch response.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::{FutureExt, StreamExt};
use lambda_runtime::LambdaEvent;
use tracing::{Instrument, info_span, warn};

use crate::clock::Time;
use crate::config::{Config, FifoScope};
use crate::idempotency::{Charger, Details, IdempotencyStore, Key, Level, Outcome, Settings};
use crate::order::{Order, OrderError};
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
    /// What the first failure in a FIFO batch stops.
    pub fifo_failure_scope: FifoScope,
}

impl From<&Config> for Limits {
    fn from(config: &Config) -> Self {
        Self {
            max_concurrency: config.max_concurrency,
            deadline_margin: config.deadline_margin,
            invoke_deadline: config.invoke_deadline,
            fifo_failure_scope: config.fifo_failure_scope,
        }
    }
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

/// A record that is not an order: it fails on its own, with no I/O.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRecord {
    #[error("record has no body")]
    NoBody,
    #[error(transparent)]
    Order(#[from] OrderError),
}

/// Why a record was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// An earlier record of the same order failed in this batch.
    SameOrder,
    /// An earlier record of this FIFO batch failed.
    Fifo,
    /// An earlier record of the same FIFO message group failed.
    FifoGroup,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Self::SameOrder => "an earlier record of the same order failed in this batch",
            Self::Fifo => "an earlier record of this FIFO batch failed",
            Self::FifoGroup => "an earlier record of this FIFO message group failed",
        }
    }
}

/// How one record of a batch ends: the state machine's outcome, or what the batch
/// decided without running it.
#[derive(Debug)]
pub enum RecordOutcome<'a> {
    Processed(Outcome),
    Invalid(&'a InvalidRecord),
    /// Not started: too little time was left before the invocation deadline.
    Unstarted {
        time_left: Duration,
    },
    Skipped(Skip),
    /// The record's processing panicked; the lease ends at the invocation deadline.
    Panicked,
}

impl RecordOutcome<'_> {
    pub fn is_ack(&self) -> bool {
        matches!(self, Self::Processed(outcome) if outcome.is_ack())
    }

    /// Stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Processed(outcome) => outcome.name(),
            Self::Invalid(_) => "invalid",
            Self::Unstarted { .. } => "unstarted",
            Self::Skipped(_) => "skipped",
            Self::Panicked => "failed_retryable",
        }
    }

    fn level(&self) -> Level {
        match self {
            Self::Processed(outcome) => outcome.level(),
            Self::Skipped(_) => Level::Info,
            Self::Invalid(_) | Self::Unstarted { .. } | Self::Panicked => Level::Warn,
        }
    }

    fn reason(&self) -> Option<Cow<'static, str>> {
        match self {
            Self::Processed(outcome) => outcome.reason(),
            Self::Invalid(invalid) => Some(Cow::Owned(crate::error_chain(*invalid))),
            Self::Unstarted { .. } => Some(Cow::Borrowed(
                "too little time left before the invocation deadline",
            )),
            Self::Skipped(skip) => Some(Cow::Borrowed(skip.as_str())),
            Self::Panicked => Some(Cow::Borrowed(
                "panicked while processing; the lease ends at the invocation deadline",
            )),
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Skipped(_) => "record not started",
            _ if self.is_ack() => "record done",
            _ => "record failed",
        }
    }
}

/// One record after parsing: a valid order comes with its key, built once.
struct Parsed<'a> {
    message_id: &'a str,
    order: Result<(Order, Key), InvalidRecord>,
    /// `ApproximateReceiveCount`: the last delivery before the DLQ stands out.
    receive_count: Option<u32>,
    /// The `Root=` of the record's `AWSTraceHeader` (X-Ray), when present.
    trace_id: Option<&'a str>,
}

impl Parsed<'_> {
    /// The record's span: every line about it carries these fields.
    fn span(&self) -> tracing::Span {
        let key = self.order.as_ref().ok().map(|(_, key)| key.as_str());
        info_span!(
            "record",
            message_id = self.message_id,
            key,
            receive_count = self.receive_count,
            trace_id = self.trace_id
        )
    }
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

    /// The Lambda handler: the invocation deadline comes from the context. Its span
    /// carries the request id and the invocation's X-Ray trace id.
    pub async fn handle_lambda_event(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, BatchError> {
        let span = info_span!(
            "invocation",
            request_id = event.context.request_id.as_str(),
            trace_id = event.context.xray_trace_id.as_deref()
        );
        self.handle_in_lambda(event).instrument(span).await
    }

    async fn handle_in_lambda(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, BatchError> {
        let sent = i64::try_from(event.context.deadline).unwrap_or(i64::MAX);
        let deadline = if sent < PLAUSIBLE_DEADLINE_MS {
            let fallback = self.default_deadline();
            warn!(
                sent,
                fallback = fallback.as_ms(),
                "the invocation deadline is not an epoch time (an emulator?); using INVOKE_DEADLINE"
            );
            fallback
        } else {
            Time::from_ms(sent)
        };
        self.handle(&event.payload, deadline).await
    }

    /// Now + `invoke_deadline`: the deadline of a batch run outside Lambda.
    pub fn default_deadline(&self) -> Time {
        self.settings.now() + self.limits.invoke_deadline
    }

    /// Processes a batch whose invocation ends at `deadline`.
    pub async fn handle(
        &self,
        event: &SqsEvent,
        deadline: Time,
    ) -> Result<SqsBatchResponse, BatchError> {
        let parsed = parse_records(&event.records)?;
        let mut outcomes: Vec<Option<RecordOutcome<'_>>> = parsed.iter().map(|_| None).collect();
        let (groups, why_skipped) = if !event.records.iter().any(is_fifo) {
            (order_groups(&parsed, &mut outcomes), Skip::SameOrder)
        } else {
            let by_group = match self.limits.fifo_failure_scope {
                FifoScope::Group => message_groups(&event.records),
                FifoScope::Batch => None,
            };
            match by_group {
                Some(groups) => (groups, Skip::FifoGroup),
                // Batch scope, or a FIFO record without a group: the whole batch in order.
                None => (vec![(0..parsed.len()).collect()], Skip::Fifo),
            }
        };
        self.run_groups(&parsed, groups, deadline, why_skipped, &mut outcomes)
            .await;
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

    /// Groups run concurrently (at most `max_concurrency` at once), each in message
    /// order, stopping at its first non-success.
    async fn run_groups<'a>(
        &self,
        parsed: &'a [Parsed<'a>],
        groups: Vec<Vec<usize>>,
        deadline: Time,
        why_skipped: Skip,
        out: &mut [Option<RecordOutcome<'a>>],
    ) {
        let results: Vec<Vec<(usize, RecordOutcome<'a>)>> = futures::stream::iter(groups)
            .map(|members| self.run_in_order(parsed, members, deadline, why_skipped))
            .buffer_unordered(self.limits.max_concurrency)
            .collect()
            .await;
        for (i, outcome) in results.into_iter().flatten() {
            out[i] = Some(outcome);
        }
    }

    /// Runs `members` one after another; after the first non-success the rest fail
    /// without any store or provider call.
    async fn run_in_order<'a>(
        &self,
        parsed: &'a [Parsed<'a>],
        members: impl IntoIterator<Item = usize>,
        deadline: Time,
        why_skipped: Skip,
    ) -> Vec<(usize, RecordOutcome<'a>)> {
        let mut results = Vec::new();
        let mut stopped = false;
        for i in members {
            let outcome = if stopped {
                skip(&parsed[i], why_skipped)
            } else {
                self.run_record(&parsed[i], deadline).await
            };
            stopped = !outcome.is_ack();
            results.push((i, outcome));
        }
        results
    }

    /// One record inside its span, with one log line for its outcome.
    async fn run_record<'a>(&self, record: &'a Parsed<'a>, deadline: Time) -> RecordOutcome<'a> {
        let (order, key) = match &record.order {
            Ok(valid) => valid,
            Err(invalid) => return rejected(record, invalid),
        };
        let span = record.span();
        async move {
            let started = Instant::now();
            let time_left = self.time_left(deadline);
            let outcome = if time_left < self.limits.deadline_margin {
                RecordOutcome::Unstarted { time_left }
            } else {
                let charger = Charger {
                    store: self.store.as_ref(),
                    provider: self.provider.as_ref(),
                    settings: &self.settings,
                };
                // Release builds keep `panic = "unwind"`, so a panic in one record is
                // caught here and fails that record only.
                match AssertUnwindSafe(charger.process(order, key, deadline))
                    .catch_unwind()
                    .await
                {
                    Ok(outcome) => RecordOutcome::Processed(outcome),
                    Err(_panic) => RecordOutcome::Panicked,
                }
            };
            log_outcome(&outcome, started.elapsed());
            outcome
        }
        .instrument(span)
        .await
    }

    fn time_left(&self, deadline: Time) -> Duration {
        self.settings.now().until(deadline)
    }
}

/// Standard queues: invalid records fail on their own; valid ones are grouped by
/// key, so two copies of one order never run at once.
fn order_groups<'a>(
    parsed: &'a [Parsed<'a>],
    out: &mut [Option<RecordOutcome<'a>>],
) -> Vec<Vec<usize>> {
    let mut valid = Vec::new();
    for (i, record) in parsed.iter().enumerate() {
        match &record.order {
            Err(invalid) => out[i] = Some(rejected(record, invalid)),
            Ok((_, key)) => valid.push((i, key)),
        }
    }
    group_in_order(valid)
}

/// An invalid record needs no I/O: it fails with its reason.
fn rejected<'a>(record: &Parsed<'_>, invalid: &'a InvalidRecord) -> RecordOutcome<'a> {
    let span = record.span();
    let _entered = span.enter();
    let outcome = RecordOutcome::Invalid(invalid);
    log_outcome(&outcome, Duration::ZERO);
    outcome
}

fn skip<'a>(record: &Parsed<'_>, why: Skip) -> RecordOutcome<'a> {
    let span = record.span();
    let _entered = span.enter();
    let outcome = RecordOutcome::Skipped(why);
    log_outcome(&outcome, Duration::ZERO);
    outcome
}

/// One line per record outcome, at the level that says who must act.
fn log_outcome(outcome: &RecordOutcome<'_>, elapsed: Duration) {
    let name = outcome.name();
    crate::telemetry::count_outcome(name);
    let d = match outcome {
        RecordOutcome::Processed(processed) => processed.details(),
        _ => Details::default(),
    };
    let time_left_ms = match outcome {
        RecordOutcome::Unstarted { time_left } => Some(millis(*time_left)),
        _ => None,
    };
    let reason = outcome.reason();
    let latency_ms = millis(elapsed);
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                outcome = name,
                receipt = d.receipt,
                code = d.code,
                decline_code = d.decline_code,
                status = d.status,
                declines = d.declines,
                before = d.before,
                attempt = d.attempt,
                time_left_ms,
                latency_ms,
                reason = reason.as_deref(),
                "{}",
                outcome.message()
            )
        };
    }
    match outcome.level() {
        Level::Info => line!(info),
        Level::Warn => line!(warn),
        Level::Error => line!(error),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
                None => Err(InvalidRecord::NoBody),
                Some(body) => Order::parse(body)
                    .map(|order| {
                        let key = Key::for_order(&order);
                        (order, key)
                    })
                    .map_err(InvalidRecord::from),
            };
            let receive_count = message
                .attributes
                .get("ApproximateReceiveCount")
                .and_then(|n| n.parse().ok());
            let trace_id = message
                .attributes
                .get("AWSTraceHeader")
                .and_then(|header| trace_root(header));
            Ok(Parsed {
                message_id,
                order,
                receive_count,
                trace_id,
            })
        })
        .collect()
}

/// The `Root=` of an X-Ray trace header (`Root=1-…;Parent=…;Sampled=1`).
fn trace_root(header: &str) -> Option<&str> {
    header
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Root="))
        .filter(|root| !root.is_empty())
}

/// The records' indices by `MessageGroupId`, each group in message order; `None` when
/// a record has no group (then only the whole batch's order is known).
fn message_groups(records: &[SqsMessage]) -> Option<Vec<Vec<usize>>> {
    let keyed: Option<Vec<(usize, &String)>> = records
        .iter()
        .enumerate()
        .map(|(i, message)| Some((i, message.attributes.get("MessageGroupId")?)))
        .collect();
    keyed.map(group_in_order)
}

/// Indices grouped by their key: groups in order of first appearance, each in message
/// order.
fn group_in_order<K: Hash + Eq>(keyed: Vec<(usize, K)>) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<K, usize> = HashMap::new();
    for (i, key) in keyed {
        let g = *group_of.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

fn is_fifo(message: &SqsMessage) -> bool {
    message
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_the_root_of_the_x_ray_header() {
        let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        assert_eq!(
            trace_root(header),
            Some("1-5759e988-bd862e3fe1be46a994272793")
        );
        assert_eq!(trace_root("Parent=1;Root=1-a-b"), Some("1-a-b"));
        assert_eq!(trace_root("Parent=1;Sampled=0"), None);
        assert_eq!(trace_root("Root="), None);
    }

    #[test]
    fn groups_keep_first_appearance_and_message_order() {
        let keyed = vec![(0, "b"), (1, "a"), (2, "b"), (3, "c"), (4, "a")];
        assert_eq!(group_in_order(keyed), vec![vec![0, 2], vec![1, 4], vec![3]]);
    }
}
