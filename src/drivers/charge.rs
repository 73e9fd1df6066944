//! The driver of one record: the library's effect loop (`idempotent_consumer::effect`)
//! with an order's payment as its effect ([`Payment`]), each end read as the record's
//! [`Outcome`]; and the driver of `resolve`'s machine (`policy/resolve.rs`). Every call
//! goes through the one executor (`drivers/executor.rs`): the breakers, the deadline
//! budget, the pace, spans, metrics and crash points.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idempotent_consumer::effect::{self, Effect};
use idempotent_consumer::in_store::Invalid;
use idempotent_consumer::machine::{self as library, Cancel, Found};

use crate::config::Config;
use crate::contracts::payment::{ChargePath, FailureKind, Lookup, PaymentError};
use crate::contracts::store::IdempotencyStore;
pub use crate::domain::clock::Clock;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{ForOrder, Identity, Owner};
use crate::drivers::executor::{Closed, Executor, executor};
use crate::drivers::spans::{self, ProviderCall};
use crate::error_chain;
use crate::policy::deadline::{Budget, CallKind, time_left};
use crate::policy::machine::{NoAnswer, PROCESSING_WAIT, found, outcome_of, receipt};
use crate::policy::outcome::Outcome;
use crate::policy::pacing::Pacer;
use crate::policy::resolve::{
    Confirmed, Resolution, ResolveError, ResolveInput, ResolveStep, Resolver,
};
use crate::policy::retry::breaker::Breakers;

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

    /// How long records are kept and how long an order waits, as the library's effect
    /// loop reads it: an order awaits a payment Stripe processes for the longer of
    /// `AUTHENTICATION_WAIT` and [`PROCESSING_WAIT`].
    pub fn policy(&self) -> effect::Policy {
        effect::Policy {
            retention: self.retention,
            key_ttl: self.provider_key_ttl,
            max_refusals: self.max_declines,
            someone_wait: self.authentication_wait,
            processing_wait: self.authentication_wait.max(PROCESSING_WAIT),
        }
    }
}

/// Runs the state machine for one order against a store and a provider.
pub struct Charger<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub provider: &'a dyn ChargePath,
    pub settings: &'a Settings,
}

impl Charger<'_> {
    /// Processes one valid order: the library's [`effect::apply`] with the order's
    /// payment as its effect ([`Payment`]), through the one executor. `deadline` is the
    /// invocation deadline; the lease ends there and no call runs past it.
    pub async fn process(&self, order: &Order, identity: &Identity, deadline: Time) -> Outcome {
        let executor = executor(self.settings, deadline);
        let payment = Payment {
            provider: self.provider,
        };
        effect::apply(
            &payment,
            self.store,
            &executor,
            &self.settings.policy(),
            order,
            identity,
        )
        .await
        .map_or_else(deferred, outcome_of)
    }
}

/// An order's payment as the library's effect at a provider: charged under the key the
/// machine names, looked up among the customer's payments, its open attempt cancelled.
/// Stripe keeps each key for 24 hours and lists an order's PaymentIntents, so an
/// unknown outcome is looked up (the effect's default).
pub struct Payment<'a> {
    pub provider: &'a dyn ChargePath,
}

#[async_trait]
impl Effect for Payment<'_> {
    type Fact = Order;
    type Failure = PaymentError;

    fn parse(&self, body: &str) -> Result<Order, Invalid> {
        Order::parse(body).map_err(|e| Invalid(error_chain(&e)))
    }

    fn identity(&self, order: &Order) -> Identity {
        Identity::for_order(order)
    }

    async fn perform(&self, order: &Order, key: &str) -> Result<library::Receipt, PaymentError> {
        self.provider.charge(order, key).await.map(receipt)
    }

    async fn look_up(&self, order: &Order, since: Time) -> Result<Found, PaymentError> {
        self.provider.find_payment(order, since).await.map(found)
    }

    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError> {
        self.provider.cancel(payment_id).await
    }

    /// A charge that failed transiently (a dropped connection, a 5xx, a 409 on a key in
    /// use) is sent again once, under the same key; `Stripe-Should-Retry: false` comes
    /// before the status. A rate limit or a lock was already waited for, at the pace; a
    /// timeout is not replayed (a hanging provider would cost its timeout twice).
    fn replay_now(&self, failure: &PaymentError) -> bool {
        replays_now(failure)
    }
}

/// Whether a Stripe request that failed is sent again at once under the same key: a
/// dropped connection, a 5xx or a 409 on a key in use, unless Stripe advised against
/// it (`Stripe-Should-Retry: false`).
pub fn replays_now(failure: &PaymentError) -> bool {
    matches!(
        failure,
        PaymentError::Retryable {
            kind: FailureKind::Connection | FailureKind::Server(_) | FailureKind::Conflict,
            ..
        }
    ) && !failure.advised_not_to_retry()
}

/// A unit of work a breaker did not admit: `Deferred`, with no write and no call.
pub(crate) fn deferred(closed: Closed) -> Outcome {
    Outcome::Deferred {
        dependency: closed.dependency,
        until: closed.until,
    }
}

/// What `resolve` asks the provider about one fact: what its effect did (a lookup), and
/// to cancel an attempt left open.
#[async_trait]
pub trait Asks: Sync {
    /// The fact's effect among the provider's, since `since`.
    async fn look_up(&self, since: Time) -> Result<Lookup, PaymentError>;
    /// Cancels the open attempt `id`.
    async fn cancel(&self, id: &str) -> Result<Cancel, PaymentError>;
}

/// An order's payment, as `resolve` asks about it.
struct OrderAsks<'a> {
    provider: &'a dyn ChargePath,
    order: &'a Order,
}

#[async_trait]
impl Asks for OrderAsks<'_> {
    async fn look_up(&self, since: Time) -> Result<Lookup, PaymentError> {
        self.provider.find_payment(self.order, since).await
    }

    async fn cancel(&self, id: &str) -> Result<Cancel, PaymentError> {
        self.provider.cancel(id).await
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
    let asks = OrderAsks { provider, order };
    resolve_fact(
        store,
        &asks,
        settings,
        Identity::for_order(order),
        confirmed,
    )
    .await
}

/// Settles the record of the fact `identity` names by asking the provider through
/// `asks` (an order's payment, a refund).
pub async fn resolve_fact(
    store: &dyn IdempotencyStore,
    asks: &dyn Asks,
    settings: &Settings,
    identity: Identity,
    confirmed: Confirmed,
) -> Result<Resolution, ResolveError> {
    let now = settings.now();
    let lease_until = settings.budget.resolve_lease(now);
    let resolver = Resolver::of(
        identity,
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
        .admitted(resolve_steps(store, asks, resolver, &executor))
        .await
        .unwrap_or_else(|closed| {
            Err(ResolveError::Deferred {
                dependency: closed.dependency,
            })
        })
}

async fn resolve_steps(
    store: &dyn IdempotencyStore,
    asks: &dyn Asks,
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
                    .provider(ProviderCall::Lookup, false, || asks.look_up(since))
                    .await;
                let found = answer_of(found, "lookup", CallKind::Provider, executor)?;
                resolver.on(ResolveInput::Looked(found))
            }
            ResolveStep::Cancel { payment_id } => {
                let cancelled = executor
                    .provider(ProviderCall::Cancel, false, || asks.cancel(&payment_id))
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
