//! The SQS batch (ARCHITECTURE.md, "The batch" and "Retries"): parse every record,
//! group by key, run groups concurrently (bounded) and records of a group in message
//! order, stop a group after its first non-success, keep FIFO batches strictly in
//! order, respect the deadline margin, isolate panics; then settle each record that is
//! not acknowledged (the DLQ at once, or a delay chosen by its cause, told to SQS), log
//! one line per record, and answer with a partial batch response.

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
use crate::deadline::{self, CallKind};
use crate::idempotency::{Charger, Details, IdempotencyStore, Key, Level, Outcome, Settings};
use crate::order::{Order, OrderError};
use crate::payment::PaymentProvider;
use crate::queue::{DeadLetter, Offline, Queue, QueueError, VisibilityChange};
use crate::retry::{self, Backoff, Class, Disposition, Jitter};
use crate::telemetry::{DEAD_LETTERED, QUEUE_FAILURES};

/// The batch cannot be judged at all: the whole batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("record {index} has no messageId, so no partial failure can name it")]
    MissingMessageId { index: usize },
}

/// How a batch is run (ARCHITECTURE.md, "The batch").
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Key groups processed at once.
    pub max_concurrency: usize,
    /// The deadline given to a batch whose invocation has none usable (outside
    /// Lambda, or an emulator that sends no epoch deadline).
    pub invoke_deadline: Duration,
    /// What the first failure in a FIFO batch stops.
    pub fifo_failure_scope: FifoScope,
    /// The backoff of transient failures.
    pub backoff: Backoff,
}

impl From<&Config> for Limits {
    fn from(config: &Config) -> Self {
        Self {
            max_concurrency: config.max_concurrency,
            invoke_deadline: config.invoke_deadline,
            fifo_failure_scope: config.fifo_failure_scope,
            backoff: Backoff {
                base: config.retry_base,
                cap: config.retry_cap,
            },
        }
    }
}

/// The consumer: clients and settings built once at cold start, shared by every
/// invocation.
pub struct Consumer {
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn PaymentProvider>,
    queue: Arc<dyn Queue>,
    settings: Settings,
    limits: Limits,
}

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
    /// Not started, behind the failure of the record at index `behind`.
    Skipped {
        why: Skip,
        behind: usize,
    },
    /// The record's processing panicked; the lease ends at the invocation deadline.
    Panicked,
    /// No outcome was recorded for the record: a bug, and failing it loses nothing.
    NoOutcome,
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
            Self::Skipped { .. } => "skipped",
            Self::Panicked | Self::NoOutcome => "failed_retryable",
        }
    }

    /// What retrying it can do; a skipped record waits as long as the failure ahead
    /// of it (the batch settles it after that one).
    fn class(&self) -> Class {
        match self {
            Self::Processed(outcome) => outcome.class(),
            Self::Invalid(_) => Class::Poison,
            Self::Unstarted { .. } | Self::Skipped { .. } | Self::Panicked | Self::NoOutcome => {
                Class::Transient
            }
        }
    }

    fn level(&self) -> Level {
        match self {
            Self::Processed(outcome) => outcome.level(),
            Self::Skipped { .. } => Level::Info,
            Self::Invalid(_) | Self::Unstarted { .. } | Self::Panicked | Self::NoOutcome => {
                Level::Warn
            }
        }
    }

    fn reason(&self) -> Option<Cow<'static, str>> {
        match self {
            Self::Processed(outcome) => outcome.reason(),
            Self::Invalid(invalid) => Some(Cow::Owned(crate::error_chain(*invalid))),
            Self::Unstarted { .. } => Some(Cow::Borrowed(
                "too little time left before the invocation deadline",
            )),
            Self::Skipped { why, .. } => Some(Cow::Borrowed(why.as_str())),
            Self::Panicked => Some(Cow::Borrowed(
                "panicked while processing; the lease ends at the invocation deadline",
            )),
            Self::NoOutcome => Some(Cow::Borrowed(
                "internal: no outcome was recorded for this record; retried",
            )),
        }
    }
}

/// How one record was settled after its outcome: what the batch chose, and what the
/// queue calls made of it.
struct Settled {
    disposition: Disposition,
    /// A dead letter: whether the send succeeded (only then is the record
    /// acknowledged).
    dead_lettered: Option<bool>,
    /// A queue call for this record that failed or was not made.
    queue_error: Option<QueueError>,
}

