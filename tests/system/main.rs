//! System test: the real binary under a Runtime API emulator, fed by an event source
//! mapping emulator from moto's SQS, through fault proxies, with consumers SIGKILLed at
//! random points, paying at localstripe. An order whose card asks for authentication is
//! acknowledged and its record awaits the customer (`espera`, naming its
//! PaymentIntent); the test then plays the customer on the shop's page. With Stripe's
//! events on (the layer in front of localstripe puts them on a partner event bus on
//! moto, whose rule delivers them to the orders queue), the consumer completes each
//! confirmed order from its event; with no event at all, the scheduled settler does,
//! and on a clock moved past the wait's end it cancels the payments nobody confirmed,
//! ends those orders (`fallido`) and reports each on the report queue. Then a DLQ
//! redrive, and the invariants: every valid order charged exactly once, each confirmed
//! order completed with the PaymentIntent the customer confirmed, only the invalid,
//! conflicting or declined messages in the DLQ, with their reason, no live lease left,
//! nothing lost. Prints one summary line; the chaos run also refunds some of its
//! orders through the refund function and prints the refunds' line (`refunds.rs`). The
//! outage run takes the provider down for a while and shows the backoff and the
//! breakers at work; the same outage under SQS's defaults shows what they prevent.
//!
//! The run itself and its checks are here; the scenarios, each a test, in
//! `scenarios.rs`; the refunds beside the charges in `refunds.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::OrderKey;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use charge_once::adapters::dynamodb::record_from_item;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::adapters::sqs::SqsReports;
use charge_once::config::Secret;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::{Key, State};
use charge_once::drivers::settle::{SettleRun, Settler};
use harness::clock::TestClock;
use harness::event_source::{DlqMessage, EsmStats, Queues, drain, poll};
use harness::eventbridge::stripe_events_of;
use harness::localstripe::{self, Card};
use harness::log_dir;
use harness::producer::{Plan, charges_by_order, produce_with};
use harness::proxy::{Faults, Target, start_proxy};
use harness::rig::batch_of;
use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};
use harness::servers::{Backend, Table, localstripe_url};
use rand::Rng;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(6);
/// The consumers' `AUTHENTICATION_WAIT` (the default).
const AUTHENTICATION_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest a confirmed order's event takes to complete it.
const EVENT_LIMIT: Duration = Duration::from_secs(60);

/// How the customers asked to authenticate come back, and what tells the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Customers {
    /// Every one confirms; Stripe's events complete the orders.
    ConfirmWithEvents,
    /// No event at all: every other one confirms, the rest never do; the scheduled
    /// settler completes the first and, past the wait's end, expires the rest.
    SettlerOnly,
}

