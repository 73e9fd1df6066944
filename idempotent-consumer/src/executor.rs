//! The one executor: every call a machine's step makes, on every path of a consumer
//! (a record, an event, a scheduled run, an operator's command), is made here, so each
//! safeguard holds on every path by construction:
//!
//! * the breakers ([`crate::breaker`]): a unit of work starts only once both admit it
//!   ([`Executor::admitted`]), every call's answer is told to its breaker, and a probe
//!   that reached nothing is handed back;
//! * the deadline budget ([`crate::deadline`]): no call starts unless its timeout ends
//!   before the deadline less the safety margin, and each is bounded by it;
//! * the pace ([`crate::pacing`]): every provider call waits for a slot, and each
//!   answer adjusts the pace; a call refused for the provider's rate or on a locked
//!   object is sent again, the same request, a bounded number of times;
//! * spans and latency metrics for each call, and the count of refused credentials.
//!
//! What a path's machine decides stays in its machine; how an application names its
//! calls in traces is its [`Observe`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{Instrument as _, Span};

use crate::breaker::{Admission, Breaker, Breakers, Dependency};
use crate::clock::{Clock, Time};
use crate::deadline::{Budget, CallKind};
use crate::jitter::Jitter;
use crate::pacing::{LOCK_PAUSE, MAX_THROTTLED_TRIES, Pacer};
use crate::queue::QueueError;

/// Histogram of every store call, ms.
pub const STORE_LATENCY: &str = "store_latency_ms";
/// Histogram of the waits for this environment's pace before a provider call, ms (only
/// the calls that waited).
pub const PACING_WAIT: &str = "pacing_wait_ms";
/// A provider call refused by one of the provider's rate limiters: backpressure,
/// counted apart from failures.
pub const PROVIDER_RATE_LIMITED: &str = "provider_rate_limited";
/// A provider call refused because another request held the object it needs.
pub const PROVIDER_LOCKED: &str = "provider_locked";
/// Provider calls refused for the credentials themselves (401) or a permission they
/// lack (403): a setting to fix.
pub const PROVIDER_KEY_REFUSED: &str = "provider_key_refused";

/// Why a call gave no answer.
#[derive(Debug)]
pub enum NoAnswer<E> {
    /// Too little time left before the deadline: not started.
    NoTime,
    /// Started, and its timeout ended first: the outcome is unknown.
    TimedOut,
    /// It answered with an error.
    Failed(E),
}

impl<E> NoAnswer<E> {
    /// The same missing answer, its error made another (shared, wrapped).
    pub fn map_failure<F>(self, f: impl FnOnce(E) -> F) -> NoAnswer<F> {
        match self {
            Self::NoTime => NoAnswer::NoTime,
            Self::TimedOut => NoAnswer::TimedOut,
            Self::Failed(e) => NoAnswer::Failed(f(e)),
        }
    }
}

/// Backpressure from the provider: not a failure, never counted by the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Throttle {
    /// One of the provider's rate limiters refused the call: the pace is cut.
    RateLimited,
    /// Another request held the object the call needs: a short pause.
    Lock,
}

/// What the executor reads of a provider's failure.
pub trait ProviderFailure: Sized {
    /// The provider is down (timeout, connection, 5xx, an answer that cannot be read,
    /// no endpoint): a failure for the breaker, and nothing about its rate. An answer
    /// about the call itself (a refusal, a conflict) is not.
    fn is_down(&self) -> bool;
    /// Backpressure, if it is.
    fn throttle(&self) -> Option<Throttle>;
    /// The provider advised against sending the call again.
    fn advised_not_to_retry(&self) -> bool;
    /// The provider refused the credentials (401) or a permission they lack (403).
    fn refuses_the_key(&self) -> bool;
    /// The failure of a call never sent: the pace had no slot for it before the
    /// deadline (backpressure, as a rate limit is; the provider advised nothing).
    fn not_sent() -> Self;
}

/// How an application names its provider calls and waits in traces, and which
/// histogram holds its provider calls' latency.
pub trait Observe: Send + Sync {
    /// The application's name of one provider operation.
    type Call: Copy;
    /// A provider call's failure, as the executor reads it.
    type Failure: ProviderFailure;
    /// The histogram of provider call latency, ms.
    const PROVIDER_LATENCY: &'static str = "provider_latency_ms";
    /// The span of one provider request (`retry`: the same request sent again).
    fn call_span(&self, call: Self::Call, retry: bool) -> Span;
    /// How it went, on its span (`None`: it succeeded).
    fn answered(&self, span: &Span, failure: Option<&NoAnswer<Self::Failure>>);
    /// The span of one wait (`planned`: its first pause).
    fn wait_span(&self, wait: Wait, planned: Duration) -> Span;
}

