//! What happens to a record that is not acknowledged: whether it is acknowledged,
//! dead-lettered or retried ([`Handling`]), the class of a retry's delay by its cause
//! ([`Wait`]), who must act ([`Level`]), and the delay before SQS hands it out again,
//! drawn by [`dispose`]. Pure policy: no I/O, no AWS types; the randomness of the
//! jitter comes in as an argument.

use std::time::Duration;

use crate::clock::Time;

/// Who must act on an ending: nobody (info), maybe later (warn), a person (error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Nobody.
    Info,
    /// Maybe someone, later.
    Warn,
    /// A person.
    Error,
}

/// What becomes of the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Left out of `batchItemFailures`: its effect is in the table.
    Ack,
    /// No retry can fix it: the dead-letter queue at once, with its reason.
    DeadLetter,
    /// Listed in `batchItemFailures`, invisible for a delay of this class, which
    /// [`dispose`] draws.
    Retry(Wait),
}

impl Handling {
    /// Whether the message is acknowledged with its effect: the one place this is
    /// answered (a dead letter is acknowledged too, but only once its send succeeded,
    /// which the batch knows).
    pub fn is_ack(self) -> bool {
        self == Self::Ack
    }
}

/// The class of a retried record's delay, by its cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Transient or unknown (a failed call, a deadline, a record not started): back
    /// off on the receive count.
    Backoff,
    /// Another delivery holds a lease on the fact: until it ends, plus a little (the
    /// backoff when its end is unknown).
    LeaseEnd,
    /// A breaker is open: the backoff, but no longer than until shortly after the
    /// breaker lets a probe through, and never below half the step.
    BreakerProbe,
    /// Refused for the provider's rate or on a locked object after the waits the
    /// invocation could afford: backpressure, not an outage; back in seconds.
    Backpressure,
    /// Refused below the fact's limit, a refusal a new key may overcome: providers
    /// (networks behind them) penalise rapid retries.
    Refusal,
    /// The provider holds the effect in flight: it settles by itself, and the retry
    /// looks it up again.
    Settle,
    /// Skipped behind a failure of its group: as long as that one waits, or the
    /// backoff when it went to the dead-letter queue.
    Behind,
}

/// What the batch does with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Left out of `batchItemFailures`.
    Ack,
    /// Sent to the DLQ with its reason, then acknowledged: only once the send
    /// succeeded (the model's mutant `ack-before-dead-letter` shows why).
    DeadLetter,
    /// Listed in `batchItemFailures`, visible again after this delay.
    Retry(Duration),
}

/// SQS's longest visibility timeout: no retry delay can be longer.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

pub use crate::jitter::Jitter;

/// No delay is shorter: SQS counts visibility in whole seconds, and 0 would hand an
/// outage's failures straight back, all at once.
pub const MIN_DELAY: Duration = Duration::from_secs(1);

/// The longest delay the batch may set now: SQS's 12-hour limit is counted from the
/// receive, which was up to the event source's batching window (5 min at most) before
/// the invocation started.
pub fn longest_delay(elapsed_in_invocation: Duration) -> Duration {
    const BATCHING_WINDOW_MAX: Duration = Duration::from_secs(300);
    MAX_VISIBILITY
        .saturating_sub(BATCHING_WINDOW_MAX)
        .saturating_sub(elapsed_in_invocation)
        .max(MIN_DELAY)
}

/// The backoff of transient failures: `base` doubling per receive up to `cap`, each
/// delay jittered into the upper half of its step ("equal jitter"), so the retries of
/// an outage spread out and none is shorter than half its step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first step.
    pub base: Duration,
    /// The longest step.
    pub cap: Duration,
}

/// How much longer a refusal waits than a transient failure's longest step.
const REFUSAL_FACTOR: u32 = 2;
/// The jitter added after another delivery's lease ends.
const AFTER_LEASE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(5));
/// A rate-limited record comes back this soon, jittered so that a fleet's refusals do
/// not come back together: the pace, not the queue, spreads the load.
const AFTER_RATE_LIMIT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(5));
/// Receives a rate-limited record comes back in seconds; past them it takes the
/// backoff, so a limit that stays cannot spend the queue's receives (and reach the DLQ
/// through the redrive policy) faster than an outage would.
const QUICK_RATE_LIMIT_RECEIVES: u32 = 10;

