//! The drain: how fast a backlog of orders clears against the provider's rate limit,
//! with nothing charged twice and nothing lost (docs/performance.md, "The drain").
//!
//! For each contender, one after the other: a backlog of orders from a few dozen
//! localstripe customers (each with an attached card; some with many orders) is put in
//! a fresh moto SQS queue, then several execution environments in Lambda mode (the
//! template's `MaximumConcurrency`) are fed from it by the harness's event-source
//! pollers (the template's batch size), paying at localstripe behind its layer with a
//! rate limit on creates and the per-customer lock on. Measured: orders charged per
//! second from the first charge to the last (the layer's accepted creates, sampled
//! against wall time), its ratio to the limit, the share of creates the layer refused
//! (429), orders charged twice, orders never charged (left in the queue or in the
//! DLQ), and the time to drain, within a time limit per contender: one that does not
//! drain in time is reported with what it charged, and the run goes on. charge-once
//! drains twice: at the template's defaults (its pace finds the limit from the answers)
//! and with the template's optional fleet budget set to the limit.
//!
//! It asserts nothing about speed; it asserts that each contender did the work it is
//! reported with: every charge of an order of its backlog, with the order's amount,
//! seen by the layer; and that charge-once charged no order twice.

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::event_source::{EsmStats, Queues, poll};
use harness::localstripe::{self, Card, Limits, Payer, set_limits};
use harness::producer::charges_by_order;
use harness::runtime_api::{RuntimeApi, lambda_environment};
use harness::servers::{Backend, localstripe_url};
use serde_json::{Value, json};

use crate::rig::{CONTENDERS, Contender, PEERS};

/// The create endpoint the layer limits, as its counters name it.
const CREATE: &str = "POST /v1/payment_intents";

/// How a drain is set up; the same for every contender of a run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Orders in the backlog (`BENCH_DRAIN_ORDERS`, default 300).
    pub orders: usize,
    /// Customers the orders belong to.
    pub customers: usize,
    /// Execution environments: the template's `MaximumConcurrency` default.
    pub environments: usize,
    /// Records per invocation: the template's `BatchSize` default (the poller's).
    pub batch: usize,
    /// The layer's limit on creates, per second.
    pub limit_per_s: u64,
    /// How long a create holds its customer's lock, and how long another create for
    /// the same customer waits for it before a 429 `lock_timeout`.
    pub lock_ms: u64,
    pub lock_wait_ms: u64,
    /// The function's timeout, and the queue's visibility: 6 × the timeout, as the
    /// template sets them (60 s and 360 s), compressed.
    pub function_timeout: Duration,
    pub visibility: Duration,
    /// The template's `MaxReceiveCount` default.
    pub max_receive_count: u32,
    /// How long a contender may take to drain the backlog (`BENCH_DRAIN_SECONDS`,
    /// default 180).
    pub time_limit: Duration,
}

impl Setup {
    pub fn from_env() -> Self {
        let orders = crate::env_usize("BENCH_DRAIN_ORDERS", 300);
        assert!(orders >= 10, "BENCH_DRAIN_ORDERS ≥ 10");
        let seconds = crate::env_usize("BENCH_DRAIN_SECONDS", 180);
        let function_timeout = Duration::from_secs(10);
        Self {
            orders,
            customers: 40,
            environments: 5,
            batch: 10,
            limit_per_s: 10,
            lock_ms: 20,
            lock_wait_ms: 200,
            function_timeout,
            visibility: function_timeout * 6,
            max_receive_count: 250,
            time_limit: Duration::from_secs(seconds as u64),
        }
    }

    /// The layer's settings for the measured part.
    fn limits(&self) -> Limits {
        Limits {
            per_endpoint_per_s: Some(self.limit_per_s as f64),
            lock_ms: Some(self.lock_ms),
            lock_wait_ms: Some(self.lock_wait_ms),
        }
    }

    /// The customer of order `n`: half of the orders go to the first quarter of the
    /// customers (many orders each, so their lock is contended), the other half spread
    /// over the rest.
    fn customer_of(&self, n: usize) -> usize {
        let many = (self.customers / 4).max(1);
        if n.is_multiple_of(2) {
            (n / 2) % many
        } else {
            many + (n / 2) % (self.customers - many).max(1)
        }
    }
}

