//! `make bench`: charge-once against Powertools for AWS Lambda (Python and TypeScript),
//! side by side, doing the same work on the same backend (DESIGN §9, issue "Benchmark
//! against Powertools"). Not a timed test: it is `#[ignore]`d, run only by `make
//! bench`, and asserts nothing about speed; it asserts only that every contender did
//! the work (no unexpected item failures), so a broken peer cannot pass for a fast one.
//!
//! Every contender is a process under its own Runtime API emulator, behind its own
//! counting, latency-adding proxy in front of the same DynamoDB-compatible server, and
//! charges through the same HTTP payment stub:
//! * charge-once: the release binary in Lambda mode, at its default log level;
//! * Powertools Python: `bench/peers/python/handler.py` under `awslambdaric` (.venv);
//! * Powertools TypeScript: `bench/peers/node/handler.mjs` under the small Runtime API
//!   loop `bench/peers/node/runtime.mjs` (bench/node_modules).
//!
//! Rounds are interleaved (each round runs every contender once, in an order rotated
//! per round, after a warm-up round) and ratios are taken inside each round; medians
//! and ranges are reported. CPU is the process's threads' time on CPU from
//! /proc/<pid>/task/*/schedstat (nanoseconds), or utime + stime (10 ms ticks, but
//! counting ended threads too) when a thread ended during the round.
//! Store calls are counted on moto (dynalite ignores ALL_OLD). Writes
//! `bench/results/<date>.{json,md,svg}`.
//!
//! Also measured: what one reservation costs dynalite itself per request shape, which
//! explains the batch latencies on it (see README "Performance").
//!
//! Knobs: `FULL=1` runs the full matrix; `BENCH_ROUNDS` (default 5, at least 5 for
//! figures worth quoting), `BENCH_RECORDS` (records per contender per round, default
//! 100) and `BENCH_CELLS=<slug>,<slug>` (cells of the full matrix, e.g.
//! `fresh-b10-s0-p0`) shorten a development run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use support::Backend;
use support::system::{
    Endpoints, Faults, Reply, RuntimeApi, Target, lambda_environment, log_dir, start_proxy,
};

const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Orders charged once before the rounds, which the duplicate scenarios send again.
const SEEDS: usize = 10;
const COLD_STARTS: usize = 5;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// --- Contenders ---------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Contender {
    ChargeOnce,
    PowertoolsPython,
    PowertoolsTs,
}

const CONTENDERS: [Contender; 3] = [
    Contender::ChargeOnce,
    Contender::PowertoolsPython,
    Contender::PowertoolsTs,
];
const PEERS: [Contender; 2] = [Contender::PowertoolsPython, Contender::PowertoolsTs];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Self::ChargeOnce => "charge-once",
            Self::PowertoolsPython => "powertools-python",
            Self::PowertoolsTs => "powertools-ts",
        }
    }

    /// A short tag for order ids, so contenders never share a key.
    fn tag(self) -> &'static str {
        match self {
            Self::ChargeOnce => "co",
            Self::PowertoolsPython => "py",
            Self::PowertoolsTs => "ts",
        }
    }

    fn command(self) -> Command {
        match self {
            Self::ChargeOnce => Command::new(env!("CARGO_BIN_EXE_charge-once")),
            Self::PowertoolsPython => {
                let python = root().join(".venv/bin/python");
                assert!(
                    has_module(&python, "awslambdaric, aws_lambda_powertools"),
                    "the Powertools Python peer is not installed ({} lacks awslambdaric). \
                     Run `make bench`, which installs requirements-bench.txt into .venv",
                    python.display()
                );
                let mut command = Command::new(python);
                command
                    .args(["-m", "awslambdaric", "handler.handler"])
                    .current_dir(root().join("bench/peers/python"));
                command
            }
            Self::PowertoolsTs => {
                assert!(
                    root()
                        .join("bench/node_modules/@aws-lambda-powertools/idempotency")
                        .exists(),
                    "the Powertools TypeScript peer is not installed (bench/node_modules is \
                     missing). Run `make bench`, which runs `npm ci` in bench/"
                );
                let mut command = Command::new("node");
                command
                    .arg("runtime.mjs")
                    .current_dir(root().join("bench/peers/node"));
                command
            }
        }
    }
}

fn has_module(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success())
}

/// One contender's store: its own table and proxy (latency, call counts).
struct Rig {
    faults: Arc<Faults>,
    store_url: String,
    table: String,
}

impl Rig {
    async fn new(backend: Backend, store_latency: Duration) -> Self {
        let table = backend.fresh_table().await.name;
        let faults = Arc::new(Faults {
            latency: store_latency,
            ..Faults::default()
        });
        let store_url = start_proxy(backend.url(), Target::DynamoDb, faults.clone()).await;
        Self {
            faults,
            store_url,
            table,
        }
    }
}

/// A contender's process and its execution environment.
struct Lane {
    contender: Contender,
    runtime: RuntimeApi,
    child: Child,
    spawned: Instant,
    log: PathBuf,
}

