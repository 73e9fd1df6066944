//! The queue contract: what a batch asks of SQS besides the partial batch response.
//! Set how long each failed record stays invisible, and send the records no retry can
//! fix to the dead-letter queue. [`crate::sqs::SqsQueue`] is the adapter; the batch
//! decides what to ask, the adapter only asks.

use std::sync::Arc;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsMessage;

use crate::BoxError;

/// One failed record's new visibility.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibilityChange<'a> {
    /// The queue the record came from (`eventSourceARN`).
    pub queue_arn: &'a str,
    /// The handle SQS gave this delivery of the message.
    pub receipt_handle: &'a str,
    /// Seconds from now until SQS hands the message out again.
    pub delay_s: u32,
}

/// One record for the dead-letter queue: the message as it came, and why.
#[derive(Clone, Debug)]
pub struct DeadLetter<'a> {
    /// The message as it came.
    pub message: &'a SqsMessage,
    /// The message's SQS id.
    pub message_id: &'a str,
    /// The note attribute's value (named for the consumer): why, as a JSON object.
    pub note: String,
}
/// SQS's limit of message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;

/// Why one entry was not done. Cloned to every entry of a call that failed whole.
#[derive(Clone, Debug, thiserror::Error)]
pub enum QueueError {
    /// The whole call failed; the SDK's error is kept.
    #[error("{operation} failed")]
    Call {
        /// The SQS operation (`SendMessageBatch`, ...).
        operation: &'static str,
        /// The SDK's error.
        #[source]
        source: Arc<BoxError>,
    },
    /// SQS refused this entry of a batch call.
    #[error("{operation} refused the entry: {code}: {message}")]
    Entry {
        /// The SQS operation.
        operation: &'static str,
        /// SQS's error code for the entry.
        code: String,
        /// SQS's message for the entry.
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
    /// No queue to call (a run outside Lambda that calls none).
    #[error("not sent: the queue is not called outside Lambda without --sqs")]
    Offline,
}

impl QueueError {
    /// A whole call of `operation` failed with `source`.
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
    /// attributes unchanged, plus the consumer's note attribute when there is room.
    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Vec<Result<(), QueueError>>;
}

/// The queue outside Lambda: nothing is sent, every entry says so, and the records fail
/// as they would if the call had failed.
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
            parse_queue_arn("arn:aws:sqs:eu-west-1:123456789012:events.fifo").unwrap(),
            ("123456789012", "events.fifo")
        );
        assert!(parse_queue_arn("arn:aws:sns:eu-west-1:123456789012:events").is_err());
        assert!(parse_queue_arn("events").is_err());
    }
}