/// The waits of a unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// For a slot of the environment's pace.
    Pacing,
    /// The jittered pause after a locked object.
    Lock,
    /// The jittered pause before a retry within the invocation.
    Retry,
}

/// The [`Observe`] of a consumer whose effect is made inside the store: it makes no
/// provider call, so it names none.
pub struct StoreOnly;

/// The failure of a provider call a [`StoreOnly`] consumer never makes.
#[derive(Debug)]
pub struct NoProvider;

impl ProviderFailure for NoProvider {
    fn is_down(&self) -> bool {
        false
    }
    fn throttle(&self) -> Option<Throttle> {
        None
    }
    fn advised_not_to_retry(&self) -> bool {
        true
    }
    fn refuses_the_key(&self) -> bool {
        false
    }
    fn not_sent() -> Self {
        Self
    }
}

impl Observe for StoreOnly {
    type Call = ();
    type Failure = NoProvider;
    fn call_span(&self, (): (), _retry: bool) -> Span {
        Span::none()
    }
    fn answered(&self, _span: &Span, _failure: Option<&NoAnswer<NoProvider>>) {}
    fn wait_span(&self, _wait: Wait, _planned: Duration) -> Span {
        Span::none()
    }
}

/// The safeguards of one execution environment, built once at cold start and shared
/// by every invocation: the clock, the deadline budget, the breakers and the pace.
#[derive(Clone)]
pub struct Safeguards {
    /// Where "now" comes from.
    pub clock: Clock,
    /// Every margin before the invocation deadline.
    pub budget: Budget,
    /// The breakers and the pace, shared by every invocation.
    pub breakers: Arc<Breakers>,
}

impl Safeguards {
    /// The safeguards of a consumer that knows no better: the wall clock; no record
    /// starts with less than 3 s left and a provider call may take 1 s; the breakers
    /// open after 5 transient failures in a row, for 30 s at first and 15 min at most.
    /// A consumer with a slow provider sets its own ([`Budget::new`]).
    pub fn standard() -> Self {
        Self {
            clock: crate::clock::system(),
            budget: Budget::new(Duration::from_secs(3), Duration::from_secs(1)),
            breakers: Arc::new(Breakers::new(
                5,
                Duration::from_secs(30),
                Duration::from_secs(15 * 60),
            )),
        }
    }

    /// The time now, by the clock.
    pub fn now(&self) -> Time {
        (self.clock)()
    }
}

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
pub struct Executor<'s, O> {
    safeguards: Safeguards,
    observe: &'s O,
    deadline: Time,
    /// Whether a call reached the store, and the provider: a breaker's probe that
    /// reached nothing proves nothing and is handed back.
    reached_store: AtomicBool,
    reached_provider: AtomicBool,
}

impl<'s, O: Observe> Executor<'s, O> {
    /// The executor of work whose calls must end before `deadline` (less the budget's
    /// safety margin).
    pub fn new(safeguards: Safeguards, observe: &'s O, deadline: Time) -> Self {
        Self {
            safeguards,
            observe,
            deadline,
            reached_store: AtomicBool::new(false),
            reached_provider: AtomicBool::new(false),
        }
    }

    /// The safeguards every call is made under.
    pub fn safeguards(&self) -> &Safeguards {
        &self.safeguards
    }

