//! The whole bill (docs/performance.md): what a million orders cost on AWS for each
//! contender, every part of it, measured in one run and priced at one dated table of
//! list prices.
//!
//! Each contender charges fresh orders, then the same orders again (duplicates), then
//! orders the payment stub refuses, then orders no retry can fix (an invalid id), at
//! the template's batch size, on dynalite behind
//! the counting proxy, which asks the store for `ReturnConsumedCapacity` on every call
//! and adds the units up (a refused conditional write reports none: it is computed
//! from the largest record by DynamoDB's item-size rules, `harness::capacity`, which
//! `tests/store_contract.rs` shows agreeing with the reported units). SQS goes through
//! a counting proxy too (charge-once's visibility changes and dead letters); the event
//! source's receives and deletes and the producer's send are modelled, not measured.
//! Every byte the process prints (stdout and stderr: log lines and metrics documents)
//! is counted; Lambda's own START and REPORT lines are a constant per invocation.
//! After the fresh orders the table is read back and each record sized as DynamoDB
//! sizes it for storage. Lambda comes from the bill (`bill.rs`).
//!
//! Storage is the steady state: a record is kept for the retention plus the time TTL
//! takes to delete it (`BENCH_TTL_LAG_HOURS`, the pattern card's trap 2), so storage per
//! million orders is `bytes × 10⁶ × (retention + lag) / month × price`, whatever the
//! rate. charge-once's daily audit reads what changed, never the table (DESIGN §11): each
//! order of its window by key (one strongly consistent `GetItem`, by every run whose
//! window holds it: `AUDIT_SINCE` over a day), the awaiting records from the sparse
//! index, and the provider's listings (no AWS money); the index itself costs its writes
//! for the orders that await their customer (2 units each: put when the wait begins,
//! removed when it ends), at an assumed share of orders (`BENCH_AWAITING_SHARE`,
//! default 0.02). None of it grows with the retention.
//!
//! Knobs: `BENCH_WHOLE=0` leaves it out; `BENCH_WHOLE_ORDERS` (default 100) orders per
//! phase; `BENCH_RETENTIONS` (default `1h,1d,7d,21d,30d,90d,400d`) the retention sweep;
//! `BENCH_EQUAL_RETENTION` (default the template's) the retention every contender is
//! compared at; `BENCH_TTL_LAG_HOURS` (default 48); `BENCH_AWAITING_SHARE`; every price
//! by `BENCH_PRICE_*`. `BENCH_REPRICE=<a results .json>` measures nothing: it prices
//! that run's measured figures (the whole bill's and the bill's) again, at this tree's
//! template and model, and rewrites that run's whole-bill section, its `whole_bill`
//! and its `-whole.svg` ([`reprice`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use harness::capacity::{read_units, stored_size, write_units};
use harness::proxy::{Consumed, Faults, Target, start_proxy};
use harness::runtime_api::RuntimeApi;
use harness::servers::Backend;
use serde_json::{Value, json};

use crate::bill::{self, Bill, BillCell};
use crate::rig::{CONTENDERS, Contender, Lane, PEERS, REFUSED, Rig, event, payment_stub};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// An average month, as AWS bills storage and fixed costs.
const MONTH_S: f64 = 730.0 * 3600.0;
/// Powertools' idempotency default (`expires_after_seconds`): one hour.
const POWERTOOLS_RETENTION: Duration = Duration::from_secs(3600);
/// The event source receives and deletes at most 10 messages per request.
const SQS_BATCH: usize = 10;

const WRITES: &[&str] = &[
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "BatchWriteItem",
    "TransactWriteItems",
];

/// Lambda's platform lines per invocation at SystemLogLevel INFO (its default), in
/// the JSON log format, as documented (a request id of 36 characters; the report with
/// X-Ray tracing on). At WARN neither is sent.
const PLATFORM_START: &str = r#"{"time":"2026-12-01T12:00:00.000Z","type":"platform.start","record":{"requestId":"6d68ca91-49c9-448d-89b8-7ca3e6dc66aa","version":"$LATEST"}}"#;
const PLATFORM_REPORT: &str = r#"{"time":"2026-12-01T12:00:00.200Z","type":"platform.report","record":{"requestId":"6d68ca91-49c9-448d-89b8-7ca3e6dc66aa","metrics":{"durationMs":123.45,"billedDurationMs":124,"memorySizeMB":128,"maxMemoryUsedMB":24},"tracing":{"spanId":"1a2b3c4d5e6f7a8b","type":"X-Amzn-Trace-Id","value":"Root=1-6d68ca91-49c9448d89b87ca3e6dc66aa;Parent=1a2b3c4d5e6f7a8b;Sampled=1"},"status":"success"}}"#;

fn platform_bytes_per_invocation() -> f64 {
    (PLATFORM_START.len() + 1 + PLATFORM_REPORT.len() + 1) as f64
}

// --- The template's defaults --------------------------------------------------------

/// What `template.yaml` deploys by default, read from it.
#[derive(Clone, Debug)]
pub struct Template {
    pub batch: usize,
    pub memory_mb: u64,
    pub arm64: bool,
    pub retention: Duration,
    pub table_class: Class,
    pub pitr: bool,
    /// SystemLogLevel below INFO: no START and REPORT lines.
    pub platform_lines: bool,
    pub queue_retention: Duration,
    pub dlq_retention: Duration,
    /// Alarm metrics: what CloudWatch bills alarms by.
    pub alarms: usize,
    pub dashboards: usize,
    pub custom_metrics: Vec<String>,
    pub audit: bool,
    /// The audit's window (`AUDIT_SINCE` of the AuditFunction), read daily.
    pub audit_since: Duration,
}

impl Template {
    pub fn read() -> Self {
        let path = crate::root().join("template.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let t: serde_norway::Value = serde_norway::from_str(&text).unwrap();
        let default = |name: &str| t["Parameters"][name]["Default"].clone();
        let number = |v: serde_norway::Value| -> u64 {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or_else(|| panic!("template.yaml: not a number: {v:?}"))
        };
        let resources = t["Resources"].as_mapping().unwrap();
        let of_type = |kind: &str| resources.values().filter(|r| r["Type"] == kind).count();
        let table = &t["Resources"]["IdempotencyTable"]["Properties"];
        let function = &t["Resources"]["ChargeFunction"]["Properties"];
        let class = match default("TableClass").as_str() {
            Some("STANDARD_INFREQUENT_ACCESS") => Class::InfrequentAccess,
            _ => Class::Standard,
        };
        let seconds = |name: &str| {
            Duration::from_secs(number(
                t["Resources"][name]["Properties"]["MessageRetentionPeriod"].clone(),
            ))
        };
        Self {
            batch: number(default("BatchSize")) as usize,
            memory_mb: number(default("MemorySize")),
            arm64: default("Architecture").as_str() == Some("arm64"),
            retention: Duration::from_secs(number(default("IdempotencyRetentionDays")) * 86_400),
            table_class: class,
            pitr: table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] == true,
            platform_lines: function["LoggingConfig"]["SystemLogLevel"] != "WARN",
            queue_retention: seconds("OrdersQueue"),
            dlq_retention: seconds("OrdersDeadLetterQueue"),
            // CloudWatch bills an alarm per metric it reads: a metric-math alarm
            // (the DLQ's arrivals) counts each of its metrics.
            alarms: resources
                .values()
                .filter(|r| r["Type"] == "AWS::CloudWatch::Alarm")
                .map(|r| match r["Properties"]["Metrics"].as_sequence() {
                    Some(queries) => queries
                        .iter()
                        .filter(|q| !q["MetricStat"].is_null())
                        .count(),
                    None => 1,
                })
                .sum(),
            dashboards: of_type("AWS::CloudWatch::Dashboard"),
            custom_metrics: custom_metrics(&t),
            audit: !t["Resources"]["AuditFunction"].is_null(),
            audit_since: t["Resources"]["AuditFunction"]["Properties"]["Environment"]["Variables"]
                ["AUDIT_SINCE"]
                .as_str()
                .map_or(Duration::from_secs(86_400), |since| {
                    humantime::parse_duration(since)
                        .unwrap_or_else(|e| panic!("template.yaml: AUDIT_SINCE {since:?}: {e}"))
                }),
        }
    }

