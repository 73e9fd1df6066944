//! The queue contract (ARCHITECTURE.md, "Retries"): the library's (`idempotent_consumer::queue`:
//! visibility changes and dead letters, [`crate::adapters::sqs::SqsQueue`] its adapter),
//! the name of charge-once's dead letters' note attribute, and where the shop hears of
//! an order whose wait ended without a payment.

use async_trait::async_trait;

pub use idempotent_consumer::queue::{
    DeadLetter, MAX_ATTRIBUTES, Offline, Queue, QueueError, VisibilityChange, parse_queue_arn,
};

/// The name of the message attribute that carries a dead letter's reason: a JSON
/// object with `outcome`, `reason`, `message_id` and `receive_count`.
pub const NOTE_ATTRIBUTE: &str = "charge-once";

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

/// A refund the bank refused after it was pending, reported to the shop: its money is
/// still the shop's, the customer was not refunded. At least once, so the shop reads it
/// by refund id.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailedRefund<'a> {
    pub refund_id: &'a str,
    pub order_id: Option<&'a str>,
    /// `refund_failed`.
    pub outcome: &'static str,
    /// The provider's refund (`re_…`).
    pub refund: &'a str,
    /// Stripe's `failure_reason` (`lost_or_stolen_card`, `expired_or_canceled_card`, …).
    pub reason: Option<&'a str>,
    pub ended_at_ms: i64,
}

/// Where ended waits are reported (`AUTHENTICATION_ENDED_QUEUE_URL`): the shop's
/// report queue.
#[async_trait]
pub trait Reports: Send + Sync {
    async fn ended(&self, report: &EndedWait<'_>) -> Result<(), QueueError>;
    async fn refund_failed(&self, report: &FailedRefund<'_>) -> Result<(), QueueError>;
}

/// No report queue configured (local runs, tests that do not read it): the log line
/// and the metric are the report.
pub struct Unreported;

#[async_trait]
impl Reports for Unreported {
    async fn ended(&self, _report: &EndedWait<'_>) -> Result<(), QueueError> {
        Ok(())
    }

    async fn refund_failed(&self, _report: &FailedRefund<'_>) -> Result<(), QueueError> {
        Ok(())
    }
}
