//! The SQS batch (ARCHITECTURE.md, "The batch" and "Retries"), as a pure plan and a
//! thin I/O layer, as the record is a machine and a driver. The plan (`plan.rs`) parses
//! every record into an entry, groups them, stops a group after its first non-success,
//! keeps FIFO batches strictly in order, chooses each record's disposition and builds
//! the partial batch response. This layer runs the groups concurrently (bounded; one
//! customer's groups one after another), each in message order, within the deadline margin, isolating panics; then makes the
//! queue calls (the DLQ at once, or a delay chosen by the cause, told to SQS).
//! `report.rs` writes one line per record and counts its metrics. The event source's
//! types stop here: each SQS record is read into the plan's own `plan::Message`, and
//! the plan's `plan::Response` is written back as the `SqsBatchResponse` (the edge,
//! below).

mod report;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::{FutureExt, StreamExt};
use lambda_runtime::{Context, LambdaEvent};
use tracing::{Instrument, info_span, warn};

use crate::config::{Config, FifoScope};
use crate::contracts::payment::ChargePath;
use crate::contracts::queue::{DeadLetter, Offline, Queue, QueueError, Reports, Unreported};
use crate::contracts::store::IdempotencyStore;
use crate::domain::clock::Time;
use crate::drivers::charge::{Charger, Settings};
use crate::drivers::executor::executor;
use crate::drivers::metrics::QUEUE_FAILURES;
pub use crate::policy::batch::ending::{InvalidRecord, RecordOutcome};
pub use crate::policy::batch::plan::BatchError;
pub use crate::policy::batch::plan::Skip;
use crate::policy::batch::plan::{
    self, Entry, InOrder, Message, Response, Retries, Schedule, Valid,
};
use crate::policy::deadline;
use crate::policy::retry::{self, Backoff, Jitter};

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
    provider: Arc<dyn ChargePath>,
    queue: Arc<dyn Queue>,
    /// Where an order whose wait ended without a payment is reported.
    reports: Arc<dyn Reports>,
    settings: Settings,
    limits: Limits,
}

