//! The drain: a backlog of orders through several execution environments in Lambda
//! mode (the real binary under the Runtime API emulator, fed by the event source
//! emulator from moto's SQS) against localstripe behind its layer with Stripe's
//! per-endpoint rate limit and customer lock on, a few customers with many orders.
//! Prints one line (rate of charges, its ratio to the limit, the share of creates
//! refused) and asserts what must hold whatever the speed: nothing charged twice,
//! nothing lost, nothing dead-lettered. The speed itself is `make bench`'s to judge.
//! Also the layer's limits themselves, as the drain relies on them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use charge_once::adapters::payment_http::charge_form;
use charge_once::domain::order::Order;
use harness::event_source::{EsmStats, Queues, drain, poll};
use harness::localstripe::{self, Card, Limits, Payer, limit_counters, set_limits};
use harness::log_dir;
use harness::producer::charges_by_order;
use harness::runtime_api::{ConsumerProcess, Launch, RuntimeApi};
use harness::servers::{Backend, localstripe_url};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(10);
const CREATE: &str = "POST /v1/payment_intents";

/// The layer's limits are one per process: the tests that set them take turns.
static LAYER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The provider's own create (`charge_form`) of an order `key` for `payer`, under
/// `key`: its status, error code and limiter.
async fn create(payer: &Payer, key: String) -> (u16, Option<String>, Option<String>) {
    let order = Order::new(&key, 1000, "EUR", &payer.customer, &payer.card).unwrap();
    let response = harness::http_client()
        .post(format!("{}/v1/payment_intents", localstripe_url()))
        .bearer_auth(localstripe::TEST_KEY)
        .header("Idempotency-Key", key.as_str())
        .form(&charge_form(&order, Default::default()))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let reason = response
        .headers()
        .get("Stripe-Rate-Limited-Reason")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: serde_json::Value = response.json().await.unwrap();
    let code = body["error"]["code"].as_str().map(str::to_owned);
    (status, code, reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_refuses_past_its_rate_and_times_out_on_a_locked_customer_and_stores_neither() {
    let _turn = LAYER.lock().await;
    let payers = [
        localstripe::payer(Card::Visa).await,
        localstripe::payer(Card::Visa).await,
        localstripe::payer(Card::Visa).await,
        localstripe::payer(Card::Visa).await,
    ];
    let run = uuid::Uuid::new_v4().simple().to_string();

    // Rate: 3 a second, creates of four customers at once: three pass, one is refused.
    set_limits(Limits {
        per_endpoint_per_s: Some(3.0),
        ..Limits::OFF
    })
    .await;
    let answers = futures::future::join_all(
        payers
            .iter()
            .enumerate()
            .map(|(i, p)| create(p, format!("{run}-rate-{i}"))),
    )
    .await;
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(refused.len(), 1, "{answers:?}");
    assert_eq!(refused[0].1.as_deref(), Some("rate_limit"), "{answers:?}");
    assert_eq!(refused[0].2.as_deref(), Some("endpoint-rate"));
    assert_eq!(limit_counters().await.of(CREATE), (3, 1));
    // Nothing was stored under the refused key: a second later it charges.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let i = answers.iter().position(|a| a.0 == 429).unwrap();
    let again = create(&payers[i], format!("{run}-rate-{i}")).await;
    assert_eq!(again.0, 200, "{again:?}");

    // Lock: one customer's second create while the first holds it.
    set_limits(Limits {
        lock_ms: Some(400),
        lock_wait_ms: Some(50),
        ..Limits::OFF
    })
    .await;
    let (first, second) = tokio::join!(create(&payers[0], format!("{run}-lock-0")), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        create(&payers[0], format!("{run}-lock-1")).await
    });
    assert_eq!(first.0, 200, "{first:?}");
    assert_eq!(
        (second.0, second.1.as_deref(), second.2.as_deref()),
        (429, Some("lock_timeout"), None)
    );
    // Another customer is not held.
    assert_eq!(create(&payers[1], format!("{run}-lock-2")).await.0, 200);
    assert_eq!(limit_counters().await.locks, 1);
    let retried = create(&payers[0], format!("{run}-lock-1")).await;
    assert_eq!(
        retried.0, 200,
        "the refused key was not stored: {retried:?}"
    );
    set_limits(Limits::OFF).await;
}

/// The drain's shape: the layer's limit, the orders, how many of them belong to a few
/// customers with many orders each, and the environments.
const LIMIT_PER_S: f64 = 8.0;
const ORDERS: usize = 200;
const SHARED_CUSTOMERS: usize = 6;
const ORDERS_PER_SHARED_CUSTOMER: usize = 10;
const ENVIRONMENTS: usize = 4;
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// `DRAIN_PAYMENT_RATE_BUDGET=<n>` runs the drain with the fleet budget set to `n`.
fn budget() -> Option<String> {
    std::env::var("DRAIN_PAYMENT_RATE_BUDGET")
        .ok()
        .filter(|b| !b.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_drains_through_the_providers_rate_limit_charged_once_with_nothing_lost() {
    let _turn = LAYER.lock().await;
    set_limits(Limits::OFF).await;
    let run = format!("drain{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let table = Backend::Moto.fresh_table().await;
    let queues = Arc::new(Queues::create(Duration::from_secs(8), 100).await);

    // The backlog: most customers with one order, a few with many.
    let mut bodies: Vec<String> = Vec::new();
    let mut order_ids: Vec<String> = Vec::new();
    let mut payers: Vec<Payer> = Vec::new();
    for _ in 0..SHARED_CUSTOMERS {
        payers.push(localstripe::payer(Card::Visa).await);
    }
    for n in 0..ORDERS {
        let shared = n < SHARED_CUSTOMERS * ORDERS_PER_SHARED_CUSTOMER;
        let payer = if shared {
            payers[n % SHARED_CUSTOMERS].clone()
        } else {
            localstripe::payer(Card::Visa).await
        };
        let id = format!("{run}-{n}");
        bodies.push(
            json!({"id": id, "amount": 100 + n, "currency": "EUR",
                "customer": payer.customer, "payment_method": payer.card})
            .to_string(),
        );
        order_ids.push(id);
    }
    queues.send(&bodies).await;

    set_limits(Limits {
        per_endpoint_per_s: Some(LIMIT_PER_S),
        lock_ms: Some(100),
        lock_wait_ms: Some(50),
    })
    .await;
    let mut env = vec![
        ("RETRY_BASE", "1s".to_owned()),
        ("RETRY_CAP", "4s".to_owned()),
        ("PAYMENT_TIMEOUT", "2s".to_owned()),
        ("DEADLINE_MARGIN", "2500ms".to_owned()),
        ("EVENT_SOURCE_MAX_CONCURRENCY", ENVIRONMENTS.to_string()),
    ];
    if let Some(budget) = budget() {
        env.push(("PAYMENT_RATE_BUDGET", budget));
    }
    let endpoints = queues.endpoints(
        Backend::Moto.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );
    let (stats, stop) = (
        Arc::new(EsmStats::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let mut processes = Vec::new();
    let mut pollers = Vec::new();
    for i in 0..ENVIRONMENTS {
        let runtime = Arc::new(RuntimeApi::start().await);
        let launch = Launch {
            env: env.clone(),
            ..Launch::logging_to(log_dir().join(format!("{run}-consumer-{i}.log")))
        };
        processes.push(ConsumerProcess::launch(
            BIN.as_ref(),
            &runtime,
            &endpoints,
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
    let started = Instant::now();
    let drained = drain(&queues, DRAIN_LIMIT).await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for p in pollers {
        p.await.unwrap();
    }
    for p in &mut processes {
        p.stop();
    }
    let counters = limit_counters().await;
    set_limits(Limits::OFF).await;
    assert!(drained, "the backlog did not drain within {DRAIN_LIMIT:?}");

    let charges = charges_by_order(&run).await;
    let double = charges.values().filter(|c| c.len() > 1).count();
    let lost = order_ids
        .iter()
        .filter(|id| !charges.contains_key(*id))
        .count();
    let dlq = queues.drain_dlq().await.len();
    let charged: usize = charges.values().map(Vec::len).sum();
    // Charges a second from the first to the last (PaymentIntents' `created`, seconds).
    let mut created: Vec<i64> = Vec::new();
    for ids in charges.values() {
        for (_, id) in ids {
            let intent = localstripe::payment_intent(id).await;
            created.push(intent["created"].as_i64().unwrap());
        }
    }
    created.sort_unstable();
    let span = match (created.first(), created.last()) {
        (Some(first), Some(last)) => (last - first).max(1) as f64,
        _ => f64::INFINITY,
    };
    let rate = charged.saturating_sub(1) as f64 / span;
    let (accepted, refused) = counters.of(CREATE);
    let refused_share = refused as f64 / (accepted + refused).max(1) as f64;
    let by_endpoint: BTreeMap<&String, (u64, u64)> = counters
        .accepted
        .keys()
        .chain(counters.refused.keys())
        .map(|e| (e, counters.of(e)))
        .collect();
    println!(
        "drain orders={ORDERS} charged={charged} double={double} lost={lost} dlq={dlq} rate={rate:.2}/s limit={LIMIT_PER_S}/s ratio={:.2} refused_share={refused_share:.3} locks={} budget={} environments={ENVIRONMENTS} invocations={} elapsed={:.1}s",
        rate / LIMIT_PER_S,
        counters.locks,
        budget().unwrap_or_else(|| "none".to_owned()),
        stats.invocations.load(Ordering::Relaxed),
        elapsed.as_secs_f64(),
    );
    eprintln!("layer counters (accepted, refused) by endpoint: {by_endpoint:?}");
    assert_eq!(double, 0, "orders charged twice");
    assert_eq!(lost, 0, "orders never charged");
    assert_eq!(dlq, 0, "orders dead-lettered");
    assert_eq!(charged, ORDERS);
}
