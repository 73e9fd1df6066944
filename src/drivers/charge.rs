//! The driver of one record: performs each step the state machine (`policy/machine/`) asks for
//! with the real store and provider, and feeds the answer back. It owns what the machine
//! must not touch: the clock, the owner token, timeouts, metrics and log lines.
//!
//! Every store and provider call is bounded, and none starts unless its timeout ends
//! before the invocation deadline less the safety margin (`policy/deadline.rs`): a handler
//! that answers late loses its whole partial response, charged records included.
//!
//! It also keeps the execution environment's breakers (`policy/retry/breaker.rs`): a record
//! whose store or provider breaker is open is `Deferred` before any call, every call's
//! answer is fed to its breaker, and a charge that failed transiently is sent again
//! once, under the same key, while the provider's breaker is closed.
//!
//! Every provider call (charge, lookup, cancel) first waits for this environment's
//! pace (`policy/pacing.rs`), which each answer adjusts. A call refused for the
//! provider's rate waits for the next slot and is tried again, same key; one refused
//! on a locked customer after a short jittered pause; both a bounded number of times,
//! and only while the deadline rule allows. Neither counts toward the breaker.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{Instrument as _, warn};

use crate::config::Config;
use crate::contracts::payment::{
    ChargePath, FailureKind, Limiter, PaymentError, Receipt, Throttle,
};
use crate::contracts::store::{IdempotencyStore, StoreError, WriteOutcome};
pub use crate::domain::clock::Clock;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Owner};
use crate::drivers::metrics::{
    CHARGE_RETRIED, PACING_WAIT, PAYMENT_LATENCY, PROVIDER_KEY_REFUSED, PROVIDER_LOCKED,
    PROVIDER_RATE_LIMITED, STORE_LATENCY, TAKEOVER,
};
use crate::drivers::spans::{self, ProviderCall, Wait};
use crate::policy::deadline::{Budget, CallKind, time_left};
use crate::policy::machine::{Input, Machine, NoAnswer, Start, Step, WriteKind};
use crate::policy::outcome::Outcome;
use crate::policy::pacing::{LOCK_PAUSE, MAX_THROTTLED_TRIES, Pacer};
use crate::policy::resolve::{
    Confirmed, Resolution, ResolveError, ResolveInput, ResolveStep, Resolver,
};
use crate::policy::retry::Jitter;
use crate::policy::retry::breaker::{Admission, Breaker, Breakers, Dependency};
use crate::policy::rules::Rules;
use crate::{crash_points, error_chain};

/// The pause before the one in-invocation retry of a transient charge failure (same
/// key), jittered so that the records of a batch do not retry together.
const CHARGE_RETRY_PAUSE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_millis(400));

/// What the state machine needs from the configuration.
#[derive(Clone)]
pub struct Settings {
    /// `expires` = now + this.
    pub retention: Duration,
    /// Keys first sent longer ago than this are reconciled before reuse.
    pub provider_key_ttl: Duration,
    /// The invocation's time: when a record may start, how long each call may take.
    pub budget: Budget,
    /// Declines per order before deliveries stop calling the provider.
    pub max_declines: u32,
    /// How long an order awaits its customer's authentication.
    pub authentication_wait: Duration,
    pub clock: Clock,
    /// This execution environment's breakers, shared by every invocation.
    pub breakers: Arc<Breakers>,
}

impl From<&Config> for Settings {
    /// What the state machine needs from the configuration, on the wall clock.
    fn from(config: &Config) -> Self {
        Self {
            retention: config.retention,
            provider_key_ttl: config.provider_key_ttl,
            budget: Budget::new(config.deadline_margin, config.payment_timeout),
            max_declines: config.max_declines,
            authentication_wait: config.authentication_wait,
            clock: crate::domain::clock::system(),
            breakers: Arc::new(
                Breakers::new(
                    config.breaker_threshold,
                    config.retry_base,
                    config.retry_cap,
                )
                .with_pacer(Pacer::new(config.payment_rate_share())),
            ),
        }
    }
}

impl Settings {
    pub fn now(&self) -> Time {
        (self.clock)()
    }