impl Lane {
    fn spawn(contender: Contender, rig: &Rig, payment_url: &str, runtime: RuntimeApi) -> Self {
        let log = log_dir().join(format!("bench-{}.log", contender.name()));
        let output = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap()
        };
        let endpoints = Endpoints {
            dynamodb: rig.store_url.clone(),
            payment: payment_url.to_owned(),
            table: rig.table.clone(),
        };
        let mut command = contender.command();
        lambda_environment(&mut command, &runtime.addr, &endpoints)
            .env("PAYMENT_TIMEOUT_SECONDS", "1") // the peers' spelling
            .stdin(Stdio::null())
            .stdout(output())
            .stderr(output());
        let spawned = Instant::now();
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", contender.name()));
        Self {
            contender,
            runtime,
            child,
            spawned,
            log,
        }
    }

    async fn start(contender: Contender, rig: &Rig, payment_url: &str) -> Self {
        Self::spawn(contender, rig, payment_url, RuntimeApi::start().await)
    }

    /// One invocation: its wall time and the number of batch item failures. A
    /// function error counts every record as failed: Powertools raises
    /// `BatchProcessingError` when all records of a batch failed, by design.
    async fn invoke(&self, event: String) -> (Duration, usize) {
        let records = event.matches("\"messageId\"").count();
        let started = Instant::now();
        let reply = self.runtime.invoke(event, FUNCTION_TIMEOUT).await;
        let elapsed = started.elapsed();
        let failures = match reply {
            Reply::Response(body) => {
                let response: Value = serde_json::from_slice(&body).unwrap();
                response["batchItemFailures"]
                    .as_array()
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: no batchItemFailures in {response}",
                            self.contender.name()
                        )
                    })
                    .len()
            }
            Reply::Error => records,
            Reply::Timeout => panic!(
                "{}: no answer within {FUNCTION_TIMEOUT:?}; see {}",
                self.contender.name(),
                self.log.display()
            ),
        };
        (elapsed, failures)
    }

    /// A CPU reading of the process: per-thread nanoseconds on CPU
    /// (`/proc/<pid>/task/<tid>/schedstat`) and utime + stime in ms (10 ms ticks, but
    /// counting threads that have ended too).
    fn cpu(&self) -> CpuReading {
        let pid = self.child.id();
        let mut threads = BTreeMap::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let entry = entry.unwrap();
            let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
                continue; // the thread ended meanwhile
            };
            let ns: u64 = text.split_whitespace().next().unwrap().parse().unwrap();
            threads.insert(entry.file_name().to_string_lossy().into_owned(), ns);
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        CpuReading {
            threads,
            ticks_ms: ticks as f64 * 1000.0 / clock_ticks_per_second(),
        }
    }

    /// Peak resident set (VmHWM), in MB.
    fn peak_rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: f64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap()
            .parse()
            .unwrap();
        kb / 1024.0
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct CpuReading {
    threads: BTreeMap<String, u64>,
    ticks_ms: f64,
}

impl CpuReading {
    /// CPU ms used since `before`: exact (schedstat) when no thread ended in between,
    /// else from the ticks.
    fn since(&self, before: &CpuReading) -> f64 {
        if before.threads.keys().all(|t| self.threads.contains_key(t)) {
            let ns: u64 = self
                .threads
                .iter()
                .map(|(t, ns)| ns.saturating_sub(before.threads.get(t).copied().unwrap_or(0)))
                .sum();
            ns as f64 / 1e6
        } else {
            self.ticks_ms - before.ticks_ms
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    })
}

// --- The payment stub and the events ------------------------------------------------

/// Marks an order id the payment stub refuses.
const REFUSED: &str = "refuse";