    /// The longest a message can live before a redelivery: its time in the DLQ (which
    /// keeps the enqueue time, so it covers the queue too) plus one redrive back into
    /// the queue.
    pub fn message_life(&self) -> Duration {
        self.dlq_retention + self.queue_retention
    }
}

/// Every metric name of the function's namespace the dashboard and the alarms read
/// (each one a custom metric, published by the function's metrics documents).
fn custom_metrics(t: &serde_norway::Value) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for resource in t["Resources"].as_mapping().unwrap().values() {
        let props = &resource["Properties"];
        if resource["Type"] == "AWS::CloudWatch::Alarm"
            && props["Namespace"] == "charge-once"
            && let Some(name) = props["MetricName"].as_str()
        {
            names.insert(name.to_owned());
        }
        if resource["Type"] != "AWS::CloudWatch::Dashboard" {
            continue;
        }
        let body = match &props["DashboardBody"] {
            serde_norway::Value::Tagged(sub) => sub.value[0].as_str().unwrap_or(""),
            other => other.as_str().unwrap_or(""),
        };
        let Ok(body) = serde_json::from_str::<Value>(body) else {
            continue;
        };
        for widget in body["widgets"].as_array().into_iter().flatten() {
            let mut namespace = String::new();
            for row in widget["properties"]["metrics"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let first = row[0].as_str().unwrap_or("");
                if first == "..." {
                    continue; // the row above with another statistic
                }
                if first != "." {
                    namespace = first.to_owned();
                }
                if namespace == "${Namespace}"
                    && let Some(name) = row[1].as_str()
                {
                    names.insert(name.to_owned());
                }
            }
        }
    }
    names.into_iter().collect()
}

// --- Prices -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Standard,
    InfrequentAccess,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Self::Standard => "Standard",
            Self::InfrequentAccess => "Standard-IA",
        }
    }
}

/// us-east-1 list prices, dated. Each can be overridden (`BENCH_PRICE_<NAME>`).
#[derive(Clone, Debug)]
pub struct Prices {
    pub date: &'static str,
    pub region: &'static str,
    /// Per million write / read request units, on demand: Standard, Standard-IA.
    pub write_request: [f64; 2],
    pub read_request: [f64; 2],
    /// Per provisioned write / read capacity unit-hour: Standard, Standard-IA.
    pub write_unit_hour: [f64; 2],
    pub read_unit_hour: [f64; 2],
    /// Per GB-month: Standard, Standard-IA.
    pub storage: [f64; 2],
    /// Continuous backups (PITR), per GB-month of table.
    pub pitr: f64,
    /// SQS standard queue, per million requests (each 64 KB chunk a request).
    pub sqs_request: f64,
    /// CloudWatch Logs ingestion (Lambda's logs, first tier), per GB.
    pub logs_ingested: f64,
    pub metric_month: f64,
    pub alarm_month: f64,
    pub dashboard_month: f64,
    pub secret_month: f64,
    pub lambda: bill::Prices,
}

impl Prices {
    pub fn from_env() -> Self {
        let f = |name: &str, default: f64| {
            std::env::var(format!("BENCH_PRICE_{name}"))
                .ok()
                .map(|v| {
                    v.parse()
                        .unwrap_or_else(|_| panic!("BENCH_PRICE_{name}: a number"))
                })
                .unwrap_or(default)
        };
        Self {
            date: "2026-12-01",
            region: "us-east-1",
            write_request: [f("WRITE_REQUEST", 0.625), f("WRITE_REQUEST_IA", 0.78125)],
            read_request: [f("READ_REQUEST", 0.125), f("READ_REQUEST_IA", 0.15625)],
            write_unit_hour: [f("WCU_HOUR", 0.00065), f("WCU_HOUR_IA", 0.00081)],
            read_unit_hour: [f("RCU_HOUR", 0.00013), f("RCU_HOUR_IA", 0.00016)],
            storage: [f("STORAGE", 0.25), f("STORAGE_IA", 0.10)],
            pitr: f("PITR", 0.20),
            sqs_request: f("SQS_REQUEST", 0.40),
            logs_ingested: f("LOGS_GB", 0.50),
            metric_month: f("METRIC_MONTH", 0.30),
            alarm_month: f("ALARM_MONTH", 0.10),
            dashboard_month: f("DASHBOARD_MONTH", 3.00),
            secret_month: f("SECRET_MONTH", 0.40),
            lambda: bill::Prices::from_env(),
        }
    }

    fn class(&self, prices: [f64; 2], class: Class) -> f64 {
        prices[class as usize]
    }
}

// --- The measurement ----------------------------------------------------------------

/// What one phase of orders cost a contender.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    pub orders: usize,
    pub invocations: usize,
    pub failures: usize,
    pub capacity: BTreeMap<String, Consumed>,
    pub sqs_calls: BTreeMap<String, u64>,
    pub log_bytes: u64,
    pub log_lines: u64,
}

impl Phase {
    /// Write and read units per order: reported by the store, and computed (a call the
    /// store reported none for, at the largest record's size; reads as consistent).
    pub fn units_per_order(&self, largest: u64) -> (f64, f64) {
        let (mut writes, mut reads) = (0.0, 0.0);
        for (operation, c) in &self.capacity {
            if WRITES.contains(&operation.as_str()) {
                writes += c.units + c.unreported as f64 * write_units(largest);
            } else {
                reads += c.units + c.unreported as f64 * read_units(largest, true);
            }
        }
        let n = self.orders as f64;
        (writes / n, reads / n)
    }

    /// Calls the store answered without units (refused conditional writes).
    pub fn computed_calls(&self) -> u64 {
        self.capacity.values().map(|c| c.unreported).sum()
    }

    pub fn sqs_per_order(&self) -> f64 {
        self.sqs_calls.values().sum::<u64>() as f64 / self.orders as f64
    }

    pub fn log_bytes_per_order(&self) -> f64 {
        self.log_bytes as f64 / self.orders as f64
    }
}

/// One contender's measurement.
#[derive(Clone, Debug)]
pub struct Measured {
    pub batch: usize,
    pub fresh: Phase,
    pub duplicate: Phase,
    pub failed: Phase,
    /// Orders no retry can fix (an id the rules refuse): charge-once sends each to the
    /// DLQ itself; the peers fail them back to the queue.
    pub invalid: Phase,
    /// Stored bytes (size + 100) of every record left after the fresh orders.
    pub records: Vec<u64>,
    /// One record of the median size: each attribute and its bytes (name + value).
    pub sample: Vec<(String, u64)>,
    /// The smallest record that holds the key, the state, the receipt and the
    /// fingerprint (and the expiry TTL needs), built from a real record's key and
    /// receipt, stored bytes.
    pub smallest: Option<u64>,
}

impl Measured {
    pub fn record_bytes(&self) -> f64 {
        self.records.iter().sum::<u64>() as f64 / self.records.len().max(1) as f64
    }

    fn largest(&self) -> u64 {
        self.records
            .iter()
            .max()
            .map_or(0, |b| b - harness::capacity::STORAGE_OVERHEAD)
    }

    pub fn units(&self) -> (f64, f64) {
        self.fresh.units_per_order(self.largest())
    }
}

/// Every contender: fresh orders, the same again, refused orders, at `batch`.
pub async fn measure(batch: usize, orders: usize) -> BTreeMap<Contender, Measured> {
    let payment = payment_stub(Duration::ZERO).await;
    let mut out = BTreeMap::new();
    for contender in CONTENDERS {
        out.insert(
            contender,
            measure_one(contender, batch, orders, &payment).await,
        );
        eprintln!("bench: whole bill, {} measured", contender.name());
    }
    out
}

