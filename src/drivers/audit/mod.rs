//! Reads both sides for the audit, what changed in the window and never the whole
//! table: the provider's payments created in the window, the payments that succeeded
//! in it whenever created (Stripe's `payment_intent.succeeded` events: a customer who
//! authenticated an old payment late), each one's record by key, every record that
//! awaits its customer (the sparse awaiting index), and the payments those records
//! name that no listing held, by id. Its reads grow with the window's orders (one
//! strongly consistent `GetItem` each, and a few pages), never with the table.
//!
//! A record is read because a payment of the window names its order, or because it
//! awaits its customer: `stuck` (a lease that ended long ago) is found for records
//! that hold a payment of the window. A stuck record that never made a payment is not
//! read: no money moved, and its message is still retried or in the DLQ, whose alarm
//! covers it.
//!
//! The refunds, when asked: those made in the window, every refund of the payments
//! they return money of, and each refund request's record by key.
//!
//! Any read that fails fails the audit: a partial read is never "clean".

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::contracts::payment::{ListedRefund, PaymentError, PaymentListing, RefundPath};
use crate::contracts::store::{IdempotencyStore, StoreError};
use crate::domain::ORDER_PREFIX;
use crate::domain::clock::Time;
use crate::policy::audit::{Evidence, FINDINGS_METRIC, Finding, Kind, findings};

/// What the audit could not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the table failed")]
    Store(#[from] StoreError),
    #[error("reading the provider's payments failed")]
    Provider(#[from] PaymentError),
    #[error("more than {0} records await their customer; the audit reads at most that many")]
    TooManyAwaiting(usize),
}

/// The window of an audit.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub now: Time,
    /// Payments created, or succeeded, at or after this.
    pub since: Time,
    /// An `InProgress` record whose lease ended longer ago than this is stuck.
    pub stuck_after: Duration,
}

impl Window {
    /// The window that ends now on the wall clock and reaches `since` back: the one
    /// place an audit's window is built.
    pub fn ending_now(since: Duration, stuck_after: Duration) -> Self {
        let now = Time::from_ms(crate::domain::clock::wall_ms());
        Self {
            now,
            since: now - since,
            stuck_after,
        }
    }
}

/// The audit's answer: what it read, and what disagrees.
#[derive(Debug)]
pub struct Report {
    /// Payments created in the window.
    pub payments: usize,
    /// Payments that succeeded in the window (their events), whenever created.
    pub confirmed: usize,
    pub records: usize,
    /// Refunds read: made in the window, and every refund of their payments.
    pub refunds: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    /// Findings per kind, every kind named (0 included).
    pub fn counts(&self) -> Vec<(Kind, u64)> {
        Kind::ALL
            .iter()
            .map(|kind| {
                let n = self.findings.iter().filter(|f| f.kind == *kind).count();
                (*kind, n as u64)
            })
            .collect()
    }

    /// One line for a human or a log: the window, what was read, findings per kind.
    pub fn summary(&self, window: &Window) -> Value {
        let by_kind: serde_json::Map<String, Value> = self
            .counts()
            .into_iter()
            .map(|(kind, n)| (kind.name().to_owned(), json!(n)))
            .collect();
        json!({
            "audit": if self.findings.is_empty() { "clean" } else { "findings" },
            "since_ms": window.since.as_ms(),
            "payments": self.payments,
            "confirmed": self.confirmed,
            "records": self.records,
            "refunds": self.refunds,
            "findings": by_kind,
        })
    }

    /// Counts the findings as metrics: `audit_findings` and one count per kind.
    pub fn record_metrics(&self) {
        metrics::counter!(FINDINGS_METRIC).increment(self.findings.len() as u64);
        for (kind, n) in self.counts() {
            metrics::counter!(kind.metric()).increment(n);
        }
    }
}

/// The most awaiting records one audit reads: more, and the audit is incomplete (the
/// settler reads them in runs of its own limit; this many waiting at once is an
/// incident of its own).
pub const MAX_AWAITING: usize = 100_000;

/// Records the audit reads at once (its DynamoDB reads: far below any table's limit).
const READS_AT_ONCE: usize = 32;

/// Reads both sides and judges them; with `refunds`, the refunds too.
pub async fn audit(
    store: &dyn IdempotencyStore,
    provider: &dyn PaymentListing,
    refunds: Option<&dyn RefundPath>,
    window: Window,
) -> Result<Report, ReadError> {
    let mut evidence = Evidence {
        since: window.since,
        payments: provider.payments_since(window.since).await?,
        confirmed: provider.confirmed_since(window.since).await?,
        ..Evidence::default()
    };
    // Every record that awaits its customer, whenever it began: its payment may have
    // succeeded without the record saying so. One more than read, to know it is all.
    let far = Time::from_secs(i64::MAX / 1000);
    let awaiting = store.awaiting(None, far, MAX_AWAITING + 1).await?;
    if awaiting.len() > MAX_AWAITING {
        return Err(ReadError::TooManyAwaiting(MAX_AWAITING));
    }
    // Only orders: the table may hold other consumers' facts under their own prefixes.
    for record in awaiting
        .into_iter()
        .filter(|r| r.pk.prefix() == ORDER_PREFIX)
    {
        evidence.records.insert(record.pk.clone(), record);
    }
    // Each payment's order, by key: a payment of the window may belong to a record
    // reserved long before it. A day's orders are read many at a time: one after
    // another, a read's round trip bounds the orders one run can hold.
    let reads = evidence.unread_orders().into_iter().map(|key| async move {
        let record = store.get(&key).await?;
        Ok::<_, StoreError>((key, record))
    });
    let mut reads = futures::stream::iter(reads).buffer_unordered(READS_AT_ONCE);
    while let Some(read) = reads.next().await {
        if let (key, Some(record)) = read? {
            evidence.records.insert(key, record);
        }
    }
    if let Some(refunds) = refunds {
        evidence.refunds = refunds_read(refunds, window.since).await?;
        for key in evidence.unread_refunds() {
            if let Some(record) = store.get(&key).await? {
                evidence.refund_records.insert(key, record);
            }
        }
    }
    // A receipt, an awaited payment or a refunded one may have been created before the
    // window.
    for id in evidence.unlisted_payments() {
        let payment = provider.payment_by_id(&id).await?;
        evidence.receipts.insert(id, payment);
    }
    Ok(Report {
        payments: evidence.payments.len(),
        confirmed: evidence.confirmed.len(),
        records: evidence.records.len() + evidence.refund_records.len(),
        refunds: evidence.refunds.len(),
        findings: findings(&evidence, window.now, window.stuck_after),
    })
}

/// The refunds made since `since`, and every refund of the payments they return money
/// of (what their sum is held against), each once.
async fn refunds_read(
    refunds: &dyn RefundPath,
    since: Time,
) -> Result<Vec<ListedRefund>, PaymentError> {
    let made = refunds.refunds_since(since).await?;
    let mut payments: Vec<String> = made.iter().map(|r| r.payment_id.clone()).collect();
    payments.sort();
    payments.dedup();
    let mut all: std::collections::BTreeMap<String, ListedRefund> =
        made.into_iter().map(|r| (r.id.clone(), r)).collect();
    for payment in payments.iter().filter(|p| !p.is_empty()) {
        for refund in refunds.refunds_of_payment(payment).await? {
            all.insert(refund.id.clone(), refund);
        }
    }
    Ok(all.into_values().collect())
}
