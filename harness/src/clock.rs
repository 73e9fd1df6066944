//! A clock the test moves by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use charge_once::domain::clock::{Clock, Time};

/// A clock the test moves by hand; starts at the wall clock's second.
#[derive(Clone)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// A fixed instant, for tests that write times of their own.
    pub const START: Time = Time::from_ms(1_800_000_000_000);

    /// Starts now (whole seconds), not at a fixed instant: the real provider stamps its
    /// payments with its own clock, and a record's lookups start at the record's
    /// creation (less a margin for clocks), so the two must agree as in production.
    pub fn new() -> Self {
        let now = charge_once::domain::clock::wall_ms() / 1000 * 1000;
        Self(Arc::new(AtomicI64::new(now)))
    }

    pub fn now(&self) -> Time {
        Time::from_ms(self.0.load(Ordering::SeqCst))
    }

    pub fn advance(&self, by: Duration) {
        self.0
            .fetch_add(i64::try_from(by.as_millis()).unwrap(), Ordering::SeqCst);
    }

    pub fn clock(&self) -> Clock {
        let inner = self.0.clone();
        Arc::new(move || Time::from_ms(inner.load(Ordering::SeqCst)))
    }
}

impl Default for TestClock {
    fn default() -> Self {
        Self::new()
    }
}
