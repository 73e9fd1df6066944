//! The queue contract (ARCHITECTURE.md, "Retries"): what the batch asks of SQS besides
//! the partial batch response. Set how long each failed record stays invisible, and
//! send the records no retry can fix to the dead-letter queue. [`crate::adapters::sqs::SqsQueue`] is the
//! adapter; the batch decides what to ask (`policy/retry/mod.rs`), the adapter only asks.

use std::sync::Arc;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;

use crate::BoxError;

/// One failed record's new visibility.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibilityChange<'a> {
    /// The queue the record came from (`eventSourceARN`).
    pub queue_arn: &'a str,
    pub receipt_handle: &'a str,
    /// Seconds from now until SQS hands the message out again.
    pub delay_s: u32,
}

/// One record for the dead-letter queue: the message as it came, and why.
#[derive(Clone, Debug)]
pub struct DeadLetter<'a> {
    pub message: &'a SqsMessage,
    pub message_id: &'a str,
    /// The `charge-once` attribute's value: a JSON object with `outcome`, `reason`,
    /// `message_id` and `receive_count`.
    pub note: String,
}

/// The name of the message attribute that carries a dead letter's reason.
pub const NOTE_ATTRIBUTE: &str = "charge-once";
/// SQS's limit of message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;

/// Why one entry was not done. Cloned to every entry of a call that failed whole.
#[derive(Clone, Debug, thiserror::Error)]
pub enum QueueError {
    /// The whole call failed; the SDK's error is kept.
    #[error("{operation} failed")]
    Call {
        operation: &'static str,
        #[source]
        source: Arc<BoxError>,
    },
    /// SQS refused this entry of a batch call.
    #[error("{operation} refused the entry: {code}: {message}")]
    Entry {
        operation: &'static str,
        code: String,
        message: String,
    },
    /// The record came without what the call needs.
    #[error("the record has no {0}")]
    Missing(&'static str),
    /// The event source ARN is not an SQS queue's.
    #[error("event source {0:?} is not an SQS queue ARN")]
    NotAQueue(String),
    /// The call was not started: too little time left before the deadline.
    #[error("not started: too little time left before the invocation deadline")]
    NoTime,
    /// Started, and its timeout ended first.
    #[error("timed out")]
    TimedOut,
    /// No queue to call: `invoke` without `--sqs`.
    #[error("not sent: the queue is not called outside Lambda without --sqs")]
    Offline,
}

impl QueueError {
    pub fn call(operation: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Call {
            operation,
            source: Arc::new(source.into()),
        }
    }
}

/// What the batch needs from SQS. Each method answers entry by entry, in order.
#[async_trait]
pub trait Queue: Send + Sync {
    /// Sets each record's visibility (`ChangeMessageVisibilityBatch`, 10 a call).
    async fn change_visibility(
        &self,
        changes: &[VisibilityChange<'_>],
    ) -> Vec<Result<(), QueueError>>;

    /// Sends each record to the dead-letter queue (`SendMessageBatch`): the body and
    /// attributes unchanged, plus the [`NOTE_ATTRIBUTE`] when there is room.
    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Vec<Result<(), QueueError>>;
}

/// The queue outside Lambda without `--sqs`: nothing is sent, every entry says so, and
/// the records fail as they would if the call had failed.
pub struct Offline;

#[async_trait]
impl Queue for Offline {
    async fn change_visibility(
        &self,
        changes: &[VisibilityChange<'_>],
    ) -> Vec<Result<(), QueueError>> {
        vec![Err(QueueError::Offline); changes.len()]
    }

    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Vec<Result<(), QueueError>> {
        vec![Err(QueueError::Offline); letters.len()]
    }
}

/// An order whose wait for its customer ended without a payment, as the shop hears of
/// it (ARCHITECTURE.md, "An order that awaits its customer"): at least once, so the
/// shop reads it by order and payment.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EndedWait<'a> {
    pub order_id: &'a str,
    /// `authentication_expired`.
    pub outcome: &'static str,
    /// The PaymentIntent the customer did not confirm (now cancelled).
    pub payment_id: &'a str,
    pub ended_at_ms: i64,
}

/// Where ended waits are reported (`AUTHENTICATION_ENDED_QUEUE_URL`).
#[async_trait]
pub trait Reports: Send + Sync {
    async fn ended(&self, report: &EndedWait<'_>) -> Result<(), QueueError>;
}

/// No report queue configured (local runs, tests that do not read it): the log line
/// and the metric are the report.
pub struct Unreported;

#[async_trait]
impl Reports for Unreported {
    async fn ended(&self, _report: &EndedWait<'_>) -> Result<(), QueueError> {
        Ok(())
    }
}

/// The queue's name and account from its ARN (`arn:aws:sqs:<region>:<account>:<name>`).
pub fn parse_queue_arn(arn: &str) -> Result<(&str, &str), QueueError> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", _, "sqs", _, account, name] if !account.is_empty() && !name.is_empty() => {
            Ok((account, name))
        }
        _ => Err(QueueError::NotAQueue(arn.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_arn_gives_its_account_and_name() {
        assert_eq!(
            parse_queue_arn("arn:aws:sqs:eu-west-1:123456789012:orders.fifo").unwrap(),
            ("123456789012", "orders.fifo")
        );
        assert!(parse_queue_arn("arn:aws:sns:eu-west-1:123456789012:orders").is_err());
        assert!(parse_queue_arn("orders").is_err());
    }
}