async fn measure_one(contender: Contender, batch: usize, orders: usize, payment: &str) -> Measured {
    let mut rig = Rig::new(Backend::Dynalite, Duration::ZERO).await;
    rig.faults.ask_capacity.store(true, Ordering::Relaxed);
    let sqs = Arc::new(Faults::default());
    rig.sqs_url = start_proxy(&rig.sqs_url, Target::Sqs, sqs.clone()).await;
    let log = harness::log_dir().join(format!("bench-whole-{}.log", contender.name()));
    let _ = std::fs::remove_file(&log);
    let mut command = contender.command();
    // What the template's ApplicationLogLevel (INFO) makes Lambda set.
    command.env("AWS_LAMBDA_LOG_LEVEL", "INFO");
    let lane = Lane::spawn_logged(
        contender,
        command,
        &rig,
        payment,
        RuntimeApi::start().await,
        log.clone(),
    );
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tag = contender.tag();
    // A warm-up batch: the cold start's lines and calls are not per order.
    let warm: Vec<String> = (0..batch)
        .map(|i| format!("{tag}-warm-{run}-{i}"))
        .collect();
    let (_, failures) = lane.invoke(event(&warm)).await;
    assert_eq!(
        failures,
        0,
        "{}: warm-up; see {}",
        contender.name(),
        log.display()
    );
    let fresh: Vec<String> = (0..orders).map(|i| format!("{tag}-{run}-{i}")).collect();
    let refused: Vec<String> = (0..orders)
        .map(|i| format!("{tag}-{run}-{REFUSED}-{i}"))
        .collect();
    let fresh_phase = phase(&lane, &rig, &sqs, &log, &fresh, batch).await;
    assert_eq!(
        fresh_phase.failures,
        0,
        "{}: fresh orders failed; see {}",
        contender.name(),
        log.display()
    );
    let items = scan(&rig.table).await;
    let duplicate = phase(&lane, &rig, &sqs, &log, &fresh, batch).await;
    assert_eq!(
        duplicate.failures,
        0,
        "{}: duplicates failed; see {}",
        contender.name(),
        log.display()
    );
    let failed = phase(&lane, &rig, &sqs, &log, &refused, batch).await;
    assert_eq!(
        failed.failures,
        orders,
        "{}: refused orders did not fail",
        contender.name()
    );
    // An id with a space breaks the rules every contender applies.
    let invalid: Vec<String> = (0..orders.min(20))
        .map(|i| format!("{tag} {run} invalid {i}"))
        .collect();
    let invalid = phase(&lane, &rig, &sqs, &log, &invalid, batch).await;
    let mut records: Vec<u64> = items.iter().map(stored_size).collect();
    records.sort_unstable();
    let median = records.get(records.len() / 2).copied();
    let sample = items
        .iter()
        .find(|i| Some(stored_size(i)) == median)
        .map(|item| {
            let mut attrs: Vec<(String, u64)> = item
                .iter()
                .map(|(k, v)| (k.clone(), k.len() as u64 + harness::capacity::value_size(v)))
                .collect();
            attrs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            attrs
        })
        .unwrap_or_default();
    let smallest = items.iter().find_map(|item| {
        let receipt = item.get(charge_once::contracts::schema::attr::RECEIPT)?;
        // The order id the key was made of (the longest that ends a string of it).
        let fresh_id = fresh
            .iter()
            .filter(|id| {
                item.values()
                    .any(|v| matches!(v, AttributeValue::S(s) if s.ends_with(id.as_str())))
            })
            .max_by_key(|id| id.len())?;
        Some(smallest_record(fresh_id, receipt))
    });
    Measured {
        batch,
        fresh: fresh_phase,
        duplicate,
        failed,
        invalid,
        records,
        sample,
        smallest,
    }
}

