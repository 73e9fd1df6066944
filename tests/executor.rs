//! The one executor (`drivers/executor.rs`) on every path: a record, a provider event
//! in the batch, the scheduled settler and `resolve`. On each, an open breaker stops
//! every call before it is made, and a spent budget stops the steps: nothing is
//! written, nothing is asked of the provider, and the record is as it was. The store
//! is moto; the provider is the harness's, with every call it receives counted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::{ForOrder, OrderKey};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use charge_once::contracts::payment::{
    Cancel, ChargePath, ListedPayment, Lookup, PaymentError, Receipt,
};
use charge_once::contracts::queue::Unreported;
use charge_once::domain::clock::Time;
use charge_once::domain::event::PaymentEvent;
use charge_once::domain::message::Incoming;
use charge_once::domain::order::Order;
use charge_once::domain::{Identity, Key, State};
use charge_once::drivers::charge::{Charger, resolve};
use charge_once::drivers::settle::Settler;
use charge_once::policy::outcome::Outcome;
use charge_once::policy::resolve::{Confirmed, ResolveError};
use charge_once::policy::retry::breaker::Dependency;
use harness::eventbridge::stripe_event;
use harness::provider::{Fault, TestProvider};
use harness::rig::{Harness, INVOCATION, Options, batch_of};

/// The harness's provider, every call it receives counted; once given a clock, each
/// lookup takes it past the end of `resolve`'s lease, so the step after it finds its
/// budget spent.
#[derive(Default)]
struct Counted {
    inner: TestProvider,
    calls: AtomicUsize,
    lookups_eat_the_lease: std::sync::OnceLock<harness::clock::TestClock>,
}

impl Counted {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ChargePath for Counted {
    async fn charge(&self, order: &Order, key: &str) -> Result<Receipt, PaymentError> {
        self.count();
        self.inner.charge(order, key).await
    }

    async fn find_payment(&self, order: &Order, since: Time) -> Result<Lookup, PaymentError> {
        self.count();
        let found = self.inner.find_payment(order, since).await;
        if let Some(clock) = self.lookups_eat_the_lease.get() {
            clock.advance(harness::rig::PAYMENT_TIMEOUT * 10);
        }
        found
    }

    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError> {
        self.count();
        self.inner.cancel(payment_id).await
    }

    async fn payment_by_id(&self, id: &str) -> Result<Option<ListedPayment>, PaymentError> {
        self.count();
        self.inner.payment_by_id(id).await
    }
}

/// A harness whose breakers open at the first failure.
async fn harness() -> Harness<Counted> {
    let options = Options {
        breaker_threshold: Some(1),
        ..Options::default()
    };
    Harness::with(Counted::default(), options).await
}

fn order(id: &str) -> Order {
    Order::new(id, 900, "EUR", "cus_1", "pm_card_visa").unwrap()
}

fn body(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","amount":900,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}}"#
    )
}

/// Opens the provider's breaker now, for its first open period (one failure in a row
/// is its threshold here).
fn open_the_providers_breaker(h: &Harness<Counted>) {
    h.settings.breakers.provider.success();
    h.settings.breakers.provider.failure(h.now());
    assert!(!h.settings.breakers.provider.is_closed());
}

/// An order that awaits its customer: the payment they are asked to confirm.
async fn awaiting(h: &Harness<Counted>, id: &str) -> String {
    h.provider
        .inner
        .script(id, &[Fault::AuthenticationRequired]);
    assert!(
        h.invoke_event_with(batch_of(&[body(id)]), INVOCATION)
            .await
            .is_empty()
    );
    let record = h.record(id).await.unwrap();
    assert_eq!(record.state, State::Awaiting);
    record.awaited.unwrap()
}

/// An order whose charge timed out: its record is `libre` with its key kept.
async fn timed_out(h: &Harness<Counted>, id: &str) {
    h.provider.inner.script(id, &[Fault::Timeout]);
    assert_eq!(
        h.invoke_event_with(batch_of(&[body(id)]), INVOCATION)
            .await
            .len(),
        1
    );
    h.redeliver_later();
}

fn charger(h: &Harness<Counted>) -> Charger<'_> {
    Charger {
        store: h.store.as_ref(),
        provider: h.provider.as_ref(),
        settings: &h.settings,
    }
}

fn settler(h: &Harness<Counted>, time: Duration) -> Settler<'_> {
    Settler {
        store: h.store.as_ref(),
        provider: h.provider.as_ref(),
        refunds: None,
        reports: &Unreported,
        settings: &h.settings,
        time,
        limit: 10,
        per_run: usize::MAX,
    }
}

