//! The pace of this execution environment's provider calls: a token bucket whose
//! rate adapts to the provider's rate limits, as TCP's congestion control adapts to
//! losses (AIMD). Every provider call takes a slot first;
//! a rate limit cuts the rate (multiplicatively, at most once an interval, so one burst
//! of refusals is one cut), a success raises it (additively in time; quickly until the
//! first rate limit, "slow start"). Several environments sharing one limit each do the
//! same and settle near their share of it, with few refusals; a cut never leaves the
//! rate above what the provider accepted of this environment since the last one (the
//! limiter's burst hides an excess until it is spent). An optional fleet budget
//! caps the rate (its share of the fleet's requests a second).
//!
//! No call waits for a refusal nobody made: without a budget, a pacer hands out every
//! slot at once until the provider first refuses a call for its rate, and paces from
//! then on (a fresh environment on a quiet day sends at once; one that met the limit
//! keeps what it learnt). With a budget the pace holds from the first call, since the
//! budget is the fleet's known share.
//!
//! Pure: the time comes in as an argument; the driver sleeps. One pacer per execution
//! environment, built at cold start beside the breakers, shared by every invocation.

use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Time;

/// The rate a pacer starts at without a budget: what a fresh execution environment
/// may send before it has heard from the provider. Not low: environments are started
/// and stopped all the time, and every one of them would otherwise begin slowly
/// whatever the provider allows (a refusal costs a short wait, a slow start every
/// record's latency). A common per-endpoint limit is 25 a second.
pub const START_RATE: f64 = 10.0;
/// No pacer goes slower: a rate of zero would never call again.
pub const FLOOR_RATE: f64 = 0.5;
/// No pacer goes faster without a budget (a common account-wide limit).
pub const CEILING_RATE: f64 = 100.0;
/// The cut on a rate limit: the rate becomes this share of what it was.
const DECREASE: f64 = 0.75;
/// At most one cut per interval: the refusals of one burst all answer the same excess.
const DECREASE_INTERVAL: Duration = Duration::from_secs(1);
/// Slow start: each success adds this much, so the rate grows by a quarter a second.
const SLOW_START_STEP: f64 = 0.25;
/// The accepted rate counts once it was measured over this long, and only while the
/// last cut is recent: after a quiet spell, few answers say nothing of the limit.
const ACCEPTED_WINDOW: Duration = Duration::from_secs(1);
const ACCEPTED_WINDOW_END: Duration = Duration::from_secs(10);
/// No cut goes below this share of the rate it cuts.
const DEEPEST_CUT: f64 = 0.25;
/// A cut goes this far below the accepted rate.
const BELOW_ACCEPTED: f64 = 0.92;
/// After the first rate limit: the rate grows by this many requests a second, each
/// second (each success adds it divided by the rate). Small, so that the fleet's sum
/// creeps over the limit rather than leaping: few refusals per cycle.
const INCREASE_PER_S: f64 = 0.05;

/// This environment's pacer.
#[derive(Debug)]
pub struct Pacer {
    /// Off: every slot is free at once (runs that pace nothing, such as the tests'
    /// in-process provider on a clock moved by hand).
    off: bool,
    ceiling: f64,
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct State {
    /// Requests a second.
    rate: f64,
    /// When the next slot is free (ms, fractional: slots can be closer than 1 ms).
    next_slot_ms: f64,
    /// Until the first rate limit, the rate grows quickly.
    slow_start: bool,
    /// No budget and no refusal yet: every slot is free at once (the rate is still
    /// tracked, so the first cut starts from it).
    unpaced: bool,
    last_decrease: Option<Time>,
    /// Since when `accepted` counts: the last cut, or the first slot taken.
    counting_since: Option<Time>,
    /// Answers (not rate limits) since the last cut: what the provider accepted of
    /// this environment, which a cut does not go above.
    accepted: u32,
}

impl Pacer {
    /// A pacer with this environment's share of a fleet budget (`None`: no budget, the
    /// rate is found from the provider's answers alone).
    pub fn new(share: Option<f64>) -> Self {
        let ceiling = share
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(CEILING_RATE, |s| s.max(FLOOR_RATE));
        // With a budget the share is known to be safe to start at; without one, start
        // low and find the limit.
        let (rate, slow_start) = match share {
            Some(_) => (ceiling, false),
            None => (START_RATE, true),
        };
        Self {
            off: false,
            ceiling,
            state: Mutex::new(State {
                rate,
                next_slot_ms: f64::MIN,
                slow_start,
                unpaced: share.is_none(),
                last_decrease: None,
                counting_since: None,
                accepted: 0,
            }),
        }
    }

