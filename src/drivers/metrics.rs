//! The names of the metrics the drivers count (their units are set in `telemetry.rs`);
//! each record outcome is counted under its own name (`policy/outcome_kind.rs`), here:
//! the policy only names outcomes, the drivers count them.

use crate::policy::outcome_kind::OutcomeKind;

/// Counts one record that ended as `kind`, under the kind's declared name.
pub fn count_outcome(kind: OutcomeKind) {
    metrics::counter!(kind.name()).increment(1);
}

/// Histogram of every store call, ms.
pub const STORE_LATENCY: &str = "store_latency_ms";
/// Histogram of every provider call (charge and lookup), ms.
pub const PAYMENT_LATENCY: &str = "payment_latency_ms";
/// A retry reserved a record left `Free` or with an expired lease.
pub const TAKEOVER: &str = "takeover";
/// A charge retried once in the invocation after a transient failure (same key).
pub const CHARGE_RETRIED: &str = "charge_retried";
/// A record sent to the dead-letter queue (and then acknowledged).
pub const DEAD_LETTERED: &str = "dead_lettered";
/// A queue call (visibility change, dead letter) that failed or was not started.
pub const QUEUE_FAILURES: &str = "queue_failures";
/// A provider call refused by one of the provider's rate limiters (429 `rate_limit`):
/// backpressure, counted apart from failures.
pub const PROVIDER_RATE_LIMITED: &str = "provider_rate_limited";
/// A provider call refused because another request held the customer (429
/// `lock_timeout`).
pub const PROVIDER_LOCKED: &str = "provider_locked";
/// Histogram of the waits for this environment's pace before a provider call, ms (only
/// the calls that waited).
pub const PACING_WAIT: &str = "pacing_wait_ms";
/// A payment a record names that the provider does not have (404 `resource_missing`):
/// the provider never deletes one, so the key's mode or account, or the URL, is wrong.
pub const PAYMENT_MISSING: &str = "payment_missing";
/// Provider calls refused for the key itself (401) or a permission it lacks (403): a
/// setting, alarmed (`ProviderKeyRefusedAlarm`); the line of each names the permission.
pub const PROVIDER_KEY_REFUSED: &str = "provider_key_refused";