/// The smallest record that holds what the rules need of a done order: its key (the
/// order id), its state, its receipt, its fingerprint (a SHA-256) and the expiry TTL
/// deletes it by; one-letter names.
fn smallest_record(order_id: &str, receipt: &AttributeValue) -> u64 {
    let item: HashMap<String, AttributeValue> = [
        ("k", AttributeValue::S(order_id.to_owned())),
        ("s", AttributeValue::S("h".to_owned())),
        ("r", receipt.clone()),
        ("f", AttributeValue::B(vec![0u8; 32].into())),
        ("e", AttributeValue::N("1799999999".to_owned())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    stored_size(&item)
}

/// One phase: `ids` in batches; the calls, units, queue requests and printed bytes.
async fn phase(
    lane: &Lane,
    rig: &Rig,
    sqs: &Faults,
    log: &Path,
    ids: &[String],
    batch: usize,
) -> Phase {
    rig.faults.reset_calls();
    sqs.reset_calls();
    // Bytes already written, then after the phase (bounded wait for the last lines).
    let (before, lines_before) = log_size(log);
    let mut out = Phase {
        orders: ids.len(),
        ..Phase::default()
    };
    for chunk in ids.chunks(batch) {
        let (_, failures) = lane.invoke(event(chunk)).await;
        out.failures += failures;
        out.invocations += 1;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (after, lines_after) = log_size(log);
    out.log_bytes = after - before;
    out.log_lines = lines_after - lines_before;
    out.capacity = rig.faults.capacity();
    out.sqs_calls = sqs.calls();
    out
}

fn log_size(log: &Path) -> (u64, u64) {
    let bytes = std::fs::read(log).unwrap_or_default();
    (
        bytes.len() as u64,
        bytes.iter().filter(|b| **b == b'\n').count() as u64,
    )
}

/// Every item of a table (bounded: 1,000 pages).
async fn scan(table: &str) -> Vec<HashMap<String, AttributeValue>> {
    let client = Backend::Dynalite.client();
    let mut items = Vec::new();
    let mut start = None;
    for _ in 0..1000 {
        let page = client
            .scan()
            .table_name(table)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .unwrap();
        items.extend(page.items().iter().cloned());
        match page.last_evaluated_key() {
            Some(last) if !last.is_empty() => start = Some(last.clone()),
            _ => break,
        }
    }
    items
}

// --- Pricing ------------------------------------------------------------------------

/// The parts of the bill, in the chart's stacking order.
pub const PARTS: [&str; 8] = [
    "DynamoDB writes",
    "DynamoDB reads",
    "storage",
    "PITR",
    "audit reads",
    "SQS",
    "logs",
    "Lambda",
];

/// One deployment of a contender.
#[derive(Clone, Debug)]
pub struct Config {
    pub retention: Duration,
    pub class: Class,
    pub pitr: bool,
    pub platform_lines: bool,
    pub audit: Option<Audit>,
    pub batch: usize,
    /// Lambda per million orders and where it comes from, when the bill measured it.
    pub lambda: Option<(f64, String)>,
}

impl Config {
    pub fn describe(&self) -> String {
        format!(
            "{}, {}{}, retention {}, batch {}, {}",
            self.class.name(),
            if self.pitr { "PITR" } else { "no PITR" },
            if self.audit.is_some() {
                ", daily audit"
            } else {
                ""
            },
            days(self.retention),
            self.batch,
            self.lambda
                .as_ref()
                .map_or("Lambda not measured".to_owned(), |(_, cell)| cell.clone()),
        )
    }
}

/// What the daily audit reads per order (DESIGN §11), and what the awaiting index costs.
#[derive(Clone, Copy, Debug)]
pub struct Audit {
    /// How many daily runs read each order: `AUDIT_SINCE` over a day (25 h: 1.04).
    pub runs_per_order: f64,
    /// The share of orders that await their customer: assumed
    /// (`BENCH_AWAITING_SHARE`, default 0.02), not measured.
    pub awaiting_share: f64,
    /// How long an order awaits at most (`AUTHENTICATION_WAIT`'s default, 7 d): every
    /// daily run reads it from the index meanwhile.
    pub wait: Duration,
}

impl Audit {
    fn of(template: &Template) -> Self {
        let share = std::env::var("BENCH_AWAITING_SHARE").map_or(0.02, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("BENCH_AWAITING_SHARE: a share, such as 0.02"))
        });
        Self {
            runs_per_order: template.audit_since.as_secs_f64() / 86_400.0,
            awaiting_share: share,
            wait: Duration::from_secs(7 * 86_400),
        }
    }

    /// Read and write units per order: (reads, writes).
    fn units(&self, item_bytes: f64) -> (f64, f64) {
        // Each order of a window: its record by key, strongly consistent.
        let by_key = self.runs_per_order * read_units(item_bytes.ceil() as u64, true);
        // Each awaiting record from the index (a Query: eventually consistent, half a
        // unit per 4 KB of items), by every run while it waits.
        let index = self.awaiting_share * self.wait.as_secs_f64() / 86_400.0 * item_bytes
            / harness::capacity::READ_UNIT_BYTES as f64
            / 2.0;
        // The index's writes: its item put when the wait begins, removed when it ends.
        (by_key + index, 2.0 * self.awaiting_share)
    }
}

/// The whole bill of `m` deployed as `c`, per million orders, part by part (`PARTS`).
pub fn price(m: &Measured, c: &Config, p: &Prices, ttl_lag: Duration) -> [f64; 8] {
    let (writes, reads) = m.units();
    let kept_months = (c.retention + ttl_lag).as_secs_f64() / MONTH_S;
    let stored_gib_months = m.record_bytes() * 1e6 / GIB * kept_months;
    // The audit's reads and the awaiting index's writes: per order, whatever the
    // retention.
    let (audit_reads, index_writes) = c.audit.map_or((0.0, 0.0), |a| {
        a.units(m.record_bytes() - harness::capacity::STORAGE_OVERHEAD as f64)
    });
    let requests = (c.batch.div_ceil(SQS_BATCH) * 2) as f64 / c.batch as f64;
    let sqs = 1.0 + requests + m.fresh.sqs_per_order();
    let platform = if c.platform_lines {
        platform_bytes_per_invocation() / c.batch as f64
    } else {
        0.0
    };
    let log_bytes = m.fresh.log_bytes_per_order() + platform;
    [
        writes * p.class(p.write_request, c.class),
        reads * p.class(p.read_request, c.class),
        stored_gib_months * p.class(p.storage, c.class),
        if c.pitr {
            stored_gib_months * p.pitr
        } else {
            0.0
        },
        audit_reads * p.class(p.read_request, c.class)
            + index_writes * p.class(p.write_request, c.class),
        sqs * p.sqs_request,
        log_bytes * 1e6 / GIB * p.logs_ingested,
        c.lambda.as_ref().map_or(0.0, |(cost, _)| *cost),
    ]
}

/// The floor per million orders, part by part (`PARTS`): 2 write units, the send,
/// receive and delete, and the smallest record for the template's retention at its
/// class (and PITR, if on). No reads, no logs, no Lambda.
pub fn floor_parts(m: &Measured, t: &Template, p: &Prices, ttl_lag: Duration) -> Option<[f64; 8]> {
    let smallest = m.smallest? as f64;
    let kept_months = (t.retention + ttl_lag).as_secs_f64() / MONTH_S;
    let stored_gib_months = smallest * 1e6 / GIB * kept_months;
    let requests = 1.0 + (t.batch.div_ceil(SQS_BATCH) * 2) as f64 / t.batch as f64;
    Some([
        2.0 * p.class(p.write_request, t.table_class),
        0.0,
        stored_gib_months * p.class(p.storage, t.table_class),
        if t.pitr {
            stored_gib_months * p.pitr
        } else {
            0.0
        },
        0.0,
        requests * p.sqs_request,
        0.0,
        0.0,
    ])
}

pub fn floor(m: &Measured, t: &Template, p: &Prices, ttl_lag: Duration) -> Option<f64> {
    floor_parts(m, t, p, ttl_lag).map(|parts| parts.iter().sum())
}

/// The whole bill, with what it is made of.
pub struct Whole {
    pub template: Template,
    pub measured: BTreeMap<Contender, Measured>,
    pub prices: Prices,
    pub ttl_lag: Duration,
    pub equal_retention: Duration,
    pub retentions: Vec<Duration>,
    /// When the figures were priced again from a run's results (`BENCH_REPRICE`).
    pub repriced: Option<String>,
}

/// A retention or a delay as an operator reads it: whole days, else hours.
fn days(d: Duration) -> String {
    let hours = d.as_secs_f64() / 3600.0;
    if hours >= 24.0 {
        format!("{:.0} d", hours / 24.0)
    } else {
        format!("{hours:.0} h")
    }
}

fn retentions() -> Vec<Duration> {
    std::env::var("BENCH_RETENTIONS")
        .unwrap_or_else(|_| "1h,1d,7d,21d,30d,90d,400d".to_owned())
        .split(',')
        .map(|r| {
            humantime::parse_duration(r.trim())
                .unwrap_or_else(|e| panic!("BENCH_RETENTIONS: {r:?}: {e}"))
        })
        .collect()
}

fn env_duration(name: &str, default: &str) -> Duration {
    let text = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    humantime::parse_duration(&text)
        .unwrap_or_else(|e| panic!("{name}: a duration such as 400d or 1h ({text:?}: {e})"))
}

impl Whole {
    pub async fn run() -> Self {
        let template = Template::read();
        let orders = crate::env_usize("BENCH_WHOLE_ORDERS", 100);
        assert!(
            orders >= template.batch,
            "BENCH_WHOLE_ORDERS ≥ the template's BatchSize"
        );
        let measured = measure(template.batch, orders).await;
        let ttl_lag =
            Duration::from_secs(crate::env_usize("BENCH_TTL_LAG_HOURS", 48) as u64 * 3600);
        let equal_retention = match std::env::var("BENCH_EQUAL_RETENTION") {
            Ok(_) => env_duration("BENCH_EQUAL_RETENTION", ""),
            Err(_) => template.retention,
        };
        let retentions = retentions();
        Self {
            template,
            measured,
            prices: Prices::from_env(),
            ttl_lag,
            equal_retention,
            retentions,
            repriced: None,
        }
    }

    /// Lambda per million orders of `contender` at `memory_mb` and `batch` (arm64 or
    /// x86_64), from the bill; at the smallest size it runs at for that batch when it
    /// does not run at `memory_mb`.
    fn lambda_at(
        bill: Option<&Bill>,
        contender: Contender,
        memory_mb: u64,
        batch: usize,
        arm64: bool,
    ) -> Option<(f64, String)> {
        let bill = bill?;
        bill.measured
            .iter()
            .filter(|((cell, c), m)| {
                *c == contender
                    && cell.batch == batch
                    && cell.period_ms == 100
                    && cell.memory_mb >= memory_mb
                    && matches!(
                        m,
                        bill::Measured::Ran {
                            failed_records: 0,
                            ..
                        }
                    )
            })
            .min_by_key(|((cell, _), _)| cell.memory_mb)
            .and_then(|((cell, _), m)| {
                bill::cost_per_million(m, *cell, &bill.prices).map(|(arm, x86)| {
                    let arch = if arm64 { "arm64" } else { "x86_64" };
                    (
                        if arm64 { arm } else { x86 },
                        format!("{} MB {arch}", cell.memory_mb),
                    )
                })
            })
    }

    /// The cheapest Lambda cell of `contender` in the bill: (cost, its cell).
    fn cheapest_lambda(bill: Option<&Bill>, contender: Contender) -> Option<(f64, BillCell)> {
        bill.and_then(|b| bill::cheapest(b, contender, None))
    }

    /// A contender as its defaults deploy it: charge-once by the template; the
    /// Powertools peers as Lambda and CloudFormation default a function and a table
    /// (batch 10, 128 MB, x86_64, START/REPORT lines, Standard, no PITR) with
    /// Powertools' one-hour expiry.
    pub fn defaults(&self, contender: Contender, bill: Option<&Bill>) -> Config {
        let t = &self.template;
        if contender == Contender::ChargeOnce {
            Config {
                retention: t.retention,
                class: t.table_class,
                pitr: t.pitr,
                platform_lines: t.platform_lines,
                audit: t.audit.then(|| Audit::of(t)),
                batch: t.batch,
                lambda: Self::lambda_at(bill, contender, t.memory_mb, t.batch, t.arm64),
            }
        } else {
            Config {
                retention: POWERTOOLS_RETENTION,
                class: Class::Standard,
                pitr: false,
                platform_lines: true,
                audit: None,
                batch: 10,
                lambda: Self::lambda_at(bill, contender, 128, 10, false),
            }
        }
    }

    /// The cheapest deployment at `retention`: either class, the cheapest Lambda cell
    /// of the bill (its batch), and for the peers no START/REPORT lines. charge-once
    /// keeps what its template fixes (PITR, the platform log level, the audit).
    pub fn cheapest(
        &self,
        contender: Contender,
        retention: Duration,
        bill: Option<&Bill>,
    ) -> (Config, f64) {
        let mut base = self.defaults(contender, bill);
        base.retention = retention;
        if contender != Contender::ChargeOnce {
            base.platform_lines = false;
        }
        if let Some((cost, cell)) = Self::cheapest_lambda(bill, contender) {
            base.batch = cell.batch;
            base.lambda = Some((
                cost,
                format!("{} MB arm64, {} ms period", cell.memory_mb, cell.period_ms),
            ));
        }
        let m = &self.measured[&contender];
        [Class::Standard, Class::InfrequentAccess]
            .into_iter()
            .map(|class| {
                let c = Config {
                    class,
                    ..base.clone()
                };
                let total = price(m, &c, &self.prices, self.ttl_lag).iter().sum::<f64>();
                (c, total)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
    }

    fn total(&self, contender: Contender, c: &Config) -> f64 {
        price(&self.measured[&contender], c, &self.prices, self.ttl_lag)
            .iter()
            .sum()
    }

    /// The retention at which Standard-IA costs what Standard costs for `contender`
    /// deployed as `c` (the bill is linear in the retention); `None` when one class is
    /// cheaper at every retention.
    pub fn class_break_even(&self, contender: Contender, c: &Config) -> Option<Duration> {
        let at = |class, retention| {
            self.total(
                contender,
                &Config {
                    class,
                    retention,
                    ..c.clone()
                },
            )
        };
        let month = Duration::from_secs_f64(MONTH_S);
        let (s0, s1) = (
            at(Class::Standard, Duration::ZERO),
            at(Class::Standard, month),
        );
        let (i0, i1) = (
            at(Class::InfrequentAccess, Duration::ZERO),
            at(Class::InfrequentAccess, month),
        );
        let (slope_s, slope_i) = (s1 - s0, i1 - i0);
        let months = (i0 - s0) / (slope_s - slope_i);
        (months.is_finite() && months > 0.0).then(|| Duration::from_secs_f64(months * MONTH_S))
    }

    /// Provisioned capacity beats on-demand when the units provisioned are used above
    /// this share of every hour (the same for reads and writes, and both classes, at
    /// these prices).
    pub fn provisioned_break_even(&self) -> [f64; 2] {
        let p = &self.prices;
        [
            p.write_unit_hour[0] / 3600.0 / (p.write_request[0] / 1e6),
            p.write_unit_hour[1] / 3600.0 / (p.write_request[1] / 1e6),
        ]
    }

    /// The fixed monthly costs: (what, how many, $ per month).
    pub fn fixed(&self) -> Vec<(String, usize, f64)> {
        let t = &self.template;
        let p = &self.prices;
        vec![
            (
                format!("custom metrics ({})", t.custom_metrics.join(", ")),
                t.custom_metrics.len(),
                t.custom_metrics.len() as f64 * p.metric_month,
            ),
            (
                "alarm metrics (standard resolution)".to_owned(),
                t.alarms,
                t.alarms as f64 * p.alarm_month,
            ),
            (
                "dashboards (the first three of an account are free)".to_owned(),
                t.dashboards,
                t.dashboards as f64 * p.dashboard_month,
            ),
            (
                "the provider's API key secret (Secrets Manager)".to_owned(),
                1,
                p.secret_month,
            ),
        ]
    }

    /// The goals: (what, goal, measured, met).
    pub fn verdicts(&self, bill: Option<&Bill>) -> Vec<(String, String, String, bool)> {
        let mut out = Vec::new();
        let co = Contender::ChargeOnce;
        let m = &self.measured[&co];
        let defaults = self.defaults(co, bill);
        let ours = self.total(co, &defaults);
        if let Some(floor) = floor(m, &self.template, &self.prices, self.ttl_lag) {
            let multiple = ours / floor;
            let over = ours - 1.2 * floor;
            out.push((
                "whole bill at the template's defaults against its floor".to_owned(),
                "≤ 1.2× the floor".to_owned(),
                format!(
                    "{multiple:.2}× (${ours:.3} against a floor of ${floor:.3} per million orders{})",
                    if over > 0.0 { format!("; ${over:.3} over the goal") } else { String::new() }
                ),
                multiple <= 1.2,
            ));
        }
        let mut ours_equal = defaults.clone();
        ours_equal.retention = self.equal_retention;
        let ours_equal_total = self.total(co, &ours_equal);
        for peer in PEERS {
            let (c, theirs) = self.cheapest(peer, self.equal_retention, bill);
            out.push((
                format!(
                    "whole bill at equal retention ({}), against {}'s cheapest",
                    days(self.equal_retention),
                    peer.name()
                ),
                "below it".to_owned(),
                format!(
                    "${ours_equal_total:.3} against ${theirs:.3} ({}): {:.2}× ({:+.1}%)",
                    c.describe(),
                    theirs / ours_equal_total,
                    (ours_equal_total / theirs - 1.0) * 100.0
                ),
                ours_equal_total < theirs,
            ));
        }
        let (cheaper, _) = self.cheapest(co, self.template.retention, None);
        out.push((
            "the template's default table class is the cheaper at its default retention".to_owned(),
            self.template.table_class.name().to_owned(),
            format!("{} is cheaper", cheaper.class.name()),
            cheaper.class == self.template.table_class,
        ));
        out
    }

    pub fn markdown(&self, bill: Option<&Bill>) -> String {
        let p = &self.prices;
        let t = &self.template;
        let mut md = vec![
            "## The whole bill".to_owned(),
            String::new(),
            format!(
                "What a million orders cost on AWS, every part, per contender. Measured, per contender, at the template's batch size ({}): {} fresh orders, the same orders again (duplicates), {} orders the payment stub refuses, and {} orders no retry can fix (an invalid id), on dynalite behind a proxy that asks for `ReturnConsumedCapacity` (dynalite reports units by item size; moto reports a fixed number per operation, so it is not used here); the table read back after the fresh orders. dynalite ignores `ReturnValuesOnConditionCheckFailure`, so a duplicate costs every contender a read here that DynamoDB spares it. **Modelled, not measured:** the producer's send (one request per order) and the event source's receives and deletes (one each per {SQS_BATCH} records of a batch); Lambda's START and REPORT lines ({:.0} bytes per invocation, JSON format, when SystemLogLevel is INFO; none at the template's WARN). Storage is the steady state: retention + {} for TTL to delete (BENCH_TTL_LAG_HOURS; the pattern card's trap 2). Logs are priced by the bytes printed (stdout and stderr, metrics documents included). Lambda comes from the bill below (p50 billed duration).",
                t.batch,
                self.measured[&Contender::ChargeOnce].fresh.orders,
                self.measured[&Contender::ChargeOnce].failed.orders,
                self.measured[&Contender::ChargeOnce].invalid.orders,
                platform_bytes_per_invocation(),
                days(self.ttl_lag),
            ),
            String::new(),
            "### What each contender leaves and makes, per order".to_owned(),
            String::new(),
            "| contender | write units | read units (computed calls) | record bytes (stored, mean) | SQS requests by the function | log bytes (lines) | duplicate: write / read units, log bytes | refused: write / read units, SQS requests, log bytes | invalid: SQS requests, failed back, log bytes |".to_owned(),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |".to_owned(),
        ];
        for (contender, m) in &self.measured {
            let (w, r) = m.units();
            let (dw, dr) = m.duplicate.units_per_order(m.largest());
            let (fw, fr) = m.failed.units_per_order(m.largest());
            md.push(format!(
                "| {} | {w:.2} | {r:.2} ({}) | {:.0} | {:.2} | {:.0} ({:.2}) | {dw:.2} / {dr:.2}, {:.0} | {fw:.2} / {fr:.2}, {:.2}, {:.0} | {:.2}, {}/{}, {:.0} |",
                contender.name(),
                m.fresh.computed_calls(),
                m.record_bytes(),
                m.fresh.sqs_per_order(),
                m.fresh.log_bytes_per_order(),
                m.fresh.log_lines as f64 / m.fresh.orders as f64,
                m.duplicate.log_bytes_per_order(),
                m.failed.sqs_per_order(),
                m.failed.log_bytes_per_order(),
                m.invalid.sqs_per_order(),
                m.invalid.failures,
                m.invalid.orders,
                m.invalid.log_bytes_per_order(),
            ));
        }
        md.push(String::new());
        md.push("A record of the median size, attribute by attribute (name + value bytes; +100 of overhead in storage):".to_owned());
        md.push(String::new());
        for (contender, m) in &self.measured {
            let attrs: Vec<String> = m.sample.iter().map(|(k, b)| format!("`{k}` {b}")).collect();
            md.push(format!("* {}: {}", contender.name(), attrs.join(", ")));
        }
        md.push(String::new());
        md.push(format!(
            "### List prices ({}, as of {}; `BENCH_PRICE_*` overrides each)",
            p.region, p.date
        ));
        md.push(String::new());
        md.push("| item | Standard | Standard-IA |".to_owned());
        md.push("| --- | --- | --- |".to_owned());
        for (what, prices) in [
            (
                "DynamoDB on-demand, per million write request units",
                p.write_request,
            ),
            (
                "DynamoDB on-demand, per million read request units",
                p.read_request,
            ),
            (
                "DynamoDB provisioned, per write capacity unit-hour",
                p.write_unit_hour,
            ),
            (
                "DynamoDB provisioned, per read capacity unit-hour",
                p.read_unit_hour,
            ),
            ("DynamoDB storage, per GB-month", p.storage),
        ] {
            md.push(format!("| {what} | ${} | ${} |", prices[0], prices[1]));
        }
        for (what, price) in [
            ("DynamoDB continuous backups (PITR), per GB-month", p.pitr),
            ("SQS standard, per million requests", p.sqs_request),
            ("CloudWatch Logs ingestion, per GB", p.logs_ingested),
            ("Lambda arm64, per GB-second", p.lambda.arm64_gb_s),
            ("Lambda x86_64, per GB-second", p.lambda.x86_gb_s),
            ("Lambda, per request", p.lambda.per_request),
            ("CloudWatch custom metric, per month", p.metric_month),
            ("CloudWatch alarm, per month", p.alarm_month),
            ("CloudWatch dashboard, per month", p.dashboard_month),
            ("Secrets Manager secret, per month", p.secret_month),
        ] {
            md.push(format!("| {what} | ${price} | |"));
        }
        md.push(String::new());
        md.push("GB = 2³⁰ bytes; no free tier; a month is 730 hours.".to_owned());
        md.push(String::new());
        if let Some(a) = self.defaults(Contender::ChargeOnce, bill).audit {
            let item = self.measured[&Contender::ChargeOnce].record_bytes()
                - harness::capacity::STORAGE_OVERHEAD as f64;
            let (reads, writes) = a.units(item);
            md.push(format!(
                "The audit reads what changed (ARCHITECTURE.md, \"The audit\"), never the table: each order of its window by key, one strongly consistent `GetItem` by each of the {:.2} daily runs whose window (`AUDIT_SINCE`) holds it; the records awaiting their customer from the sparse index, by every run while they wait (up to {}); the provider's listings and lookups, which cost no AWS money. The index costs 2 write units per order that awaits (its item put, then removed), at an assumed {:.0}% of orders (`BENCH_AWAITING_SHARE`): {reads:.3} read and {writes:.3} write units per order, whatever the retention.",
                a.runs_per_order,
                days(a.wait),
                a.awaiting_share * 100.0,
            ));
            md.push(String::new());
        }
        if let Some(date) = &self.repriced {
            md.push(format!(
                "Priced again on {date} from this run's measured figures (`BENCH_REPRICE`), at the template and model of the tree that priced it; nothing was measured again."
            ));
            md.push(String::new());
        }
        md.push("### The whole bill per million orders".to_owned());
        md.push(String::new());
        let mut header = "| contender | configuration | ".to_owned();
        header.push_str(&PARTS.join(" | "));
        header.push_str(" | total | × floor |");
        md.push(header);
        md.push(format!("| --- | --- |{}", " --- |".repeat(PARTS.len() + 2)));
        let floor = floor(&self.measured[&Contender::ChargeOnce], t, p, self.ttl_lag);
        for (label, contender, config) in self.rows(bill) {
            let parts = price(&self.measured[&contender], &config, p, self.ttl_lag);
            let total: f64 = parts.iter().sum();
            let cells: Vec<String> = parts
                .iter()
                .map(|v| format!("{v:.3} ({:.0}%)", v / total * 100.0))
                .collect();
            md.push(format!(
                "| {} | {label}: {} | {} | **{total:.3}** | {} |",
                contender.name(),
                config.describe(),
                cells.join(" | "),
                floor.map_or("—".to_owned(), |f| format!("{:.2}", total / f)),
            ));
        }
        if let Some(parts) = floor_parts(&self.measured[&Contender::ChargeOnce], t, p, self.ttl_lag)
        {
            let f: f64 = parts.iter().sum();
            let cells: Vec<String> = parts.iter().map(|v| format!("{v:.3}")).collect();
            md.push(format!(
                "| the floor | 2 write units, send + receive + delete, the smallest record ({} bytes stored) for {} at the template's class{} | {} | **{f:.3}** | 1 |",
                self.measured[&Contender::ChargeOnce].smallest.unwrap_or(0),
                days(t.retention),
                if t.pitr { " with PITR" } else { "" },
                cells.join(" | "),
            ));
        }
        md.push(String::new());
        md.push("### What each retention costs charge-once, and what it protects".to_owned());
        md.push(String::new());
        md.push(format!(
            "The model's assumption: a record outlives any redelivery of its message, i.e. the DLQ's retention (the message keeps its enqueue time there) plus one redrive into the queue: {} by the template. TTL deletes up to {} late (trap 2), so a business window must be kept in an attribute, not in the TTL.",
            days(t.message_life()),
            days(self.ttl_lag),
        ));
        md.push(String::new());
        md.push("| retention | storage + PITR + audit reads $/M | whole bill $/M (template's defaults otherwise) | its floor at that retention | × floor | outlives queue + DLQ + redrive | the template allows it (≥ 30 d) |".to_owned());
        md.push("| --- | --- | --- | --- | --- | --- | --- |".to_owned());
        let co = Contender::ChargeOnce;
        let m = &self.measured[&co];
        for retention in &self.retentions {
            let c = Config {
                retention: *retention,
                ..self.defaults(co, bill)
            };
            let parts = price(m, &c, p, self.ttl_lag);
            let total: f64 = parts.iter().sum();
            let at = Template {
                retention: *retention,
                ..t.clone()
            };
            let floor = self::floor(m, &at, p, self.ttl_lag).unwrap_or(f64::NAN);
            md.push(format!(
                "| {} | {:.3} | {total:.3} | {floor:.3} | {:.2} | {} | {} |",
                days(*retention),
                parts[2] + parts[3] + parts[4],
                total / floor,
                if *retention > t.message_life() {
                    "yes"
                } else {
                    "**no**"
                },
                if *retention >= Duration::from_secs(30 * 86_400) {
                    "yes"
                } else {
                    "no"
                },
            ));
        }
        md.push(String::new());
        md.push("### Table class and capacity mode".to_owned());
        md.push(String::new());
        let defaults = self.defaults(co, bill);
        md.push(match self.class_break_even(co, &defaults) {
            Some(d) => format!(
                "Standard-IA costs what Standard costs for charge-once at a retention of {} (its record, units and audit at the template's defaults); longer, Standard-IA is cheaper. The template's default class: {}.",
                days(d),
                t.table_class.name(),
            ),
            None => "One table class is cheaper at every retention.".to_owned(),
        });
        let [standard, ia] = self.provisioned_break_even();
        md.push(String::new());
        md.push(format!(
            "Provisioned capacity beats on-demand for a steady load when the capacity provisioned is used above {:.1}% of every hour on average (Standard; {:.1}% on Standard-IA): a unit-hour costs what {:.0} on-demand requests cost. A flat load provisioned with headroom of less than {:.1}× its mean is cheaper provisioned; a spiky one, or one under about a unit per second, is not.",
            standard * 100.0,
            ia * 100.0,
            standard * 3600.0,
            1.0 / standard,
        ));
        md.push(String::new());
        md.push("### Fixed monthly costs (do not scale with orders)".to_owned());
        md.push(String::new());
        md.push("| what (counted from template.yaml) | count | $ per month |".to_owned());
        md.push("| --- | --- | --- |".to_owned());
        let mut fixed_total = 0.0;
        for (what, n, cost) in self.fixed() {
            fixed_total += cost;
            md.push(format!("| {what} | {n} | {cost:.2} |"));
        }
        md.push(format!("| total | | **{fixed_total:.2}** |"));
        md.push(String::new());
        md.push("Not counted: the event source's empty receives while the queue is idle, the secret's API calls (one per cold start), X-Ray traces, the log group's storage (the template sets no retention on it) and the audit function's own Lambda time.".to_owned());
        md.push(String::new());
        md.push("| whole-bill goal | goal | measured | met |".to_owned());
        md.push("| --- | --- | --- | --- |".to_owned());
        for (what, goal, measured, met) in self.verdicts(bill) {
            md.push(format!(
                "| {what} | {goal} | {measured} | {} |",
                if met { "yes" } else { "**no**" }
            ));
        }
        md.push(String::new());
        md.extend(self.gaps(bill));
        md.join("\n")
    }

    /// Where charge-once's bill at its defaults stands above its floor, and above each
    /// peer's cheapest at equal retention, part by part: what a goal needs cut.
    fn gaps(&self, bill: Option<&Bill>) -> Vec<String> {
        let co = Contender::ChargeOnce;
        let m = &self.measured[&co];
        let defaults = self.defaults(co, bill);
        let ours = price(m, &defaults, &self.prices, self.ttl_lag);
        let describe = |theirs: [f64; 8]| -> String {
            let mut parts: Vec<(usize, f64)> = (0..PARTS.len())
                .map(|k| (k, ours[k] - theirs[k]))
                .filter(|(_, d)| d.abs() >= 0.0005)
                .collect();
            parts.sort_by(|a, b| b.1.total_cmp(&a.1));
            parts
                .iter()
                .map(|(k, d)| format!("{} {d:+.3}", PARTS[*k]))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = Vec::new();
        if let Some(floor) = floor_parts(m, &self.template, &self.prices, self.ttl_lag) {
            let total: f64 = ours.iter().sum();
            let goal = 1.2 * floor.iter().sum::<f64>();
            out.push(format!(
                "Above the floor, part by part ($ per million orders; the record is {:.0} bytes stored against the smallest's {}, the log {:.0} bytes per order): {}. The goal needs ${:.3} cut.",
                m.record_bytes(),
                m.smallest.unwrap_or(0),
                m.fresh.log_bytes_per_order(),
                describe(floor),
                (total - goal).max(0.0),
            ));
        }
        let mut equal = defaults.clone();
        equal.retention = self.equal_retention;
        let ours_equal = price(m, &equal, &self.prices, self.ttl_lag);
        for peer in PEERS {
            let (c, _) = self.cheapest(peer, self.equal_retention, bill);
            let theirs = price(&self.measured[&peer], &c, &self.prices, self.ttl_lag);
            let diff: Vec<String> = (0..PARTS.len())
                .map(|k| (k, ours_equal[k] - theirs[k]))
                .filter(|(_, d)| d.abs() >= 0.0005)
                .map(|(k, d)| format!("{} {d:+.3}", PARTS[k]))
                .collect();
            out.push(String::new());
            out.push(format!(
                "Against {}'s cheapest at {}, part by part: {}.",
                peer.name(),
                days(self.equal_retention),
                diff.join(", ")
            ));
        }
        out
    }

    /// The rows of the table and the chart: each contender at its defaults, at its
    /// cheapest at its default retention, and at its cheapest at equal retention.
    fn rows(&self, bill: Option<&Bill>) -> Vec<(String, Contender, Config)> {
        let mut rows = Vec::new();
        for contender in CONTENDERS {
            rows.push((
                "defaults".to_owned(),
                contender,
                self.defaults(contender, bill),
            ));
        }
        for contender in CONTENDERS {
            let own = self.defaults(contender, bill).retention;
            rows.push((
                "cheapest".to_owned(),
                contender,
                self.cheapest(contender, own, bill).0,
            ));
        }
        for contender in CONTENDERS {
            let label = format!("cheapest at {}", days(self.equal_retention));
            rows.push((
                label,
                contender,
                self.cheapest(contender, self.equal_retention, bill).0,
            ));
        }
        rows
    }

    pub fn json(&self, bill: Option<&Bill>) -> Value {
        let p = &self.prices;
        let measured: serde_json::Map<String, Value> = self
            .measured
            .iter()
            .map(|(c, m)| {
                let phase = |ph: &Phase| {
                    let (w, r) = ph.units_per_order(m.largest());
                    json!({
                        "orders": ph.orders, "invocations": ph.invocations,
                        "write_units_per_order": w, "read_units_per_order": r,
                        "calls_without_reported_units": ph.computed_calls(),
                        "capacity": ph.capacity.iter().map(|(k, v)| (k.clone(), json!({"units": v.units, "reported": v.reported, "unreported": v.unreported}))).collect::<serde_json::Map<_, _>>(),
                        "sqs_calls": ph.sqs_calls, "failures": ph.failures,
                        "log_bytes": ph.log_bytes, "log_lines": ph.log_lines,
                    })
                };
                (
                    c.name().to_owned(),
                    json!({
                        "batch": m.batch,
                        "record_bytes_stored_mean": m.record_bytes(),
                        "records": m.records.len(),
                        "sample_record": m.sample,
                        "smallest_record_bytes_stored": m.smallest,
                        "fresh": phase(&m.fresh),
                        "duplicate": phase(&m.duplicate),
                        "refused": phase(&m.failed),
                        "invalid": phase(&m.invalid),
                    }),
                )
            })
            .collect();
        let rows: Vec<Value> = self
            .rows(bill)
            .into_iter()
            .map(|(label, c, config)| {
                let parts = price(&self.measured[&c], &config, &self.prices, self.ttl_lag);
                json!({
                    "contender": c.name(), "row": label, "configuration": config.describe(),
                    "parts": PARTS.iter().zip(parts).map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                    "total": parts.iter().sum::<f64>(),
                })
            })
            .collect();
        json!({
            "prices": {
                "region": p.region, "as_of": p.date,
                "write_request_per_million": {"standard": p.write_request[0], "standard_ia": p.write_request[1]},
                "read_request_per_million": {"standard": p.read_request[0], "standard_ia": p.read_request[1]},
                "write_unit_hour": {"standard": p.write_unit_hour[0], "standard_ia": p.write_unit_hour[1]},
                "read_unit_hour": {"standard": p.read_unit_hour[0], "standard_ia": p.read_unit_hour[1]},
                "storage_gb_month": {"standard": p.storage[0], "standard_ia": p.storage[1]},
                "pitr_gb_month": p.pitr, "sqs_per_million": p.sqs_request, "logs_gb": p.logs_ingested,
                "lambda_arm64_gb_s": p.lambda.arm64_gb_s, "lambda_x86_64_gb_s": p.lambda.x86_gb_s, "lambda_request": p.lambda.per_request,
                "metric_month": p.metric_month, "alarm_month": p.alarm_month, "dashboard_month": p.dashboard_month, "secret_month": p.secret_month,
            },
            "ttl_lag_hours": self.ttl_lag.as_secs() / 3600,
            "equal_retention_s": self.equal_retention.as_secs(),
            "measured": measured,
            "per_million_orders": rows,
            "floor": floor(&self.measured[&Contender::ChargeOnce], &self.template, &self.prices, self.ttl_lag),
            "fixed_monthly": self.fixed().into_iter().map(|(w, n, c)| json!({"what": w, "count": n, "usd": c})).collect::<Vec<_>>(),
            "verdicts": self.verdicts(bill).into_iter().map(|(w, g, m, met)| json!({"target": w, "goal": g, "measured": m, "met": met})).collect::<Vec<_>>(),
        })
    }

    /// Stacked bars per million orders, part by part: each contender at its defaults
    /// with the floor, then at its cheapest at equal retention.
    pub fn chart(&self, path: &Path, bill: Option<&Bill>) {
        let floor = floor_parts(
            &self.measured[&Contender::ChargeOnce],
            &self.template,
            &self.prices,
            self.ttl_lag,
        );
        let mut defaults = Vec::new();
        let mut equal = Vec::new();
        for (label, contender, config) in self.rows(bill) {
            let parts = price(
                &self.measured[&contender],
                &config,
                &self.prices,
                self.ttl_lag,
            )
            .to_vec();
            if label == "defaults" {
                defaults.push((contender.name().to_owned(), parts));
            } else if label.starts_with("cheapest at") {
                equal.push((contender.name().to_owned(), parts));
            }
        }
        if let Some(parts) = floor {
            defaults.push(("the floor".to_owned(), parts.to_vec()));
        }
        let panels = vec![
            (
                "the whole bill per million orders at each contender's defaults, $".to_owned(),
                defaults,
            ),
            (
                format!(
                    "the whole bill per million orders, cheapest configurations at equal retention ({}), $",
                    days(self.equal_retention)
                ),
                equal,
            ),
        ];
        crate::chart::draw_stacked(path, &panels, &PARTS);
    }
}

// --- Pricing a committed run again ---------------------------------------------------

fn contender_named(name: &str) -> Contender {
    CONTENDERS
        .into_iter()
        .find(|c| c.name() == name)
        .unwrap_or_else(|| panic!("no contender named {name:?}"))
}

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("the results hold no number at {what}: {v}"))
}

fn count(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("the results hold no count at {what}: {v}"))
}

/// A phase as `Whole::json` wrote it.
fn phase_from(j: &Value, what: &str) -> Phase {
    let capacity = j["capacity"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(op, c)| {
            let consumed = Consumed {
                units: number(&c["units"], what),
                reported: count(&c["reported"], what),
                unreported: count(&c["unreported"], what),
            };
            (op.clone(), consumed)
        })
        .collect();
    let sqs_calls = j["sqs_calls"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(op, n)| (op.clone(), count(n, what)))
        .collect();
    Phase {
        orders: count(&j["orders"], what) as usize,
        invocations: count(&j["invocations"], what) as usize,
        failures: count(&j["failures"], &format!("{what}.failures")) as usize,
        capacity,
        sqs_calls,
        log_bytes: count(&j["log_bytes"], what),
        log_lines: count(&j["log_lines"], what),
    }
}

/// A contender's measurement as `Whole::json` wrote it. The records' sizes are kept
/// as their count and mean: rebuilt as that many sizes of that exact sum (every
/// record under a unit either way, so the units computed from the largest agree).
fn measured_from(j: &Value, name: &str) -> Measured {
    let n = count(&j["records"], name);
    let sum = (number(&j["record_bytes_stored_mean"], name) * n as f64).round() as u64;
    let records: Vec<u64> = (0..n)
        .map(|i| sum / n.max(1) + u64::from(i < sum % n.max(1)))
        .collect();
    let sample = j["sample_record"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|pair| {
            (
                pair[0].as_str().unwrap_or_default().to_owned(),
                count(&pair[1], name),
            )
        })
        .collect();
    let m = Measured {
        batch: count(&j["batch"], name) as usize,
        fresh: phase_from(&j["fresh"], name),
        duplicate: phase_from(&j["duplicate"], name),
        failed: phase_from(&j["refused"], name),
        invalid: phase_from(&j["invalid"], name),
        records,
        sample,
        smallest: j["smallest_record_bytes_stored"].as_u64(),
    };
    // What the run derived from its figures, derived again the same.
    for (phase, key) in [
        (&m.fresh, "fresh"),
        (&m.duplicate, "duplicate"),
        (&m.failed, "refused"),
        (&m.invalid, "invalid"),
    ] {
        let (w, r) = phase.units_per_order(m.largest());
        let written = (
            number(&j[key]["write_units_per_order"], name),
            number(&j[key]["read_units_per_order"], name),
        );
        assert!(
            (w - written.0).abs() < 1e-9 && (r - written.1).abs() < 1e-9,
            "{name} {key}: units per order {:?} against the run's {written:?}",
            (w, r)
        );
    }
    m
}

/// The bill's cells as `Bill::json` wrote them.
fn bill_from(j: &Value) -> Bill {
    let prices = bill::Prices::from_env();
    let measured = j["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|cell| {
            let at = BillCell {
                memory_mb: count(&cell["memory_mb"], "bill"),
                period_ms: count(&cell["period_ms"], "bill"),
                batch: count(&cell["batch"], "bill") as usize,
            };
            let contender = contender_named(cell["contender"].as_str().unwrap_or_default());
            let m = &cell["measured"];
            let measured = match m["does_not_run"].as_str() {
                Some(reason) => bill::Measured::DoesNotRun {
                    reason: reason.to_owned(),
                },
                None => bill::Measured::Ran {
                    billed_ms: m["billed_ms"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|v| number(v, "bill"))
                        .collect(),
                    init_ms: number(&m["init_ms"], "bill"),
                    failed_records: count(&m["failed_records"], "bill") as usize,
                    records: count(&m["records"], "bill") as usize,
                },
            };
            if let (Some((arm, x86)), Some(written)) = (
                bill::cost_per_million(&measured, at, &prices),
                cell["cost_per_million"].as_object(),
            ) {
                let same = |a: f64, key: &str| (a - number(&written[key], "bill")).abs() < 1e-9;
                assert!(
                    same(arm, "arm64") && same(x86, "x86_64"),
                    "{} {at:?}: the bill's cost per million, priced again, differs",
                    contender.name()
                );
            }
            ((at, contender), measured)
        })
        .collect();
    Bill {
        measured,
        share: j["share"].as_str().unwrap_or_default().to_owned(),
        prices,
    }
}

