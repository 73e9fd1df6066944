//! The invocation's time: every margin the executor keeps
//! before the Lambda deadline, in one [`Budget`], and the two questions it answers: may
//! this record start, and how long may this call take. A handler that answers after
//! its deadline loses its whole partial response, done records included, so no call
//! may still be running then.

use std::time::Duration;

use crate::clock::Time;

/// Kept free before the invocation deadline for answering: every call ends earlier.
pub const SAFETY: Duration = Duration::from_millis(500);
/// The longest one store call may take (the SDK's operation timeout is the same).
pub const STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// The SDK's own bounds on one connection and one attempt of a call, so that a hung
/// connection fails the record well before the deadline rather than hanging it.
pub const SDK_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The SDK's bound on one attempt of a call (see [`SDK_CONNECT_TIMEOUT`]).
pub const SDK_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// A store call is started with less than its full timeout left, but not with less
/// than this: a healthy store answers in milliseconds, and `complete` is worth trying.
const MIN_STORE_CALL: Duration = Duration::from_millis(250);
/// One step of queue calls (the dead letters, then the visibility changes) takes at
/// most this; a healthy SQS answers in tens of milliseconds.
const QUEUE_STEP: Duration = Duration::from_millis(750);
/// The room kept after the records for the two queue steps.
pub const QUEUE_RESERVE: Duration = Duration::from_millis(1500);
/// A queue step is not started with less than this left.
const MIN_QUEUE_STEP: Duration = Duration::from_millis(100);
/// The lease `resolve` takes, in provider timeouts: a lookup, a cancel of an open
/// effect, a second lookup, the key history, and room for the writes.
const RESOLVE_LEASE_CALLS: u32 = 5;
/// 2001-09-09 in ms: any real invocation deadline is far later. Smaller values come
/// from emulators that send a duration instead of an epoch (`cargo lambda watch`
/// sends 600000).
const PLAUSIBLE_DEADLINE_MS: i64 = 1_000_000_000_000;

/// What a call is, as far as its time is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// An effect or a lookup: only with its whole timeout left, since one cut short
    /// would leave an effect's outcome unknown for nothing.
    Provider,
    /// A conditional write or read: cut to the time left, not below 250 ms.
    Store,
    /// One step of queue calls: at most 750 ms, not below 100 ms.
    Queue,
}

/// Every margin of an invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// No record starts with less than this left (`DEADLINE_MARGIN`).
    pub record_margin: Duration,
    /// One provider call.
    pub provider_timeout: Duration,
    /// One store call.
    pub store_timeout: Duration,
    /// Kept after the records for the queue steps: zero when there is no queue to
    /// call (`invoke` without `--sqs`).
    pub queue_reserve: Duration,
    /// A started call is bounded by all that is left before the deadline, not by its
    /// own timeout: `resolve`'s calls, whose deadline is its lease's end.
    pub calls_take_what_is_left: bool,
    /// Kept before the invocation deadline for the traces' flush before the response
    /// (`traces.rs`): zero when traces are off.
    pub flush_reserve: Duration,
}

impl Budget {
    /// The budget of a consumer without queue calls.
    pub fn new(record_margin: Duration, provider_timeout: Duration) -> Self {
        Self {
            record_margin,
            provider_timeout,
            store_timeout: STORE_TIMEOUT,
            queue_reserve: Duration::ZERO,
            calls_take_what_is_left: false,
            flush_reserve: Duration::ZERO,
        }
    }

    /// The same, keeping `reserve` before the invocation deadline for the traces' flush.
    pub fn with_flush_reserve(self, reserve: Duration) -> Self {
        Self {
            flush_reserve: reserve,
            ..self
        }
    }

    /// The deadline every call of an invocation ends before: the invocation's, less
    /// the flush reserve. Every path takes its deadline from here.
    pub fn answer_by(&self, invocation_deadline: Time) -> Time {
        invocation_deadline - self.flush_reserve
    }

    /// The same for work under a lease of its own (`resolve`): a call starts only with
    /// the time it needs left, and then has all that is left of the lease (its own
    /// timeout, the HTTP client's, ends it first unless the lease does).
    pub fn under_lease(self) -> Self {
        Self {
            calls_take_what_is_left: true,
            ..self
        }
    }

    /// The same, keeping room for the two queue steps after the records.
    pub fn with_queue_steps(self) -> Self {
        Self {
            queue_reserve: QUEUE_RESERVE,
            ..self
        }
    }

    /// When the records' own calls must end: the invocation deadline less the room
    /// the queue steps need. It is also the records' lease end.
    pub fn records_deadline(&self, invocation_deadline: Time) -> Time {
        invocation_deadline - self.queue_reserve
    }

    /// May a record start at `now`? `Err(time left)` when too little is left.
    pub fn may_start(&self, now: Time, records_deadline: Time) -> Result<(), Duration> {
        let left = now.until(records_deadline);
        if left < self.record_margin {
            Err(left)
        } else {
            Ok(())
        }
    }

