//! The handler harness: the real `Consumer` on a fresh moto table, a movable clock, a
//! store wrapper that can fail or hang chosen `complete` calls, and helpers to invoke
//! the handler with `LambdaEvent`s built from `events/`.

use charge_once::domain::OrderKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::dynamodb::DynamoStore;
use charge_once::config::FifoScope;
use charge_once::contracts::payment::ChargePath;
use charge_once::contracts::store::{
    AwaitingCursor, IdempotencyStore, StoreError, Write, WriteOutcome,
};
use charge_once::domain::clock::Clock;
use charge_once::domain::{Key, Record};
use charge_once::drivers::batch::{Consumer, Limits};
use charge_once::drivers::charge::Settings;
use charge_once::policy::deadline::Budget;
use charge_once::policy::retry::Backoff;
use charge_once::policy::retry::breaker::Breakers;
use lambda_runtime::{Context, LambdaEvent};

use charge_once::domain::clock::Time;

use crate::clock::TestClock;
use crate::proxy::{Faults, Target, start_proxy};
use crate::servers::{Backend, Table};

pub const PAYMENT_TIMEOUT: Duration = Duration::from_millis(1500);
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(2);
pub const INVOCATION: Duration = Duration::from_secs(60);
pub const PROVIDER_KEY_TTL: Duration = Duration::from_secs(23 * 3600);
pub const MAX_DECLINES: u32 = 3;
/// The wait for a customer's authentication, as the default (`AUTHENTICATION_WAIT`).
pub const AUTHENTICATION_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The template's backoff defaults.
pub const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(30),
    cap: Duration::from_secs(15 * 60),
};

/// The real store, with injectable faults on `complete`: the server is real; only the
/// answer to chosen calls is replaced by a backend error, or never comes (the process
/// "dies" there).
pub struct FlakyStore {
    inner: Arc<DynamoStore>,
    pub fail_completes: AtomicUsize,
    pub hang_completes: AtomicUsize,
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl IdempotencyStore for FlakyStore {
    async fn write(&self, write: &Write<'_>) -> Result<WriteOutcome, StoreError> {
        if let Write::Complete(req) = write {
            if take(&self.hang_completes) {
                // Bounded: the caller's timeout ends the invocation long before this.
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            if take(&self.fail_completes) {
                let reset = std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected: connection reset",
                );
                return Err(StoreError::backend("complete", req.pk.as_str(), reset));
            }
        }
        self.inner.write(write).await
    }
    async fn get(&self, pk: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(pk).await
    }
    async fn awaiting(
        &self,
        after: Option<&AwaitingCursor>,
        until: Time,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.awaiting(after, until, limit).await
    }
    async fn settle_cursor(&self) -> Result<Option<AwaitingCursor>, StoreError> {
        self.inner.settle_cursor().await
    }
    async fn save_settle_cursor(&self, cursor: Option<&AwaitingCursor>) -> Result<(), StoreError> {
        self.inner.save_settle_cursor(cursor).await
    }
}

pub struct Harness<P> {
    pub table: Table,
    pub store: Arc<FlakyStore>,
    pub provider: Arc<P>,
    /// The movable clock; the consumer reads it unless the harness runs on wall time.
    pub clock: TestClock,
    /// The clock the consumer reads (the test clock, or the wall clock).
    now: Clock,
    /// The consumer's settings (for `resolve` beside it).
    pub settings: Settings,
    pub consumer: Consumer,
}

/// How a harness differs from the default (moto direct, movable clock).
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Every DynamoDB request goes through a proxy that adds this round trip.
    pub store_latency: Option<Duration>,
    /// The consumer reads the wall clock: for tests of real time (deadlines).
    pub wall_clock: bool,
    /// `FIFO_FAILURE_SCOPE` (default: the message group).
    pub fifo_failure_scope: FifoScope,
    /// `BREAKER_THRESHOLD`; by default the breakers never open, so that a test of
    /// faults sees every call it injects.
    pub breaker_threshold: Option<u32>,
    /// `AUTHENTICATION_WAIT` (default [`AUTHENTICATION_WAIT`]).
    pub authentication_wait: Option<Duration>,
}

impl Options {
    fn breakers(&self) -> Breakers {
        Breakers::new(
            self.breaker_threshold.unwrap_or(u32::MAX),
            BACKOFF.base,
            BACKOFF.cap,
        )
    }
}