/// What drains: a contender at its defaults, or charge-once with the template's
/// optional fleet budget (`PaymentRateBudget`) set to the provider's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entrant {
    pub contender: Contender,
    /// `PAYMENT_RATE_BUDGET`, requests a second for the whole fleet.
    pub budget: Option<u64>,
}

impl Entrant {
    pub fn name(&self) -> String {
        match self.budget {
            None => self.contender.name().to_owned(),
            Some(b) => format!("{} (PAYMENT_RATE_BUDGET={b})", self.contender.name()),
        }
    }

    /// For logs and order ids: never shared by two entrants.
    fn slug(&self) -> String {
        match self.budget {
            None => self.contender.tag().to_owned(),
            Some(b) => format!("{}-budget{b}", self.contender.tag()),
        }
    }
}

/// What one entrant's drain did.
#[derive(Clone, Debug)]
pub struct Figures {
    pub entrant: Entrant,
    pub orders: usize,
    /// Orders with at least one succeeded PaymentIntent.
    pub charged: usize,
    /// Orders with more than one.
    pub double: usize,
    /// Orders never charged, and of them what the queue and the DLQ still hold.
    pub lost: usize,
    pub left_in_queue: u64,
    pub in_dlq: usize,
    /// Whether the queue emptied within the time limit, and when (from the start of
    /// the environments).
    pub drained: bool,
    pub elapsed: Duration,
    /// From the first create the layer accepted to the last.
    pub charging: Duration,
    /// Creates the rate limit let through and refused (429 `rate_limit`), and the
    /// 429 `lock_timeout`s (any request naming a customer whose lock was held: a
    /// create, or a lookup by customer).
    pub accepted: u64,
    pub refused: u64,
    pub locks: u64,
    pub invocations: u64,
    pub failed_batches: u64,
}

impl Figures {
    /// Orders charged per second from the first charge to the last (to the end of the
    /// time limit when the backlog did not drain: the work was not done by the last
    /// charge): `charged − 1` intervals over that span.
    pub fn rate(&self) -> f64 {
        let span = self.charging.as_secs_f64();
        if self.charged < 2 || span <= 0.0 {
            return 0.0;
        }
        (self.charged - 1) as f64 / span
    }

    /// The share of creates answered 429: refused by the rate limit, or let through
    /// and then timed out on the customer's lock (every lock timeout counts as a
    /// create's, which overstates it by the lookups that timed out).
    pub fn refused_share(&self) -> f64 {
        let all = self.accepted + self.refused;
        if all == 0 {
            return 0.0;
        }
        (self.refused + self.locks).min(all) as f64 / all as f64
    }
}

/// The drain of every contender, in [`CONTENDERS`] order, charge-once twice: at the
/// template's defaults, and with the fleet budget set to the limit.
pub struct Drain {
    pub setup: Setup,
    pub figures: Vec<Figures>,
    pub elapsed: Duration,
}

impl Drain {
    pub async fn run(setup: Setup) -> Self {
        let started = Instant::now();
        let mut figures = Vec::new();
        let budgeted = Entrant {
            contender: Contender::ChargeOnce,
            budget: Some(setup.limit_per_s),
        };
        let entrants = CONTENDERS
            .map(|contender| Entrant {
                contender,
                budget: None,
            })
            .into_iter()
            .flat_map(|e| {
                let extra = (e.contender == Contender::ChargeOnce).then_some(budgeted);
                std::iter::once(e).chain(extra)
            });
        for entrant in entrants {
            let f = drain_one(entrant, &setup).await;
            eprintln!(
                "bench: drain {}: {} of {} charged in {:.1} s, {:.2}/s, {:.1} % refused",
                entrant.name(),
                f.charged,
                f.orders,
                f.elapsed.as_secs_f64(),
                f.rate(),
                f.refused_share() * 100.0
            );
            figures.push(f);
        }
        Self {
            setup,
            figures,
            elapsed: started.elapsed(),
        }
    }