    /// How long a call of `kind` started at `now` may take, ending before `deadline`
    /// less [`SAFETY`]; `None`: do not start it.
    pub fn call_timeout(&self, kind: CallKind, now: Time, deadline: Time) -> Option<Duration> {
        let left = time_left(now, deadline);
        let (timeout, least) = match kind {
            CallKind::Provider => (self.provider_timeout, self.provider_timeout),
            CallKind::Store => (self.store_timeout, MIN_STORE_CALL),
            CallKind::Queue => (QUEUE_STEP, MIN_QUEUE_STEP),
        };
        let timeout = if self.calls_take_what_is_left {
            left
        } else {
            timeout.min(left)
        };
        (timeout >= least).then_some(timeout)
    }

    /// The least time a call of `kind` needs to be started (see [`Self::call_timeout`]).
    pub fn least(&self, kind: CallKind) -> Duration {
        match kind {
            CallKind::Provider => self.provider_timeout,
            CallKind::Store => MIN_STORE_CALL,
            CallKind::Queue => MIN_QUEUE_STEP,
        }
    }

    /// Whether a provider call may still follow a pause of `pause` (the in-invocation
    /// retry of an effect).
    pub fn fits_after(&self, pause: Duration, now: Time, deadline: Time) -> bool {
        time_left(now, deadline) >= pause + self.provider_timeout
    }

    /// The end of the lease `resolve` takes at `now`.
    pub fn resolve_lease(&self, now: Time) -> Time {
        now + self.provider_timeout * RESOLVE_LEASE_CALLS
    }
}

/// The time left at `now` before `deadline` less [`SAFETY`].
pub fn time_left(now: Time, deadline: Time) -> Duration {
    now.until(deadline - SAFETY)
}

/// The invocation deadline the runtime sent (ms since the epoch), or `None` when it is
/// not an epoch time (an emulator that sent a duration).
pub fn plausible(sent_ms: i64) -> Option<Time> {
    (sent_ms >= PLAUSIBLE_DEADLINE_MS).then(|| Time::from_ms(sent_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_reserve_holds_both_queue_steps() {
        assert_eq!(QUEUE_RESERVE, QUEUE_STEP * 2);
    }

    const S: Duration = Duration::from_secs(1);

    fn budget() -> Budget {
        Budget::new(12 * S, 10 * S)
    }

    fn at(secs: u32) -> Time {
        Time::from_ms(1_800_000_000_000) + S * secs
    }

    #[test]
    fn a_record_starts_only_with_the_margin_left_before_the_records_deadline() {
        let b = budget().with_queue_steps();
        let records = b.records_deadline(at(60));
        assert_eq!(records, at(60) - Duration::from_millis(1500));
        assert_eq!(b.may_start(at(46), records), Ok(()));
        assert_eq!(
            b.may_start(at(47), records),
            Err(Duration::from_millis(11_500))
        );
        assert_eq!(budget().records_deadline(at(60)), at(60));
    }

    #[test]
    fn a_provider_call_needs_its_whole_timeout_and_ends_before_the_safety_margin() {
        let b = budget();
        assert_eq!(
            b.call_timeout(CallKind::Provider, at(0), at(11)),
            Some(10 * S)
        );
        let late = at(1) + Duration::from_millis(1);
        assert_eq!(b.call_timeout(CallKind::Provider, late, at(11)), None);
    }

    #[test]
    fn a_store_call_is_cut_to_the_time_left_but_not_below_a_quarter_second() {
        let b = budget();
        assert_eq!(
            b.call_timeout(CallKind::Store, at(0), at(60)),
            Some(STORE_TIMEOUT)
        );
        assert_eq!(
            b.call_timeout(CallKind::Store, at(0), at(2)),
            Some(Duration::from_millis(1500))
        );
        let deadline = at(0) + Duration::from_millis(700);
        assert_eq!(b.call_timeout(CallKind::Store, at(0), deadline), None);
    }

    #[test]
    fn a_queue_step_takes_at_most_three_quarters_of_a_second() {
        let b = budget();
        assert_eq!(
            b.call_timeout(CallKind::Queue, at(0), at(60)),
            Some(Duration::from_millis(750))
        );
        let deadline = at(0) + Duration::from_millis(550);
        assert_eq!(b.call_timeout(CallKind::Queue, at(0), deadline), None);
    }

    #[test]
    fn the_flush_reserve_comes_off_every_deadline_of_the_invocation() {
        let b = budget()
            .with_queue_steps()
            .with_flush_reserve(Duration::from_millis(500));
        let answer_by = b.answer_by(at(60));
        assert_eq!(answer_by, at(60) - Duration::from_millis(500));
        assert_eq!(b.records_deadline(answer_by), at(58));
        assert_eq!(budget().answer_by(at(60)), at(60));
    }

    #[test]
    fn under_a_lease_a_call_starts_with_its_least_time_left_and_has_all_that_is_left() {
        let b = budget().under_lease();
        assert_eq!(
            b.call_timeout(CallKind::Provider, at(0), at(60)),
            Some(Duration::from_millis(59_500))
        );
        let late = at(1) + Duration::from_millis(1);
        assert_eq!(b.call_timeout(CallKind::Provider, late, at(11)), None);
        assert_eq!(
            b.call_timeout(CallKind::Store, at(0), at(60)),
            Some(Duration::from_millis(59_500))
        );
    }

    #[test]
    fn a_deadline_that_is_not_an_epoch_time_is_refused() {
        assert_eq!(plausible(600_000), None);
        assert_eq!(
            plausible(1_800_000_000_000),
            Some(Time::from_ms(1_800_000_000_000))
        );
    }
}
