//! The one executor (ARCHITECTURE.md, "One executor"): every call a machine's step
//! makes, on every path (a record, a provider event in the batch, the scheduled
//! settler, `resolve`), is made here, so each safeguard holds on every path by
//! construction:
//!
//! * the breakers: a unit of work starts only once both admit it ([`Executor::admitted`]),
//!   every call's answer is told to its breaker, and a probe that reached nothing is
//!   handed back;
//! * the deadline budget (`policy/deadline.rs`): no call starts unless its timeout ends
//!   before the deadline less the safety margin, and each is bounded by it;
//! * the pace (`policy/pacing.rs`): every provider call waits for a slot, and each
//!   answer adjusts the pace; a call refused for the provider's rate or on a locked
//!   object is sent again, the same request, a bounded number of times;
//! * spans and latency metrics for each call, and the count of refused keys.
//!
//! What a path's machine decides stays in its machine; what its driver adds (crash
//! points, log lines) stays in its driver.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{Instrument as _, Span};

use crate::contracts::payment::{FailureKind, Limiter, PaymentError, Throttle};
use crate::contracts::store::StoreError;
use crate::domain::clock::Time;
use crate::drivers::charge::Settings;
use crate::drivers::metrics::{
    PACING_WAIT, PAYMENT_LATENCY, PROVIDER_KEY_REFUSED, PROVIDER_LOCKED, PROVIDER_RATE_LIMITED,
    STORE_LATENCY,
};
use crate::drivers::spans::{self, ProviderCall, Wait};
use crate::policy::deadline::CallKind;
use crate::policy::machine::NoAnswer;
use crate::policy::pacing::{LOCK_PAUSE, MAX_THROTTLED_TRIES, Pacer};
use crate::policy::retry::Jitter;
use crate::policy::retry::breaker::{Admission, Breaker, Dependency};

/// A unit of work not started because a breaker is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed {
    /// The dependency whose breaker is open.
    pub dependency: Dependency,
    /// When the next probe may go.
    pub until: Time,
}

/// The calls of one unit of work (a record, an event, one awaiting record of the
/// settler, one `resolve`) before one deadline.
pub struct Executor<'s> {
    settings: &'s Settings,
    deadline: Time,
    /// Whether a call reached the store, and the provider: a breaker's probe that
    /// reached nothing proves nothing and is handed back.
    reached_store: AtomicBool,
    reached_provider: AtomicBool,
}

impl<'s> Executor<'s> {
    /// The executor of work whose calls must end before `deadline` (less the budget's
    /// safety margin).
    pub fn new(settings: &'s Settings, deadline: Time) -> Self {
        Self {
            settings,
            deadline,
            reached_store: AtomicBool::new(false),
            reached_provider: AtomicBool::new(false),
        }
    }

