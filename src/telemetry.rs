//! Logs and metrics. Logs: JSON lines on stderr, one span per record (`message_id`,
//! `key`), one line per record outcome. Metrics: CloudWatch embedded metric format
//! (EMF) through the `metrics` facade, one document per invocation: a count per
//! outcome (named as the outcome), `takeover`, and the latency of every store and
//! payment call in ms.

use metrics_cloudwatch_embedded::Collector;
use tracing_subscriber::EnvFilter;

/// Histogram of every store call, ms.
pub const STORE_LATENCY: &str = "store_latency_ms";
/// Histogram of every provider call (charge and lookup), ms.
pub const PAYMENT_LATENCY: &str = "payment_latency_ms";
/// A retry reserved a record left `libre` or with an expired lease.
pub const TAKEOVER: &str = "takeover";

/// Installs the JSON subscriber. `RUST_LOG` overrides the default `info` level.
/// Called once at cold start; a second call is a no-op.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

#[derive(Debug, thiserror::Error)]
#[error("METRICS_NAMESPACE: the metrics recorder could not be installed: {0}")]
pub struct MetricsInitError(String);

/// Installs the global EMF recorder (once per process) with `namespace`. The caller
/// flushes it after each invocation ([`Collector::flush`]).
pub fn init_metrics(namespace: &str) -> Result<&'static Collector, MetricsInitError> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .init()
        .map_err(|e| MetricsInitError(e.to_string()))?;
    metrics::describe_histogram!(
        STORE_LATENCY,
        metrics::Unit::Milliseconds,
        "store call latency"
    );
    metrics::describe_histogram!(
        PAYMENT_LATENCY,
        metrics::Unit::Milliseconds,
        "payment call latency"
    );
    metrics::describe_counter!(TAKEOVER, metrics::Unit::Count, "records reserved again");
    Ok(collector)
}

/// Counts one record outcome under its name (`charged`, `duplicate`, ...).
pub fn count_outcome(name: &'static str) {
    metrics::counter!(name).increment(1);
}
