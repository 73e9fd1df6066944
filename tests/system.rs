//! System test: the real binary under a Runtime API emulator, fed by an event source
//! mapping emulator from moto's SQS, through fault proxies, with consumers SIGKILLed at
//! random points; then a DLQ redrive; then the invariants: every valid order charged
//! exactly once, every invalid, conflicting or declined message in the DLQ, no live
//! lease left, nothing lost. Prints one summary line.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use charge_once::idempotency::State;
use charge_once::store::dynamodb::record_from_item;
use harness::event_source::{EsmStats, Queues, drain, poll};
use harness::log_dir;
use harness::producer::{charges_by_order, produce};
use harness::proxy::{Faults, Target, start_proxy};
use harness::rig::batch_of;
use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};
use harness::servers::{Backend, stripe_mock_url};
use rand::Rng;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(4);
const VISIBILITY: Duration = Duration::from_secs(6);

struct Summary {
    line: String,
    double: usize,
    lost: usize,
}

async fn run(orders: usize, consumers: usize, drain_limit: Duration) -> Summary {
    let started = Instant::now();
    let run_id = format!("sys{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let table = Backend::Moto.fresh_table().await;
    let faults = Arc::new(Faults {
        enabled: AtomicBool::new(true),
        rate: 0.04,
        injected: AtomicU64::new(0),
        payment_delay: Duration::from_millis(1500),
        ..Faults::default()
    });
    let endpoints = Arc::new(Endpoints {
        dynamodb: start_proxy(Backend::Moto.url(), Target::DynamoDb, faults.clone()).await,
        payment: start_proxy(stripe_mock_url(), Target::Payment, faults.clone()).await,
        table: table.name.clone(),
    });
    let queues = Arc::new(Queues::create(VISIBILITY, 3).await);
    let stats = Arc::new(EsmStats::default());
    let stop = Arc::new(AtomicBool::new(false));

    let mut runtimes = Vec::new();
    let mut processes = Vec::new();
    for i in 0..consumers {
        let runtime = Arc::new(RuntimeApi::start().await);
        let log = log_dir().join(format!("{run_id}-consumer-{i}.log"));
        processes.push(ConsumerProcess::spawn(
            BIN.as_ref(),
            &runtime,
            &endpoints,
            log,
        ));
        runtimes.push(runtime);
    }
    let processes = Arc::new(Mutex::new(processes));
    let pollers: Vec<_> = runtimes
        .iter()
        .map(|r| {
            tokio::spawn(poll(
                queues.clone(),
                r.clone(),
                stats.clone(),
                stop.clone(),
                FUNCTION_TIMEOUT,
            ))
        })
        .collect();

    let plan = produce(&run_id, orders).await;
    let producer = {
        let (queues, messages) = (queues.clone(), plan.messages.clone());
        tokio::spawn(async move { queues.send_paced(&messages, 300).await })
    };

    // Chaos: SIGKILL a random consumer now and then, and start a fresh one.
    let kills = Arc::new(AtomicU64::new(0));
    let chaos_on = Arc::new(AtomicBool::new(true));
    let chaos = {
        let (processes, endpoints, kills, chaos_on) = (
            processes.clone(),
            endpoints.clone(),
            kills.clone(),
            chaos_on.clone(),
        );
        tokio::spawn(async move {
            while chaos_on.load(Ordering::Relaxed) {
                let wait = rand::rng().random_range(300..1500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if !chaos_on.load(Ordering::Relaxed) {
                    break;
                }
                let mut all = processes.lock().unwrap();
                let victim = rand::rng().random_range(0..all.len());
                all[victim].kill_and_restart(&endpoints);
                kills.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    producer.await.unwrap();
    let drained = drain(&queues, drain_limit).await;
    chaos_on.store(false, Ordering::Relaxed);
    chaos.await.unwrap();
    faults.enabled.store(false, Ordering::Relaxed);
    assert!(drained, "the queue did not drain within {drain_limit:?}");

    // A redrive after the faults are fixed: the DLQ re-sent as new messages.
    let redriven = queues.drain_dlq().await;
    queues.send(&redriven).await;
    assert!(
        drain(&queues, drain_limit).await,
        "the redrive did not drain within {drain_limit:?}"
    );
    let dlq = queues.drain_dlq().await;

    stop.store(true, Ordering::Relaxed);
    for p in pollers {
        p.await.unwrap();
    }
    for p in processes.lock().unwrap().iter_mut() {
        p.stop();
    }

    // Invariants.
    let charges = charges_by_order(&run_id).await;
    let double: Vec<_> = charges.iter().filter(|(_, c)| c.len() > 1).collect();
    let lost: Vec<&String> = plan
        .must_charge
        .keys()
        .filter(|id| !charges.contains_key(*id))
        .collect();
    let dlq_set: std::collections::HashSet<&str> = dlq.iter().map(String::as_str).collect();
    for (id, body) in &plan.must_charge {
        let amount = serde_json::from_str::<serde_json::Value>(body).unwrap()["amount"]
            .as_u64()
            .unwrap();
        if let Some(c) = charges.get(id) {
            assert!(
                c.iter().all(|(a, _)| *a == amount),
                "{id} charged {c:?}, planned {amount}"
            );
        }
        assert!(
            !dlq.iter().any(|m| m.contains(&format!("\"{id}\""))),
            "{id} was charged yet left in the DLQ"
        );
    }
    for id in &plan.declined {
        assert!(!charges.contains_key(id), "declined {id} was charged");
        assert!(
            dlq.iter().any(|m| m.contains(&format!("\"{id}\""))),
            "declined {id} not in the DLQ"
        );
    }
    for body in &plan.invalid {
        assert!(
            dlq_set.contains(body.as_str()),
            "invalid message not in the DLQ: {body}"
        );
    }
    for (id, (a, b)) in &plan.conflicting {
        let c = charges
            .get(id)
            .unwrap_or_else(|| panic!("conflicting {id} never charged"));
        let charged_amount = c[0].0;
        let loser =
            if serde_json::from_str::<serde_json::Value>(a).unwrap()["amount"] == charged_amount {
                b
            } else {
                a
            };
        assert!(
            dlq_set.contains(loser.as_str()),
            "conflicting copy of {id} not in the DLQ"
        );
    }
    let expected_dlq = plan.invalid.len() + plan.declined.len() + plan.conflicting.len();
    assert_eq!(
        dlq.len(),
        expected_dlq,
        "the DLQ holds exactly the bad messages"
    );

    let now = charge_once::clock::Time::from_ms(charge_once::clock::wall_ms());
    let scan = table
        .client
        .scan()
        .table_name(&table.name)
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let live: Vec<_> = scan
        .items()
        .iter()
        .map(|item| record_from_item(item).unwrap())
        .filter(|record| record.state == State::InProgress)
        .filter(|record| record.lease_until.is_none_or(|until| until > now))
        .collect();
    assert!(
        live.is_empty(),
        "records left en-curso with a live lease: {live:?}"
    );

    let charged: usize = charges.values().map(Vec::len).sum();
    let line = format!(
        "orders={orders} messages={} deliveries={} invocations={} failed_batches={} faults={} kills={} charged={charged} double={} lost={} dlq={} redriven={} elapsed={:.1}s",
        plan.messages.len(),
        stats.deliveries.load(Ordering::Relaxed),
        stats.invocations.load(Ordering::Relaxed),
        stats.batch_failures.load(Ordering::Relaxed),
        faults.injected.load(Ordering::Relaxed),
        kills.load(Ordering::Relaxed),
        double.len(),
        lost.len(),
        dlq.len(),
        redriven.len(),
        started.elapsed().as_secs_f64(),
    );
    Summary {
        line,
        double: double.len(),
        lost: lost.len(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hundred_orders_through_faults_kills_and_a_redrive_are_charged_exactly_once() {
    let summary = run(300, 3, Duration::from_secs(120)).await;
    println!("{}", summary.line);
    assert_eq!(summary.double, 0, "{}", summary.line);
    assert_eq!(summary.lost, 0, "{}", summary.line);
}

/// `make soak N=5000`: the same at scale. Not in `make test` (minutes long).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "soak: run with `make soak N=5000`"]
async fn soak() {
    let orders: usize = std::env::var("SOAK_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let summary = run(orders, 4, Duration::from_secs(1800)).await;
    println!("{}", summary.line);
    assert_eq!(summary.double, 0, "{}", summary.line);
    assert_eq!(summary.lost, 0, "{}", summary.line);
}

/// Lambda Managed Instances: one process serves several invocations at once
/// (`AWS_LAMBDA_MAX_CONCURRENCY`), sharing its clients; each invocation's EMF document
/// counts only that invocation's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_process_serving_invocations_at_once_writes_each_its_own_metrics() {
    let run_id = format!("mi{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let table = Backend::Moto.fresh_table().await;
    // Every request takes 100 ms longer, so that the invocations overlap.
    let slow = Arc::new(Faults {
        latency: Duration::from_millis(100),
        ..Faults::default()
    });
    let endpoints = Endpoints {
        dynamodb: start_proxy(Backend::Moto.url(), Target::DynamoDb, slow.clone()).await,
        payment: start_proxy(stripe_mock_url(), Target::Payment, slow.clone()).await,
        table: table.name.clone(),
    };
    let runtime = RuntimeApi::start().await;
    let metrics = log_dir().join(format!("{run_id}-metrics.jsonl"));
    let mut process = ConsumerProcess::launch(
        BIN.as_ref(),
        &runtime,
        &endpoints,
        Launch {
            metrics: Some(metrics.clone()),
            max_concurrency: Some(4),
            ..Launch::logging_to(log_dir().join(format!("{run_id}-consumer.log")))
        },
    );
    let customer = harness::stripe::customer("tok_visa").await;

    // Invocation n carries n fresh orders.
    let invocations: Vec<(String, usize)> = (1..=4)
        .map(|n| (format!("{run_id}-invocation-{n}"), n))
        .collect();
    let replies = invocations.iter().map(|(request_id, n)| {
        let bodies: Vec<String> = (0..*n)
            .map(|k| {
                serde_json::json!({"id": format!("{request_id}-{k}"), "amount": 500 + k,
                    "currency": "EUR", "customer": customer})
                .to_string()
            })
            .collect();
        let event = serde_json::to_string(&batch_of(&bodies)).unwrap();
        runtime.invoke_as(request_id.clone(), event, Duration::from_secs(20))
    });
    let replies = futures::future::join_all(replies).await;
    process.stop();

    for ((request_id, _), reply) in invocations.iter().zip(&replies) {
        match reply {
            Reply::Response(body) => {
                let response: serde_json::Value = serde_json::from_slice(body).unwrap();
                assert_eq!(
                    response["batchItemFailures"],
                    serde_json::json!([]),
                    "{request_id}"
                );
            }
            other => panic!("{request_id}: {other:?}"),
        }
    }
    assert!(
        runtime.most_in_flight() >= 2,
        "the process never served two invocations at once (most in flight: {})",
        runtime.most_in_flight()
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    let documents: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for (request_id, n) in &invocations {
        let own: Vec<&serde_json::Value> = documents
            .iter()
            .filter(|d| d["RequestId"] == request_id.as_str())
            .collect();
        assert_eq!(own.len(), 1, "one document for {request_id}:\n{text}");
        let doc = own[0];
        assert_eq!(doc["charged"], *n, "{request_id}: {doc}");
        assert_eq!(
            doc["payment_latency_ms"].as_array().map(Vec::len),
            Some(*n),
            "{request_id}: {doc}"
        );
    }
    assert_eq!(documents.len(), invocations.len(), "{text}");
}