    fn of(&self, contender: Contender, budget: Option<u64>) -> &Figures {
        let entrant = Entrant { contender, budget };
        self.figures.iter().find(|f| f.entrant == entrant).unwrap()
    }

    /// The goal (DESIGN §9) for charge-once at the template's defaults (`None`) or
    /// with the fleet budget: it drains at ≥ 0.9 of the limit with ≤ 5 % of creates
    /// refused, and better than each peer in the same run.
    pub fn goal(&self, budget: Option<u64>) -> (bool, String) {
        let limit = self.setup.limit_per_s as f64;
        let co = self.of(Contender::ChargeOnce, budget);
        let ratio = co.rate() / limit;
        let share = co.refused_share();
        let mut short = Vec::new();
        if !co.drained {
            short.push(format!(
                "did not drain in {} s",
                self.setup.time_limit.as_secs()
            ));
        }
        if ratio < 0.9 {
            short.push(format!("ratio {ratio:.2}, {:.2} short of 0.9", 0.9 - ratio));
        }
        if share > 0.05 {
            short.push(format!(
                "{:.1} % refused, {:.1} points over 5 %",
                share * 100.0,
                (share - 0.05) * 100.0
            ));
        }
        if co.double > 0 || co.lost > 0 {
            short.push(format!("{} double, {} lost", co.double, co.lost));
        }
        for peer in PEERS {
            let p = self.of(peer, None);
            let better = co.drained
                && co.lost == 0
                && co.rate() > p.rate()
                && (!p.drained || co.elapsed < p.elapsed);
            if !better {
                short.push(format!("not better than {}", peer.name()));
            }
        }
        let measured = format!("ratio {ratio:.2}, {:.1} % refused", share * 100.0);
        if short.is_empty() {
            (true, format!("{measured}: met"))
        } else {
            (false, format!("{measured}: not met ({})", short.join("; ")))
        }
    }

    pub fn markdown(&self) -> String {
        let s = &self.setup;
        let (_, goal) = self.goal(None);
        let (_, budgeted) = self.goal(Some(s.limit_per_s));
        let mut md = vec![
            "## The drain".to_owned(),
            String::new(),
            format!(
                "A backlog of {} orders of {} localstripe customers (half of them from a \
                 quarter of the customers), each contender in turn: {} execution environments \
                 in Lambda mode fed by the event-source poller from one moto SQS queue (batch \
                 {}, function timeout {} s, visibility {} s, {} receives), paying at \
                 localstripe behind its layer: {} creates a second, a customer's lock held {} \
                 ms per create and waited for at most {} ms. Rate: orders charged per second \
                 from the first create the layer let through to the last; refused: the share of \
                 creates answered 429, by the rate limit or a customer's lock (every lock \
                 timeout counted as a create's). At most {} s per \
                 contender. Took {:.0?}.",
                s.orders,
                s.customers,
                s.environments,
                s.batch,
                s.function_timeout.as_secs(),
                s.visibility.as_secs(),
                s.max_receive_count,
                s.limit_per_s,
                s.lock_ms,
                s.lock_wait_ms,
                s.time_limit.as_secs(),
                self.elapsed
            ),
            String::new(),
            format!(
                "**Goal: ≥ 0.9 of the limit, ≤ 5 % refused, better than each peer: at the \
                 template's defaults, {goal}.** With `PaymentRateBudget` set to the limit: \
                 {budgeted}."
            ),
            String::new(),
            "| contender | orders | charged | double | lost (queue / DLQ) | drain time | rate /s | limit /s | ratio | refused | creates let through / rate-limited / lock timeouts | invocations (whole-batch failures) |".into(),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into(),
        ];
        for f in &self.figures {
            let time = if f.drained {
                format!("{:.1} s", f.elapsed.as_secs_f64())
            } else {
                format!("did not drain in {} s", s.time_limit.as_secs())
            };
            md.push(format!(
                "| {} | {} | {} | {} | {} ({} / {}) | {time} | {:.2} | {} | {:.2} | {:.1} % | {} / {} / {} | {} ({}) |",
                f.entrant.name(),
                f.orders,
                f.charged,
                f.double,
                f.lost,
                f.left_in_queue,
                f.in_dlq,
                f.rate(),
                s.limit_per_s,
                f.rate() / s.limit_per_s as f64,
                f.refused_share() * 100.0,
                f.accepted,
                f.refused,
                f.locks,
                f.invocations,
                f.failed_batches,
            ));
        }
        md.join("\n")
    }

