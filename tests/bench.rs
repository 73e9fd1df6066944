//! `make bench`: charge-once's own figures for DESIGN §9, measured on the release
//! binary in Lambda mode under the Runtime API emulator. Not a timed test: it is
//! `#[ignore]`d and only run by `make bench`, and it asserts nothing about speed.
//!
//! INCOMPLETE (issue "Benchmark against Powertools"): the Powertools peers (Python and
//! TypeScript) are not built yet, so no ratios are reported, only charge-once's
//! absolute figures.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use support::Backend;
use support::system::{
    ConsumerProcess, Endpoints, Faults, Reply, RuntimeApi, Target, log_dir, start_proxy,
};

const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A payment stub: charges after `latency`; orders whose id contains `fail` get a 500.
async fn payment_stub(latency: Duration) -> String {
    let charge = move |body: String| async move {
        tokio::time::sleep(latency).await;
        if body.contains("fail") {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"type": "api_error"}}).to_string(),
            );
        }
        let id = format!("ch_{}", uuid::Uuid::new_v4().simple());
        (
            StatusCode::OK,
            json!({"id": id, "status": "succeeded"}).to_string(),
        )
    };
    let app = Router::new().route("/v1/charges", post(charge)).route(
        "/v1/charges",
        get(|| async {
            json!({"data": [], "has_more": false})
                .to_string()
                .into_response()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn event(prefix: &str, n: usize) -> String {
    let records: Vec<Value> = (0..n)
        .map(|i| {
            let body = json!({"id": format!("{prefix}-{i}"), "amount": 1000 + i, "currency": "EUR", "customer": "cus_bench"});
            json!({
                "messageId": uuid::Uuid::new_v4().to_string(),
                "receiptHandle": "rh",
                "body": body.to_string(),
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1764460800000"},
                "messageAttributes": {},
                "md5OfBody": "x",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders",
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({"Records": records}).to_string()
}

struct Setup {
    runtime: RuntimeApi,
    process: ConsumerProcess,
    store: Arc<Faults>,
    spawned: Instant,
}

async fn setup(backend: Backend, store_latency: Duration, payment_latency: Duration) -> Setup {
    let table = backend.fresh_table().await;
    let store = Arc::new(Faults {
        latency: store_latency,
        ..Faults::default()
    });
    let endpoints = Endpoints {
        dynamodb: start_proxy(backend.url(), Target::DynamoDb, store.clone()).await,
        payment: payment_stub(payment_latency).await,
        table: table.name.clone(),
    };
    let runtime = RuntimeApi::start().await;
    let spawned = Instant::now();
    let process = ConsumerProcess::spawn(&runtime, &endpoints, log_dir().join("bench.log"));
    Setup {
        runtime,
        process,
        store,
        spawned,
    }
}

async fn invoke(s: &Setup, event: String) -> (Duration, usize) {
    let started = Instant::now();
    let reply = s.runtime.invoke(event, FUNCTION_TIMEOUT).await;
    let elapsed = started.elapsed();
    let Reply::Response(body) = reply else {
        panic!("invocation failed: {reply:?}")
    };
    let response: Value = serde_json::from_slice(&body).unwrap();
    (
        elapsed,
        response["batchItemFailures"].as_array().unwrap().len(),
    )
}

/// utime + stime of `pid`, in ms (`/proc/<pid>/stat`, clock ticks of 10 ms).
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 * 10.0
}

fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn per_record(calls: &BTreeMap<String, u64>, records: usize) -> String {
    calls
        .iter()
        .map(|(op, n)| format!("{op} {:.1}", *n as f64 / records as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with `make bench`"]
async fn bench() {
    let mut results = serde_json::Map::new();
    let mut table = vec![
        "| metric | charge-once | goal (DESIGN §9) |".to_owned(),
        "| --- | --- | --- |".to_owned(),
    ];

    // Init: spawn -> first /next, over 5 cold starts.
    let mut inits = Vec::new();
    for _ in 0..5 {
        let mut s = setup(Backend::Dynalite, Duration::ZERO, Duration::ZERO).await;
        invoke(
            &s,
            event(&format!("warm-{}", uuid::Uuid::new_v4().simple()), 1),
        )
        .await;
        inits.push(
            s.runtime
                .first_next()
                .unwrap()
                .duration_since(s.spawned)
                .as_secs_f64()
                * 1000.0,
        );
        s.process.stop();
    }
    let init = median(inits.clone());
    results.insert("init_ms".into(), json!({"median": init, "all": inits}));
    table.push(format!(
        "| spawn → first `next` (median of 5) | {init:.1} ms | ≤ 15 ms |"
    ));

    // CPU per fresh record and peak RSS: dynalite, no added latency, 50 batches of 10.
    let mut s = setup(Backend::Dynalite, Duration::ZERO, Duration::ZERO).await;
    invoke(&s, event("cpu-warmup", 10)).await;
    let pid = s.process.pid();
    let before = cpu_ms(pid);
    let batches = 50;
    for b in 0..batches {
        let (_, failed) = invoke(&s, event(&format!("cpu-{b}"), 10)).await;
        assert_eq!(failed, 0);
    }
    let cpu_per_record = (cpu_ms(pid) - before) / (batches * 10) as f64;
    let rss = peak_rss_mb(pid);
    s.process.stop();
    results.insert("cpu_ms_per_fresh_record".into(), json!(cpu_per_record));
    results.insert("peak_rss_mb".into(), json!(rss));
    table.push(format!("| handler CPU per fresh record (dynalite, {} records) | {cpu_per_record:.3} ms | ≥ 5× below the best peer (peers ~1.8–2.8 ms) |", batches * 10));
    table.push(format!("| peak RSS (VmHWM) | {rss:.1} MB | ≤ 20 MB |"));

    // Store calls per record on moto: fresh, duplicate, failed.
    let mut s = setup(Backend::Moto, Duration::ZERO, Duration::ZERO).await;
    let fresh = event("calls", 10);
    s.store.reset_calls();
    invoke(&s, fresh.clone()).await;
    let fresh_calls = s.store.calls();
    s.store.reset_calls();
    invoke(&s, fresh).await;
    let duplicate_calls = s.store.calls();
    s.store.reset_calls();
    let (_, failed) = invoke(&s, event("calls-fail", 10)).await;
    assert_eq!(failed, 10);
    let failed_calls = s.store.calls();
    s.process.stop();
    results.insert(
        "store_calls_per_record".into(),
        json!({"fresh": fresh_calls, "duplicate": duplicate_calls, "failed": failed_calls, "records": 10}),
    );
    table.push(format!(
        "| store calls per record, fresh / duplicate / failed (moto) | {} / {} / {} | 2 / 1 / 2 |",
        per_record(&fresh_calls, 10),
        per_record(&duplicate_calls, 10),
        per_record(&failed_calls, 10)
    ));

    // A batch of 10 with 5 ms store round trips and a 50 ms payment.
    let mut s = setup(
        Backend::Dynalite,
        Duration::from_millis(5),
        Duration::from_millis(50),
    )
    .await;
    invoke(&s, event("lat-warmup", 10)).await;
    let mut latencies = Vec::new();
    for round in 0..10 {
        let (elapsed, failed) = invoke(&s, event(&format!("lat-{round}"), 10)).await;
        assert_eq!(failed, 0);
        latencies.push(elapsed.as_secs_f64() * 1000.0);
    }
    s.process.stop();
    let batch = median(latencies.clone());
    results.insert(
        "batch10_5ms_store_50ms_payment_ms".into(),
        json!({"median": batch, "all": latencies}),
    );
    table.push(format!(
        "| batch of 10, 5 ms store, 50 ms payment (median of 10) | {batch:.1} ms | ≈ one record's latency (≥ 5× faster than sequential ≈ 10 × 65 ms) |"
    ));

    let text = table.join("\n");
    println!("\n{text}\n\nPowertools peers: NOT MEASURED (not built yet; see README Performance).");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    let date = today();
    std::fs::write(
        dir.join(format!("{date}.json")),
        serde_json::to_string_pretty(&Value::Object(results)).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join(format!("{date}.md")), format!("{text}\n")).unwrap();
}

/// Today's date (UTC) as YYYY-MM-DD.
fn today() -> String {
    humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10].to_owned()
}
