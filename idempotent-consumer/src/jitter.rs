//! The jitter of every pause and retry delay: one uniform random number, handed in, so
//! that the policies using it stay pure and testable.

use std::time::Duration;

/// A uniform random number in `[0, 1)`: the jitter's only source of randomness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Jitter(f64);

impl Jitter {
    /// Clamps `unit` into `[0, 1)`.
    pub fn new(unit: f64) -> Self {
        Self(if unit.is_finite() {
            unit.clamp(0.0, 1.0 - f64::EPSILON)
        } else {
            0.0
        })
    }

    /// A fresh random jitter, from the thread's generator.
    pub fn random() -> Self {
        Self::new(rand::random::<f64>())
    }

    /// A point in `[low, high]`.
    pub fn between(self, low: Duration, high: Duration) -> Duration {
        low + high.saturating_sub(low).mul_f64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jitter_stays_between_its_bounds_whatever_number_it_is_given() {
        let (low, high) = (Duration::from_millis(100), Duration::from_millis(400));
        for unit in [f64::NAN, -1.0, 0.0, 0.5, 1.0, 7.0, f64::INFINITY] {
            let d = Jitter::new(unit).between(low, high);
            assert!(low <= d && d <= high, "{unit}: {d:?}");
        }
        assert_eq!(
            Jitter::new(0.5).between(low, high),
            Duration::from_millis(250)
        );
    }
}
