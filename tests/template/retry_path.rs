//! The retry path against the queue's retention and a 24-hour outage.

use std::time::Duration;

use serde_norway::Value;

use charge_once::policy::retry::Backoff;

use crate::values::*;

/// The retry path against the queue (ARCHITECTURE.md, "Retries"): SQS deletes a
/// message that outlives the queue's retention, with no DLQ, so the longest path (every
/// delay at its cap of jitter, one function timeout per receive) must end well before
/// it: within half of it by default, within it at every parameter's maximum. And a
/// 24-hour outage must not move an order to the DLQ: the shortest path (every delay at
/// the bottom of its jitter) must outlast it.
pub fn retry_path_violations(
    t: &Value,
    env: &Value,
    max_receive_count: &Value,
    timeout: u64,
    queue_retention: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    let seconds = |v: &Value, field: &str, default: u64| {
        Duration::from_secs(parameter_field(t, v, field).unwrap_or(default))
    };
    let path = |field: &str| {
        let backoff = Backoff {
            base: seconds(&env["RETRY_BASE"], field, 30),
            cap: seconds(&env["RETRY_CAP"], field, 900),
        };
        let receives = u32::try_from(parameter_field(t, max_receive_count, field).unwrap_or(3))
            .unwrap_or(u32::MAX);
        let longest = backoff.longest_path(receives) + Duration::from_secs(timeout) * receives;
        (backoff, receives, longest)
    };
    let retention = Duration::from_secs(queue_retention);
    let (backoff, receives, longest) = path("Default");
    if longest > retention / 2 {
        out.push(format!(
            "the longest retry path ({} receives: {:?}) does not end well before the queue's retention ({retention:?})",
            receives, longest
        ));
    }
    let (_, max_receives, longest_at_max) = path("MaxValue");
    if longest_at_max >= retention {
        out.push(format!(
            "at the parameters' maxima the longest retry path ({max_receives} receives: {longest_at_max:?}) outlives the queue's retention ({retention:?}): messages would expire"
        ));
    }
    let shortest = backoff.shortest_path(receives);
    if shortest < Duration::from_secs(24 * 3600) {
        out.push(format!(
            "a 24-hour outage would move orders to the DLQ: {receives} receives last at least {shortest:?}"
        ));
    }
    out
}

#[test]
fn a_retry_path_that_outlives_the_queue_or_not_a_day_of_outage_is_caught() {
    // The old settings: 3 receives end in minutes.
    broken(
        &["Parameters", "MaxReceiveCount", "Default"],
        Value::from(3),
        "a 24-hour outage",
    );
    // A 4-day queue cannot hold the default path twice over.
    broken(
        &[
            "Resources",
            "OrdersQueue",
            "Properties",
            "MessageRetentionPeriod",
        ],
        Value::from(345_600),
        "does not end well before the queue's retention",
    );
    // Allowed to reach an hour per delay and 300 receives: 12 days.
    broken(
        &["Parameters", "RetryCapSeconds", "MaxValue"],
        Value::from(3600),
        "messages would expire",
    );
    broken(
        &at(&FN_PROPS, &["Environment", "Variables", "RETRY_CAP"]),
        Value::from("1h"),
        "does not end well before",
    );
}