    /// How the calls are observed.
    pub fn observe(&self) -> &'s O {
        self.observe
    }

    /// The work's deadline: every call ends before it, less the safety margin.
    pub fn deadline(&self) -> Time {
        self.deadline
    }

    /// The time now, by the safeguards' clock.
    pub fn now(&self) -> Time {
        self.safeguards.now()
    }

    /// Runs `work` once both breakers admit it: [`Closed`], with no write and no call,
    /// while either is open. A probe that reached nothing is handed back, so the next
    /// unit of work probes.
    pub async fn admitted<T>(&self, work: impl Future<Output = T>) -> Result<T, Closed> {
        let now = self.now();
        let breakers = self.safeguards.breakers.as_ref();
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
    /// in milliseconds; recording a done effect is worth a short try), its answer told to
    /// the store's breaker.
    pub async fn store<T, E>(
        &self,
        span: &Span,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, NoAnswer<E>> {
        let answer = self
            .bounded(CallKind::Store, STORE_LATENCY, call)
            .instrument(span.clone())
            .await;
        let reached = tell_breaker(&self.safeguards.breakers.store, &answer, self.now(), |_| {
            true
        });
        self.reached_store.fetch_or(reached, Ordering::Relaxed);
        answer
    }

    /// One queue call answering as a whole, bounded like every other call.
    pub async fn queue<T, E>(
        &self,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, NoAnswer<E>> {
        let now = self.now();
        match self
            .safeguards
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

    /// One step of queue calls answering entry by entry (`entries` of them), bounded
    /// like every other call: not started, or cut short, every entry says so.
    pub async fn queue_step(
        &self,
        entries: usize,
        call: impl Future<Output = Vec<Result<(), QueueError>>>,
    ) -> Vec<Result<(), QueueError>> {
        let now = self.now();
        match self
            .safeguards
            .budget
            .call_timeout(CallKind::Queue, now, self.deadline)
        {
            None => vec![Err(QueueError::NoTime); entries],
            Some(timeout) => tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_elapsed| vec![Err(QueueError::TimedOut); entries]),
        }
    }

    /// A provider call at this environment's pace, its answer told to the pace and to
    /// the breaker. Refused for the provider's rate, it waits for its next slot (the
    /// pace is cut first) and is sent again; refused on a locked object, it is sent
    /// again after a short jittered pause; each at most [`MAX_THROTTLED_TRIES`] times,
    /// only while the deadline rule allows, and never against the provider's advice.
    /// The same request each time, so an effect is a replay under its key. A call whose
    /// slot comes too late is not sent: it fails as [`ProviderFailure::not_sent`]. Each request sent has its span (`what`; `retry`: the first is
    /// already a retry).
    pub async fn provider<T, Fut>(
        &self,
        what: O::Call,
        retry: bool,
        call: impl Fn() -> Fut,
    ) -> Result<T, NoAnswer<O::Failure>>
    where
        Fut: Future<Output = Result<T, O::Failure>>,
    {
        let pacer = &self.safeguards.breakers.pacer;
        let budget = &self.safeguards.budget;
        let mut tries = 0;
        loop {
            tries += 1;
            if !self.wait_for_slot(pacer).await {
                return Err(NoAnswer::Failed(O::Failure::not_sent()));
            }
            let span = self.observe.call_span(what, retry || tries > 1);
            let answer = self
                .bounded(CallKind::Provider, O::PROVIDER_LATENCY, call())
                .instrument(span.clone())
                .await;
            self.observe.answered(&span, answer.as_ref().err());
            if matches!(&answer, Err(NoAnswer::Failed(e)) if e.refuses_the_key()) {
                metrics::counter!(PROVIDER_KEY_REFUSED).increment(1);
            }
            let reached = tell_breaker(
                &self.safeguards.breakers.provider,
                &answer,
                self.now(),
                O::Failure::is_down,
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
                    if !matches!(&answer, Err(NoAnswer::Failed(e)) if e.is_down()) {
                        pacer.on_success();
                    }
                    return answer;
                }
                Some(Throttle::RateLimited) => {
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
                        .instrument(self.observe.wait_span(wait, pause))
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
        let breaker = &self.safeguards.breakers.provider;
        if !breaker.is_closed()
            || !self
                .safeguards
                .budget
                .fits_after(pause, self.now(), self.deadline)
        {
            return false;
        }
        tokio::time::sleep(pause)
            .instrument(self.observe.wait_span(Wait::Retry, pause))
            .await;
        breaker.is_closed()
    }

    /// Waits until the pace lets a provider call go, while the call would still fit
    /// before the deadline; `false` when it would not. Each wait is at most one
    /// spacing of the pace, so the loop is bounded by the deadline; the count bounds
    /// it too.
    async fn wait_for_slot(&self, pacer: &Pacer) -> bool {
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
                    return true;
                }
                Err(wait) => wait.max(Duration::from_millis(1)),
            };
            if !self.safeguards.budget.fits_after(wait, now, self.deadline) {
                return false;
            }
            let span = span.get_or_insert_with(|| self.observe.wait_span(Wait::Pacing, wait));
            tokio::time::sleep(wait).instrument(span.clone()).await;
            waited += wait;
        }
        false
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
        let Some(timeout) = self
            .safeguards
            .budget
            .call_timeout(kind, now, self.deadline)
        else {
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

#[cfg(test)]
mod tests;