    pub fn settings(&self) -> &'s Settings {
        self.settings
    }

    pub fn deadline(&self) -> Time {
        self.deadline
    }

    pub fn now(&self) -> Time {
        self.settings.now()
    }

    /// Runs `work` once both breakers admit it: [`Closed`], with no write and no call,
    /// while either is open. A probe that reached nothing is handed back, so the next
    /// unit of work probes.
    pub async fn admitted<T>(&self, work: impl Future<Output = T>) -> Result<T, Closed> {
        let now = self.now();
        let breakers = self.settings.breakers.as_ref();
        let store = breakers.store.admit(now, self.deadline);
        let provider = breakers.provider.admit(now, self.deadline);
        let result = match (store, provider) {
            (Admission::Open { until }, _) => Err(Closed {
                dependency: Dependency::Store,
                until,
            }),
            (_, Admission::Open { until }) => Err(Closed {
                dependency: Dependency::Provider,
                until,
            }),
            _ => Ok(work.await),
        };
        let now = self.now();
        if store == Admission::Probe && !self.reached_store.load(Ordering::Relaxed) {
            breakers.store.return_probe(now);
        }
        if provider == Admission::Probe && !self.reached_provider.load(Ordering::Relaxed) {
            breakers.provider.return_probe(now);
        }
        result
    }

    /// A store call in `span`, with its timeout cut to the time left (a store answers
    /// in milliseconds; recording a charge is worth a short try), its answer told to
    /// the store's breaker.
    pub async fn store<T>(
        &self,
        span: &Span,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, NoAnswer<StoreError>> {
        let answer = self
            .bounded(CallKind::Store, STORE_LATENCY, call)
            .instrument(span.clone())
            .await;
        let reached = tell_breaker(&self.settings.breakers.store, &answer, self.now(), |_| true);
        self.reached_store.fetch_or(reached, Ordering::Relaxed);
        answer
    }

    /// One step of queue calls, bounded like every other call.
    pub async fn queue<T, E>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, NoAnswer<E>> {
        let now = self.now();
        match self
            .settings
            .budget
            .call_timeout(CallKind::Queue, now, self.deadline)
        {
            None => Err(NoAnswer::NoTime),
            Some(timeout) => match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer.map_err(NoAnswer::Failed),
                Err(_elapsed) => Err(NoAnswer::TimedOut),
            },
        }
    }

    /// A provider call at this environment's pace, its answer told to the pace and to
    /// the breaker. Refused for the provider's rate, it waits for its next slot (the
    /// pace is cut first) and is sent again; refused on a locked customer, it is sent
    /// again after a short jittered pause; each at most [`MAX_THROTTLED_TRIES`] times,
    /// only while the deadline rule allows, and never against the provider's advice.
    /// The same request each time, so a charge is a replay under its key. A call whose
    /// slot comes too late is not sent: it fails as rate limited, and the record comes
    /// back in seconds. Each request sent has its span (`what`; `retry`: the first is
    /// already a retry).
    pub async fn provider<T, Fut>(
        &self,
        what: ProviderCall,
        retry: bool,
        call: impl Fn() -> Fut,
    ) -> Result<T, NoAnswer<PaymentError>>
    where
        Fut: Future<Output = Result<T, PaymentError>>,
    {
        let pacer = &self.settings.breakers.pacer;
        let budget = &self.settings.budget;
        let mut tries = 0;
        loop {
            tries += 1;
            if let Err(not_sent) = self.wait_for_slot(pacer).await {
                return Err(NoAnswer::Failed(not_sent));
            }
            let span = spans::provider_call(what, retry || tries > 1);
            let answer = self
                .bounded(CallKind::Provider, PAYMENT_LATENCY, call())
                .instrument(span.clone())
                .await;
            spans::provider_answered(&span, &answer);
            if matches!(&answer, Err(NoAnswer::Failed(e)) if e.refuses_the_key()) {
                metrics::counter!(PROVIDER_KEY_REFUSED).increment(1);
            }
            let reached = tell_breaker(
                &self.settings.breakers.provider,
                &answer,
                self.now(),
                provider_is_down,
            );
            self.reached_provider.fetch_or(reached, Ordering::Relaxed);
            let (throttle, advised_not) = match &answer {
                Ok(_) => (None, false),
                Err(NoAnswer::Failed(e)) => (e.throttle(), e.advised_not_to_retry()),
                // No answer says nothing about the provider's rate.
                Err(_) => return answer,
            };
            let (pause, wait) = match throttle {
                None => {
                    // An answer about this call speeds the pace up; a provider that is
                    // down (5xx, connection, no endpoint) says nothing of its rate.
                    if !matches!(&answer, Err(NoAnswer::Failed(e)) if provider_is_down(e)) {
                        pacer.on_success();
                    }
                    return answer;
                }
                Some(Throttle::RateLimited(_)) => {
                    metrics::counter!(PROVIDER_RATE_LIMITED).increment(1);
                    pacer.on_rate_limited(self.now());
                    // The cut pace's next slot is the wait.
                    (Duration::ZERO, None)
                }
                Some(Throttle::Lock) => {
                    metrics::counter!(PROVIDER_LOCKED).increment(1);
                    let pause = Jitter::random().between(LOCK_PAUSE.0, LOCK_PAUSE.1);
                    (pause, Some(Wait::Lock))
                }
            };
            if advised_not
                || tries >= MAX_THROTTLED_TRIES
                || !budget.fits_after(pause, self.now(), self.deadline)
            {
                return answer;
            }
            match wait {
                Some(wait) => {
                    tokio::time::sleep(pause)
                        .instrument(spans::wait(wait, pause))
                        .await;
                }
                None => tokio::time::sleep(pause).await,
            }
        }
    }

    /// Sleeps `pause` (in its span) when a provider call may still follow it before
    /// the deadline and the provider's breaker is still closed after it; whether it
    /// may.
    pub async fn pause_before_retry(&self, pause: Duration) -> bool {
        let breaker = &self.settings.breakers.provider;
        if !breaker.is_closed()
            || !self
                .settings
                .budget
                .fits_after(pause, self.now(), self.deadline)
        {
            return false;
        }
        tokio::time::sleep(pause)
            .instrument(spans::wait(Wait::Retry, pause))
            .await;
        breaker.is_closed()
    }

    /// Waits until the pace lets a provider call go, while the call would still fit
    /// before the deadline; [`not_sent`] when it would not. Each wait is at most one
    /// spacing of the pace, so the loop is bounded by the deadline; the count bounds
    /// it too.
    async fn wait_for_slot(&self, pacer: &Pacer) -> Result<(), PaymentError> {
        const MOST_WAITS: u32 = 10_000;
        let mut waited = Duration::ZERO;
        // One span for the whole wait, made at its first pause (none when a slot is
        // free at once).
        let mut span: Option<Span> = None;
        for _ in 0..MOST_WAITS {
            let now = self.now();
            let wait = match pacer.try_take(now) {
                Ok(()) => {
                    if !waited.is_zero() {
                        metrics::histogram!(PACING_WAIT).record(waited.as_secs_f64() * 1000.0);
                    }
                    return Ok(());
                }
                Err(wait) => wait.max(Duration::from_millis(1)),
            };
            if !self.settings.budget.fits_after(wait, now, self.deadline) {
                return Err(not_sent());
            }
            let span = span.get_or_insert_with(|| spans::wait(Wait::Pacing, wait));
            tokio::time::sleep(wait).instrument(span.clone()).await;
            waited += wait;
        }
        Err(not_sent())
    }

    /// A call of `kind` under the budget's timeout for it, or not started; its latency
    /// recorded in `metric`.
    async fn bounded<T, E>(
        &self,
        kind: CallKind,
        metric: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, NoAnswer<E>> {
        let now = self.now();
        let Some(timeout) = self.settings.budget.call_timeout(kind, now, self.deadline) else {
            return Err(NoAnswer::NoTime);
        };
        let timed = async {
            let started = Instant::now();
            let answer = call.await;
            metrics::histogram!(metric).record(started.elapsed().as_secs_f64() * 1000.0);
            answer
        };
        match tokio::time::timeout(timeout, timed).await {
            Ok(result) => result.map_err(NoAnswer::Failed),
            Err(_elapsed) => Err(NoAnswer::TimedOut),
        }
    }
}

