//! The driver of one record: performs each step the state machine (`policy/machine/`)
//! asks for with the real store and provider, and feeds the answer back; and the
//! driver of `resolve`'s machine (`policy/resolve.rs`). It owns what the machines must
//! not touch: the clock, the owner token, log lines and crash points. Every call goes
//! through the one executor (`drivers/executor.rs`): the breakers, the deadline budget,
//! the pace, spans and metrics.
//!
//! A charge that failed transiently is sent again once, under the same key, while the
//! provider's breaker is closed.

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use crate::config::Config;
use crate::contracts::payment::{ChargePath, FailureKind, PaymentError, Receipt};
use crate::contracts::store::{IdempotencyStore, StoreError, WriteOutcome};
pub use crate::domain::clock::Clock;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Identity, Owner};
use crate::drivers::executor::{Closed, Executor, executor};
use crate::drivers::metrics::{CHARGE_RETRIED, TAKEOVER};
use crate::drivers::spans::{self, ProviderCall};
use crate::policy::deadline::{Budget, CallKind, time_left};
use crate::policy::machine::{Input, Machine, NoAnswer, Start, Step, WriteKind};
use crate::policy::outcome::Outcome;
use crate::policy::pacing::Pacer;
use crate::policy::resolve::{
    Confirmed, Resolution, ResolveError, ResolveInput, ResolveStep, Resolver,
};
use crate::policy::retry::Jitter;
use crate::policy::retry::breaker::Breakers;
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
        let executor = executor(self.settings, deadline);
        executor
            .admitted(self.run(order, identity, &executor))
            .await
            .unwrap_or_else(deferred)
    }

    async fn run(&self, order: &Order, identity: &Identity, executor: &Executor<'_>) -> Outcome {
        let now = self.settings.now();
        let (mut machine, mut step) = Machine::new(Start {
            identity: identity.clone(),
            owner: Owner::fresh(),
            now,
            deadline: executor.deadline(),
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
                        executor.store(&span, self.store.write(&write)).await
                    };
                    spans::store_answered(&span, &answer);
                    observe_write(kind, &answer, now);
                    on_written(&mut machine, answer)
                }
                Step::Charge { key } => {
                    let answer = self.charge(order, &key, executor).await;
                    on_charged(&mut machine, answer)
                }
                Step::Lookup => {
                    let since = machine.lookup_since();
                    let answer = executor
                        .provider(ProviderCall::Lookup, false, || {
                            self.provider.find_payment(order, since)
                        })
                        .await;
                    machine.on(Input::Looked(answer))
                }
                Step::Cancel { payment_id } => {
                    let answer = executor
                        .provider(ProviderCall::Cancel, false, || {
                            self.provider.cancel(&payment_id)
                        })
                        .await;
                    machine.on(Input::Cancelled(answer))
                }
            };
        }
    }

    /// The charge under `key`, and its one in-invocation retry when it failed
    /// transiently: under the same key (a replay, so it cannot charge twice), after a
    /// short jittered pause, only while the provider's breaker is closed and the
    /// deadline rule allows it. A rate limit or a lock was already waited for, at the
    /// pace; a timeout is not retried here: a hanging provider would cost its timeout
    /// twice.
    async fn charge(
        &self,
        order: &Order,
        key: &str,
        executor: &Executor<'_>,
    ) -> Result<Receipt, NoAnswer<PaymentError>> {
        let answer = executor
            .provider(ProviderCall::Charge, false, || {
                self.provider.charge(order, key)
            })
            .await;
        // The provider's own advice comes before the status: `Stripe-Should-Retry:
        // false` is never retried here (the next delivery may).
        let transient = matches!(
            &answer,
            Err(NoAnswer::Failed(e @ PaymentError::Retryable {
                kind: FailureKind::Connection | FailureKind::Server(_) | FailureKind::Conflict,
                ..
            })) if !e.advised_not_to_retry()
        );
        let pause = Jitter::random().between(CHARGE_RETRY_PAUSE.0, CHARGE_RETRY_PAUSE.1);
        if !transient || !executor.pause_before_retry(pause).await {
            return answer;
        }
        metrics::counter!(CHARGE_RETRIED).increment(1);
        executor
            .provider(ProviderCall::Charge, true, || {
                self.provider.charge(order, key)
            })
            .await
    }
}