impl Settled {
    fn is_ack(&self, outcome: &RecordOutcome<'_>) -> bool {
        outcome.is_ack() || self.dead_lettered == Some(true)
    }

    fn retry_in_s(&self) -> Option<u32> {
        match self.disposition {
            Disposition::Retry(delay) if self.dead_lettered != Some(true) => {
                Some(retry::whole_seconds(delay))
            }
            _ => None,
        }
    }

    fn message(&self, outcome: &RecordOutcome<'_>) -> &'static str {
        match outcome {
            RecordOutcome::Skipped { .. } => "record not started",
            _ if outcome.is_ack() => "record done",
            _ if self.dead_lettered == Some(true) => "record dead-lettered",
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
            queue: Arc::new(Offline),
            settings,
            limits,
        }
    }

    /// The consumer that tells `queue` what becomes of each failed record (in Lambda,
    /// and `invoke --sqs`); without it nothing is sent and the log says what would be.
    pub fn with_queue(mut self, queue: Arc<dyn Queue>) -> Self {
        self.settings.budget = self.settings.budget.with_queue_steps();
        Self { queue, ..self }
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
        let deadline = deadline::plausible(sent).unwrap_or_else(|| {
            let fallback = self.default_deadline();
            warn!(
                sent,
                fallback = fallback.as_ms(),
                "the invocation deadline is not an epoch time (an emulator?); using INVOKE_DEADLINE"
            );
            fallback
        });
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
        let started = Instant::now();
        let parsed = parse_records(&event.records)?;
        let mut outcomes: Vec<Option<(RecordOutcome<'_>, Duration)>> =
            parsed.iter().map(|_| None).collect();
        let (groups, why_skipped) = self.groups(&event.records, &parsed, &mut outcomes);
        // The records' calls end early enough for the queue steps to follow.
        let records_deadline = self.settings.budget.records_deadline(deadline);
        self.run_groups(
            &parsed,
            groups,
            records_deadline,
            why_skipped,
            &mut outcomes,
        )
        .await;
        // A record without an outcome is a bug; failing it loses nothing.
        let ended: Vec<(RecordOutcome<'_>, Duration)> = outcomes
            .into_iter()
            .map(|o| o.unwrap_or((RecordOutcome::NoOutcome, Duration::ZERO)))
            .collect();
        // SQS's 12-hour limit counts from the receive: the time spent here comes off.
        let longest = retry::longest_delay(started.elapsed());
        let mut settled = self.dispose(&parsed, &ended, longest);
        self.send_dead_letters(
            &event.records,
            &parsed,
            &ended,
            &mut settled,
            deadline,
            longest,
        )
        .await;
        self.change_visibility(&event.records, &mut settled, deadline)
            .await;

        let mut response = SqsBatchResponse::default();
        let mut listed = HashSet::new();
        for ((record, (outcome, latency)), settled) in parsed.iter().zip(&ended).zip(&settled) {
            log_outcome(record, outcome, settled, *latency);
            // SQS can hand one message twice in a batch: it is listed once.
            if !settled.is_ack(outcome) && listed.insert(record.message_id) {
                response.add_failure(record.message_id);
            }
        }
        Ok(response)
    }

    /// The groups that run concurrently, each in message order, and why a group's
    /// records after a failure are skipped. Standard queues group by order (invalid
    /// records fail on their own, here); FIFO queues by message group, or the whole
    /// batch as one group.
    fn groups<'a>(
        &self,
        records: &[SqsMessage],
        parsed: &'a [Parsed<'a>],
        outcomes: &mut [Option<(RecordOutcome<'a>, Duration)>],
    ) -> (Vec<Vec<usize>>, Skip) {
        if !records.iter().any(is_fifo) {
            return (order_groups(parsed, outcomes), Skip::SameOrder);
        }
        let by_group = match self.limits.fifo_failure_scope {
            FifoScope::Group => message_groups(records),
            FifoScope::Batch => None,
        };
        match by_group {
            Some(groups) => (groups, Skip::FifoGroup),
            // Batch scope, or a FIFO record without a group: the whole batch in order.
            None => (vec![(0..parsed.len()).collect()], Skip::Fifo),
        }
    }

    /// What becomes of each record (`retry.rs`): a skipped record waits as long as
    /// the failure ahead of it, or the backoff when that one went to the DLQ.
    fn dispose(
        &self,
        parsed: &[Parsed<'_>],
        ended: &[(RecordOutcome<'_>, Duration)],
        longest: Duration,
    ) -> Vec<Settled> {
        let dispose = |class, record: &Parsed<'_>| self.dispose_one(class, record, longest);
        let dispositions: Vec<Disposition> = parsed
            .iter()
            .zip(ended)
            .map(|(record, (outcome, _))| dispose(outcome.class(), record))
            .collect();
        parsed
            .iter()
            .zip(ended)
            .zip(&dispositions)
            .map(|((record, (outcome, _)), own)| {
                let disposition = match outcome {
                    RecordOutcome::Skipped { behind, .. } => match dispositions.get(*behind) {
                        Some(&Disposition::Retry(delay)) => Disposition::Retry(delay),
                        _ => dispose(Class::Transient, record),
                    },
                    _ => *own,
                };
                Settled {
                    disposition,
                    dead_lettered: None,
                    queue_error: None,
                }
            })
            .collect()
    }

    /// One record's disposition now, delivered `ApproximateReceiveCount` times (1 when
    /// the attribute is missing).
    fn dispose_one(&self, class: Class, record: &Parsed<'_>, longest: Duration) -> Disposition {
        let receives = record.receive_count.unwrap_or(1);
        let (now, backoff) = (self.settings.now(), &self.limits.backoff);
        retry::dispose(class, receives, now, backoff, Jitter::random(), longest)
    }

    /// Sends the dead letters; a record is acknowledged only once its send succeeded,
    /// else it fails with the backoff and its next delivery tries again.
    async fn send_dead_letters(
        &self,
        messages: &[SqsMessage],
        parsed: &[Parsed<'_>],
        ended: &[(RecordOutcome<'_>, Duration)],
        settled: &mut [Settled],
        deadline: Time,
        longest: Duration,
    ) {
        let chosen: Vec<usize> = (0..settled.len())
            .filter(|i| settled[*i].disposition == Disposition::DeadLetter)
            .collect();
        if chosen.is_empty() {
            return;
        }
        let letters: Vec<DeadLetter<'_>> = chosen
            .iter()
            .map(|&i| DeadLetter {
                message: &messages[i],
                message_id: parsed[i].message_id,
                note: note(&parsed[i], &ended[i].0),
            })
            .collect();
        let results = self
            .queue_step(deadline, letters.len(), self.queue.dead_letter(&letters))
            .await;
        for (i, result) in chosen.into_iter().zip(results) {
            let s = &mut settled[i];
            s.dead_lettered = Some(result.is_ok());
            if let Err(e) = result {
                s.disposition = self.dispose_one(Class::Transient, &parsed[i], longest);
                s.queue_error = Some(e);
            }
        }
    }

    /// Tells SQS each failed record's delay. A change that fails is logged; the record
    /// comes back at the queue's own visibility timeout.
    async fn change_visibility(
        &self,
        messages: &[SqsMessage],
        settled: &mut [Settled],
        deadline: Time,
    ) {
        let mut chosen = Vec::new();
        let mut changes = Vec::new();
        for (i, s) in settled.iter_mut().enumerate() {
            let Some(delay_s) = s.retry_in_s() else {
                continue;
            };
            let message = &messages[i];
            match (
                message.event_source_arn.as_deref(),
                message.receipt_handle.as_deref(),
            ) {
                (Some(queue_arn), Some(receipt_handle)) => {
                    chosen.push(i);
                    changes.push(VisibilityChange {
                        queue_arn,
                        receipt_handle,
                        delay_s,
                    });
                }
                (None, _) => s.queue_error = Some(QueueError::Missing("eventSourceARN")),
                (_, None) => s.queue_error = Some(QueueError::Missing("receiptHandle")),
            }
        }
        if changes.is_empty() {
            return;
        }
        let results = self
            .queue_step(
                deadline,
                changes.len(),
                self.queue.change_visibility(&changes),
            )
            .await;
        for (i, result) in chosen.into_iter().zip(results) {
            if let Err(e) = result {
                settled[i].queue_error.get_or_insert(e);
            }
        }
    }

    /// One step of queue calls, bounded like every other call: it ends before the
    /// deadline less the safety margin, or is not started.
    async fn queue_step(
        &self,
        deadline: Time,
        entries: usize,
        call: impl std::future::Future<Output = Vec<Result<(), QueueError>>>,
    ) -> Vec<Result<(), QueueError>> {
        let now = self.settings.now();
        let results = match self
            .settings
            .budget
            .call_timeout(CallKind::Queue, now, deadline)
        {
            None => vec![Err(QueueError::NoTime); entries],
            Some(timeout) => tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_elapsed| vec![Err(QueueError::TimedOut); entries]),
        };
        let failures = results
            .iter()
            .filter(|r| matches!(r, Err(e) if !matches!(e, QueueError::Offline)))
            .count();
        metrics::counter!(QUEUE_FAILURES).increment(failures as u64);
        results
    }

    /// Groups run concurrently (at most `max_concurrency` at once), each in message
    /// order, stopping at its first non-success.
    async fn run_groups<'a>(
        &self,
        parsed: &'a [Parsed<'a>],
        groups: Vec<Vec<usize>>,
        deadline: Time,
        why_skipped: Skip,
        out: &mut [Option<(RecordOutcome<'a>, Duration)>],
    ) {
        let results: Vec<Vec<(usize, (RecordOutcome<'a>, Duration))>> =
            futures::stream::iter(groups)
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
    ) -> Vec<(usize, (RecordOutcome<'a>, Duration))> {
        let mut results = Vec::new();
        let mut stopped_at = None;
        for i in members {
            let ended = match stopped_at {
                Some(behind) => (
                    RecordOutcome::Skipped {
                        why: why_skipped,
                        behind,
                    },
                    Duration::ZERO,
                ),
                None => self.run_record(&parsed[i], deadline).await,
            };
            if !ended.0.is_ack() {
                stopped_at = stopped_at.or(Some(i));
            }
            results.push((i, ended));
        }
        results
    }

    /// One record inside its span; its outcome and how long it took. Its log line is
    /// written once the batch has settled it.
    async fn run_record<'a>(
        &self,
        record: &'a Parsed<'a>,
        deadline: Time,
    ) -> (RecordOutcome<'a>, Duration) {
        let (order, key) = match &record.order {
            Ok(valid) => valid,
            Err(invalid) => return (RecordOutcome::Invalid(invalid), Duration::ZERO),
        };
        let span = record.span();
        async move {
            let started = Instant::now();
            let start = self
                .settings
                .budget
                .may_start(self.settings.now(), deadline);
            let outcome = if let Err(time_left) = start {
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
            (outcome, started.elapsed())
        }
        .instrument(span)
        .await
    }
}

/// Standard queues: invalid records fail on their own; valid ones are grouped by
/// key, so two copies of one order never run at once.
fn order_groups<'a>(
    parsed: &'a [Parsed<'a>],
    out: &mut [Option<(RecordOutcome<'a>, Duration)>],
) -> Vec<Vec<usize>> {
    let mut valid = Vec::new();
    for (i, record) in parsed.iter().enumerate() {
        match &record.order {
            Err(invalid) => out[i] = Some((RecordOutcome::Invalid(invalid), Duration::ZERO)),
            Ok((_, key)) => valid.push((i, key)),
        }
    }
    group_in_order(valid)
}

/// The `charge-once` attribute of a dead letter: why it is there, as JSON.
fn note(record: &Parsed<'_>, outcome: &RecordOutcome<'_>) -> String {
    serde_json::json!({
        "outcome": outcome.name(),
        "reason": outcome.reason().as_deref().unwrap_or(""),
        "message_id": record.message_id,
        "receive_count": record.receive_count,
    })
    .to_string()
}

/// One line per record outcome, in the record's span, at the level that says who must
/// act; with what the batch made of it (`retry_in_s`, `dead_lettered`).
fn log_outcome(
    record: &Parsed<'_>,
    outcome: &RecordOutcome<'_>,
    settled: &Settled,
    elapsed: Duration,
) {
    let span = record.span();
    let _entered = span.enter();
    let name = outcome.name();
    crate::telemetry::count_outcome(name);
    if settled.dead_lettered == Some(true) {
        metrics::counter!(DEAD_LETTERED).increment(1);
    }
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
    let retry_in_s = settled.retry_in_s();
    let dead_lettered = settled.dead_lettered;
    let queue_error = settled.queue_error.as_ref().map(|e| crate::error_chain(e));
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
                retry_in_s,
                dead_lettered,
                queue_error,
                reason = reason.as_deref(),
                "{}",
                settled.message(outcome)
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
