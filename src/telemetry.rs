//! Logs and metrics. Logs on stderr, the Lambda way: JSON lines when
//! `AWS_LAMBDA_LOG_FORMAT` is `JSON` (the template sets it), readable text otherwise;
//! one span per record (`message_id`, `key`, `receive_count`, `trace_id`), one line
//! per record outcome. With traces exported (`traces.rs`) the same spans also go to
//! OpenTelemetry, beside the logs; the call and wait spans go there only. Metrics: CloudWatch embedded metric format (EMF, [`crate::adapters::emf`])
//! through the `metrics` facade, one document per invocation: a count per outcome
//! (named as the outcome), `takeover`, and the latency of every store and payment
//! call in ms.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{FilterExt as _, FilterFn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::drivers::metrics::{
    CHARGE_RETRIED, DEAD_LETTERED, PACING_WAIT, PAYMENT_LATENCY, PAYMENT_MISSING,
    PROVIDER_KEY_REFUSED, PROVIDER_LOCKED, PROVIDER_RATE_LIMITED, QUEUE_FAILURES, STORE_LATENCY,
    TAKEOVER,
};

use crate::adapters::emf::{Emf, InstallError};
use crate::drivers::spans::CALL_TARGET;
use crate::traces::Traces;

/// The log level when none is set: info, and the SDK's configuration loader only at
/// error.
pub const DEFAULT_DIRECTIVES: &str = "info,aws_config=error";

/// How logs are written, from the environment as `lambda_runtime`'s default subscriber
/// reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSettings {
    /// `AWS_LAMBDA_LOG_LEVEL` (Lambda's `ApplicationLogLevel`), else `RUST_LOG`, else
    /// `info`.
    pub directives: String,
    /// `AWS_LAMBDA_LOG_FORMAT=JSON` (any case): JSON lines; else readable text.
    pub json: bool,
}

impl LogSettings {
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let lambda_level = get("AWS_LAMBDA_LOG_LEVEL").map(|level| {
            // Lambda's levels; tracing has no FATAL.
            match level.trim().to_ascii_lowercase().as_str() {
                "fatal" => "error".to_owned(),
                other => other.to_owned(),
            }
        });
        // By default the SDK's own configuration chatter (a config file not found, a
        // credential provider that found nothing) stays below the line: what matters
        // reaches the command's own error.
        let directives = lambda_level
            .or_else(|| get("RUST_LOG"))
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_DIRECTIVES.to_owned());
        let json =
            get("AWS_LAMBDA_LOG_FORMAT").is_some_and(|f| f.trim().eq_ignore_ascii_case("json"));
        Self { directives, json }
    }
}

/// Installs the log subscriber (see [`LogSettings`]); a level that does not parse
/// falls back to `info`. Called once at cold start; a second call is a no-op.
pub fn init() {
    let settings = LogSettings::from_lookup(|k| std::env::var(k).ok());
    let filter = log_filter(&settings);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if settings.json {
        // Lambda's JSON format: CloudWatch Logs stamps every event with its time, so a
        // timestamp in the line is bytes paid twice (the cost figures: `make bench`).
        builder
            .json()
            .without_time()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init()
    };
}

fn log_filter(settings: &LogSettings) -> EnvFilter {
    EnvFilter::try_new(&settings.directives).unwrap_or_else(|_| EnvFilter::new(DEFAULT_DIRECTIVES))
}

/// [`init`], and with `traces` their layer beside the logs' (each with its own
/// filter): the logs as without traces (the call and wait spans left out, so a line
/// still names its record's span), the spans of `traces.rs` to OpenTelemetry.
/// Without `traces` it is [`init`] itself: not one layer more.
pub fn init_with(traces: Option<&Traces>) {
    let Some(traces) = traces else {
        return init();
    };
    let settings = LogSettings::from_lookup(|k| std::env::var(k).ok());
    let filter = log_filter(&settings).and(FilterFn::new(|meta| {
        !(meta.is_span() && meta.target() == CALL_TARGET)
    }));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let logs = if settings.json {
        logs.json()
            .without_time()
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(traces.layer())
        .try_init();
}

/// Installs the process-wide EMF recorder (once per process) with `namespace`, and
/// the units of charge-once's metrics. Each invocation runs under [`Emf::measure`].
pub fn init_metrics(namespace: &str) -> Result<&'static Emf, InstallError> {
    let emf = Emf::install(namespace)?;
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
    metrics::describe_counter!(CHARGE_RETRIED, metrics::Unit::Count, "charges retried");
    metrics::describe_counter!(DEAD_LETTERED, metrics::Unit::Count, "records dead-lettered");
    metrics::describe_counter!(QUEUE_FAILURES, metrics::Unit::Count, "queue calls failed");
    metrics::describe_counter!(
        PROVIDER_RATE_LIMITED,
        metrics::Unit::Count,
        "provider calls rate limited"
    );
    metrics::describe_counter!(
        PROVIDER_LOCKED,
        metrics::Unit::Count,
        "provider calls refused on a locked customer"
    );
    metrics::describe_counter!(
        PAYMENT_MISSING,
        metrics::Unit::Count,
        "payments a record names that the provider does not have"
    );
    metrics::describe_counter!(
        PROVIDER_KEY_REFUSED,
        metrics::Unit::Count,
        "provider calls refused for the key or a permission it lacks"
    );
    metrics::describe_histogram!(
        PACING_WAIT,
        metrics::Unit::Milliseconds,
        "waits for the pace of provider calls"
    );
    Ok(emf)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> LogSettings {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        LogSettings::from_lookup(|k| map.get(k).map(|v| (*v).to_owned()))
    }

    #[test]
    fn lambdas_log_level_wins_over_rust_log_and_info_is_the_default() {
        assert_eq!(settings(&[]).directives, DEFAULT_DIRECTIVES);
        assert_eq!(settings(&[("RUST_LOG", "warn")]).directives, "warn");
        let both = settings(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG"), ("RUST_LOG", "warn")]);
        assert_eq!(both.directives, "debug");
        assert_eq!(
            settings(&[("AWS_LAMBDA_LOG_LEVEL", "FATAL")]).directives,
            "error"
        );
    }

    #[test]
    fn json_lines_only_when_lambda_says_json() {
        assert!(!settings(&[]).json, "a terminal reads text");
        assert!(settings(&[("AWS_LAMBDA_LOG_FORMAT", "JSON")]).json);
        assert!(settings(&[("AWS_LAMBDA_LOG_FORMAT", "json")]).json);
        assert!(!settings(&[("AWS_LAMBDA_LOG_FORMAT", "Text")]).json);
    }
}