/// One run of the system: how the queue and the consumers are set, and what goes wrong.
struct Scenario {
    orders: usize,
    consumers: usize,
    drain_limit: Duration,
    /// The source queue's own visibility timeout and redrive policy.
    visibility: Duration,
    max_receive_count: u32,
    /// Random faults on both proxies, and consumers SIGKILLed now and then.
    chaos: bool,
    /// The provider down (503s, half after hanging) for this long, right after the
    /// orders are sent.
    outage: Option<Duration>,
    /// Whether the consumers reach SQS: without, every visibility change and dead
    /// letter fails, which is SQS's default behaviour (a fixed visibility, the DLQ
    /// only through the redrive policy).
    queue_calls: bool,
    /// The consumers' own settings.
    env: Vec<(&'static str, String)>,
    customers: Customers,
    /// The share of orders (%) paid with the card that always asks for authentication,
    /// on top of the producers' usual 4 % of the rest.
    authenticating_percent: u32,
    /// Refund requests for some of the orders, to the refund function (`refunds.rs`).
    refunds: bool,
}

struct Summary {
    line: String,
    double: usize,
    lost: usize,
}

/// What the consumers and the world did, for the checks.
struct Run {
    plan: Plan,
    charges: BTreeMap<String, Vec<(u64, String)>>,
    dlq: Vec<DlqMessage>,
    redriven: usize,
    /// Order id → the PaymentIntent its record awaited once the queue drained.
    awaited: BTreeMap<String, String>,
    /// Order id → the PaymentIntent its customer confirmed.
    authenticated: BTreeMap<String, String>,
    /// Confirmed orders completed by their event, before any redrive or settler ran.
    completed_by_event: usize,
    /// Stripe's events put on the bus (those of the customer asked to authenticate).
    events: Option<localstripe::Published>,
    /// The settler's runs and the reports it sent (no events).
    settled: Option<Settled>,
    stats: Arc<EsmStats>,
    faults: Arc<Faults>,
    kills: u64,
    table: Table,
    outage_calls: u64,
    recovered_in: Option<Duration>,
    elapsed: Duration,
    refunds: Option<refunds::RefundRun>,
}

/// The environments of a run: a Runtime API and a consumer process each, and a poller
/// feeding each from the queue.
struct Environments {
    processes: Arc<Mutex<Vec<ConsumerProcess>>>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<EsmStats>,
    stop: Arc<AtomicBool>,
}

impl Environments {
    /// `count` processes with `env`, logging to `<name>-<i>.log`, each fed from `queues`.
    async fn start(
        count: usize,
        env: Vec<(&'static str, String)>,
        name: &str,
        queues: &Arc<Queues>,
        endpoints: &Endpoints,
    ) -> Self {
        let (stats, stop) = (
            Arc::new(EsmStats::default()),
            Arc::new(AtomicBool::new(false)),
        );
        let mut processes = Vec::new();
        let mut pollers = Vec::new();
        for i in 0..count {
            let runtime = Arc::new(RuntimeApi::start().await);
            let launch = Launch {
                env: env.clone(),
                ..Launch::logging_to(log_dir().join(format!("{name}-{i}.log")))
            };
            processes.push(ConsumerProcess::launch(
                BIN.as_ref(),
                &runtime,
                endpoints,
                launch,
            ));
            pollers.push(tokio::spawn(poll(
                queues.clone(),
                runtime,
                stats.clone(),
                stop.clone(),
                FUNCTION_TIMEOUT,
            )));
        }
        Self {
            processes: Arc::new(Mutex::new(processes)),
            pollers,
            stats,
            stop,
        }
    }

    /// SIGKILLs a random consumer now and then and starts a fresh one, while `on`;
    /// counts the kills.
    fn chaos(
        &self,
        endpoints: Arc<Endpoints>,
        on: Arc<AtomicBool>,
        kills: Arc<AtomicU64>,
    ) -> tokio::task::JoinHandle<()> {
        let processes = self.processes.clone();
        tokio::spawn(async move {
            while on.load(Ordering::Relaxed) {
                let wait = rand::rng().random_range(300..1500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if !on.load(Ordering::Relaxed) {
                    break;
                }
                let mut all = processes.lock().unwrap();
                let victim = rand::rng().random_range(0..all.len());
                all[victim].kill_and_restart(&endpoints);
                kills.fetch_add(1, Ordering::Relaxed);
            }
        })
    }

    async fn stop(self) -> Arc<EsmStats> {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.pollers {
            p.await.unwrap();
        }
        for p in self.processes.lock().unwrap().iter_mut() {
            p.stop();
        }
        self.stats
    }
}

/// Ends the outage once it has lasted `outage` since `started`; returns the provider
/// calls made during it and how long after its end every order that must be charged
/// was (`None`: not within `limit`).
async fn end_outage(
    faults: &Faults,
    outage: Duration,
    started: Instant,
    run_id: &str,
    plan: &Plan,
    limit: Duration,
) -> (u64, Option<Duration>) {
    tokio::time::sleep(outage.saturating_sub(started.elapsed())).await;
    faults.outage.store(false, Ordering::Relaxed);
    let calls = faults.outage_calls.load(Ordering::Relaxed);
    let ended = Instant::now();
    while ended.elapsed() < limit {
        let charged = charges_by_order(run_id).await;
        if plan.must_charge.keys().all(|id| charged.contains_key(id)) {
            return (calls, Some(ended.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (calls, None)
}

/// The record of every order that needed authentication, once the queue drained:
/// `espera`, naming the PaymentIntent the customer must confirm, which names the order.
/// Order id → that PaymentIntent.
async fn awaited(table: &Table, plan: &Plan) -> BTreeMap<String, String> {
    let mut awaited = BTreeMap::new();
    for id in plan.authenticating.keys() {
        let record = table
            .store
            .get(&Key::for_order_id(id))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id}: no record"));
        assert_eq!(record.state, State::Awaiting, "{id}: {record:?}");
        assert!(record.wait_until.is_some(), "{id}: {record:?}");
        let payment = record
            .awaited
            .clone()
            .expect("the record names its payment");
        let intent = localstripe::payment_intent(&payment).await;
        assert_eq!(intent["metadata"]["order_id"], id.as_str(), "{intent}");
        assert_eq!(intent["status"], "requires_action", "{intent}");
        awaited.insert(id.clone(), payment);
    }
    awaited
}

/// The customers come back on the shop's page and confirm the PaymentIntent their
/// order awaits (those `confirms` picks). Returns order id → PaymentIntent confirmed.
async fn confirm(
    awaited: &BTreeMap<String, String>,
    confirms: impl Fn(usize) -> bool,
) -> BTreeMap<String, String> {
    let mut confirmed = BTreeMap::new();
    for (n, (id, payment)) in awaited.iter().enumerate() {
        if !confirms(n) {
            continue;
        }
        let done = localstripe::authenticate(payment).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        confirmed.insert(id.clone(), payment.clone());
    }
    confirmed
}

/// How many of the confirmed orders their record shows `hecho` with the confirmed
/// PaymentIntent within `limit` (the consumers still polling: only events reach them).
async fn completed_within(
    table: &Table,
    confirmed: &BTreeMap<String, String>,
    limit: Duration,
) -> usize {
    let started = Instant::now();
    loop {
        let mut done = 0;
        for (id, payment) in confirmed {
            let record = table.store.get(&Key::for_order_id(id)).await.unwrap();
            if record.is_some_and(|r| {
                r.state == State::Done && r.receipt.as_deref() == Some(payment.as_str())
            }) {
                done += 1;
            }
        }
        if done == confirmed.len() || started.elapsed() >= limit {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the scheduled settler did, with no event at all.
struct Settled {
    /// Run now: the confirmed orders completed, the rest still waiting.
    first: SettleRun,
    /// Run on a clock moved past the wait's end: the rest expired.
    after_the_wait: SettleRun,
    /// The report queue's messages, parsed.
    reports: Vec<serde_json::Value>,
}

/// The settler as the scheduled function runs it (`audit_lambda.rs`), on the run's
/// table, localstripe and a report queue on moto: once now, once on a clock moved past
/// the end of the wait.
async fn settle(table: &Table, queues: &Queues) -> Settled {
    let report_queue = queues.create_report_queue().await;
    let provider = HttpProvider::new(
        localstripe_url(),
        &Secret::new(localstripe::TEST_KEY.to_owned()),
        Duration::from_secs(5),
        &harness::tls(),
    )
    .unwrap();
    let reports = SqsReports::new(queues.client.clone(), &report_queue);
    let clock = TestClock::new();
    let settings = harness::rig::settler_settings(
        clock.clock(),
        Duration::from_secs(30 * 24 * 3600),
        Duration::from_secs(10),
    );
    let settler = Settler {
        store: table.store.as_ref(),
        provider: &provider,
        refunds: None,
        reports: &reports,
        settings: &settings,
        time: Duration::from_secs(180),
        limit: 1000,
        per_run: usize::MAX,
    };
    let first = settler.run().await.unwrap();
    clock.advance(AUTHENTICATION_WAIT + Duration::from_secs(3600));
    let after_the_wait = settler.run().await.unwrap();
    let reports = queues.drain_reports(&report_queue).await;
    Settled {
        first,
        after_the_wait,
        reports,
    }
}

/// A redrive after the faults are fixed: the DLQ re-sent as new messages, drained
/// again. No order that awaits its customer is there. Returns what was redriven and
/// what the DLQ holds after.
async fn redrive(
    queues: &Queues,
    plan: &Plan,
    limit: Duration,
) -> (Vec<DlqMessage>, Vec<DlqMessage>) {
    let redriven = queues.drain_dlq().await;
    for m in &redriven {
        let order: serde_json::Value = serde_json::from_str(&m.body).unwrap_or_default();
        let id = order["id"].as_str().unwrap_or_default();
        assert!(
            !plan.authenticating.contains_key(id),
            "an order that awaits its customer is in the DLQ: {m:?}"
        );
    }
    let bodies: Vec<String> = redriven.iter().map(|m| m.body.clone()).collect();
    queues.send(&bodies).await;
    assert!(
        drain(queues, limit).await,
        "the redrive did not drain within {limit:?}"
    );
    (redriven, queues.drain_dlq().await)
}

async fn run(scenario: &Scenario) -> Run {
    let started = Instant::now();
    let run_id = format!("sys{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let table = Backend::Moto.fresh_table().await;
    let faults = Arc::new(Faults {
        enabled: AtomicBool::new(scenario.chaos),
        rate: 0.04,
        injected: AtomicU64::new(0),
        payment_delay: Duration::from_millis(1500),
        outage_hang: Duration::from_secs(3),
        ..Faults::default()
    });
    let queues = Arc::new(Queues::create(scenario.visibility, scenario.max_receive_count).await);
    let dynamodb = start_proxy(Backend::Moto.url(), Target::DynamoDb, faults.clone()).await;
    let payment = start_proxy(localstripe_url(), Target::Payment, faults.clone()).await;
    let proxies = (dynamodb.clone(), payment.clone());
    let endpoints = Arc::new(if scenario.queue_calls {
        queues.endpoints(dynamodb, payment, table.name.clone())
    } else {
        Endpoints::without_queue(dynamodb, payment, table.name.clone())
    });
    let environments = Environments::start(
        scenario.consumers,
        scenario.env.clone(),
        &format!("{run_id}-consumer"),
        &queues,
        &endpoints,
    )
    .await;

    let plan = produce_with(&run_id, scenario.orders, scenario.authenticating_percent).await;
    // The refund function on its own queue, through the same proxies: the early
    // requests go before any order does.
    let refunding = match scenario.refunds {
        true => Some(refunds::Refunding::start(scenario, &run_id, &plan, proxies, &table).await),
        false => None,
    };
    // Stripe's events, on moto's EventBridge, routed to the queue: those of the
    // customer whose card asks for authentication. The events of every other payment
    // (a `succeeded` each) would add as many messages again to a queue that moto
    // serves slower the deeper it is, and show nothing the handler tests do not: a
    // succeeded event of a done order changes nothing.
    let destination = match scenario.customers {
        Customers::ConfirmWithEvents => Some(
            stripe_events_of(
                &queues.arn,
                Some(&run_id),
                Some(&plan.authenticating_customer),
                ("test", "test"),
            )
            .await,
        ),
        Customers::SettlerOnly => None,
    };
    faults
        .outage
        .store(scenario.outage.is_some(), Ordering::Relaxed);
    let outage_started = Instant::now();
    let producer = {
        let (queues, messages) = (queues.clone(), plan.messages.clone());
        tokio::spawn(async move { queues.send_paced(&messages, 300).await })
    };
    let (chaos_on, kills) = (
        Arc::new(AtomicBool::new(scenario.chaos)),
        Arc::new(AtomicU64::new(0)),
    );
    let chaos = environments.chaos(endpoints.clone(), chaos_on.clone(), kills.clone());
    let refund_chaos = refunding
        .as_ref()
        .filter(|_| scenario.chaos)
        .map(|r| r.chaos(chaos_on.clone()));

    producer.await.unwrap();
    let (outage_calls, recovered_in) = match scenario.outage {
        Some(outage) => {
            let limit = scenario.drain_limit;
            end_outage(&faults, outage, outage_started, &run_id, &plan, limit).await
        }
        None => (0, None),
    };
    let drained = drain(&queues, scenario.drain_limit).await;
    chaos_on.store(false, Ordering::Relaxed);
    chaos.await.unwrap();
    if let Some(refund_chaos) = refund_chaos {
        refund_chaos.await.unwrap();
    }
    faults.enabled.store(false, Ordering::Relaxed);
    assert!(
        drained,
        "the queue did not drain within {:?}",
        scenario.drain_limit
    );
    if let Some(refunding) = &refunding {
        refunding.send_late().await;
    }
    // Every order that needed authentication awaits its customer; they come back.
    let awaited = awaited(&table, &plan).await;
    let (authenticated, completed_by_event) = match scenario.customers {
        Customers::ConfirmWithEvents => {
            let confirmed = confirm(&awaited, |_| true).await;
            let completed = completed_within(&table, &confirmed, EVENT_LIMIT).await;
            (confirmed, completed)
        }
        Customers::SettlerOnly => (confirm(&awaited, |n| n % 2 == 0).await, 0),
    };
    let events = match &destination {
        Some(destination) => {
            let published = localstripe::events_settled(destination, Duration::from_secs(10)).await;
            localstripe::disarm_eventbridge(destination).await;
            Some(published)
        }
        None => None,
    };
    let (redriven, dlq) = redrive(&queues, &plan, scenario.drain_limit).await;
    let stats = environments.stop().await;
    let charges = charges_by_order(&run_id).await;
    let refunds = match refunding {
        Some(refunding) => Some(refunding.finish(&charges, scenario.drain_limit).await),
        None => None,
    };
    let settled = match scenario.customers {
        Customers::ConfirmWithEvents => None,
        Customers::SettlerOnly => Some(settle(&table, &queues).await),
    };
    Run {
        charges,
        plan,
        dlq,
        redriven: redriven.len(),
        awaited,
        authenticated,
        completed_by_event,
        events,
        settled,
        stats,
        faults,
        kills: kills.load(Ordering::Relaxed),
        table,
        outage_calls,
        recovered_in,
        elapsed: started.elapsed(),
        refunds,
    }
}

impl Run {
    fn double(&self) -> usize {
        self.charges.values().filter(|c| c.len() > 1).count()
    }

    /// Orders that must be charged (those whose customer confirmed too) and were not.
    fn lost(&self) -> usize {
        self.plan
            .must_charge
            .keys()
            .chain(self.authenticated.keys())
            .filter(|id| !self.charges.contains_key(*id))
            .count()
    }

    fn charged(&self) -> usize {
        self.charges.values().map(Vec::len).sum()
    }

    /// The bodies that must end in the DLQ: invalid, declined, the losing copy of a
    /// conflict.
    fn poison(&self) -> HashSet<&str> {
        let mut poison: HashSet<&str> = self.plan.invalid.iter().map(String::as_str).collect();
        for (id, (a, b)) in &self.plan.conflicting {
            let charged = self.charges.get(id).map(|c| c[0].0);
            let amount_of = |body: &str| {
                serde_json::from_str::<serde_json::Value>(body).unwrap()["amount"].as_u64()
            };
            poison.insert(if amount_of(a) == charged { b } else { a });
        }
        for body in &self.plan.messages {
            let order: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            if order["id"]
                .as_str()
                .is_some_and(|id| self.plan.declined.contains(id))
            {
                poison.insert(body);
            }
        }
        poison
    }

    /// The distinct bodies in the DLQ (a lost acknowledgement leaves a harmless copy).
    fn dlq_bodies(&self) -> HashSet<&str> {
        self.dlq.iter().map(|m| m.body.as_str()).collect()
    }

    /// The orders whose customer never confirmed (ended by the settler).
    fn expired(&self) -> BTreeSet<&String> {
        self.awaited
            .keys()
            .filter(|id| !self.authenticated.contains_key(*id))
            .collect()
    }

    /// Every valid order charged once with its own amount, every declined one never,
    /// every conflict charged once, every order that needed authentication awaited its
    /// customer and was completed with the one PaymentIntent its customer confirmed
    /// (by its event, or by the settler) or, never confirmed, ended with its payment
    /// cancelled and reported once; no order left in the DLQ; no live lease.
    async fn check(&self) {
        for (id, body) in &self.plan.must_charge {
            let amount = serde_json::from_str::<serde_json::Value>(body).unwrap()["amount"]
                .as_u64()
                .unwrap();
            if let Some(c) = self.charges.get(id) {
                assert!(
                    c.iter().all(|(a, _)| *a == amount),
                    "{id} charged {c:?}, planned {amount}"
                );
            }
            assert!(
                !self
                    .dlq
                    .iter()
                    .any(|m| m.body.contains(&format!("\"{id}\""))),
                "{id} must be charged, yet it is in the DLQ"
            );
        }
        for id in &self.plan.declined {
            assert!(!self.charges.contains_key(id), "declined {id} was charged");
        }
        // Every order that needed authentication awaited its customer (no DLQ); those
        // the customer confirmed are completed with that PaymentIntent: one succeeded
        // PaymentIntent, no other.
        let needing: BTreeSet<&String> = self.plan.authenticating.keys().collect();
        let awaited: BTreeSet<&String> = self.awaited.keys().collect();
        assert_eq!(awaited, needing, "orders that awaited their customer");
        for id in &needing {
            assert!(
                !self
                    .dlq
                    .iter()
                    .any(|m| m.body.contains(&format!("\"{id}\""))),
                "{id} awaits its customer, yet it is in the DLQ"
            );
        }
        if self.events.is_some() {
            assert_eq!(
                self.authenticated.len(),
                self.awaited.len(),
                "every customer confirms"
            );
            assert_eq!(
                self.completed_by_event,
                self.authenticated.len(),
                "every confirmed order completed by its event"
            );
        }
        for id in self.expired() {
            assert!(
                !self.charges.contains_key(id),
                "{id} was never confirmed, yet charged"
            );
            let intent = localstripe::payment_intent(&self.awaited[id]).await;
            assert_eq!(intent["status"], "canceled", "{id}: {intent}");
        }
        if let Some(settled) = &self.settled {
            let expired = self.expired();
            assert_eq!(
                settled.first.completed,
                self.authenticated.len(),
                "{:?}",
                settled.first
            );
            assert_eq!(settled.first.waiting, expired.len(), "{:?}", settled.first);
            assert_eq!(
                settled.after_the_wait.ended,
                expired.len(),
                "{:?}",
                settled.after_the_wait
            );
            assert_eq!(
                (settled.first.failed, settled.after_the_wait.failed),
                (0, 0)
            );
            let mut reported: Vec<(&str, &str, &str)> = settled
                .reports
                .iter()
                .map(|r| {
                    (
                        r["order_id"].as_str().unwrap(),
                        r["outcome"].as_str().unwrap(),
                        r["payment_id"].as_str().unwrap(),
                    )
                })
                .collect();
            reported.sort_unstable();
            let expected: Vec<(&str, &str, &str)> = expired
                .iter()
                .map(|id| {
                    (
                        id.as_str(),
                        "authentication_expired",
                        self.awaited[*id].as_str(),
                    )
                })
                .collect();
            assert_eq!(reported, expected, "one report per expired order");
        }
        for (id, payment) in &self.authenticated {
            let paid: Vec<&str> = self
                .charges
                .get(id)
                .map(|c| c.iter().map(|(_, p)| p.as_str()).collect())
                .unwrap_or_default();
            assert_eq!(
                paid,
                [payment.as_str()],
                "{id}: one payment, the confirmed one"
            );
        }
        for id in self.plan.conflicting.keys() {
            assert!(
                self.charges.contains_key(id),
                "conflicting {id} never charged"
            );
        }
        let poison = self.poison();
        let dlq = self.dlq_bodies();
        for body in &poison {
            assert!(dlq.contains(body), "poison message not in the DLQ: {body}");
        }
        for body in &dlq {
            assert!(poison.contains(body), "not poison, yet in the DLQ: {body}");
        }

        let now = charge_once::domain::clock::Time::from_ms(charge_once::domain::clock::wall_ms());
        let scan = self
            .table
            .client
            .scan()
            .table_name(&self.table.name)
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        // Every order's record (the settler's cursor item is the table's too).
        let orders: Vec<_> = scan
            .items()
            .iter()
            .filter(|item| {
                item.get("pk")
                    .and_then(|pk| pk.as_s().ok())
                    .is_some_and(|pk| pk.starts_with(charge_once::domain::ORDER_PREFIX))
            })
            .collect();
        let live: Vec<_> = orders
            .iter()
            .map(|item| record_from_item(item).unwrap())
            .filter(|record| record.state == State::InProgress)
            .filter(|record| record.lease_until.is_none_or(|until| until > now))
            .collect();
        assert!(
            live.is_empty(),
            "records left en-curso with a live lease: {live:?}"
        );
        for (id, payment) in &self.authenticated {
            let key = Key::for_order_id(id);
            let record = orders
                .iter()
                .map(|item| record_from_item(item).unwrap())
                .find(|record| record.pk == key)
                .unwrap_or_else(|| panic!("{id}: no record"));
            assert_eq!(record.state, State::Done, "{id}: {record:?}");
            assert_eq!(record.receipt.as_deref(), Some(payment.as_str()), "{id}");
        }
        for id in self.expired() {
            let record = self.table.store.get(&Key::for_order_id(id)).await.unwrap();
            let record = record.unwrap_or_else(|| panic!("{id}: no record"));
            assert_eq!(record.state, State::Failed, "{id}: {record:?}");
        }
    }

    /// Every DLQ message came from the consumer with its reason, none from the redrive
    /// policy; an invalid one on its first delivery.
    fn check_dead_letters(&self) {
        for m in &self.dlq {
            let outcome = m
                .note_str("outcome")
                .unwrap_or_else(|| panic!("moved by the redrive policy, not the consumer: {m:?}"));
            assert!(m.note_str("reason").is_some_and(|r| !r.is_empty()), "{m:?}");
            assert!(m.note_str("message_id").is_some(), "{m:?}");
            let expected = if self.plan.invalid.contains(&m.body) {
                assert_eq!(m.note.as_ref().unwrap()["receive_count"], 1, "{m:?}");
                "invalid"
            } else if self
                .plan
                .conflicting
                .values()
                .any(|(a, b)| *a == m.body || *b == m.body)
            {
                "conflict"
            } else {
                "decline_limit"
            };
            assert_eq!(outcome, expected, "{m:?}");
        }
    }

    /// The summary's figures of the orders that awaited their customer.
    fn customers(&self) -> String {
        let mut line = format!(
            "authenticated={} awaited={} confirmed={}",
            self.plan.authenticating.len(),
            self.awaited.len(),
            self.authenticated.len(),
        );
        if let Some(events) = &self.events {
            line.push_str(&format!(
                " completed_by_event={} events={} succeeded_events={} events_failed={}",
                self.completed_by_event,
                events.published,
                events.of("payment_intent.succeeded"),
                events.failed,
            ));
        }
        if let Some(settled) = &self.settled {
            line.push_str(&format!(
                " completed_by_settler={} still_waiting={} expired={} reports={}",
                settled.first.completed,
                settled.first.waiting,
                settled.after_the_wait.ended,
                settled.reports.len(),
            ));
        }
        line
    }

    fn summary(&self, orders: usize, outage: Option<Duration>) -> Summary {
        let mut line = String::new();
        if let Some(outage) = outage {
            line.push_str(&format!(
                "outage_s={} orders={orders} charged={} double={} lost={} {} dlq={} poison={} provider_calls_during_outage={} recovered_in_s={} ",
                outage.as_secs(),
                self.charged(),
                self.double(),
                self.lost(),
                self.customers(),
                self.dlq_bodies().len(),
                self.poison().len(),
                self.outage_calls,
                self.recovered_in
                    .map_or("never".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
            ));
        } else {
            line.push_str(&format!(
                "orders={orders} messages={} charged={} double={} lost={} {} dlq={} poison={} ",
                self.plan.messages.len(),
                self.charged(),
                self.double(),
                self.lost(),
                self.customers(),
                self.dlq_bodies().len(),
                self.poison().len(),
            ));
        }
        line.push_str(&format!(
            "deliveries={} invocations={} failed_batches={} faults={} kills={} redriven={} elapsed={:.1}s",
            self.stats.deliveries.load(Ordering::Relaxed),
            self.stats.invocations.load(Ordering::Relaxed),
            self.stats.batch_failures.load(Ordering::Relaxed),
            self.faults.injected.load(Ordering::Relaxed),
            self.kills,
            self.redriven,
            self.elapsed.as_secs_f64(),
        ));
        Summary {
            line,
            double: self.double(),
            lost: self.lost(),
        }
    }
}

/// The retry settings of the system runs: the template's rules, compressed in time.
fn compressed(base: &str, cap: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RETRY_BASE", base.to_owned()),
        ("RETRY_CAP", cap.to_owned()),
        ("BREAKER_THRESHOLD", "5".to_owned()),
    ]
}

async fn chaos(orders: usize, consumers: usize, drain_limit: Duration) -> Summary {
    let scenario = Scenario {
        customers: Customers::ConfirmWithEvents,
        authenticating_percent: 0,
        orders,
        consumers,
        drain_limit,
        visibility: Duration::from_secs(8),
        max_receive_count: 10,
        chaos: true,
        outage: None,
        queue_calls: true,
        env: compressed("1s", "4s"),
        refunds: true,
    };
    let run = run(&scenario).await;
    let summary = run.summary(orders, None);
    println!("{}", summary.line);
    let refunds = run.refunds.as_ref().expect("refunds ran");
    println!("{}", refunds.line());
    run.check().await;
    refunds.check();
    summary
}

/// The outage of the system runs: 30 × `RETRY_BASE`. A queue with SQS's defaults
/// (3 receives, 8 s visibility: 24 s to the DLQ) cannot outlast it.
const OUTAGE: Duration = Duration::from_secs(30);
const OUTAGE_ORDERS: usize = 200;
const OUTAGE_CONSUMERS: usize = 2;

fn outage_scenario(queue_calls: bool) -> Scenario {
    let (max_receive_count, env) = if queue_calls {
        // RETRY_BASE=1s doubling to RETRY_CAP=8s, 20 receives: the shortest path to
        // the DLQ is 1 + 1 + 2 + 17 × 4 = 72 s, beyond the outage.
        (20, compressed("1s", "8s"))
    } else {
        // SQS's defaults: every call to SQS fails, the breaker never opens.
        (3, vec![("BREAKER_THRESHOLD", "1000".to_owned())])
    };
    Scenario {
        customers: Customers::ConfirmWithEvents,
        authenticating_percent: 0,
        orders: OUTAGE_ORDERS,
        consumers: OUTAGE_CONSUMERS,
        drain_limit: Duration::from_secs(150),
        visibility: Duration::from_secs(8),
        max_receive_count,
        chaos: false,
        outage: Some(OUTAGE),
        queue_calls,
        env: [env, vec![("MAX_DECLINES", "1".to_owned())]].concat(),
        refunds: false,
    }
}

/// The provider's breaker lets through, per execution environment, the calls of the
/// records in flight when it opens (`MAX_CONCURRENCY` 10, each at most twice: the
/// in-invocation retry) on top of the `BREAKER_THRESHOLD` failures that opened it,
/// and then one probe per open period: periods double from `RETRY_BASE` (1 s) to
/// `RETRY_CAP` (8 s), so at most 1 + 2 + 4 + 8 × k ≥ OUTAGE, i.e. 7 probes in 30 s.
const CALLS_PER_ENVIRONMENT: u64 = 5 + 10 * 2 + 7;

mod refunds;
mod scenarios;