/// A payment stub: charges after `latency`; orders whose id contains [`REFUSED`] get
/// a 500.
async fn payment_stub(latency: Duration) -> String {
    let charge = move |body: String| async move {
        tokio::time::sleep(latency).await;
        if body.contains(REFUSED) {
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

/// An SQS event carrying one order per id (same amount, currency and customer for
/// every order, so a duplicate is a true duplicate).
fn event(ids: &[String]) -> String {
    let records: Vec<Value> = ids
        .iter()
        .map(|id| {
            let body =
                json!({"id": id, "amount": 1000, "currency": "EUR", "customer": "cus_bench"});
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Fresh,
    TenPercentDuplicates,
    InBatchDuplicates,
    TenPercentFailures,
    AllDuplicates,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Fresh => "all fresh",
            Self::TenPercentDuplicates => "10% duplicates",
            Self::InBatchDuplicates => "in-batch duplicates",
            Self::TenPercentFailures => "10% payment failures",
            Self::AllDuplicates => "all duplicates",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::TenPercentDuplicates => "dup10",
            Self::InBatchDuplicates => "inbatch",
            Self::TenPercentFailures => "payerr10",
            Self::AllDuplicates => "alldup",
        }
    }

    /// The order ids of batch `b` of a round. `prefix` is unique per contender and
    /// round; `seed` names the orders charged before the rounds.
    fn ids(self, prefix: &str, seed: &str, b: usize, size: usize) -> Vec<String> {
        (0..size)
            .map(|i| {
                let g = b * size + i;
                match self {
                    Self::Fresh => format!("{prefix}-{g}"),
                    Self::TenPercentDuplicates if g % 10 == 9 => {
                        format!("{seed}-{}", (g / 10) % SEEDS)
                    }
                    Self::TenPercentDuplicates => format!("{prefix}-{g}"),
                    // Pairs: records 2k and 2k+1 carry the same order.
                    Self::InBatchDuplicates => format!("{prefix}-{}", g - i % 2),
                    Self::TenPercentFailures if g % 10 == 9 => format!("{prefix}-{REFUSED}-{g}"),
                    Self::TenPercentFailures => format!("{prefix}-{g}"),
                    Self::AllDuplicates => format!("{seed}-{}", g % SEEDS),
                }
            })
            .collect()
    }

    /// Whether every record must succeed (a failure means a broken contender).
    fn all_succeed(self) -> bool {
        matches!(
            self,
            Self::Fresh | Self::TenPercentDuplicates | Self::AllDuplicates
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Cell {
    scenario: Scenario,
    batch: usize,
    store_ms: u64,
    payment_ms: u64,
}

impl Cell {
    fn slug(&self) -> String {
        format!(
            "{}-b{}-s{}-p{}",
            self.scenario.slug(),
            self.batch,
            self.store_ms,
            self.payment_ms
        )
    }

    fn label(&self) -> String {
        format!(
            "{}, batch {}, store {} ms, payment {} ms",
            self.scenario.name(),
            self.batch,
            self.store_ms,
            self.payment_ms
        )
    }
}

const SCENARIOS: [Scenario; 4] = [
    Scenario::Fresh,
    Scenario::TenPercentDuplicates,
    Scenario::InBatchDuplicates,
    Scenario::TenPercentFailures,
];

fn matrix(full: bool) -> Vec<Cell> {
    if !full {
        return SCENARIOS
            .iter()
            .map(|&scenario| Cell {
                scenario,
                batch: 10,
                store_ms: 5,
                payment_ms: 50,
            })
            .collect();
    }
    let mut cells = Vec::new();
    for scenario in SCENARIOS.into_iter().chain([Scenario::AllDuplicates]) {
        for batch in [10, 1] {
            if batch == 1 && scenario == Scenario::InBatchDuplicates {
                continue; // no batch-mate to duplicate
            }
            for store_ms in [5, 0] {
                for payment_ms in [50, 0] {
                    cells.push(Cell {
                        scenario,
                        batch,
                        store_ms,
                        payment_ms,
                    });
                }
            }
        }
    }
    cells
}

// --- Statistics ---------------------------------------------------------------------

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Nearest-rank percentile.
fn percentile(v: &[f64], p: f64) -> f64 {
    let v = sorted(v);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank - 1]
}

fn median(v: &[f64]) -> f64 {
    let v = sorted(v);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median and range of a series, with the series.
fn spread(v: &[f64]) -> Value {
    let s = sorted(v);
    json!({"median": median(v), "min": s[0], "max": s[s.len() - 1], "rounds": v})
}

fn fmt_spread(v: &[f64], digits: usize) -> String {
    let s = sorted(v);
    format!(
        "{:.digits$} [{:.digits$}–{:.digits$}]",
        median(v),
        s[0],
        s[s.len() - 1]
    )
}

/// One contender's figures in one round of a cell.
#[derive(Clone, Default)]
struct RoundFigures {
    cpu_ms_per_record: f64,
    records_per_s: f64,
    batches_ms: Vec<f64>,
    failures: usize,
}

#[derive(Default)]
struct CellFigures {
    rounds: BTreeMap<Contender, Vec<RoundFigures>>,
    peak_rss_mb: BTreeMap<Contender, f64>,
    /// Store calls by operation over the recorded rounds, and the records they served.
    store_calls: BTreeMap<Contender, (Calls, usize)>,
}

impl CellFigures {
    fn series(&self, c: Contender, f: impl Fn(&RoundFigures) -> f64) -> Vec<f64> {
        self.rounds[&c].iter().map(f).collect()
    }

    fn batches(&self, c: Contender) -> Vec<f64> {
        self.rounds[&c]
            .iter()
            .flat_map(|r| r.batches_ms.iter().copied())
            .collect()
    }

    /// `f(peer) / f(charge-once)` inside each round.
    fn ratios(&self, peer: Contender, f: impl Fn(&RoundFigures) -> f64) -> Vec<f64> {
        self.rounds[&peer]
            .iter()
            .zip(&self.rounds[&Contender::ChargeOnce])
            .map(|(p, c)| f(p) / f(c))
            .collect()
    }
}

fn batch_p50(r: &RoundFigures) -> f64 {
    median(&r.batches_ms)
}

// --- The cells ----------------------------------------------------------------------

async fn run_cell(cell: Cell, rounds: usize, records: usize) -> CellFigures {
    let payment = payment_stub(Duration::from_millis(cell.payment_ms)).await;
    let mut lanes = Vec::new();
    for contender in CONTENDERS {
        let rig = Rig::new(Backend::Dynalite, Duration::from_millis(cell.store_ms)).await;
        lanes.push((Lane::start(contender, &rig, &payment).await, rig));
    }
    let batches = records.div_ceil(cell.batch);
    let slug = cell.slug();
    // The orders the duplicate scenarios send again, charged before any round.
    for (lane, _) in &lanes {
        let seed = format!("{}-{slug}-seed", lane.contender.tag());
        let ids: Vec<String> = (0..SEEDS).map(|k| format!("{seed}-{k}")).collect();
        for chunk in ids.chunks(cell.batch) {
            let (_, failures) = lane.invoke(event(chunk)).await;
            assert_eq!(failures, 0, "{}: seeding failed", lane.contender.name());
        }
    }
    let mut figures = CellFigures::default();
    // Round 0 warms up every contender and is not recorded.
    for round in 0..=rounds {
        for k in 0..lanes.len() {
            let (lane, rig) = &lanes[(k + round) % lanes.len()];
            if round == 1 {
                rig.faults.reset_calls(); // count the recorded rounds only
            }
            let tag = lane.contender.tag();
            let prefix = format!("{tag}-{slug}-r{round}");
            let seed = format!("{tag}-{slug}-seed");
            let cpu_before = lane.cpu();
            let mut r = RoundFigures::default();
            for b in 0..batches {
                let ids = cell.scenario.ids(&prefix, &seed, b, cell.batch);
                let (elapsed, failures) = lane.invoke(event(&ids)).await;
                r.batches_ms.push(elapsed.as_secs_f64() * 1000.0);
                r.failures += failures;
            }
            let n = (batches * cell.batch) as f64;
            r.cpu_ms_per_record = lane.cpu().since(&cpu_before) / n;
            r.records_per_s = n / (r.batches_ms.iter().sum::<f64>() / 1000.0);
            if cell.scenario.all_succeed() {
                assert_eq!(
                    r.failures,
                    0,
                    "{}: {} item failures in {}; see {}",
                    lane.contender.name(),
                    r.failures,
                    cell.label(),
                    lane.log.display()
                );
            }
            if round > 0 {
                figures.rounds.entry(lane.contender).or_default().push(r);
            }
        }
    }
    for (lane, rig) in &lanes {
        figures
            .peak_rss_mb
            .insert(lane.contender, lane.peak_rss_mb());
        figures.store_calls.insert(
            lane.contender,
            (rig.faults.calls(), rounds * batches * cell.batch),
        );
    }
    figures
}

/// Spawn → first `next`, and spawn → the answer to a first batch of 10 fresh orders
/// (queued before the spawn) at 5 ms store and 50 ms payment.
async fn cold_starts() -> BTreeMap<Contender, (Vec<f64>, Vec<f64>, f64)> {
    let payment = payment_stub(Duration::from_millis(50)).await;
    let mut rigs = BTreeMap::new();
    for contender in CONTENDERS {
        rigs.insert(
            contender,
            Rig::new(Backend::Dynalite, Duration::from_millis(5)).await,
        );
    }
    let mut out: BTreeMap<Contender, (Vec<f64>, Vec<f64>, f64)> = BTreeMap::new();
    for i in 0..COLD_STARTS {
        for k in 0..CONTENDERS.len() {
            let contender = CONTENDERS[(k + i) % CONTENDERS.len()];
            let runtime = RuntimeApi::start().await;
            let ids: Vec<String> = (0..10)
                .map(|r| format!("{}-cold-{i}-{r}", contender.tag()))
                .collect();
            let lane = Lane::spawn(contender, &rigs[&contender], &payment, runtime);
            let (_, failures) = lane.invoke(event(&ids)).await;
            let first_response = lane.spawned.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(failures, 0, "{}: cold batch failed", contender.name());
            let first_next = lane
                .runtime
                .first_next()
                .unwrap()
                .duration_since(lane.spawned)
                .as_secs_f64()
                * 1000.0;
            let entry = out.entry(contender).or_default();
            entry.0.push(first_next);
            entry.1.push(first_response);
            entry.2 = entry.2.max(lane.peak_rss_mb());
        }
    }
    out
}

/// What one store call costs dynalite itself, by request shape: 200 sequential calls
/// each, from the same Rust SDK client, no proxy. dynalite is one Node process and
/// parses every expression per request, so a concurrent batch's latency on it is about
/// the sum of its requests' server costs; this explains the batch figures.
async fn dynalite_cost_per_call() -> BTreeMap<&'static str, f64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    use charge_once::idempotency::{IdempotencyStore, ReserveRequest};
    const CALLS: u32 = 200;
    let table = Backend::Dynalite.fresh_table().await;
    let now_ms = 1_764_460_800_000_i64;
    let started = Instant::now();
    for i in 0..CALLS {
        let order =
            charge_once::order::Order::new(&format!("cost-{i}"), 1000, "EUR", "cus_bench").unwrap();
        let (pk, huella) = (order.key(), order.fingerprint());
        let req = ReserveRequest {
            pk: &pk,
            huella: &huella,
            titular: "bench",
            now_ms,
            lease_until_ms: now_ms + 60_000,
            expira_s: now_ms / 1000 + 86_400,
            max_declines: 3,
        };
        table.store.reserve(&req).await.unwrap();
    }
    let reserve = started.elapsed() / CALLS;
    // Powertools' reservation: PutItem with its condition (both peers send this shape).
    let started = Instant::now();
    for i in 0..CALLS {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: &str| AttributeValue::N(v.to_owned());
        table
            .client
            .put_item()
            .table_name(&table.name)
            .item("pk", s(&format!("pt-cost-{i}")))
            .item("status", s("INPROGRESS"))
            .item("expiration", n("1764547200"))
            .item("in_progress_expiration", n("1764460860000"))
            .item("validation", s("0123456789abcdef0123456789abcdef"))
            .condition_expression(
                "attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress AND \
                 attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis)",
            )
            .expression_attribute_names("#id", "pk")
            .expression_attribute_names("#expiry", "expiration")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#in_progress_expiry", "in_progress_expiration")
            .expression_attribute_values(":now", n("1764460800"))
            .expression_attribute_values(":now_in_millis", n("1764460800000"))
            .expression_attribute_values(":inprogress", s("INPROGRESS"))
            .send()
            .await
            .unwrap();
    }
    let put = started.elapsed() / CALLS;
    BTreeMap::from([
        (
            "charge-once reserve (UpdateItem)",
            reserve.as_secs_f64() * 1000.0,
        ),
        ("powertools reserve (PutItem)", put.as_secs_f64() * 1000.0),
    ])
}

type Calls = BTreeMap<String, u64>;

/// Store calls for 10 fresh, 10 duplicate and 10 failed records, on moto.
async fn store_calls() -> BTreeMap<Contender, [Calls; 3]> {
    let payment = payment_stub(Duration::ZERO).await;
    let mut out = BTreeMap::new();
    for contender in CONTENDERS {
        let rig = Rig::new(Backend::Moto, Duration::ZERO).await;
        let lane = Lane::start(contender, &rig, &payment).await;
        let tag = contender.tag();
        let fresh: Vec<String> = (0..10).map(|i| format!("{tag}-calls-{i}")).collect();
        let failing: Vec<String> = (0..10)
            .map(|i| format!("{tag}-calls-{REFUSED}-{i}"))
            .collect();
        let mut counted = Vec::new();
        for (ids, expected_failures) in [(&fresh, 0), (&fresh, 0), (&failing, 10)] {
            rig.faults.reset_calls();
            let (_, failures) = lane.invoke(event(ids)).await;
            assert_eq!(
                failures,
                expected_failures,
                "{}: store calls",
                contender.name()
            );
            counted.push(rig.faults.calls());
        }
        out.insert(contender, counted.try_into().unwrap());
    }
    out
}

fn calls_per_record(calls: &Calls, records: usize) -> BTreeMap<String, f64> {
    calls
        .iter()
        .map(|(op, n)| (op.clone(), *n as f64 / records as f64))
        .collect()
}

fn per_record(calls: &Calls) -> String {
    let total: u64 = calls.values().sum();
    let ops = calls
        .iter()
        .map(|(op, n)| format!("{op} {}", *n as f64 / 10.0))
        .collect::<Vec<_>>()
        .join(" + ");
    format!("**{}** ({ops})", total as f64 / 10.0)
}

// --- Versions -----------------------------------------------------------------------

fn output_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn npm_version(dir: &str, package: &str) -> String {
    let manifest = root().join(dir).join(package).join("package.json");
    std::fs::read_to_string(manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn versions() -> Value {
    let python = root().join(".venv/bin/python");
    let py = |package: &str| {
        output_of(
            python.to_str().unwrap(),
            &[
                "-c",
                &format!("import importlib.metadata as m; print(m.version('{package}'))"),
            ],
        )
    };
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    json!({
        "charge-once": env!("CARGO_PKG_VERSION"),
        "rustc": output_of("rustc", &["-V"]),
        "python": output_of(python.to_str().unwrap(), &["-V"]),
        "aws-lambda-powertools (python)": py("aws-lambda-powertools"),
        "boto3": py("boto3"),
        "awslambdaric": py("awslambdaric"),
        "moto": py("moto"),
        "node": output_of("node", &["-v"]),
        "@aws-lambda-powertools/idempotency": npm_version("bench/node_modules", "@aws-lambda-powertools/idempotency"),
        "@aws-lambda-powertools/batch": npm_version("bench/node_modules", "@aws-lambda-powertools/batch"),
        "@aws-sdk/client-dynamodb": npm_version("bench/node_modules", "@aws-sdk/client-dynamodb"),
        "dynalite": npm_version("node_modules", "dynalite"),
        "kernel": output_of("uname", &["-r"]),
        "cpu": model,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

// --- The run ------------------------------------------------------------------------

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
        })
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with `make bench`"]
async fn bench() {
    let full = std::env::var("FULL").is_ok_and(|v| v == "1");
    let rounds = env_usize("BENCH_ROUNDS", 5);
    let records = env_usize("BENCH_RECORDS", 100);
    assert!(
        rounds >= 1 && records >= 10,
        "BENCH_ROUNDS ≥ 1, BENCH_RECORDS ≥ 10"
    );
    let started = Instant::now();

    let dynalite_cost = dynalite_cost_per_call().await;
    let calls = store_calls().await;
    eprintln!("bench: store calls done ({:.0?})", started.elapsed());
    let cold = cold_starts().await;
    eprintln!("bench: cold starts done ({:.0?})", started.elapsed());
    let mut cells = Vec::new();
    // BENCH_CELLS=<slug>,<slug> picks cells of the full matrix (development).
    let only: Vec<String> = std::env::var("BENCH_CELLS")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let chosen: Vec<Cell> = if only.is_empty() {
        matrix(full)
    } else {
        matrix(true)
            .into_iter()
            .filter(|c| only.contains(&c.slug()))
            .collect()
    };
    assert!(
        !chosen.is_empty(),
        "BENCH_CELLS matches no cell of the full matrix"
    );
    for cell in chosen {
        let figures = run_cell(cell, rounds, records).await;
        eprintln!("bench: {} done ({:.0?})", cell.label(), started.elapsed());
        cells.push((cell, figures));
    }

    let mut command = "make bench".to_owned();
    if full {
        command.push_str(" FULL=1");
    }
    if !only.is_empty() {
        command.push_str(&format!(" BENCH_CELLS={}", only.join(",")));
    }
    if rounds != 5 || records != 100 {
        command.push_str(&format!(" BENCH_ROUNDS={rounds} BENCH_RECORDS={records}"));
    }
    let report = Report {
        command,
        dynalite_cost,
        rounds,
        records,
        calls,
        cold,
        cells,
        elapsed: started.elapsed(),
    };
    let dir = root().join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    let date = today();
    // A full or partial run never overwrites the default run's files of the day.
    let stem = if !only.is_empty() {
        format!("{date}-cells")
    } else if full {
        format!("{date}-full")
    } else {
        date.clone()
    };
    let markdown = report.markdown(&date);
    println!("\n{markdown}");
    std::fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&report.json(&date)).unwrap() + "\n",
    )
    .unwrap();
    std::fs::write(dir.join(format!("{stem}.md")), markdown).unwrap();
    report.chart(&dir.join(format!("{stem}.svg")));
    eprintln!("bench: wrote bench/results/{stem}.{{json,md,svg}}");
}

struct Report {
    /// The command line that produced it.
    command: String,
    dynalite_cost: BTreeMap<&'static str, f64>,
    rounds: usize,
    records: usize,
    calls: BTreeMap<Contender, [Calls; 3]>,
    cold: BTreeMap<Contender, (Vec<f64>, Vec<f64>, f64)>,
    cells: Vec<(Cell, CellFigures)>,
    elapsed: Duration,
}

/// A DESIGN §9 target: what it asks, what was measured, and whether it holds.
struct Verdict {
    target: &'static str,
    goal: String,
    measured: String,
    met: bool,
}

impl Report {
    fn headline(&self) -> Option<&CellFigures> {
        self.cells
            .iter()
            .find(|(c, _)| {
                c.scenario == Scenario::Fresh
                    && c.batch == 10
                    && c.store_ms == 5
                    && c.payment_ms == 50
            })
            .map(|(_, f)| f)
    }

    fn verdicts(&self) -> Vec<Verdict> {
        let co = Contender::ChargeOnce;
        let totals: Vec<f64> = self.calls[&co]
            .iter()
            .map(|c| c.values().sum::<u64>() as f64 / 10.0)
            .collect();
        let init = median(&self.cold[&co].0);
        let rss = self
            .cells
            .iter()
            .map(|(_, f)| f.peak_rss_mb[&co])
            .chain([self.cold[&co].2])
            .fold(0.0, f64::max);
        let mut verdicts = vec![
            Verdict {
                target: "store calls fresh / duplicate / failed (moto)",
                goal: "2 / 1 / 2".into(),
                measured: format!("{} / {} / {}", totals[0], totals[1], totals[2]),
                met: totals == [2.0, 1.0, 2.0],
            },
            Verdict {
                target: "init (spawn → first `next`)",
                goal: "≤ 15 ms".into(),
                measured: format!("{init:.1} ms (median of {COLD_STARTS})"),
                met: init <= 15.0,
            },
            Verdict {
                target: "peak RSS",
                goal: "≤ 20 MB".into(),
                measured: format!("{rss:.1} MB (highest VmHWM of any cell or cold start)"),
                met: rss <= 20.0,
            },
        ];
        // The headline cell; absent when BENCH_CELLS left it out.
        let Some(head) = self.headline() else {
            return verdicts;
        };
        let cpu = |c| median(&head.series(c, |r| r.cpu_ms_per_record));
        let best_peer = PEERS
            .into_iter()
            .min_by(|a, b| cpu(*a).total_cmp(&cpu(*b)))
            .unwrap();
        let cpu_ratio = median(&head.ratios(best_peer, |r| r.cpu_ms_per_record));
        let batch_ratio = median(&head.ratios(Contender::PowertoolsPython, batch_p50));
        verdicts.insert(
            0,
            Verdict {
                target: "handler CPU per fresh record",
                goal: "≥ 5× less than the best peer".into(),
                measured: format!(
                    "{:.3} ms vs {} {:.3} ms: {cpu_ratio:.1}× (median of per-round ratios)",
                    cpu(co),
                    best_peer.name(),
                    cpu(best_peer)
                ),
                met: cpu_ratio >= 5.0,
            },
        );
        verdicts.push(Verdict {
            target: "batch of 10, 5 ms store RTT, 50 ms payment",
            goal: "≥ 5× faster than Powertools Python".into(),
            measured: format!(
                "p50 {:.0} ms vs {:.0} ms: {batch_ratio:.1}× (median of per-round ratios)",
                median(&head.batches(co)),
                median(&head.batches(Contender::PowertoolsPython))
            ),
            met: batch_ratio >= 5.0,
        });
        verdicts
    }

    fn markdown(&self, date: &str) -> String {
        let mut md = vec![
            format!("# `{}`, {date}", self.command),
            String::new(),
            format!(
                "{} rounds after a warm-up, {} records per contender per round, order rotated \
                 per round; ratios are peer ÷ charge-once inside each round, median [range]. \
                 Backend dynalite (store calls: moto), loopback, {} cores shared by everything. \
                 Took {:.0?}.",
                self.rounds,
                self.records,
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(0),
                self.elapsed
            ),
            String::new(),
            "## DESIGN §9 targets".into(),
            String::new(),
            "| target | goal | measured | met |".into(),
            "| --- | --- | --- | --- |".into(),
        ];
        for v in self.verdicts() {
            md.push(format!(
                "| {} | {} | {} | {} |",
                v.target,
                v.goal,
                v.measured,
                if v.met { "yes" } else { "**no**" }
            ));
        }
        md.extend([
            String::new(),
            "## Steady state".into(),
            String::new(),
            "| cell | contender | CPU ms/record | CPU × | batch p50 / p99 ms | p50 × | records/s | peak RSS MB | item failures/round | store calls/record |".into(),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into(),
        ]);
        for (cell, f) in &self.cells {
            for c in CONTENDERS {
                let (cpu_x, p50_x) = if c == Contender::ChargeOnce {
                    ("1".to_owned(), "1".to_owned())
                } else {
                    (
                        fmt_spread(&f.ratios(c, |r| r.cpu_ms_per_record), 1),
                        fmt_spread(&f.ratios(c, batch_p50), 1),
                    )
                };
                let batches = f.batches(c);
                let (calls, served) = &f.store_calls[&c];
                md.push(format!(
                    "| {} | {} | {} | {cpu_x} | {:.0} / {:.0} | {p50_x} | {:.0} | {:.1} | {} | {:.2} |",
                    cell.label(),
                    c.name(),
                    fmt_spread(&f.series(c, |r| r.cpu_ms_per_record), 3),
                    median(&batches),
                    percentile(&batches, 99.0),
                    median(&f.series(c, |r| r.records_per_s)),
                    f.peak_rss_mb[&c],
                    median(&f.series(c, |r| r.failures as f64)),
                    calls.values().sum::<u64>() as f64 / *served as f64,
                ));
            }
        }
        md.extend([
            String::new(),
            format!("## Cold start ({COLD_STARTS} spawns each, rotated; first batch: 10 fresh records, 5 ms store, 50 ms payment)"),
            String::new(),
            "| contender | spawn → first `next` ms | spawn → first response ms | peak RSS MB |".into(),
            "| --- | --- | --- | --- |".into(),
        ]);
        for c in CONTENDERS {
            let (next, first, rss) = &self.cold[&c];
            md.push(format!(
                "| {} | {} | {} | {rss:.1} |",
                c.name(),
                fmt_spread(next, 1),
                fmt_spread(first, 1)
            ));
        }
        md.extend([
            String::new(),
            "## Store calls per record (moto, 10 records each)".into(),
            String::new(),
            "| contender | fresh | duplicate | failed payment |".into(),
            "| --- | --- | --- | --- |".into(),
        ]);
        for c in CONTENDERS {
            let [fresh, dup, failed] = &self.calls[&c];
            md.push(format!(
                "| {} | {} | {} | {} |",
                c.name(),
                per_record(fresh),
                per_record(dup),
                per_record(failed)
            ));
        }
        md.extend([
            String::new(),
            "## What one store call costs dynalite (200 sequential calls, same SDK client, no proxy)".into(),
            String::new(),
            "| request | ms per call |".into(),
            "| --- | --- |".into(),
        ]);
        for (request, ms) in &self.dynalite_cost {
            md.push(format!("| {request} | {ms:.2} |"));
        }
        md.extend([
            String::new(),
            "## Versions".into(),
            String::new(),
            "```json".into(),
            serde_json::to_string_pretty(&versions()).unwrap(),
            "```".into(),
            String::new(),
        ]);
        md.join("\n")
    }

    fn json(&self, date: &str) -> Value {
        let cells: Vec<Value> = self
            .cells
            .iter()
            .map(|(cell, f)| {
                let contenders: serde_json::Map<String, Value> = CONTENDERS
                    .iter()
                    .map(|&c| {
                        let batches = f.batches(c);
                        let mut v = json!({
                            "cpu_ms_per_record": spread(&f.series(c, |r| r.cpu_ms_per_record)),
                            "records_per_s": spread(&f.series(c, |r| r.records_per_s)),
                            "batch_ms_p50": median(&batches),
                            "batch_ms_p99": percentile(&batches, 99.0),
                            "batch_ms": batches,
                            "item_failures_per_round": f.series(c, |r| r.failures as f64),
                            "peak_rss_mb": f.peak_rss_mb[&c],
                            "store_calls_per_record_dynalite": calls_per_record(&f.store_calls[&c].0, f.store_calls[&c].1),
                        });
                        if c != Contender::ChargeOnce {
                            v["ratio_to_charge_once"] = json!({
                                "cpu_ms_per_record": spread(&f.ratios(c, |r| r.cpu_ms_per_record)),
                                "batch_ms_p50": spread(&f.ratios(c, batch_p50)),
                            });
                        }
                        (c.name().to_owned(), v)
                    })
                    .collect();
                json!({
                    "cell": cell.slug(),
                    "scenario": cell.scenario.name(),
                    "batch": cell.batch,
                    "store_rtt_ms": cell.store_ms,
                    "payment_ms": cell.payment_ms,
                    "contenders": contenders,
                })
            })
            .collect();
        let cold: serde_json::Map<String, Value> = self
            .cold
            .iter()
            .map(|(c, (next, first, rss))| {
                (
                    c.name().to_owned(),
                    json!({"spawn_to_first_next_ms": spread(next), "spawn_to_first_response_ms": spread(first), "peak_rss_mb": rss}),
                )
            })
            .collect();
        let calls: serde_json::Map<String, Value> = self
            .calls
            .iter()
            .map(|(c, [fresh, dup, failed])| {
                (
                    c.name().to_owned(),
                    json!({"records": 10, "fresh": fresh, "duplicate": dup, "failed": failed}),
                )
            })
            .collect();
        let targets: Vec<Value> = self
            .verdicts()
            .into_iter()
            .map(|v| json!({"target": v.target, "goal": v.goal, "measured": v.measured, "met": v.met}))
            .collect();
        json!({
            "date": date,
            "command": self.command,
            "rounds": self.rounds,
            "records_per_round": self.records,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "versions": versions(),
            "targets": targets,
            "cold_start": cold,
            "store_calls": calls,
            "dynalite_ms_per_call": self.dynalite_cost,
            "cells": cells,
        })
    }

    /// Three panels of grouped bars, one bar per contender: CPU per record and batch
    /// p50 per cell, and the cold start.
    fn chart(&self, path: &Path) {
        // Cells are named by scenario alone when they differ in nothing else.
        let same_shape = self.cells.iter().all(|(c, _)| {
            let first = self.cells[0].0;
            (c.batch, c.store_ms, c.payment_ms) == (first.batch, first.store_ms, first.payment_ms)
        });
        let cell_names: Vec<String> = self
            .cells
            .iter()
            .map(|(c, _)| {
                if same_shape {
                    c.scenario.name().to_owned()
                } else {
                    c.slug()
                }
            })
            .collect();
        let per_cell = |metric: &dyn Fn(&CellFigures, Contender) -> f64| -> Vec<[f64; 3]> {
            self.cells
                .iter()
                .map(|(_, f)| CONTENDERS.map(|c| metric(f, c)))
                .collect()
        };
        let shape = self
            .cells
            .first()
            .map(|(c, _)| c.label())
            .unwrap_or_default();
        let panels = [
            (
                if same_shape {
                    format!(
                        "handler CPU per record, ms ({})",
                        &shape[shape.find(',').map_or(0, |i| i + 2)..]
                    )
                } else {
                    "handler CPU per record, ms".to_owned()
                },
                cell_names.clone(),
                per_cell(&|f, c| median(&f.series(c, |r| r.cpu_ms_per_record))),
            ),
            (
                "batch latency p50, ms".to_owned(),
                cell_names,
                per_cell(&|f, c| median(&f.batches(c))),
            ),
            (
                "cold start, ms (median of 5)".to_owned(),
                vec![
                    "spawn → first next".to_owned(),
                    "spawn → first response (10 records)".to_owned(),
                ],
                vec![
                    CONTENDERS.map(|c| median(&self.cold[&c].0)),
                    CONTENDERS.map(|c| median(&self.cold[&c].1)),
                ],
            ),
        ];
        draw_bars(path, &panels);
    }
}

/// A chart panel: its title, its groups' names, and one value per contender per group.
type Panel = (String, Vec<String>, Vec<[f64; 3]>);

/// Writes an SVG of stacked panels of grouped bars (one bar per contender per group).
fn draw_bars(path: &Path, panels: &[Panel]) {
    use plotters::prelude::*;
    let colors = [
        RGBColor(200, 80, 30),
        RGBColor(50, 110, 180),
        RGBColor(90, 160, 70),
    ];
    let height = 330 * u32::try_from(panels.len()).unwrap();
    // Wide enough for every group's label (the full matrix has 36 cells).
    let groups = panels.iter().map(|p| p.1.len()).max().unwrap_or(1);
    let width = u32::try_from(groups * 140).unwrap().max(1000);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let areas = root.split_evenly((panels.len(), 1));
    for (area, (title, groups, values)) in areas.iter().zip(panels) {
        let n = groups.len();
        let top = values.iter().flatten().copied().fold(0.0, f64::max) * 1.4;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .unwrap();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 0.01 && i < n {
                    groups[i].clone()
                } else {
                    String::new()
                }
            })
            .draw()
            .unwrap();
        for (k, contender) in CONTENDERS.iter().enumerate() {
            let color = colors[k];
            chart
                .draw_series(values.iter().enumerate().map(|(i, v)| {
                    let x0 = i as f64 + 0.15 + k as f64 * 0.233;
                    Rectangle::new([(x0, 0.0), (x0 + 0.21, v[k])], color.filled())
                }))
                .unwrap()
                .label(contender.name())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .unwrap();
    }
    root.present().unwrap();
}

/// Today's date (UTC) as YYYY-MM-DD.
fn today() -> String {
    humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10].to_owned()
}