impl<P: ChargePath + 'static> Harness<P> {
    pub async fn new(provider: P) -> Self {
        Self::with(provider, Options::default()).await
    }

    pub async fn with(provider: P, options: Options) -> Self {
        let table = Backend::Moto.fresh_table().await;
        let consumer_store = match options.store_latency {
            None => table.store.clone(),
            Some(latency) => {
                let faults = Arc::new(Faults {
                    latency,
                    ..Faults::default()
                });
                let url = start_proxy(Backend::Moto.url(), Target::DynamoDb, faults).await;
                let client = Backend::client_at(&url);
                Arc::new(DynamoStore::new(client, table.name.clone()))
            }
        };
        let store = Arc::new(FlakyStore {
            inner: consumer_store,
            fail_completes: AtomicUsize::new(0),
            hang_completes: AtomicUsize::new(0),
        });
        let provider = Arc::new(provider);
        let clock = TestClock::new();
        let now = if options.wall_clock {
            charge_once::domain::clock::system()
        } else {
            clock.clock()
        };
        let settings = Settings {
            retention: Duration::from_secs(400 * 24 * 3600),
            provider_key_ttl: PROVIDER_KEY_TTL,
            budget: Budget::new(DEADLINE_MARGIN, PAYMENT_TIMEOUT),
            max_declines: MAX_DECLINES,
            authentication_wait: options.authentication_wait.unwrap_or(AUTHENTICATION_WAIT),
            clock: now.clone(),
            breakers: Arc::new(options.breakers()),
        };
        let limits = Limits {
            max_concurrency: 10,
            invoke_deadline: INVOCATION,
            fifo_failure_scope: options.fifo_failure_scope,
            backoff: BACKOFF,
        };
        let consumer = Consumer::new(store.clone(), provider.clone(), settings.clone(), limits);
        Self {
            table,
            store,
            provider,
            clock,
            now,
            settings,
            consumer,
        }
    }

    /// The same consumer, reporting ended waits to `reports`.
    pub fn reporting_to(self, reports: Arc<dyn charge_once::contracts::queue::Reports>) -> Self {
        Self {
            consumer: self.consumer.with_reports(reports),
            ..self
        }
    }

    /// Now, on the clock the consumer reads.
    pub fn now(&self) -> Time {
        (self.now)()
    }

    /// Invokes the handler with `event` and a deadline `time_left` from now; returns
    /// the failed message ids.
    pub async fn invoke_event_with(&self, event: SqsEvent, time_left: Duration) -> Vec<String> {
        let mut context = Context::default();
        context.request_id = format!("req-{}", uuid::Uuid::new_v4());
        context.deadline = u64::try_from((self.now() + time_left).as_ms()).unwrap();
        let response = self
            .consumer
            .handle(LambdaEvent::new(event, context))
            .await
            .expect("batch judged");
        response
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect()
    }

    /// Invokes the handler with `events/<name>`.
    pub async fn invoke_with(&self, name: &str, time_left: Duration) -> Vec<String> {
        self.invoke_event_with(event(name), time_left).await
    }

    pub async fn invoke(&self, name: &str) -> Vec<String> {
        self.invoke_with(name, INVOCATION).await
    }

    /// Invokes and kills the invocation after `after`: the process "dies" wherever it
    /// is, and no response is sent.
    pub async fn invoke_and_die(&self, event: SqsEvent, after: Duration) {
        let died = tokio::time::timeout(after, self.invoke_event_with(event, INVOCATION)).await;
        assert!(
            died.is_err(),
            "the invocation finished before it could be killed"
        );
    }

    /// The next delivery comes after the visibility timeout, past this invocation.
    pub fn redeliver_later(&self) {
        self.clock.advance(INVOCATION + Duration::from_secs(1));
    }

    pub async fn record(&self, order_id: &str) -> Option<Record> {
        self.table
            .store
            .get(&Key::for_order_id(order_id))
            .await
            .expect("get")
    }
}

/// `events/<name>`, parsed as Lambda would.
/// Settings for a settler run outside a harness (the scheduled function's kind): on
/// `clock`, completing records for `retention`, each provider call bounded by
/// `call_timeout`; its breakers never open and its pace never waits, so that a test
/// sees every call it makes.
pub fn settler_settings(clock: Clock, retention: Duration, call_timeout: Duration) -> Settings {
    Settings {
        retention,
        provider_key_ttl: PROVIDER_KEY_TTL,
        budget: Budget::new(call_timeout + DEADLINE_MARGIN, call_timeout),
        max_declines: MAX_DECLINES,
        authentication_wait: AUTHENTICATION_WAIT,
        clock,
        breakers: Arc::new(Options::default().breakers()),
    }
}

pub fn event(name: &str) -> SqsEvent {
    let path = crate::root().join("events").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `events/sqs-single.json`'s record once per body, each with a fresh message id.
pub fn batch_of<S: AsRef<str>>(bodies: &[S]) -> SqsEvent {
    let mut batch = event("sqs-single.json");
    let template = batch.records[0].clone();
    batch.records = bodies
        .iter()
        .map(|body| {
            let mut record = template.clone();
            record.body = Some(body.as_ref().to_owned());
            record.message_id = Some(uuid::Uuid::new_v4().to_string());
            record
        })
        .collect();
    batch
}

/// `events/sqs-single.json` carrying `body` instead, with a fresh message id.
pub fn single_event_with_body(body: &str) -> SqsEvent {
    batch_of(&[body])
}

pub fn message_ids(name: &str, positions: &[usize]) -> Vec<String> {
    let event = event(name);
    positions
        .iter()
        .map(|&i| event.records[i].message_id.clone().unwrap())
        .collect()
}