#[tokio::test]
async fn on_the_record_path_an_open_breaker_defers_the_order_before_any_write_or_call() {
    let h = harness().await;
    open_the_providers_breaker(&h);
    let order = order("ex-rec");
    let outcome = charger(&h)
        .process(&order, &Identity::for_order(&order), h.now() + INVOCATION)
        .await;
    assert!(
        matches!(
            outcome,
            Outcome::Deferred {
                dependency: Dependency::Provider,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(h.provider.calls(), 0);
    assert!(h.record("ex-rec").await.is_none(), "nothing written");
}

#[tokio::test]
async fn on_the_record_path_a_spent_budget_starts_no_step() {
    let h = harness().await;
    let order = order("ex-rec-late");
    let outcome = charger(&h)
        .process(&order, &Identity::for_order(&order), h.now())
        .await;
    assert!(matches!(outcome, Outcome::Deadline { .. }), "{outcome:?}");
    assert_eq!(h.provider.calls(), 0);
    assert!(h.record("ex-rec-late").await.is_none(), "nothing written");
}

/// The event of `payment`'s success, as the batch reads it.
fn succeeded(payment: &str, order_id: &str) -> PaymentEvent {
    let body = stripe_event("payment_intent.succeeded", payment, "succeeded", order_id);
    match Incoming::parse(&body) {
        Ok(Incoming::PaymentEvent(event)) => event,
        other => panic!("not a provider event: {other:?}"),
    }
}

#[tokio::test]
async fn on_the_event_path_an_open_breaker_defers_the_event_before_any_fetch() {
    let h = harness().await;
    let payment = awaiting(&h, "ex-evt").await;
    assert!(h.provider.inner.confirm(&payment), "its customer confirms");
    let before = h.provider.calls();
    open_the_providers_breaker(&h);
    let key = Key::for_order_id("ex-evt");
    let outcome = charger(&h)
        .settle_event(
            &succeeded(&payment, "ex-evt"),
            Some(&key),
            &Unreported,
            h.now() + INVOCATION,
        )
        .await;
    assert!(matches!(outcome, Outcome::Deferred { .. }), "{outcome:?}");
    assert_eq!(h.provider.calls(), before, "no fetch");
    assert_eq!(h.record("ex-evt").await.unwrap().state, State::Awaiting);
}

#[tokio::test]
async fn on_the_event_path_a_spent_budget_starts_no_step() {
    let h = harness().await;
    let payment = awaiting(&h, "ex-evt-late").await;
    assert!(h.provider.inner.confirm(&payment), "its customer confirms");
    let before = h.provider.calls();
    let key = Key::for_order_id("ex-evt-late");
    let outcome = charger(&h)
        .settle_event(
            &succeeded(&payment, "ex-evt-late"),
            Some(&key),
            &Unreported,
            h.now(),
        )
        .await;
    assert!(!matches!(outcome, Outcome::Settled { .. }), "{outcome:?}");
    assert_eq!(h.provider.calls(), before, "no fetch");
    assert_eq!(
        h.record("ex-evt-late").await.unwrap().state,
        State::Awaiting
    );
}

#[tokio::test]
async fn in_the_settler_an_open_breaker_stops_every_fetch_and_the_wait_stays_for_the_next_run() {
    let h = harness().await;
    let payment = awaiting(&h, "ex-due").await;
    assert!(h.provider.inner.confirm(&payment), "its customer confirms");
    let before = h.provider.calls();
    open_the_providers_breaker(&h);
    let run = settler(&h, Duration::from_secs(120)).run().await.unwrap();
    assert_eq!((run.read, run.failed, run.completed), (1, 1, 0), "{run:?}");
    assert_eq!(h.provider.calls(), before, "no fetch");
    assert_eq!(h.record("ex-due").await.unwrap().state, State::Awaiting);
    // Once the breaker admits a probe, the next run completes it.
    h.clock.advance(Duration::from_secs(31));
    let run = settler(&h, Duration::from_secs(120)).run().await.unwrap();
    assert_eq!(run.completed, 1, "{run:?}");
    assert_eq!(h.record("ex-due").await.unwrap().state, State::Done);
}

#[tokio::test]
async fn in_the_settler_a_spent_budget_starts_no_record() {
    let h = harness().await;
    let payment = awaiting(&h, "ex-due-late").await;
    assert!(h.provider.inner.confirm(&payment), "its customer confirms");
    let before = h.provider.calls();
    let run = settler(&h, Duration::from_secs(1)).run().await.unwrap();
    assert_eq!((run.read, run.unread), (0, true), "{run:?}");
    assert_eq!(h.provider.calls(), before, "no fetch");
    assert_eq!(
        h.record("ex-due-late").await.unwrap().state,
        State::Awaiting
    );
}

#[tokio::test]
async fn resolve_under_an_open_breaker_stops_before_its_read_with_one_clear_line() {
    let h = harness().await;
    timed_out(&h, "ex-res").await;
    let before = h.provider.calls();
    let record = h.record("ex-res").await.unwrap();
    open_the_providers_breaker(&h);
    let resolved = resolve(
        h.store.as_ref(),
        h.provider.as_ref(),
        &h.settings,
        &order("ex-res"),
        Confirmed::default(),
    )
    .await;
    let Err(
        error @ ResolveError::Deferred {
            dependency: Dependency::Provider,
        },
    ) = resolved
    else {
        panic!("{resolved:?}")
    };
    assert!(
        error.to_string().starts_with("resolve did not start"),
        "{error}"
    );
    assert_eq!(h.provider.calls(), before, "no lookup");
    assert_eq!(h.record("ex-res").await.unwrap(), record, "nothing written");
}

#[tokio::test]
async fn resolve_whose_lease_is_spent_after_its_lookup_starts_no_write() {
    let h = harness().await;
    h.provider.inner.script("ex-res-late", &[Fault::Timeout]);
    assert_eq!(
        h.invoke_event_with(batch_of(&[body("ex-res-late")]), INVOCATION)
            .await
            .len(),
        1
    );
    h.redeliver_later();
    let record = h.record("ex-res-late").await.unwrap();
    h.provider
        .lookups_eat_the_lease
        .set(h.clock.clone())
        .ok()
        .unwrap();
    let resolved = resolve(
        h.store.as_ref(),
        h.provider.as_ref(),
        &h.settings,
        &order("ex-res-late"),
        Confirmed::default(),
    )
    .await;
    let Err(ResolveError::LeaseEnding { step, .. }) = &resolved else {
        panic!("{resolved:?}")
    };
    assert_ne!(
        *step, "lookup",
        "the lookup was made; the next step was not"
    );
    let after = h.record("ex-res-late").await.unwrap();
    // Only resolve's own lease was written before the lookup; its key is the one sent.
    assert_eq!(
        (after.state.clone(), after.attempt),
        (State::InProgress, record.attempt)
    );
    assert_eq!(h.provider.inner.charge_count(), 0, "nothing charged");
}