/// A call not sent because this environment's pace had no slot for it before the
/// deadline: backpressure, as a rate limit is, and nothing reached the provider.
fn not_sent() -> PaymentError {
    PaymentError::Retryable {
        kind: FailureKind::RateLimited(Limiter::Unnamed),
        source: Some("not sent: the pace of provider calls had no slot before the deadline".into()),
        should_retry: Some(false),
    }
}

/// Feeds a call's answer to its breaker: a call that was not started says nothing; an
/// answer that `is_down` says the dependency is down is a failure; anything else, an
/// error that the dependency chose to answer with included, is a success. Whether the
/// call was made.
fn tell_breaker<T, E>(
    breaker: &Breaker,
    answer: &Result<T, NoAnswer<E>>,
    now: Time,
    is_down: impl Fn(&E) -> bool,
) -> bool {
    match answer {
        Err(NoAnswer::NoTime) => return false,
        Err(NoAnswer::TimedOut) => breaker.failure(now),
        Err(NoAnswer::Failed(e)) if is_down(e) => breaker.failure(now),
        _ => breaker.success(),
    }
    true
}

/// A provider failure that says the provider is down, not an answer about this charge
/// (a decline, a rejection, a reused key, a 409 on a key in use) nor backpressure (a
/// rate limit or a lock: paced, never a failure).
pub fn provider_is_down(error: &PaymentError) -> bool {
    matches!(
        error,
        PaymentError::Retryable {
            kind: FailureKind::Timeout
                | FailureKind::Connection
                | FailureKind::Server(_)
                | FailureKind::BadResponse
                | FailureKind::NoEndpoint,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limit_or_a_lock_never_counts_toward_the_providers_breaker() {
        for kind in [
            FailureKind::RateLimited(Limiter::EndpointRate),
            FailureKind::RateLimited(Limiter::Unnamed),
            FailureKind::Lock,
        ] {
            assert!(
                !provider_is_down(&PaymentError::retryable(kind)),
                "{kind:?}"
            );
        }
        assert!(!provider_is_down(&not_sent()));
        assert!(provider_is_down(&PaymentError::retryable(
            FailureKind::Server(503)
        )));
        let breaker = Breaker::new(1, Duration::from_secs(1), Duration::from_secs(2));
        let now = Time::from_ms(0);
        for _ in 0..10 {
            let refused: Result<(), _> = Err(NoAnswer::Failed(PaymentError::retryable(
                FailureKind::RateLimited(Limiter::EndpointRate),
            )));
            tell_breaker(&breaker, &refused, now, provider_is_down);
        }
        assert!(breaker.is_closed(), "rate limits kept the breaker closed");
    }
}