impl Consumer {
    pub fn new(
        store: Arc<dyn IdempotencyStore>,
        provider: Arc<dyn ChargePath>,
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
            reports: Arc::new(Unreported),
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

    /// The consumer that keeps `reserve` before each invocation's deadline for the
    /// traces' flush before the response (`traces.rs`).
    pub fn with_flush_reserve(mut self, reserve: Duration) -> Self {
        self.settings.budget = self.settings.budget.with_flush_reserve(reserve);
        self
    }

    /// The consumer that reports ended waits to `reports` (the shop's queue).
    pub fn with_reports(self, reports: Arc<dyn Reports>) -> Self {
        Self { reports, ..self }
    }

    /// The Lambda handler: the invocation deadline comes from the context. Its span
    /// carries the request id and the invocation's X-Ray trace id.
    pub async fn handle(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, BatchError> {
        let span = info_span!(
            "invocation",
            request_id = event.context.request_id.as_str(),
            trace_id = event.context.xray_trace_id.as_deref()
        );
        async {
            let deadline = self.invocation_deadline(&event.context);
            self.run(&event.payload, deadline).await
        }
        .instrument(span)
        .await
    }

    /// The deadline Lambda sent, or `INVOKE_DEADLINE` from now when it is not an epoch
    /// time.
    fn invocation_deadline(&self, context: &Context) -> Time {
        let sent = i64::try_from(context.deadline).unwrap_or(i64::MAX);
        deadline::plausible(sent).unwrap_or_else(|| {
            let fallback = self.default_deadline();
            warn!(
                sent,
                fallback = fallback.as_ms(),
                "the invocation deadline is not an epoch time (an emulator?); using INVOKE_DEADLINE"
            );
            fallback
        })
    }

    /// Now + `invoke_deadline`: the deadline of a batch run outside Lambda.
    pub fn default_deadline(&self) -> Time {
        self.settings.now() + self.limits.invoke_deadline
    }

    /// Runs a batch whose invocation ends at `deadline`.
    pub async fn run(
        &self,
        event: &SqsEvent,
        deadline: Time,
    ) -> Result<SqsBatchResponse, BatchError> {
        let started = Instant::now();
        // With traces, the batch ends early enough for their flush to follow.
        let deadline = self.settings.budget.answer_by(deadline);
        let messages: Vec<Message<'_>> = event.records.iter().map(message).collect();
        let mut entries = plan::parse(&messages)?;
        let schedule = plan::schedule(&mut entries, self.limits.fifo_failure_scope);
        // One span per record, from its run to its line (one entry per record, in
        // order).
        let spans: Vec<tracing::Span> = entries
            .iter()
            .zip(&event.records)
            .map(|(entry, record)| report::span(entry, record))
            .collect();
        // The records' calls end early enough for the queue steps to follow.
        let records_deadline = self.settings.budget.records_deadline(deadline);
        self.run_groups(&mut entries, &spans, schedule, records_deadline)
            .await;
        let retries = Retries {
            now: self.settings.now(),
            backoff: &self.limits.backoff,
            // SQS's 12-hour limit counts from the receive: the time spent here comes off.
            longest: retry::longest_delay(started.elapsed()),
        };
        plan::dispose(&mut entries, &retries, Jitter::random);
        self.send_dead_letters(&event.records, &mut entries, deadline, &retries)
            .await;
        self.change_visibility(&mut entries, deadline).await;
        for (entry, span) in entries.iter().zip(&spans) {
            report::report(entry, span);
        }
        Ok(batch_response(plan::response(&entries)))
    }

    /// Chains run concurrently (at most `max_concurrency` at once), each its groups one
    /// after another (one customer's orders), each group in message order.
    async fn run_groups(
        &self,
        entries: &mut [Entry<'_>],
        spans: &[tracing::Span],
        schedule: Schedule,
        deadline: Time,
    ) {
        let shared: &[Entry<'_>] = entries;
        let Schedule {
            groups,
            chains,
            skip,
        } = schedule;
        let groups = &groups;
        let ended: Vec<Vec<(usize, RecordOutcome, Duration)>> = futures::stream::iter(chains)
            .map(|chain| async move {
                let mut ended = Vec::new();
                for g in chain {
                    let members = groups[g].clone();
                    ended.extend(
                        self.run_in_order(shared, spans, members, deadline, skip)
                            .await,
                    );
                }
                ended
            })
            .buffer_unordered(self.limits.max_concurrency)
            .collect()
            .await;
        for (i, outcome, latency) in ended.into_iter().flatten() {
            entries[i].outcome = outcome;
            entries[i].latency = latency;
        }
    }

    /// Runs `members` one after another, as the skip rule lets them.
    async fn run_in_order(
        &self,
        entries: &[Entry<'_>],
        spans: &[tracing::Span],
        members: Vec<usize>,
        deadline: Time,
        skip: Skip,
    ) -> Vec<(usize, RecordOutcome, Duration)> {
        let mut rule = InOrder::new(skip);
        let mut ended = Vec::with_capacity(members.len());
        for i in members {
            let (outcome, latency) = match rule.skipped() {
                Some(skipped) => (skipped, Duration::ZERO),
                None => self.run_record(&entries[i], &spans[i], deadline).await,
            };
            rule.ended(i, &outcome);
            ended.push((i, outcome, latency));
        }
        ended
    }

    /// One record inside its span; its outcome and how long it took. Its log line is
    /// written once the batch has settled it, in the same span.
    async fn run_record(
        &self,
        entry: &Entry<'_>,
        span: &tracing::Span,
        deadline: Time,
    ) -> (RecordOutcome, Duration) {
        let Ok(valid) = &entry.fact else {
            return (RecordOutcome::Invalid, Duration::ZERO);
        };
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
                let work = async {
                    match valid {
                        Valid::Order { order, identity } => {
                            charger.process(order, identity, deadline).await
                        }
                        Valid::Event { event, key } => {
                            charger
                                .settle_event(event, key.as_ref(), self.reports.as_ref(), deadline)
                                .await
                        }
                    }
                };
                // Release builds keep `panic = "unwind"`, so a panic in one record is
                // caught here and fails that record only.
                match AssertUnwindSafe(work).catch_unwind().await {
                    Ok(outcome) => RecordOutcome::Processed(outcome),
                    Err(_panic) => RecordOutcome::Panicked,
                }
            };
            (outcome, started.elapsed())
        }
        .instrument(span.clone())
        .await
    }

    /// Sends the dead letters, each from its record as it came (`records`, one per
    /// entry, in order); each is acknowledged only once its send succeeded.
    async fn send_dead_letters(
        &self,
        records: &[SqsMessage],
        entries: &mut [Entry<'_>],
        deadline: Time,
        retries: &Retries<'_>,
    ) {
        let chosen = plan::dead_letters(entries);
        if chosen.is_empty() {
            return;
        }
        let letters: Vec<DeadLetter<'_>> = chosen
            .iter()
            .map(|&i| DeadLetter {
                message: &records[i],
                message_id: entries[i].message_id,
                note: report::note(&entries[i]),
            })
            .collect();
        let sent = self
            .queue_step(deadline, letters.len(), self.queue.dead_letter(&letters))
            .await;
        for (i, result) in chosen.into_iter().zip(sent) {
            plan::dead_lettered(&mut entries[i], result, retries, Jitter::random());
        }
    }

    /// Tells SQS each failed record's delay. A change that fails is logged; the record
    /// comes back at the queue's own visibility timeout.
    async fn change_visibility(&self, entries: &mut [Entry<'_>], deadline: Time) {
        let (chosen, changes): (Vec<usize>, Vec<_>) =
            plan::visibility_changes(entries).into_iter().unzip();
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
                entries[i].queue_error.get_or_insert(e);
            }
        }
    }

    /// One step of queue calls, through the one executor like every other call: it
    /// ends before the deadline less the safety margin, or is not started.
    async fn queue_step(
        &self,
        deadline: Time,
        entries: usize,
        call: impl std::future::Future<Output = Vec<Result<(), QueueError>>>,
    ) -> Vec<Result<(), QueueError>> {
        let results = executor(&self.settings, deadline)
            .queue_step(entries, call)
            .await;
        let failures = results
            .iter()
            .filter(|r| matches!(r, Err(e) if !matches!(e, QueueError::Offline)))
            .count();
        metrics::counter!(QUEUE_FAILURES).increment(failures as u64);
        results
    }
}

/// The edge, in: what the plan reads of an SQS record. A receive count that is not a
/// number reads as absent (the plan takes it as the first delivery).
fn message(record: &SqsMessage) -> Message<'_> {
    let attribute = |name: &str| record.attributes.get(name).map(String::as_str);
    Message {
        message_id: record.message_id.as_deref(),
        body: record.body.as_deref(),
        receive_count: attribute("ApproximateReceiveCount").and_then(|n| n.parse().ok()),
        trace_header: attribute("AWSTraceHeader"),
        message_group_id: attribute("MessageGroupId"),
        event_source_arn: record.event_source_arn.as_deref(),
        receipt_handle: record.receipt_handle.as_deref(),
    }
}

/// The edge, out: the plan's response as the event source takes it.
fn batch_response(response: Response<'_>) -> SqsBatchResponse {
    let mut batch = SqsBatchResponse::default();
    for message_id in response.failures {
        batch.add_failure(message_id);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edge_reads_what_the_plan_needs_from_an_sqs_record() {
        let mut record = SqsMessage::default();
        record.message_id = Some("m1".into());
        record.body = Some("{}".into());
        record.event_source_arn = Some("arn:aws:sqs:eu-west-1:1:orders.fifo".into());
        record.receipt_handle = Some("rh".into());
        for (name, value) in [
            ("ApproximateReceiveCount", "3"),
            ("AWSTraceHeader", "Root=1-a-b"),
            ("MessageGroupId", "g1"),
        ] {
            record.attributes.insert(name.into(), value.into());
        }
        assert_eq!(
            message(&record),
            Message {
                message_id: Some("m1"),
                body: Some("{}"),
                receive_count: Some(3),
                trace_header: Some("Root=1-a-b"),
                message_group_id: Some("g1"),
                event_source_arn: Some("arn:aws:sqs:eu-west-1:1:orders.fifo"),
                receipt_handle: Some("rh"),
            }
        );
        record
            .attributes
            .insert("ApproximateReceiveCount".into(), "many".into());
        assert_eq!(message(&record).receive_count, None);
    }

    #[test]
    fn the_edge_writes_each_failure_of_the_plan_into_the_batch_response() {
        let batch = batch_response(Response {
            failures: vec!["m0", "m2"],
        });
        let ids: Vec<&str> = batch
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect();
        assert_eq!(ids, ["m0", "m2"]);
    }
}