    pub fn json(&self) -> Value {
        let s = &self.setup;
        let (met, goal) = self.goal(None);
        let (budget_met, budgeted) = self.goal(Some(s.limit_per_s));
        let contenders: serde_json::Map<String, Value> = self
            .figures
            .iter()
            .map(|f| {
                (
                    f.entrant.name(),
                    json!({
                        "orders": f.orders,
                        "charged": f.charged,
                        "double": f.double,
                        "lost": f.lost,
                        "left_in_queue": f.left_in_queue,
                        "in_dlq": f.in_dlq,
                        "drained": f.drained,
                        "drain_s": f.elapsed.as_secs_f64(),
                        "first_to_last_charge_s": f.charging.as_secs_f64(),
                        "rate_per_s": f.rate(),
                        "ratio_to_limit": f.rate() / s.limit_per_s as f64,
                        "creates_let_through": f.accepted,
                        "creates_rate_limited": f.refused,
                        "refused_share": f.refused_share(),
                        "lock_timeouts": f.locks,
                        "invocations": f.invocations,
                        "failed_batches": f.failed_batches,
                    }),
                )
            })
            .collect();
        json!({
            "setup": {
                "orders": s.orders,
                "customers": s.customers,
                "environments": s.environments,
                "batch": s.batch,
                "limit_per_s": s.limit_per_s,
                "lock_ms": s.lock_ms,
                "lock_wait_ms": s.lock_wait_ms,
                "function_timeout_s": s.function_timeout.as_secs(),
                "visibility_s": s.visibility.as_secs(),
                "max_receive_count": s.max_receive_count,
                "time_limit_s": s.time_limit.as_secs(),
            },
            "goal": {"target": "≥ 0.9 of the limit, ≤ 5 % refused, better than each peer",
                     "met": met, "measured": goal,
                     "with_budget": {"met": budget_met, "measured": budgeted}},
            "elapsed_s": self.elapsed.as_secs_f64(),
            "contenders": contenders,
        })
    }
}

// --- The layer ----------------------------------------------------------------------

/// The layer's counters since its limits were set: creates let through and refused by
/// the rate limit, and lock timeouts (on any request naming a customer).
async fn counters() -> (u64, u64, u64) {
    let counters = localstripe::limit_counters().await;
    let (accepted, refused) = counters.of(CREATE);
    (accepted, refused, counters.locks)
}

// --- One contender ------------------------------------------------------------------

/// One execution environment: its Runtime API and the contender's process on it.
struct Environment {
    child: Child,
}

