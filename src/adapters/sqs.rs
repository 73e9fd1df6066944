//! The SQS adapters: the queue calls of the batch (the library's
//! `idempotent_consumer::sqs::SqsQueue`: visibility changes, dead letters), and
//! `SendMessage` of an ended wait or a failed refund to the shop's report queue.

use async_trait::async_trait;

pub use idempotent_consumer::sqs::SqsQueue;

use crate::contracts::queue::{EndedWait, FailedRefund, QueueError, Reports};

/// The report queue of ended waits: one `SendMessage` of the report's JSON each.
pub struct SqsReports {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl SqsReports {
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        Self {
            client,
            url: url.into(),
        }
    }
}

#[async_trait]
impl Reports for SqsReports {
    async fn ended(&self, report: &EndedWait<'_>) -> Result<(), QueueError> {
        self.send(report).await
    }

    async fn refund_failed(&self, report: &FailedRefund<'_>) -> Result<(), QueueError> {
        self.send(report).await
    }
}

impl SqsReports {
    /// One report, one JSON message.
    async fn send(&self, report: &impl serde::Serialize) -> Result<(), QueueError> {
        let body = serde_json::to_string(report).map_err(|e| QueueError::call("SendMessage", e))?;
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send()
            .await
            .map_err(|e| QueueError::call("SendMessage", e))?;
        Ok(())
    }
}
