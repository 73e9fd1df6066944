//! Time as the code keeps it: one type for every instant ([`Time`]), one clock type,
//! and the wall clock. The state machine, `resolve`, the simulator and the tests all
//! read "now" through this module, so a test can move time by handing in its own
//! clock.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::Arc;
use std::time::Duration;

/// An instant, in milliseconds since the Unix epoch. The table stores most instants in
/// ms and `expires` in whole seconds (DynamoDB's TTL unit); the schema converts, and
/// comparisons with `expires` are made in seconds, as the stores make them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(i64);

impl Time {
    /// The instant `ms` milliseconds after the epoch.
    pub const fn from_ms(ms: i64) -> Self {
        Self(ms)
    }

    /// The instant `secs` whole seconds after the epoch (saturating).
    pub const fn from_secs(secs: i64) -> Self {
        Self(secs.saturating_mul(1000))
    }

    /// Milliseconds since the epoch.
    pub const fn as_ms(self) -> i64 {
        self.0
    }

    /// Whole seconds, rounded down (also before 1970).
    pub const fn as_secs(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// The time from `self` until `later`; zero if `later` is not later.
    pub fn until(self, later: Time) -> Duration {
        Duration::from_millis(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(millis(d)))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(millis(d)))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// "Now", from whatever the caller decides it is.
pub type Clock = Arc<dyn Fn() -> Time + Send + Sync>;

/// The wall clock, in ms since the epoch (0 before 1970, never a panic).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall clock as a [`Clock`].
pub fn system() -> Clock {
    Arc::new(|| Time::from_ms(wall_ms()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_down_and_durations_saturate() {
        let t = Time::from_ms(1_999);
        assert_eq!(t.as_secs(), 1);
        assert_eq!(Time::from_ms(-1).as_secs(), -1);
        assert_eq!(Time::from_secs(2).as_ms(), 2_000);
        assert_eq!((t + Duration::from_millis(1)).as_secs(), 2);
        assert_eq!(t.until(t - Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(t.until(Time::from_secs(3)), Duration::from_millis(1_001));
        assert_eq!(
            Time::from_ms(i64::MAX) + Duration::MAX,
            Time::from_ms(i64::MAX)
        );
    }
}
