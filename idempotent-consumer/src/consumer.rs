//! The Lambda consumer's batch, whatever its effect: each record's verdict in message
//! order (a FIFO group stops at its first failure), the dead letters sent in one step
//! with their notes, one outcome line per record, and the partial batch response.
//! `in_store::Consumer` and `effect::Consumer` give each record its verdict; the
//! runtime's future is built here, once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use tracing::{Instrument as _, info, info_span, warn};

use crate::clock::Time;
use crate::error_chain;
use crate::executor::{Executor, Safeguards, StoreOnly};
use crate::queue::{DeadLetter, Queue, QueueError};

/// How a record ends, before the queue is told.
pub(crate) enum Verdict {
    /// Done, or a duplicate of a done fact: acknowledged.
    Acked(&'static str),
    /// No retry can fix it: the dead-letter queue, with its outcome and reason.
    DeadLetter {
        outcome: &'static str,
        reason: String,
    },
    /// It may succeed later: back to the queue, with why.
    Retry(String),
}

impl Verdict {
    pub(crate) fn dead(outcome: &'static str, reason: String) -> Self {
        Self::DeadLetter { outcome, reason }
    }

    /// The dead letter's note, why, as a JSON object: `None` for a record that is not
    /// one.
    fn note(&self, message_id: &str) -> Option<String> {
        let Self::DeadLetter { outcome, reason } = self else {
            return None;
        };
        let note =
            serde_json::json!({"outcome": outcome, "reason": reason, "message_id": message_id});
        Some(note.to_string())
    }

    /// Writes the record's one outcome line, given what became of its dead letter;
    /// whether it is acknowledged.
    fn told(&self, sent: Option<Result<(), QueueError>>) -> bool {
        match (self, sent) {
            (Self::Acked(outcome), _) => {
                info!(outcome, "record processed");
                true
            }
            (Self::DeadLetter { outcome, reason }, Some(Ok(()))) => {
                warn!(outcome, reason = %reason, "record dead-lettered");
                true
            }
            (Self::DeadLetter { outcome, reason }, Some(Err(e))) => {
                warn!(outcome, reason = %reason, queue_error = %error_chain(&e),
                    "record failed: its dead letter was not sent; it comes back");
                false
            }
            (Self::DeadLetter { outcome, reason }, None) => {
                warn!(outcome, reason = %reason,
                    "record failed; no retry fixes it: the queue's redrive policy moves it");
                false
            }
            (Self::Retry(reason), _) => {
                warn!(outcome = "failed", reason = %reason, "record failed; it comes back");
                false
            }
        }
    }
}

/// A batch handler whatever its effect, so that the Lambda runtime's future is built
/// here, once, and not in every application's crate.
pub(crate) trait HandleBatch: Send + Sync {
    fn handle_batch(&self, event: lambda_runtime::LambdaEvent<SqsEvent>) -> BatchFuture<'_>;
}

type BatchFuture<'a> =
    Pin<Box<dyn Future<Output = Result<SqsBatchResponse, std::convert::Infallible>> + Send + 'a>>;

/// The Lambda runtime serving `handler`. Not generic: the runtime's future is deeper
/// than the compiler's default limit, so it is laid out in this crate alone (see the
/// crate's `recursion_limit`) and handed out boxed.
pub(crate) fn serve_batches(
    handler: Arc<dyn HandleBatch>,
) -> Pin<Box<dyn Future<Output = Result<(), lambda_runtime::Error>> + Send>> {
    Box::pin(lambda_runtime::run(lambda_runtime::service_fn(
        move |event| {
            let handler = Arc::clone(&handler);
            async move { handler.handle_batch(event).await }
        },
    )))
}

/// A verdict to come, borrowed from its consumer.
pub(crate) type VerdictFuture<'a> = Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;

/// A consumer that gives each record its verdict.
pub(crate) trait Verdicts: Send + Sync {
    /// The environment's safeguards.
    fn safeguards(&self) -> &Safeguards;
    /// Where a record no retry can fix goes, when there is a queue for it.
    fn dead_letters(&self) -> Option<&Arc<dyn Queue>>;
    /// How `message` ends, before the queue is told.
    fn verdict<'a>(&'a self, message: &'a SqsMessage, deadline: Time) -> VerdictFuture<'a>;
}

impl<V: Verdicts> HandleBatch for V {
    fn handle_batch(&self, event: lambda_runtime::LambdaEvent<SqsEvent>) -> BatchFuture<'_> {
        Box::pin(async move {
            let deadline = deadline_of(&event.context, self.safeguards());
            Ok(run(self, &event.payload, deadline).await)
        })
    }
}