impl Backoff {
    /// The step after receive `receive_count` (1 for the first delivery): `base ×
    /// 2^(receive_count − 1)`, at most `cap`.
    pub fn step(&self, receive_count: u32) -> Duration {
        let doublings = receive_count.saturating_sub(1).min(31);
        self.base
            .checked_mul(1 << doublings)
            .map_or(self.cap, |d| d.min(self.cap))
            .max(MIN_DELAY)
    }

    /// A delay in the upper half of the step.
    pub fn delay(&self, receive_count: u32, jitter: Jitter) -> Duration {
        let step = self.step(receive_count);
        jitter.between(step / 2, step).max(MIN_DELAY)
    }

    /// The least time `receives` deliveries spend waiting between them and after the
    /// last one (every delay at the bottom of its jitter): a message fails for good
    /// only after this long.
    pub fn shortest_path(&self, receives: u32) -> Duration {
        (1..=receives)
            .map(|n| (self.step(n) / 2).max(MIN_DELAY))
            .sum()
    }

    /// The most time `receives` deliveries can spend waiting (every delay at the top).
    pub fn longest_path(&self, receives: u32) -> Duration {
        (1..=receives).map(|n| self.step(n)).sum()
    }
}

/// The disposition of a record whose ending is handled so (its [`Handling`]),
/// delivered for the `receive_count`th time, at `now`; `until` is when the wait its
/// cause names ends (the holder's lease, the breaker's probe), when known. No delay
/// exceeds `longest`.
pub fn dispose(
    handling: Handling,
    until: Option<Time>,
    receive_count: u32,
    now: Time,
    backoff: &Backoff,
    jitter: Jitter,
    longest: Duration,
) -> Disposition {
    let wait = match handling {
        Handling::Ack => return Disposition::Ack,
        Handling::DeadLetter => return Disposition::DeadLetter,
        Handling::Retry(wait) => wait,
    };
    let delay = match (wait, until) {
        // A skipped record's own delay is the backoff: it is used when the failure
        // ahead of it was not retried (the batch decides which one applies).
        (Wait::Backoff | Wait::Behind, _) => backoff.delay(receive_count, jitter),
        (Wait::Backpressure, _) if receive_count <= QUICK_RATE_LIMIT_RECEIVES => {
            jitter.between(AFTER_RATE_LIMIT.0, AFTER_RATE_LIMIT.1)
        }
        (Wait::Backpressure, _) => backoff.delay(receive_count, jitter),
        // Waiting past the breaker's next probe only delays the recovery; half the
        // step stays the floor, so the receives of an outage last as long as the
        // backoff's (`shortest_path`).
        (Wait::BreakerProbe, Some(until)) => {
            let after_probe = now.until(until) + jitter.between(AFTER_LEASE.0, AFTER_LEASE.1);
            backoff
                .delay(receive_count, jitter)
                .min(after_probe.max(backoff.step(receive_count) / 2))
        }
        (Wait::LeaseEnd, Some(until)) => {
            now.until(until) + jitter.between(AFTER_LEASE.0, AFTER_LEASE.1)
        }
        // An end not known: the backoff.
        (Wait::BreakerProbe | Wait::LeaseEnd, None) => backoff.delay(receive_count, jitter),
        (Wait::Refusal, _) => {
            let long = backoff.cap * REFUSAL_FACTOR;
            jitter.between(long / 2, long)
        }
        (Wait::Settle, _) => jitter.between(backoff.cap / 2, backoff.cap),
    };
    Disposition::Retry(delay.clamp(MIN_DELAY, longest.max(MIN_DELAY)))
}

