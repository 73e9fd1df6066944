//! The scheduled audit in Lambda (the template's `AuditFunction`): any event runs the
//! audit over `AUDIT_SINCE`. Each finding is one error line; the counts are metrics; a
//! read that fails fails the invocation, so the function's `Errors` alarm fires.

use std::sync::Arc;
use std::time::Duration;

use lambda_runtime::{LambdaEvent, service_fn};

use crate::adapters::emf::Emf;
use crate::contracts::payment::PaymentListing;
use crate::contracts::store::IdempotencyStore;
use crate::drivers::audit::{Window, audit};
use crate::policy::audit::INCOMPLETE_METRIC;

/// Serves audits until the runtime stops.
pub async fn serve(
    since: Duration,
    stuck_after: Duration,
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn PaymentListing>,
    metrics: &'static Emf,
) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| {
        let (store, provider) = (Arc::clone(&store), Arc::clone(&provider));
        async move {
            let window = Window::ending_now(since, stuck_after);
            let (result, recorded) = metrics
                .measure(async {
                    let result = audit(store.as_ref(), provider.as_ref(), window).await;
                    match &result {
                        Ok(report) => report.record_metrics(),
                        Err(_) => metrics::counter!(INCOMPLETE_METRIC).increment(1),
                    }
                    result
                })
                .await;
            metrics.write_invocation(&recorded, &event.context.request_id);
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
            Ok::<_, lambda_runtime::Error>(summary)
        }
    }))
    .await
}
