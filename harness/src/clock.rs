//! A clock the test moves by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use charge_once::domain::clock::{Clock, Time};

/// A clock the test moves by hand; starts at a fixed instant.
#[derive(Clone)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    pub const START: Time = Time::from_ms(1_800_000_000_000);

    pub fn new() -> Self {
        Self(Arc::new(AtomicI64::new(Self::START.as_ms())))
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
