//! A clock the test moves by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use charge_once::clock::Clock;

/// A clock the test moves by hand; starts at a fixed instant.
#[derive(Clone)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    pub const START_MS: i64 = 1_800_000_000_000;

    pub fn new() -> Self {
        Self(Arc::new(AtomicI64::new(Self::START_MS)))
    }

    pub fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    pub fn advance(&self, by: Duration) {
        self.0
            .fetch_add(i64::try_from(by.as_millis()).unwrap(), Ordering::SeqCst);
    }

    pub fn clock(&self) -> Clock {
        let inner = self.0.clone();
        Arc::new(move || inner.load(Ordering::SeqCst))
    }
}

impl Default for TestClock {
    fn default() -> Self {
        Self::new()
    }
}