/// `BENCH_REPRICE=<a results .json>`: the whole bill of that run priced again from
/// its measured figures, at this tree's template (`template.yaml`), model and prices;
/// rewrites the run's `## The whole bill` section of its `.md`, its `whole_bill` in
/// the `.json` and its `-whole.svg`. Nothing else of the run changes.
pub fn reprice(json_path: &Path) {
    let text = std::fs::read_to_string(json_path)
        .unwrap_or_else(|e| panic!("{}: {e}", json_path.display()));
    let results: Value = serde_json::from_str(&text).unwrap();
    let figures = &results["whole_bill"];
    let measured = figures["measured"]
        .as_object()
        .unwrap_or_else(|| panic!("{}: no whole_bill.measured", json_path.display()))
        .iter()
        .map(|(name, m)| (contender_named(name), measured_from(m, name)))
        .collect();
    let bill = results["bill"]
        .is_object()
        .then(|| bill_from(&results["bill"]));
    let whole = Whole {
        template: Template::read(),
        measured,
        prices: Prices::from_env(),
        ttl_lag: Duration::from_secs(count(&figures["ttl_lag_hours"], "ttl_lag_hours") * 3600),
        equal_retention: Duration::from_secs(count(
            &figures["equal_retention_s"],
            "equal_retention_s",
        )),
        retentions: retentions(),
        repriced: Some(crate::report::today()),
    };
    // Only `whole_bill` is written again, in place: the rest of the file keeps its text
    // (a number parsed and printed again may move in its last digit).
    let at = text
        .find("\n  \"whole_bill\": ")
        .unwrap_or_else(|| panic!("{}: no whole_bill", json_path.display()));
    let value = serde_json::to_string_pretty(&whole.json(bill.as_ref()))
        .unwrap()
        .replace('\n', "\n  ");
    let rest = &text[at + 1..];
    let end = rest
        .find("\n  }")
        .filter(|_| rest.trim_end().ends_with("\n  }\n}"))
        .map(|_| rest.trim_end().len() - "\n}".len())
        .unwrap_or_else(|| panic!("{}: whole_bill is not its last key", json_path.display()));
    let rewritten = format!("{}\n  \"whole_bill\": {value}{}", &text[..at], &rest[end..]);
    std::fs::write(json_path, rewritten).unwrap();
    let md_path = json_path.with_extension("md");
    let md =
        std::fs::read_to_string(&md_path).unwrap_or_else(|e| panic!("{}: {e}", md_path.display()));
    let start = md
        .find("## The whole bill\n")
        .unwrap_or_else(|| panic!("{}: no whole-bill section", md_path.display()));
    // The section ends where the next one starts (`## `), or with the file.
    let end = md[start + 1..]
        .find("\n## ")
        .map_or(md.len(), |at| start + 1 + at);
    let section = whole.markdown(bill.as_ref()) + "\n\n";
    let rewritten = format!("{}{section}{}", &md[..start], &md[end..]);
    std::fs::write(&md_path, rewritten).unwrap();
    let stem = json_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("run");
    let svg = json_path.with_file_name(format!("{stem}-whole.svg"));
    whole.chart(&svg, bill.as_ref());
    eprintln!(
        "bench: priced the whole bill of {} again: {}, its whole_bill and {}",
        json_path.display(),
        md_path.display(),
        svg.display()
    );
}