    /// `expires` of a record written at `now`: now + retention, in whole seconds (the
    /// TTL attribute's unit). The one place it is computed.
    pub fn expires(&self, now: Time) -> Time {
        Time::from_secs((now + self.retention).as_secs())
    }
}

/// Runs the state machine for one order against a store and a provider.
pub struct Charger<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub provider: &'a dyn ChargePath,
    pub settings: &'a Settings,
}

impl Charger<'_> {
    /// Processes one valid order. `deadline` is the invocation deadline; the lease
    /// ends there and no call runs past it.
    pub async fn process(&self, order: &Order, identity: &Identity, deadline: Time) -> Outcome {
        self.admitted(deadline, async |calls: &mut Calls| {
            self.run(order, identity, deadline, calls).await
        })
        .await
    }

    /// Runs `work` once both breakers admit it: `Deferred`, with no write and no call,
    /// while either is open; a probe that reached nothing is handed back.
    pub(crate) async fn admitted(
        &self,
        deadline: Time,
        work: impl AsyncFnOnce(&mut Calls) -> Outcome,
    ) -> Outcome {
        let now = self.settings.now();
        let breakers = self.settings.breakers.as_ref();
        let store = breakers.store.admit(now, deadline);
        let provider = breakers.provider.admit(now, deadline);
        let mut calls = Calls::default();
        let outcome = match (store, provider) {
            (Admission::Open { until }, _) => Outcome::Deferred {
                dependency: Dependency::Store,
                until,
            },
            (_, Admission::Open { until }) => Outcome::Deferred {
                dependency: Dependency::Provider,
                until,
            },
            _ => work(&mut calls).await,
        };
        // A probe that never reached its dependency proves nothing: the next record
        // probes.
        let now = self.settings.now();
        if store == Admission::Probe && !calls.store {
            breakers.store.return_probe(now);
        }
        if provider == Admission::Probe && !calls.provider {
            breakers.provider.return_probe(now);
        }
        outcome
    }

    async fn run(
        &self,
        order: &Order,
        identity: &Identity,
        deadline: Time,
        calls: &mut Calls,
    ) -> Outcome {
        let now = self.settings.now();
        let (mut machine, mut step) = Machine::new(Start {
            identity: identity.clone(),
            owner: Owner::fresh(),
            now,
            deadline,
            expires: self.settings.expires(now),
            max_declines: self.settings.max_declines,
            key_ttl: self.settings.provider_key_ttl,
            authentication_wait: self.settings.authentication_wait,
            processing_wait: self
                .settings
                .authentication_wait
                .max(crate::policy::machine::PROCESSING_WAIT),
            rules: Rules::ALL,
        });
        loop {
            step = match step {
                Step::Done(outcome) => return outcome,
                Step::Write(kind) => {
                    let span = spans::store_call(kind);
                    let answer = {
                        let write = machine.write(kind, self.settings.now());
                        self.store_call(deadline, self.store.write(&write))
                            .instrument(span.clone())
                            .await
                    };
                    spans::store_answered(&span, &answer);
                    calls.store |= self.tell_store_breaker(&answer);
                    observe_write(kind, &answer, now);
                    on_written(&mut machine, answer)
                }
                Step::Charge { key } => {
                    let answer = self.charge(order, &key, deadline, calls).await;
                    on_charged(&mut machine, answer)
                }
                Step::Lookup => {
                    let since = machine.lookup_since();
                    let answer = self
                        .paced_call(ProviderCall::Lookup, false, deadline, calls, || {
                            self.provider.find_payment(order, since)
                        })
                        .await;
                    machine.on(Input::Looked(answer))
                }
                Step::Cancel { payment_id } => {
                    let answer = self
                        .paced_call(ProviderCall::Cancel, false, deadline, calls, || {
                            self.provider.cancel(&payment_id)
                        })
                        .await;
                    machine.on(Input::Cancelled(answer))
                }
            };
        }
    }

    /// The charge under `key`, and its one in-invocation retry when it failed
    /// transiently.
    async fn charge(
        &self,
        order: &Order,
        key: &str,
        deadline: Time,
        calls: &mut Calls,
    ) -> Result<Receipt, NoAnswer<PaymentError>> {
        let answer = self
            .paced_call(ProviderCall::Charge, false, deadline, calls, || {
                self.provider.charge(order, key)
            })
            .await;
        if !self.may_retry_charge(&answer, deadline).await {
            return answer;
        }
        metrics::counter!(CHARGE_RETRIED).increment(1);
        self.paced_call(ProviderCall::Charge, true, deadline, calls, || {
            self.provider.charge(order, key)
        })
        .await
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
    pub(crate) async fn paced_call<T, Fut>(
        &self,
        what: ProviderCall,
        retry: bool,
        deadline: Time,
        calls: &mut Calls,
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
            if let Err(not_sent) = self.wait_for_slot(pacer, deadline).await {
                return Err(NoAnswer::Failed(not_sent));
            }
            let span = spans::provider_call(what, retry || tries > 1);
            let answer = self
                .provider_call(deadline, call())
                .instrument(span.clone())
                .await;
            spans::provider_answered(&span, &answer);
            if matches!(&answer, Err(NoAnswer::Failed(e)) if e.refuses_the_key()) {
                metrics::counter!(PROVIDER_KEY_REFUSED).increment(1);
            }
            calls.provider |= self.tell_provider_breaker(&answer);
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
                    pacer.on_rate_limited(self.settings.now());
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
                || !budget.fits_after(pause, self.settings.now(), deadline)
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

    /// Waits until the pace lets a provider call go, while the call would still fit
    /// before the deadline; [`not_sent`] when it would not. Each wait is at most one
    /// spacing of the pace, so the loop is bounded by the deadline; the count bounds
    /// it too.
    async fn wait_for_slot(&self, pacer: &Pacer, deadline: Time) -> Result<(), PaymentError> {
        const MOST_WAITS: u32 = 10_000;
        let mut waited = Duration::ZERO;
        // One span for the whole wait, made at its first pause (none when a slot is
        // free at once).
        let mut span: Option<tracing::Span> = None;
        for _ in 0..MOST_WAITS {
            let now = self.settings.now();
            let wait = match pacer.try_take(now) {
                Ok(()) => {
                    if !waited.is_zero() {
                        metrics::histogram!(PACING_WAIT).record(waited.as_secs_f64() * 1000.0);
                    }
                    return Ok(());
                }
                Err(wait) => wait.max(Duration::from_millis(1)),
            };
            if !self.settings.budget.fits_after(wait, now, deadline) {
                return Err(not_sent());
            }
            let span = span.get_or_insert_with(|| spans::wait(Wait::Pacing, wait));
            tokio::time::sleep(wait).instrument(span.clone()).await;
            waited += wait;
        }
        Err(not_sent())
    }

    /// Tells the store's breaker how a call went; whether the call was made.
    pub(crate) fn tell_store_breaker<T>(&self, answer: &Result<T, NoAnswer<StoreError>>) -> bool {
        tell_breaker(
            &self.settings.breakers.store,
            answer,
            self.settings.now(),
            |_| true,
        )
    }

    /// Tells the provider's breaker how a call went; whether the call was made.
    fn tell_provider_breaker<T>(&self, answer: &Result<T, NoAnswer<PaymentError>>) -> bool {
        tell_breaker(
            &self.settings.breakers.provider,
            answer,
            self.settings.now(),
            provider_is_down,
        )
    }

    /// At most one in-invocation retry of a charge that failed transiently (a rate
    /// limit or a lock was already waited for, at the pace), under the same key (a replay, so it cannot charge twice), after a short jittered pause:
    /// only while the provider's breaker is closed and the deadline rule allows it. A
    /// timeout is not retried here: a hanging provider would cost its timeout twice.
    async fn may_retry_charge<T>(
        &self,
        answer: &Result<T, NoAnswer<PaymentError>>,
        deadline: Time,
    ) -> bool {
        // The provider's own advice comes before the status: `Stripe-Should-Retry:
        // false` is never retried here (the next delivery may).
        let transient = matches!(
            answer,
            Err(NoAnswer::Failed(e @ PaymentError::Retryable {
                kind: FailureKind::Connection | FailureKind::Server(_) | FailureKind::Conflict,
                ..
            })) if !e.advised_not_to_retry()
        );
        if !transient || !self.settings.breakers.provider.is_closed() {
            return false;
        }
        let pause = Jitter::random().between(CHARGE_RETRY_PAUSE.0, CHARGE_RETRY_PAUSE.1);
        if !self
            .settings
            .budget
            .fits_after(pause, self.settings.now(), deadline)
        {
            return false;
        }
        tokio::time::sleep(pause)
            .instrument(spans::wait(Wait::Retry, pause))
            .await;
        self.settings.breakers.provider.is_closed()
    }

    /// A provider call, only with its full timeout left: one cut short would leave a
    /// charge's outcome unknown for nothing.
    async fn provider_call<T>(
        &self,
        deadline: Time,
        call: impl Future<Output = Result<T, PaymentError>>,
    ) -> Result<T, NoAnswer<PaymentError>> {
        self.bounded_call(CallKind::Provider, deadline, PAYMENT_LATENCY, call)
            .await
    }

    /// A store call, with its timeout cut to the time left (a store answers in
    /// milliseconds; recording a charge is worth a short try).
    pub(crate) async fn store_call<T>(
        &self,
        deadline: Time,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, NoAnswer<StoreError>> {
        self.bounded_call(CallKind::Store, deadline, STORE_LATENCY, call)
            .await
    }

    /// A call of `kind` under the budget's timeout for it, or not started.
    async fn bounded_call<T, E>(
        &self,
        kind: CallKind,
        deadline: Time,
        metric: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, NoAnswer<E>> {
        let now = self.settings.now();
        match self.settings.budget.call_timeout(kind, now, deadline) {
            None => Err(NoAnswer::NoTime),
            Some(timeout) => bounded(timeout, metric, call).await,
        }
    }
}

/// Settles `order`'s record by asking the provider: the driver of [`Resolver`].
pub async fn resolve(
    store: &dyn IdempotencyStore,
    provider: &dyn ChargePath,
    settings: &Settings,
    order: &Order,
    confirmed: Confirmed,
) -> Result<Resolution, ResolveError> {
    let now = settings.now();
    let lease_until = settings.budget.resolve_lease(now);
    let (mut resolver, mut step) = Resolver::new(
        order,
        Owner::new(format!("resolve-{}", Owner::fresh())),
        now,
        lease_until,
        settings.expires(now),
        confirmed,
    );
    // Every step must end before the lease does (less the deadline rule's safety): a
    // call that would not is never started, and each one started is bounded by what
    // is left, so nothing resolve writes can follow another owner's takeover. A step
    // cut short leaves the record as the last write did: the lease ends by itself.
    let budget = &settings.budget;
    // A call starts only with the time it needs left (`call_timeout`), and then has
    // all that is left of the lease: its own timeout (the HTTP client's) ends it first
    // unless the lease does.
    let bounded = |step: &'static str, kind: CallKind| -> Result<Duration, ResolveError> {
        let now = settings.now();
        match budget.call_timeout(kind, now, lease_until) {
            Some(_) => Ok(time_left(now, lease_until)),
            None => Err(ResolveError::LeaseEnding {
                step,
                left_ms: millis(time_left(now, lease_until)),
                needs_ms: millis(budget.least(kind)),
            }),
        }
    };
    let timed_out = |step: &'static str| ResolveError::LeaseEnded { step };
    for _ in 0..MOST_RESOLVE_STEPS {
        step = match step {
            ResolveStep::Done(result) => return result,
            ResolveStep::Read => {
                let left = bounded("read", CallKind::Store)?;
                let read = tokio::time::timeout(left, store.get(resolver.key()))
                    .await
                    .map_err(|_| timed_out("read"))?;
                resolver.on(ResolveInput::Read(read))
            }
            ResolveStep::Write(kind) => {
                let left = bounded("write", CallKind::Store)?;
                let answer = tokio::time::timeout(left, store.write(&resolver.write(kind)))
                    .await
                    .map_err(|_| timed_out("write"))?;
                resolver.on(ResolveInput::Written(answer))
            }
            ResolveStep::Lookup => {
                let left = bounded("lookup", CallKind::Provider)?;
                let lookup = provider.find_payment(order, resolver.lookup_since());
                let found = tokio::time::timeout(left, lookup)
                    .await
                    .map_err(|_| timed_out("lookup"))?;
                resolver.on(ResolveInput::Looked(found))
            }
            ResolveStep::Cancel { payment_id } => {
                let left = bounded("cancel", CallKind::Provider)?;
                let cancelled = tokio::time::timeout(left, provider.cancel(&payment_id))
                    .await
                    .map_err(|_| timed_out("cancel"))?;
                resolver.on(ResolveInput::Cancelled(cancelled))
            }
        };
    }
    Err(timed_out("next step"))
}

/// Steps a resolve takes at most: a read, a lease, a lookup, a cancel, a lookup again
/// and a write, with room; the machine ends long before.
const MOST_RESOLVE_STEPS: usize = 64;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Feeds a write's answer to the machine, with a warning when the fence was lost.
fn on_written(machine: &mut Machine, answer: Result<WriteOutcome, NoAnswer<StoreError>>) -> Step {
    let next = machine.on(Input::Written(answer));
    if next == Step::Write(WriteKind::CompleteAttempt) {
        warn!(
            attempt = machine.attempt(),
            "lease lost before complete; completing by attempt"
        );
    }
    next
}

/// Feeds a charge's answer to the machine: a replayed server error is said, and a
/// charge made is a crash point.
fn on_charged(machine: &mut Machine, answer: Result<Receipt, NoAnswer<PaymentError>>) -> Step {
    if let Err(NoAnswer::Failed(PaymentError::ReplayedServerError { status })) = &answer {
        warn!(
            status,
            attempt = machine.attempt(),
            "provider replayed a server error; reconciling"
        );
    }
    if answer.is_ok() {
        crash_points::reached("after-charge");
    }
    machine.on(Input::Charged(answer))
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

/// What each record's calls have reached, so that a probe that reached nothing is
/// handed back.
#[derive(Clone, Copy, Default)]
pub(crate) struct Calls {
    pub(crate) store: bool,
    pub(crate) provider: bool,
}

/// Feeds a call's answer to its breaker: a call that was not started says nothing; an
/// answer that `is_down` says the dependency is down is a failure; anything else, an
/// error that the dependency chose to answer with included, is a success.
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
pub(crate) fn provider_is_down(error: &PaymentError) -> bool {
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

/// Metrics, warnings and crash points on a write's answer; what the answer means is
/// the machine's to decide.
fn observe_write(
    kind: WriteKind,
    answer: &Result<WriteOutcome, NoAnswer<StoreError>>,
    started_at: Time,
) {
    match (kind, answer) {
        (WriteKind::Reserve, Ok(WriteOutcome::Applied(record))) => {
            if record.created.is_some_and(|created| created < started_at) {
                // A retry reserved a record left `Free` or with an expired lease.
                metrics::counter!(TAKEOVER).increment(1);
            }
            crash_points::reached("after-reserve");
        }
        (WriteKind::Complete, Ok(WriteOutcome::Applied(_))) => {
            crash_points::reached("after-complete");
        }
        (WriteKind::Release(_), Ok(WriteOutcome::Refused(_))) => {
            warn!("release refused: the lease is no longer ours");
        }
        (WriteKind::Release(_), Err(NoAnswer::NoTime)) => {
            warn!("release not started: too close to the deadline, where the lease ends");
        }
        (WriteKind::Release(_), Err(NoAnswer::TimedOut)) => {
            warn!("release timed out; the lease ends at its deadline");
        }
        (WriteKind::Release(_), Err(NoAnswer::Failed(e))) => {
            warn!(error = %error_chain(e), "release failed; the lease ends at its deadline");
        }
        _ => {}
    }
}

/// Runs `call` for at most `timeout`, its latency recorded in `metric`.
async fn bounded<T, E>(
    timeout: Duration,
    metric: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, NoAnswer<E>> {
    match tokio::time::timeout(timeout, timed(metric, call)).await {
        Ok(result) => result.map_err(NoAnswer::Failed),
        Err(_elapsed) => Err(NoAnswer::TimedOut),
    }
}

/// Runs `fut`, recording how long it took in the histogram `metric` (ms).
async fn timed<T>(metric: &'static str, fut: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = fut.await;
    metrics::histogram!(metric).record(started.elapsed().as_secs_f64() * 1000.0);
    out
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
