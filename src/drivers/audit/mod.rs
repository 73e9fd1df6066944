//! Reads both sides for the audit: the provider's payments in the window, the table's
//! records of the window and of every charged order, and the receipts the listing did
//! not hold. Any read that fails fails the audit: a partial read is never "clean".

use std::time::Duration;

use serde_json::{Value, json};

use crate::contracts::payment::{PaymentError, PaymentListing};
use crate::contracts::store::{IdempotencyStore, StoreError};
use crate::domain::clock::Time;
use crate::policy::audit::{Evidence, FINDINGS_METRIC, Finding, Kind, findings};

/// What the audit could not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the table failed")]
    Store(#[from] StoreError),
    #[error("reading the provider's payments failed")]
    Provider(#[from] PaymentError),
}

/// The window of an audit.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub now: Time,
    /// Charges and records created at or after this.
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
    pub payments: usize,
    pub records: usize,
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
            "records": self.records,
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

/// Reads both sides and judges them.
pub async fn audit(
    store: &dyn IdempotencyStore,
    provider: &dyn PaymentListing,
    window: Window,
) -> Result<Report, ReadError> {
    let mut evidence = Evidence {
        payments: provider.payments_since(window.since).await?,
        ..Evidence::default()
    };
    for record in store.created_since(window.since).await? {
        evidence.records.insert(record.pk.clone(), record);
    }
    // A payment in the window may belong to a record reserved before it.
    for key in evidence.unread_orders() {
        if let Some(record) = store.get(&key).await? {
            evidence.records.insert(key, record);
        }
    }
    // A receipt may name a payment created before the window (or none at all).
    for id in evidence.unlisted_receipts() {
        let payment = provider.payment_by_id(&id).await?;
        evidence.receipts.insert(id, payment);
    }
    Ok(Report {
        payments: evidence.payments.len(),
        records: evidence.records.len(),
        findings: findings(&evidence, window.now, window.stuck_after),
    })
}
