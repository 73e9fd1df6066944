//! Logging: JSON lines on stderr, one span per record (`message_id`, `key`), one line
//! per record outcome. EMF metrics are not built yet (issue "Observability").

use tracing_subscriber::EnvFilter;

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