/// A unit of work a breaker did not admit: `Deferred`, with no write and no call.
pub(crate) fn deferred(closed: Closed) -> Outcome {
    Outcome::Deferred {
        dependency: closed.dependency,
        until: closed.until,
    }
}

/// Settles `order`'s record by asking the provider: the driver of [`Resolver`], under
/// the one executor with its lease's end as the deadline.
pub async fn resolve(
    store: &dyn IdempotencyStore,
    provider: &dyn ChargePath,
    settings: &Settings,
    order: &Order,
    confirmed: Confirmed,
) -> Result<Resolution, ResolveError> {
    let now = settings.now();
    let lease_until = settings.budget.resolve_lease(now);
    let resolver = Resolver::new(
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
    let settings = Settings {
        budget: settings.budget.under_lease(),
        ..settings.clone()
    };
    let executor = executor(&settings, lease_until);
    executor
        .admitted(resolve_steps(store, provider, order, resolver, &executor))
        .await
        .unwrap_or_else(|closed| {
            Err(ResolveError::Deferred {
                dependency: closed.dependency,
            })
        })
}

async fn resolve_steps(
    store: &dyn IdempotencyStore,
    provider: &dyn ChargePath,
    order: &Order,
    (mut resolver, mut step): (Resolver, ResolveStep),
    executor: &Executor<'_>,
) -> Result<Resolution, ResolveError> {
    for _ in 0..MOST_RESOLVE_STEPS {
        step = match step {
            ResolveStep::Done(result) => return result,
            ResolveStep::Read => {
                let span = spans::store_operation("get", "GetItem");
                let read = executor.store(&span, store.get(resolver.key())).await;
                let read = answer_of(read, "read", CallKind::Store, executor)?;
                resolver.on(ResolveInput::Read(read))
            }
            ResolveStep::Write(kind) => {
                let write = resolver.write(kind);
                let span = spans::store_operation(write.operation(), "UpdateItem");
                let answer = executor.store(&span, store.write(&write)).await;
                spans::store_answered(&span, &answer);
                let answer = answer_of(answer, "write", CallKind::Store, executor)?;
                resolver.on(ResolveInput::Written(answer))
            }
            ResolveStep::Lookup => {
                let since = resolver.lookup_since();
                let found = executor
                    .provider(ProviderCall::Lookup, false, || {
                        provider.find_payment(order, since)
                    })
                    .await;
                let found = answer_of(found, "lookup", CallKind::Provider, executor)?;
                resolver.on(ResolveInput::Looked(found))
            }
            ResolveStep::Cancel { payment_id } => {
                let cancelled = executor
                    .provider(ProviderCall::Cancel, false, || provider.cancel(&payment_id))
                    .await;
                let cancelled = answer_of(cancelled, "cancel", CallKind::Provider, executor)?;
                resolver.on(ResolveInput::Cancelled(cancelled))
            }
        };
    }
    Err(ResolveError::LeaseEnded { step: "next step" })
}

/// A call's answer as `resolve`'s machine reads it (its own error, or what it
/// answered), or why `resolve` stops: the call was not started (the lease cannot hold
/// it), or was cut short at the lease's end.
fn answer_of<T, E>(
    answer: Result<T, NoAnswer<E>>,
    step: &'static str,
    kind: CallKind,
    executor: &Executor<'_>,
) -> Result<Result<T, E>, ResolveError> {
    match answer {
        Ok(value) => Ok(Ok(value)),
        Err(NoAnswer::Failed(e)) => Ok(Err(e)),
        Err(NoAnswer::TimedOut) => Err(ResolveError::LeaseEnded { step }),
        Err(NoAnswer::NoTime) => {
            let left = time_left(executor.now(), executor.deadline());
            Err(ResolveError::LeaseEnding {
                step,
                left_ms: millis(left),
                needs_ms: millis(executor.safeguards().budget.least(kind)),
            })
        }
    }
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