/// A delay in whole seconds, as SQS takes it (rounded up, so never shorter).
pub fn whole_seconds(delay: Duration) -> u32 {
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(30),
        cap: Duration::from_secs(15 * 60),
    };
    const LONGEST: Duration = Duration::from_secs(12 * 3600);

    /// The delay of a record waiting `wait` (until `until`, when it has an end).
    fn waiting(wait: Wait, until: Option<Time>, receive_count: u32, jitter: f64) -> Duration {
        match dispose(
            Handling::Retry(wait),
            until,
            receive_count,
            Time::from_ms(0),
            &BACKOFF,
            Jitter::new(jitter),
            LONGEST,
        ) {
            Disposition::Retry(delay) => delay,
            other => panic!("{wait:?}: {other:?}"),
        }
    }

    fn retry_in(wait: Wait, receive_count: u32, jitter: f64) -> Duration {
        waiting(wait, None, receive_count, jitter)
    }

    #[test]
    fn transient_failures_double_from_the_base_up_to_the_cap() {
        let steps: Vec<u64> = (1..=7).map(|n| BACKOFF.step(n).as_secs()).collect();
        assert_eq!(steps, [30, 60, 120, 240, 480, 900, 900]);
        assert_eq!(BACKOFF.step(u32::MAX), BACKOFF.cap);
    }

    #[test]
    fn jitter_keeps_each_delay_in_the_upper_half_of_its_step_and_never_zero() {
        for n in 1..=10 {
            let step = BACKOFF.step(n);
            let low = retry_in(Wait::Backoff, n, 0.0);
            let high = retry_in(Wait::Backoff, n, 0.999_999);
            assert_eq!(low, step / 2, "receive {n}");
            assert!(
                high <= step && high > step * 99 / 100,
                "receive {n}: {high:?}"
            );
        }
        let tiny = Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(10),
        };
        assert_eq!(tiny.delay(1, Jitter::new(0.0)), MIN_DELAY);
    }

    #[test]
    fn retries_of_one_outage_do_not_arrive_in_lockstep() {
        let mut delays: Vec<u32> = (0..100)
            .map(|i| whole_seconds(retry_in(Wait::Backoff, 6, f64::from(i) / 100.0)))
            .collect();
        delays.dedup();
        assert!(delays.len() > 90, "{} distinct delays", delays.len());
    }

    #[test]
    fn in_progress_waits_until_the_holders_lease_ends_plus_a_little() {
        let until = Time::from_ms(0) + Duration::from_secs(42);
        let delay = waiting(Wait::LeaseEnd, Some(until), 1, 0.5);
        assert_eq!(delay, Duration::from_secs(45));
        // A lease that already ended: a second or so, never 0.
        let ended = waiting(Wait::LeaseEnd, Some(Time::from_ms(-5)), 1, 0.0);
        assert_eq!(ended, Duration::from_secs(1));
        // Unknown holder: the backoff.
        assert_eq!(retry_in(Wait::LeaseEnd, 2, 0.0), Duration::from_secs(30));
    }

    #[test]
    fn a_deferred_record_waits_for_the_breakers_probe_but_never_below_half_a_step() {
        // Receive 8: step 900 s, the backoff draws 675..900 s.
        let soon = Time::from_ms(0) + Duration::from_secs(10);
        assert_eq!(
            waiting(Wait::BreakerProbe, Some(soon), 8, 0.5),
            Duration::from_secs(450)
        );
        let late = Time::from_ms(0) + Duration::from_secs(600);
        assert_eq!(
            waiting(Wait::BreakerProbe, Some(late), 8, 0.5),
            Duration::from_secs(603)
        );
        let never = Time::from_ms(0) + Duration::from_secs(5000);
        assert_eq!(
            waiting(Wait::BreakerProbe, Some(never), 8, 0.5),
            retry_in(Wait::Backoff, 8, 0.5)
        );
        // Early on, the step's half is the floor: 15 s on the first receive.
        assert_eq!(
            waiting(Wait::BreakerProbe, Some(soon), 1, 0.0),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn no_transient_or_deferred_record_waits_longer_than_the_cap() {
        // Whatever its receive count, and whenever its breaker lets a probe through,
        // a record that failed during an outage is visible again at most RETRY_CAP
        // later; a deferred one soon after its breaker's probe, or half its step.
        let bound = BACKOFF.cap;
        for receives in [1, 2, 5, 6, 50, 250] {
            for jitter in [0.0, 0.5, 0.999_999] {
                assert!(retry_in(Wait::Backoff, receives, jitter) <= BACKOFF.cap);
                for open_for in [0, 1, 60, 899, 900] {
                    let until = Time::from_ms(0) + Duration::from_secs(open_for);
                    let delay = waiting(Wait::BreakerProbe, Some(until), receives, jitter);
                    assert!(delay <= bound, "{receives} {jitter} {open_for}: {delay:?}");
                }
            }
        }
    }

    #[test]
    fn a_refusal_waits_longer_than_any_transient_failure_and_an_effect_in_flight_the_cap() {
        let refusal = retry_in(Wait::Refusal, 1, 0.0);
        assert!(refusal >= BACKOFF.cap, "{refusal:?}");
        assert_eq!(retry_in(Wait::Settle, 1, 0.999_999).as_secs(), 899);
        assert_eq!(retry_in(Wait::Settle, 1, 0.0), BACKOFF.cap / 2);
    }

    #[test]
    fn a_rate_limited_record_comes_back_in_seconds_then_takes_the_backoff() {
        for receives in [1, 5, QUICK_RATE_LIMIT_RECEIVES] {
            assert_eq!(
                retry_in(Wait::Backpressure, receives, 0.0),
                Duration::from_secs(1)
            );
            assert_eq!(
                retry_in(Wait::Backpressure, receives, 0.5),
                Duration::from_secs(3)
            );
            assert!(retry_in(Wait::Backpressure, receives, 0.999_999) <= Duration::from_secs(5));
        }
        // A limit that stays: the receives last as long as an outage's.
        for receives in [QUICK_RATE_LIMIT_RECEIVES + 1, 50, 250] {
            assert_eq!(
                retry_in(Wait::Backpressure, receives, 0.5),
                retry_in(Wait::Backoff, receives, 0.5)
            );
        }
    }

    #[test]
    fn a_dead_letter_goes_to_the_dead_letter_queue_and_an_ack_is_acknowledged() {
        let dispose = |handling| {
            dispose(
                handling,
                None,
                1,
                Time::from_ms(0),
                &BACKOFF,
                Jitter::new(0.3),
                LONGEST,
            )
        };
        assert_eq!(dispose(Handling::DeadLetter), Disposition::DeadLetter);
        assert_eq!(dispose(Handling::Ack), Disposition::Ack);
    }

    #[test]
    fn every_delay_is_clamped_to_what_sqs_accepts_from_this_receive() {
        let far = Time::from_ms(0) + Duration::from_secs(48 * 3600);
        let longest = longest_delay(Duration::from_secs(60));
        assert_eq!(longest, Duration::from_secs(12 * 3600 - 300 - 60));
        let delay = match dispose(
            Handling::Retry(Wait::LeaseEnd),
            Some(far),
            1,
            Time::from_ms(0),
            &BACKOFF,
            Jitter::new(0.0),
            longest,
        ) {
            Disposition::Retry(d) => d,
            other => panic!("{other:?}"),
        };
        assert_eq!(delay, longest);
        let slow = Backoff {
            base: Duration::from_secs(12 * 3600),
            cap: Duration::from_secs(12 * 3600),
        };
        assert_eq!(
            dispose(
                Handling::Retry(Wait::Refusal),
                None,
                1,
                Time::from_ms(0),
                &slow,
                Jitter::new(0.9),
                longest
            ),
            Disposition::Retry(longest)
        );
    }

    #[test]
    fn the_shortest_and_longest_paths_bound_the_time_before_the_dlq() {
        // 30 + 60 + 120 + 240 + 480 + 900 × (n − 5) at the top; half of it at the bottom.
        assert_eq!(BACKOFF.longest_path(5), Duration::from_secs(930));
        assert_eq!(BACKOFF.longest_path(7), Duration::from_secs(930 + 1800));
        assert_eq!(BACKOFF.shortest_path(7), Duration::from_secs(465 + 900));
    }

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(3)), 3);
    }
}
