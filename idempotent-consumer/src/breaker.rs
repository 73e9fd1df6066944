//! A circuit breaker per dependency and execution environment: after `threshold`
//! transient failures in a row, across records and invocations of this process, it
//! opens; while it is open, records that need the
//! dependency fail at once as `deferred` (no write, no call) and come back with the
//! backoff. After the open period one record probes: its success closes the breaker,
//! its failure opens it again for twice as long, up to the cap. The time comes in as
//! an argument; no I/O.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Time;
use crate::pacing::Pacer;

/// The two dependencies a record needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// The store: the idempotency table.
    Store,
    /// The provider that applies the effect.
    Provider,
}

/// What the breaker lets a record do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Closed: call freely.
    Closed,
    /// The one record that tests whether the dependency is back.
    Probe,
    /// Open until then (the next probe, or the running probe's deadline): do not
    /// call; the record is deferred.
    Open {
        /// When the next probe may go, or the running probe's deadline.
        until: Time,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed {
        failures_in_a_row: u32,
    },
    Open {
        until: Time,
        period: Duration,
    },
    /// A probe was let through; until `probe_until` no other record probes.
    Probing {
        period: Duration,
        probe_until: Time,
    },
}

/// One dependency's breaker, shared by every record of the process.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    first_period: Duration,
    longest_period: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// Opens after `threshold` failures in a row, first for `first_period`, doubling
    /// up to `longest_period`.
    pub fn new(threshold: u32, first_period: Duration, longest_period: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            first_period,
            longest_period: longest_period.max(first_period),
            state: Mutex::new(State::Closed {
                failures_in_a_row: 0,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic while holding this lock cannot leave the state half-written (every
        // change is one assignment), so a poisoned lock is still good.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// May a record that starts at `now` call the dependency? A probe is let through
    /// once the open period is over; a probe that reports nothing by `probe_until`
    /// (its record's deadline) is replaced by the next record.
    pub fn admit(&self, now: Time, probe_until: Time) -> Admission {
        self.with(|state| match *state {
            State::Closed { .. } => Admission::Closed,
            State::Open { until, period }
            | State::Probing {
                period,
                probe_until: until,
            } if now >= until => {
                *state = State::Probing {
                    period,
                    probe_until,
                };
                Admission::Probe
            }
            State::Open { until, .. }
            | State::Probing {
                probe_until: until, ..
            } => Admission::Open { until },
        })
    }

    /// A probe that ended without calling the dependency: the next record probes.
    pub fn return_probe(&self, now: Time) {
        self.with(|state| {
            if let State::Probing { period, .. } = *state {
                *state = State::Open { until: now, period };
            }
        });
    }

    /// The dependency answered (whatever it said): the breaker closes.
    pub fn success(&self) {
        self.with(|state| {
            *state = State::Closed {
                failures_in_a_row: 0,
            }
        });
    }

    /// A transient failure (a timeout, a connection error, a 5xx, a throttle).
    pub fn failure(&self, now: Time) {
        self.with(|state| match *state {
            State::Closed { failures_in_a_row } if failures_in_a_row + 1 >= self.threshold => {
                *state = State::Open {
                    until: now + self.first_period,
                    period: self.first_period,
                };
            }
            State::Closed { failures_in_a_row } => {
                *state = State::Closed {
                    failures_in_a_row: failures_in_a_row + 1,
                };
            }
            State::Probing { period, .. } => {
                let period = (period * 2).min(self.longest_period);
                *state = State::Open {
                    until: now + period,
                    period,
                };
            }
            // A call that started before the breaker opened: the period stands.
            State::Open { .. } => {}
        });
    }

    /// Whether the breaker is closed: calls go freely.
    pub fn is_closed(&self) -> bool {
        self.with(|state| matches!(state, State::Closed { .. }))
    }
}

/// The breakers of one execution environment, and beside them the pace of its provider
/// calls ([`crate::pacing`]): what every invocation of the process shares.
#[derive(Debug)]
pub struct Breakers {
    /// The store's breaker.
    pub store: Breaker,
    /// The provider's breaker.
    pub provider: Breaker,
    /// Off unless [`Self::with_pacer`] sets one.
    pub pacer: Pacer,
}

impl Breakers {
    /// A breaker for each dependency, each as [`Breaker::new`] makes it; no pace.
    pub fn new(threshold: u32, first_period: Duration, longest_period: Duration) -> Self {
        Self {
            store: Breaker::new(threshold, first_period, longest_period),
            provider: Breaker::new(threshold, first_period, longest_period),
            pacer: Pacer::off(),
        }
    }

    /// The same breakers, the provider's calls paced by `pacer`.
    pub fn with_pacer(self, pacer: Pacer) -> Self {
        Self { pacer, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn at(secs: u64) -> Time {
        Time::from_ms(0) + S * u32::try_from(secs).unwrap()
    }

    fn breaker() -> Breaker {
        Breaker::new(3, 10 * S, 40 * S)
    }

    #[test]
    fn it_opens_after_the_threshold_of_failures_in_a_row() {
        let b = breaker();
        b.failure(at(0));
        b.failure(at(0));
        assert_eq!(b.admit(at(0), at(60)), Admission::Closed);
        b.failure(at(1));
        // Open for the first period from the failure that opened it.
        assert_eq!(b.admit(at(2), at(60)), Admission::Open { until: at(11) });
        assert!(!b.is_closed());
    }

    #[test]
    fn an_answer_in_between_resets_the_count() {
        let b = breaker();
        b.failure(at(0));
        b.failure(at(0));
        b.success();
        b.failure(at(0));
        b.failure(at(0));
        assert_eq!(b.admit(at(0), at(60)), Admission::Closed);
    }

    #[test]
    fn after_the_open_period_one_record_probes_and_its_success_closes() {
        let b = breaker();
        (0..3).for_each(|_| b.failure(at(0)));
        assert!(matches!(b.admit(at(9), at(60)), Admission::Open { .. }));
        assert_eq!(b.admit(at(10), at(60)), Admission::Probe);
        // One probe at a time: the others wait for its deadline at the latest.
        assert_eq!(b.admit(at(11), at(70)), Admission::Open { until: at(60) });
        b.success();
        assert_eq!(b.admit(at(12), at(60)), Admission::Closed);
    }

    #[test]
    fn a_failed_probe_reopens_for_twice_as_long_up_to_the_cap() {
        let b = breaker();
        (0..3).for_each(|_| b.failure(at(0)));
        let mut now = 0;
        for period in [20, 40, 40] {
            now += 100;
            assert_eq!(b.admit(at(now), at(now + 5)), Admission::Probe);
            b.failure(at(now));
            assert_eq!(
                b.admit(at(now + period - 1), at(now + 60)),
                Admission::Open {
                    until: at(now + period)
                }
            );
            assert_eq!(b.admit(at(now + period), at(now + 60)), Admission::Probe);
            b.failure(at(now + period));
            now += period;
        }
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_its_deadline_or_when_returned() {
        let b = breaker();
        (0..3).for_each(|_| b.failure(at(0)));
        assert_eq!(b.admit(at(10), at(15)), Admission::Probe);
        assert!(matches!(b.admit(at(14), at(30)), Admission::Open { .. }));
        assert_eq!(b.admit(at(15), at(30)), Admission::Probe);
        b.return_probe(at(16));
        assert_eq!(b.admit(at(16), at(30)), Admission::Probe);
    }
}
