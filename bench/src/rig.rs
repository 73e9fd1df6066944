//! The rig: each contender a process under its own Runtime API emulator, behind its
//! own counting, latency-adding proxy; its CPU read from /proc; the payment stub and
//! the SQS events every contender gets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use harness::log_dir;
use harness::proxy::{Faults, Target, start_proxy};
use harness::runtime_api::{Endpoints, Reply, RuntimeApi, lambda_environment};
use harness::servers::Backend;
use serde_json::{Value, json};

use crate::{FUNCTION_TIMEOUT, root};

// --- Contenders ---------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contender {
    ChargeOnce,
    PowertoolsPython,
    PowertoolsTs,
}

pub const CONTENDERS: [Contender; 3] = [
    Contender::ChargeOnce,
    Contender::PowertoolsPython,
    Contender::PowertoolsTs,
];
pub const PEERS: [Contender; 2] = [Contender::PowertoolsPython, Contender::PowertoolsTs];

impl Contender {
    pub fn name(self) -> &'static str {
        match self {
            Self::ChargeOnce => "charge-once",
            Self::PowertoolsPython => "powertools-python",
            Self::PowertoolsTs => "powertools-ts",
        }
    }

    /// A short tag for order ids, so contenders never share a key.
    pub fn tag(self) -> &'static str {
        match self {
            Self::ChargeOnce => "co",
            Self::PowertoolsPython => "py",
            Self::PowertoolsTs => "ts",
        }
    }

    pub fn command(self) -> Command {
        match self {
            Self::ChargeOnce => Command::new(crate::charge_once_bin()),
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

pub fn has_module(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success())
}

/// One contender's store: its own table and proxy (latency, call counts); and the
/// queue the events name, with a DLQ (moto), for charge-once's queue calls.
pub struct Rig {
    pub faults: Arc<Faults>,
    pub store_url: String,
    pub table: String,
    pub sqs_url: String,
    pub dlq_url: String,
}

impl Rig {
    pub async fn new(backend: Backend, store_latency: Duration) -> Self {
        let table = backend.fresh_table().await.name;
        let faults = Arc::new(Faults {
            latency: store_latency,
            ..Faults::default()
        });
        let store_url = start_proxy(backend.url(), Target::DynamoDb, faults.clone()).await;
        let (sqs_url, dlq_url) = harness::event_source::orders_queue_and_dlq().await;
        Self {
            faults,
            store_url,
            table,
            sqs_url,
            dlq_url,
        }
    }
}

/// A contender's process and its execution environment.
pub struct Lane {
    pub contender: Contender,
    pub runtime: RuntimeApi,
    pub child: Child,
    pub spawned: Instant,
    pub log: PathBuf,
}

impl Lane {
    pub fn spawn(contender: Contender, rig: &Rig, payment_url: &str, runtime: RuntimeApi) -> Self {
        Self::spawn_command(contender, contender.command(), rig, payment_url, runtime)
    }

    /// [`Self::spawn`] with the command that starts the contender (under valgrind, say).
    pub fn spawn_command(
        contender: Contender,
        command: Command,
        rig: &Rig,
        payment_url: &str,
        runtime: RuntimeApi,
    ) -> Self {
        let log = log_dir().join(format!("bench-{}.log", contender.name()));
        Self::spawn_logged(contender, command, rig, payment_url, runtime, log)
    }

    /// [`Self::spawn_command`] with every line the process prints (stdout and
    /// stderr) appended to `log`.
    pub fn spawn_logged(
        contender: Contender,
        command: Command,
        rig: &Rig,
        payment_url: &str,
        runtime: RuntimeApi,
        log: PathBuf,
    ) -> Self {
        Self::spawn_with_env(contender, command, rig, payment_url, runtime, log, &[])
    }

    /// [`Self::spawn_logged`] with `env` added to the contender's environment (charge-once
    /// with traces exported, `traces.rs`).
    pub fn spawn_with_env(
        contender: Contender,
        mut command: Command,
        rig: &Rig,
        payment_url: &str,
        runtime: RuntimeApi,
        log: PathBuf,
        env: &[(&'static str, String)],
    ) -> Self {
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
            sqs: rig.sqs_url.clone(),
            dead_letter_queue: rig.dlq_url.clone(),
        };
        lambda_environment(&mut command, &runtime.addr, &endpoints)
            .env("PAYMENT_TIMEOUT_SECONDS", "1") // the peers' spelling
            .envs(env.iter().map(|(k, v)| (k, v)))
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

    pub async fn start(contender: Contender, rig: &Rig, payment_url: &str) -> Self {
        Self::spawn(contender, rig, payment_url, RuntimeApi::start().await)
    }

    /// One invocation's batch item failures, or `None` when no answer came within the
    /// function timeout (the process died, or was killed by its memory limit).
    pub async fn try_invoke(&self, event: String) -> Option<usize> {
        let records = event.matches("\"messageId\"").count();
        match self.runtime.invoke(event, FUNCTION_TIMEOUT).await {
            Reply::Response(body) => {
                let response: Value = serde_json::from_slice(&body).ok()?;
                Some(
                    response["batchItemFailures"]
                        .as_array()
                        .map_or(records, Vec::len),
                )
            }
            Reply::Error => Some(records),
            Reply::Timeout => None,
        }
    }

    /// One invocation: its wall time and the number of batch item failures. A
    /// function error counts every record as failed: Powertools raises
    /// `BatchProcessingError` when all records of a batch failed, by design.
    pub async fn invoke(&self, event: String) -> (Duration, usize) {
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
    pub fn cpu(&self) -> CpuReading {
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
    pub fn peak_rss_mb(&self) -> f64 {
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

pub struct CpuReading {
    pub threads: BTreeMap<String, u64>,
    pub ticks_ms: f64,
}

impl CpuReading {
    /// CPU ms used since `before`: exact (schedstat) when no thread ended in between,
    /// else from the ticks.
    pub fn since(&self, before: &CpuReading) -> f64 {
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

pub fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    })
}

// --- The payment stub and the events ------------------------------------------------

/// Marks an order id the payment stub refuses.
pub const REFUSED: &str = "refuse";

/// A payment stub: charges (and refunds) after `latency`; orders whose id contains
/// [`REFUSED`] get a 500.
pub async fn payment_stub(latency: Duration) -> String {
    let charge = move |body: String| async move {
        tokio::time::sleep(latency).await;
        if body.contains(REFUSED) {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"type": "api_error"}}).to_string(),
            );
        }
        let id = uuid::Uuid::new_v4().simple();
        (
            StatusCode::OK,
            json!({"id": format!("pi_{id}"), "object": "payment_intent",
                   "status": "succeeded", "latest_charge": format!("ch_{id}")})
            .to_string(),
        )
    };
    // A refund: made after the same latency, succeeded.
    let refund = move |_body: String| async move {
        tokio::time::sleep(latency).await;
        let id = uuid::Uuid::new_v4().simple();
        (
            StatusCode::OK,
            json!({"id": format!("re_{id}"), "object": "refund", "status": "succeeded"})
                .to_string(),
        )
    };
    let app = Router::new()
        .route("/v1/refunds", post(refund))
        .route("/v1/payment_intents", post(charge))
        .route(
            "/v1/payment_intents",
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
pub fn event(ids: &[String]) -> String {
    let bodies: Vec<String> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "amount": 1000, "currency": "EUR", "customer": "cus_bench",
                   "payment_method": "pm_card_visa"})
            .to_string()
        })
        .collect();
    event_of(&bodies)
}

/// An SQS event carrying one record per body.
pub fn event_of(bodies: &[String]) -> String {
    let records: Vec<Value> = bodies
        .iter()
        .map(|body| {
            json!({
                "messageId": uuid::Uuid::new_v4().to_string(),
                "receiptHandle": "rh",
                "body": body,
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
