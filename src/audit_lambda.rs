//! The scheduled function in Lambda (the template's `AuditFunction`), two jobs on two
//! schedules: an event `{"run": "settle"}` runs the settler (every order that awaits
//! its customer settled by its payment, `drivers/settle.rs`); any other event runs the
//! audit over `AUDIT_SINCE`. Each finding is one error line; the counts are metrics; a
//! read that fails fails the invocation, so the function's `Errors` alarm fires.

use std::sync::Arc;
use std::time::Duration;

use lambda_runtime::{LambdaEvent, service_fn};

use crate::adapters::emf::Emf;
use crate::contracts::payment::{PaymentProvider, RefundPath};
use crate::contracts::queue::Reports;
use crate::contracts::store::IdempotencyStore;
use crate::drivers::audit::{Window, audit};
use crate::drivers::charge::Settings;
use crate::drivers::settle::Settler;
use crate::policy::audit::INCOMPLETE_METRIC;

/// Awaiting records one page of the settler's read holds (a run reads page after page
/// until its time ends, and the next run goes on from there).
pub const SETTLE_LIMIT: usize = 100;

/// The scheduled function's parts, built once at cold start.
pub struct Scheduled {
    pub since: Duration,
    pub stuck_after: Duration,
    pub store: Arc<dyn IdempotencyStore>,
    pub provider: Arc<dyn PaymentProvider>,
    /// The refunds the bank holds `pending`, which the settler settles too, and which
    /// the audit holds when `audit_refunds`.
    pub refunds: Arc<dyn RefundPath>,
    pub audit_refunds: bool,
    pub reports: Arc<dyn Reports>,
    /// The settler's settings, the consumer's kind: the clock, the retention, the
    /// deadline budget, and the breakers and pace kept across its runs.
    pub settings: Settings,
    /// Kept before each invocation's deadline for the traces' flush.
    pub flush_reserve: Duration,
}

/// Serves audits and settler runs until the runtime stops.
pub async fn serve(parts: Scheduled, metrics: &'static Emf) -> Result<(), lambda_runtime::Error> {
    let parts = Arc::new(parts);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let parts = Arc::clone(&parts);
        async move {
            let settle = event.payload.get("run").and_then(|v| v.as_str()) == Some("settle");
            let (result, recorded) = metrics
                .measure(async {
                    if settle {
                        settle_waits(&parts, &event.context).await
                    } else {
                        run_audit(&parts).await
                    }
                })
                .await;
            metrics.write_invocation(&recorded, &event.context.request_id);
            result
        }
    }))
    .await
}

async fn settle_waits(
    parts: &Scheduled,
    context: &lambda_runtime::Context,
) -> Result<serde_json::Value, lambda_runtime::Error> {
    let left = u64::try_from(crate::domain::clock::wall_ms())
        .ok()
        .and_then(|now| context.deadline.checked_sub(now))
        .map_or(Duration::from_secs(60), Duration::from_millis);
    let settler = Settler {
        store: parts.store.as_ref(),
        provider: parts.provider.as_ref(),
        refunds: Some(parts.refunds.as_ref()),
        reports: parts.reports.as_ref(),
        settings: &parts.settings,
        time: left.saturating_sub(parts.flush_reserve),
        limit: SETTLE_LIMIT,
        per_run: usize::MAX,
    };
    let run = settler.run().await.inspect_err(|e| {
        tracing::error!(error = %crate::error_chain(e), "settler could not read the awaiting orders");
    })?;
    let summary = run.summary();
    tracing::info!(summary = %summary, "settler finished");
    Ok(summary)
}

async fn run_audit(parts: &Scheduled) -> Result<serde_json::Value, lambda_runtime::Error> {
    let window = Window::ending_now(parts.since, parts.stuck_after);
    let result = audit(
        parts.store.as_ref(),
        parts.provider.as_ref(),
        parts.audit_refunds.then_some(parts.refunds.as_ref()),
        window,
    )
    .await;
    match &result {
        Ok(report) => report.record_metrics(),
        Err(_) => metrics::counter!(INCOMPLETE_METRIC).increment(1),
    }
    let report = result.inspect_err(|e| {
        tracing::error!(error = %crate::error_chain(e), "audit incomplete");
    })?;
    for finding in &report.findings {
        tracing::error!(
            finding = finding.kind.name(),
            order_id = finding.order_id,
            evidence = %finding.evidence,
            "audit finding"
        );
    }
    let summary = report.summary(&window);
    tracing::info!(summary = %summary, "audit finished");
    Ok(summary)
}