    /// A pacer that never waits.
    pub fn off() -> Self {
        Self {
            off: true,
            ..Self::new(None)
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // Every change is a few assignments of plain numbers: a poisoned lock still
        // holds a usable state.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// The current rate, requests a second.
    pub fn rate(&self) -> f64 {
        self.with(|s| s.rate)
    }

    /// Takes a slot at `now` if one is free: `Err(how long until the next one)`
    /// otherwise, and the caller asks again then. A waiter holds no slot, so a cut of
    /// the rate holds back every waiter at once (slots handed out ahead of time would
    /// still go at the old rate, each refused).
    pub fn try_take(&self, now: Time) -> Result<(), Duration> {
        if self.off {
            return Ok(());
        }
        self.with(|s| {
            let since = *s.counting_since.get_or_insert(now);
            if s.unpaced {
                // The accepted rate counts over a recent window only, so that the first
                // cut starts from what the provider accepted just before it.
                if since.until(now) > ACCEPTED_WINDOW_END {
                    s.counting_since = Some(now);
                    s.accepted = 0;
                }
                return Ok(());
            }
            let now_ms = now.as_ms() as f64;
            let spacing = 1000.0 / s.rate;
            if s.next_slot_ms > now_ms {
                return Err(Duration::from_secs_f64((s.next_slot_ms - now_ms) / 1000.0));
            }
            // On pace when the waiter came on time; after a quiet spell no credit but
            // half a slot, so the next calls keep the pace rather than burst.
            s.next_slot_ms = (s.next_slot_ms + spacing).max(now_ms + spacing / 2.0);
            Ok(())
        })
    }

    /// The provider answered (anything but a rate limit): a little faster.
    pub fn on_success(&self) {
        let ceiling = self.ceiling;
        self.with(|s| {
            let step = if s.slow_start {
                SLOW_START_STEP
            } else {
                INCREASE_PER_S / s.rate
            };
            s.rate = (s.rate + step).clamp(FLOOR_RATE, ceiling);
            s.accepted = s.accepted.saturating_add(1);
        });
    }

    /// The provider refused a call for its rate at `now`: slower, once per interval.
    pub fn on_rate_limited(&self, now: Time) {
        self.with(|s| {
            if s.last_decrease
                .is_some_and(|last| last.until(now) < DECREASE_INTERVAL)
            {
                return;
            }
            // What the provider accepted since the last cut is this environment's share
            // of the limit as it stands: the rate goes just below it, or down by the
            // cut, whichever is lower. (The limiter's burst hides an excess until it
            // is spent, so the rate at the first refusal is above the share.)
            let accepted = s
                .counting_since
                .map(|since| since.until(now))
                .and_then(|since| {
                    (ACCEPTED_WINDOW..=ACCEPTED_WINDOW_END)
                        .contains(&since)
                        .then(|| f64::from(s.accepted) / since.as_secs_f64() * BELOW_ACCEPTED)
                });
            s.last_decrease = Some(now);
            s.counting_since = Some(now);
            s.accepted = 0;
            s.slow_start = false;
            s.unpaced = false;
            let cut = s.rate * DECREASE;
            let deepest = s.rate * DEEPEST_CUT;
            s.rate = accepted
                .map_or(cut, |a| cut.min(a).max(deepest))
                .max(FLOOR_RATE);
            // The limit refused this second's excess: the next slot a whole new
            // spacing away.
            s.next_slot_ms = s.next_slot_ms.max(now.as_ms() as f64 + 1000.0 / s.rate);
        });
    }
}

/// The pause before a call refused on a locked object is tried again: short (another
/// request holds the object for the time of one call), jittered so that the
/// waiting requests do not come back together.
pub const LOCK_PAUSE: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_millis(250));
/// A call refused for its rate or a lock is tried at most this many times in one
/// invocation (besides the deadline rule): a limit that stays will be waited for by
/// SQS, in seconds.
pub const MAX_THROTTLED_TRIES: u32 = 8;

/// This environment's share of a fleet budget: the budget divided among the event
/// source's `MaximumConcurrency` environments.
pub fn share(budget: Option<f64>, environments: u32) -> Option<f64> {
    budget.map(|b| b / f64::from(environments.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Time {
        Time::from_ms(1_800_000_000_000 + ms)
    }

    #[test]
    fn slots_are_spaced_by_the_rate_and_idle_time_saves_no_burst() {
        let pacer = Pacer::new(Some(4.0));
        // From rest, the second call comes half a spacing after the first, then the
        // pace: 4 a second, 250 ms apart.
        assert_eq!(pacer.try_take(at(0)), Ok(()));
        assert_eq!(pacer.try_take(at(0)), Err(Duration::from_millis(125)));
        assert_eq!(pacer.try_take(at(100)), Err(Duration::from_millis(25)));
        assert_eq!(pacer.try_take(at(125)), Ok(()));
        assert_eq!(pacer.try_take(at(125)), Err(Duration::from_millis(250)));
        assert_eq!(pacer.try_take(at(375)), Ok(()));
        // Ten seconds of quiet: one call at once, the next at half the spacing at most.
        assert_eq!(pacer.try_take(at(10_000)), Ok(()));
        assert_eq!(pacer.try_take(at(10_000)), Err(Duration::from_millis(125)));
    }

    #[test]
    fn without_a_budget_no_call_waits_until_the_provider_refuses_one_then_the_pace_holds() {
        let pacer = Pacer::new(None);
        // A fresh environment: a burst of calls at one instant, none waits.
        assert!((0..200).all(|_| pacer.try_take(at(0)).is_ok()));
        (0..200).for_each(|_| pacer.on_success());
        assert!((0..200).all(|_| pacer.try_take(at(10)).is_ok()));
        // The first refusal: from now on the calls are spaced by the (cut) rate.
        pacer.on_rate_limited(at(20));
        let spacing = Duration::from_secs_f64(1.0 / pacer.rate());
        assert!(pacer.try_take(at(20)).is_err());
        let next = at(20) + spacing + Duration::from_millis(1);
        assert_eq!(pacer.try_take(next), Ok(()));
        assert!(pacer.try_take(next).is_err(), "paced after the refusal");
    }

    #[test]
    fn a_rate_limit_holds_back_every_waiter_at_once() {
        let pacer = Pacer::new(Some(4.0));
        assert_eq!(pacer.try_take(at(0)), Ok(()));
        pacer.on_rate_limited(at(100));
        // 3 a second now: the next slot a whole spacing after the refusal.
        assert!(pacer.try_take(at(250)).is_err());
        assert_eq!(pacer.try_take(at(434)), Ok(()));
    }

    #[test]
    fn a_pacer_that_is_off_never_waits() {
        let pacer = Pacer::off();
        assert!((0..100).all(|_| pacer.try_take(at(0)).is_ok()));
    }

    #[test]
    fn a_burst_of_rate_limits_cuts_the_rate_once_per_interval_and_never_to_zero() {
        let pacer = Pacer::new(None);
        assert_eq!(pacer.rate(), START_RATE);
        for ms in [0, 10, 500, 999] {
            pacer.on_rate_limited(at(ms));
        }
        assert_eq!(pacer.rate(), START_RATE * DECREASE, "one cut for one burst");
        for s in 1..100 {
            pacer.on_rate_limited(at(s * 1000));
        }
        assert_eq!(pacer.rate(), FLOOR_RATE);
    }

    #[test]
    fn successes_speed_up_fast_until_the_first_rate_limit_then_slowly_up_to_the_ceiling() {
        let pacer = Pacer::new(None);
        (0..10).for_each(|_| pacer.on_success());
        assert!((pacer.rate() - (START_RATE + 10.0 * SLOW_START_STEP)).abs() < 1e-9);
        pacer.on_rate_limited(at(0));
        let cut = pacer.rate();
        // A second's worth of successes at the cut rate adds about INCREASE_PER_S.
        (0..cut.round() as usize).for_each(|_| pacer.on_success());
        assert!(
            (pacer.rate() - cut - INCREASE_PER_S).abs() < 0.05,
            "{}",
            pacer.rate()
        );
        (0..1_000_000).for_each(|_| pacer.on_success());
        assert_eq!(pacer.rate(), CEILING_RATE);
        let budgeted = Pacer::new(share(Some(12.0), 4));
        assert_eq!(budgeted.rate(), 3.0, "a budget starts at its share");
        (0..100).for_each(|_| budgeted.on_success());
        assert_eq!(budgeted.rate(), 3.0, "and never exceeds it");
    }

    #[test]
    fn a_cut_goes_just_below_what_the_provider_accepted_since_the_last_one_but_never_deep() {
        let pacer = Pacer::new(None);
        pacer.on_rate_limited(at(0));
        assert_eq!(pacer.rate(), START_RATE * DECREASE);
        // Four seconds after that cut, 20 answers: 5 a second were accepted.
        (0..20).for_each(|_| pacer.on_success());
        let before = pacer.rate();
        pacer.on_rate_limited(at(4_000));
        let accepted = 5.0 * BELOW_ACCEPTED;
        assert!(accepted < before * DECREASE && accepted > before * DEEPEST_CUT);
        assert!((pacer.rate() - accepted).abs() < 1e-9, "{}", pacer.rate());
        // One answer in the next four seconds: the cut stops at half the rate.
        pacer.on_success();
        let before = pacer.rate();
        pacer.on_rate_limited(at(8_000));
        assert!(
            (pacer.rate() - before * DEEPEST_CUT).abs() < 1e-9,
            "{}",
            pacer.rate()
        );
        // After a quiet spell, few answers say nothing: only the multiplicative cut.
        let before = pacer.rate();
        pacer.on_rate_limited(at(60_000));
        assert!((pacer.rate() - (before * DECREASE).max(FLOOR_RATE)).abs() < 1e-9);
    }

    /// Environments sharing one limit, simulated second by second: each sends at its
    /// pacer's rate, the limit refuses the excess (each environment's share of it) and
    /// they settle near the limit with few refusals.
    #[test]
    fn several_environments_sharing_one_limit_settle_near_it_with_few_refusals() {
        const LIMIT: f64 = 25.0;
        let pacers: Vec<Pacer> = (0..4).map(|_| Pacer::new(None)).collect();
        let (mut sent, mut refused, mut accepted_late) = (0.0, 0.0, 0.0);
        // 10 ms ticks for 120 s.
        let mut owed = vec![0.0; pacers.len()];
        let mut bucket = LIMIT;
        for tick in 0..12_000i64 {
            let now = at(tick * 10);
            bucket = (bucket + LIMIT / 100.0).min(LIMIT);
            for (pacer, owed) in pacers.iter().zip(owed.iter_mut()) {
                *owed += pacer.rate() / 100.0;
                while *owed >= 1.0 {
                    *owed -= 1.0;
                    sent += 1.0;
                    if bucket >= 1.0 {
                        bucket -= 1.0;
                        pacer.on_success();
                        if tick >= 3000 {
                            accepted_late += 1.0;
                        }
                    } else {
                        refused += 1.0;
                        pacer.on_rate_limited(now);
                    }
                }
            }
        }
        let share_refused = refused / sent;
        let ratio = accepted_late / (LIMIT * 90.0);
        assert!(share_refused <= 0.05, "refused {share_refused:.3}");
        assert!(ratio >= 0.9, "throughput {ratio:.3} of the limit");
    }
}
