//! Time as the code reads it: one clock type, and the wall clock. The state machine,
//! `resolve`, the simulator and the tests all read "now" through this module, so a test
//! can move time by handing in its own clock.

use std::sync::Arc;

/// Milliseconds since the Unix epoch, from whatever the caller decides is "now".
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock, in ms since the epoch (0 before 1970, never a panic).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall clock as a [`Clock`].
pub fn system() -> Clock {
    Arc::new(wall_ms)
}