impl Drop for Environment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn drain_one(entrant: Entrant, setup: &Setup) -> Figures {
    let contender = entrant.contender;
    set_limits(Limits::OFF).await;
    let run = format!(
        "{}-drain-{}",
        entrant.slug(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let mut payers: Vec<Payer> = Vec::new();
    for _ in 0..setup.customers {
        payers.push(localstripe::payer(Card::Visa).await);
    }
    let amounts: BTreeMap<String, u64> = (0..setup.orders)
        .map(|n| (format!("{run}-{n}"), 500 + n as u64))
        .collect();
    let bodies: Vec<String> = (0..setup.orders)
        .map(|n| {
            let payer = &payers[setup.customer_of(n)];
            json!({"id": format!("{run}-{n}"), "amount": 500 + n as u64, "currency": "EUR",
                   "customer": payer.customer, "payment_method": payer.card})
            .to_string()
        })
        .collect();
    let queues = Arc::new(Queues::create(setup.visibility, setup.max_receive_count).await);
    queues.send(&bodies).await;
    let table = Backend::Dynalite.fresh_table().await;
    let endpoints = queues.endpoints(
        Backend::Dynalite.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );

    set_limits(setup.limits()).await;
    let (accepted_before, refused_before, locks_before) = counters().await;
    let stats = Arc::new(EsmStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut environments = Vec::new();
    let mut pollers = Vec::new();
    let started = Instant::now();
    for i in 0..setup.environments {
        let runtime = Arc::new(RuntimeApi::start().await);
        let log = harness::log_dir().join(format!("bench-drain-{}-{i}.log", entrant.slug()));
        let _ = std::fs::remove_file(&log); // this run's lines only
        let output = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap()
        };
        let mut command = contender.command();
        lambda_environment(&mut command, &runtime.addr, &endpoints)
            .env("PAYMENT_TIMEOUT_SECONDS", "1") // the peers' spelling
            // What the template sets from MaximumConcurrency (and PaymentRateBudget).
            .env(
                "EVENT_SOURCE_MAX_CONCURRENCY",
                setup.environments.to_string(),
            )
            .stdin(Stdio::null())
            .stdout(output())
            .stderr(output());
        if let Some(budget) = entrant.budget {
            command.env("PAYMENT_RATE_BUDGET", budget.to_string());
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", contender.name()));
        environments.push(Environment { child });
        pollers.push(tokio::spawn(poll(
            queues.clone(),
            runtime,
            stats.clone(),
            stop.clone(),
            setup.function_timeout,
        )));
    }

    // Sample the layer's accepted creates against wall time until the queue is empty
    // three samples in a row, or the time limit.
    let mut first_charge: Option<Duration> = None;
    let mut last_charge = Duration::ZERO;
    let mut seen = accepted_before;
    let mut empty_in_a_row = 0;
    let mut empty_since = Duration::ZERO;
    let mut drained = false;
    while started.elapsed() < setup.time_limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (accepted, _, _) = counters().await;
        if accepted > seen {
            seen = accepted;
            let now = started.elapsed();
            first_charge.get_or_insert(now);
            last_charge = now;
        }
        if queues.pending().await == 0 {
            if empty_in_a_row == 0 {
                empty_since = started.elapsed();
            }
            empty_in_a_row += 1;
            if empty_in_a_row >= 3 {
                drained = true;
                break;
            }
        } else {
            empty_in_a_row = 0;
        }
    }
    let elapsed = if drained {
        empty_since
    } else {
        setup.time_limit
    };
    // A poller ends after the invocation it is in: at most one function timeout.
    stop.store(true, Ordering::Relaxed);
    for poller in pollers {
        let bounded = tokio::time::timeout(setup.function_timeout * 2, poller).await;
        assert!(
            bounded.is_ok(),
            "{}: a poller did not stop",
            contender.name()
        );
    }
    drop(environments);
    let (accepted, refused, locks) = counters().await;
    set_limits(Limits::OFF).await;

    let charges = charges_by_order(&run).await;
    for (order, paid) in &charges {
        let amount = amounts.get(order).unwrap_or_else(|| {
            panic!(
                "{}: {order} is not an order of the backlog",
                contender.name()
            )
        });
        assert!(
            paid.iter().all(|(a, _)| a == amount),
            "{}: {order} charged {paid:?}, ordered {amount}",
            contender.name()
        );
    }
    let charged = charges.len();
    let double = charges.values().filter(|c| c.len() > 1).count();
    let payments: usize = charges.values().map(Vec::len).sum();
    assert!(
        (accepted - accepted_before) as usize >= payments,
        "{}: {payments} payments, yet the layer accepted {} creates",
        contender.name(),
        accepted - accepted_before
    );
    if contender == Contender::ChargeOnce {
        assert_eq!(double, 0, "charge-once charged {double} orders twice");
    }
    let left_in_queue = queues.pending().await;
    let in_dlq = queues.drain_dlq().await.len();
    Figures {
        entrant,
        orders: setup.orders,
        charged,
        double,
        lost: setup.orders - charged,
        left_in_queue,
        in_dlq,
        drained,
        elapsed,
        charging: if drained {
            last_charge
        } else {
            setup.time_limit
        }
        .saturating_sub(first_charge.unwrap_or_default()),
        accepted: accepted - accepted_before,
        refused: refused - refused_before,
        locks: locks - locks_before,
        invocations: stats.invocations.load(Ordering::Relaxed),
        failed_batches: stats.batch_failures.load(Ordering::Relaxed),
    }
}