/// The invocation's deadline, or a minute from now when Lambda's is not plausible.
pub(crate) fn deadline_of(context: &lambda_runtime::Context, safeguards: &Safeguards) -> Time {
    crate::deadline::plausible(i64::try_from(context.deadline).unwrap_or(i64::MAX))
        .unwrap_or_else(|| safeguards.now() + Duration::from_secs(60))
}

/// Runs a batch whose invocation ends at `deadline`: each record in message order; a
/// failed one, and in a FIFO queue every later one of its message group, is listed in
/// the partial batch response and comes back.
pub(crate) async fn run<V: Verdicts + ?Sized>(
    consumer: &V,
    event: &SqsEvent,
    deadline: Time,
) -> SqsBatchResponse {
    let deadline = consumer.safeguards().budget.answer_by(deadline);
    let mut failed_groups: Vec<&str> = Vec::new();
    let mut verdicts = Vec::with_capacity(event.records.len());
    let mut spans = Vec::with_capacity(event.records.len());
    for message in &event.records {
        let message_id = message.message_id.as_deref().unwrap_or_default();
        let span = info_span!("record", message_id);
        let group = message.attributes.get("MessageGroupId").map(String::as_str);
        let verdict = if group.is_some_and(|g| failed_groups.contains(&g)) {
            Verdict::Retry("an earlier record of its message group failed".to_owned())
        } else {
            consumer
                .verdict(message, deadline)
                .instrument(span.clone())
                .await
        };
        if let (Verdict::Retry(_), Some(group)) = (&verdict, group) {
            failed_groups.push(group);
        }
        verdicts.push(verdict);
        spans.push(span);
    }
    let sent = send_dead_letters(consumer, &event.records, &verdicts, deadline).await;
    let mut response = SqsBatchResponse::default();
    for (((message, verdict), sent), span) in
        event.records.iter().zip(&verdicts).zip(sent).zip(&spans)
    {
        let _line = span.enter();
        if !verdict.told(sent) {
            response.add_failure(message.message_id.clone().unwrap_or_default());
        }
    }
    response
}

/// Sends the batch's dead letters in one step through the executor; each record's
/// send result, `None` for a record that is not one (or with no queue).
async fn send_dead_letters<V: Verdicts + ?Sized>(
    consumer: &V,
    records: &[SqsMessage],
    verdicts: &[Verdict],
    deadline: Time,
) -> Vec<Option<Result<(), QueueError>>> {
    let mut sent: Vec<Option<Result<(), QueueError>>> = vec![None; verdicts.len()];
    let Some(queue) = consumer.dead_letters() else {
        return sent;
    };
    let (chosen, letters): (Vec<usize>, Vec<DeadLetter<'_>>) = records
        .iter()
        .zip(verdicts)
        .enumerate()
        .filter_map(|(i, (message, verdict))| {
            let message_id = message.message_id.as_deref().unwrap_or_default();
            let note = verdict.note(message_id)?;
            Some((
                i,
                DeadLetter {
                    message,
                    message_id,
                    note,
                },
            ))
        })
        .unzip();
    if chosen.is_empty() {
        return sent;
    }
    let executor = Executor::new(consumer.safeguards().clone(), &StoreOnly, deadline);
    let results = executor
        .queue_step(chosen.len(), queue.dead_letter(&letters))
        .await;
    for (i, result) in chosen.into_iter().zip(results) {
        sent[i] = Some(result);
    }
    sent
}
