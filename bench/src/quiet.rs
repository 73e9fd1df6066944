//! A quiet day (docs/performance.md, "A quiet day"): what one order's latency is when
//! orders arrive well below the provider's limit, in a fresh execution environment and
//! in a warm one, for each contender, beside the provider's own answer time measured in
//! the same run; and what charge-once's pacer made its calls wait (nothing was refused,
//! so nothing should wait).
//!
//! Method. Each round, each contender (order rotated per round) gets a new process
//! under its own Runtime API (a fresh execution environment), with its own table on
//! dynalite behind the rig's 5 ms proxy, paying at localstripe behind its layer with the
//! drain's limit on creates and the customer lock on. It is sent `ORDERS` orders, one
//! invocation of one record each, `GAP` apart (a fifth of the limit, whatever the
//! contender's speed; two fifths with the provider's timed creates): the first `FRESH` are the fresh environment's, the rest the warm
//! one's. After each order the bench creates and confirms one PaymentIntent of the
//! same shape straight at the layer, timed: the provider's own answer. An order's
//! latency is its invocation's wall time (the Runtime API's event to its response).
//! charge-once's pacing waits are read from its metric lines (`pacing_wait_ms`, only
//! recorded when a call waited).
//!
//! It asserts that every order was charged once (no item failure, one PaymentIntent per
//! order at the layer); it asserts nothing about speed.

use std::time::{Duration, Instant};

use harness::localstripe::{self, Card, Limits, Payer, set_limits};
use harness::producer::charges_by_order;
use harness::runtime_api::RuntimeApi;
use harness::servers::{Backend, localstripe_url};
use serde_json::{Value, json};

use crate::rig::{CONTENDERS, Contender, Lane, Rig};
use crate::statistics::{median, percentile};

/// Orders per environment, the fresh environment's share of them, and the time between
/// two orders' arrivals.
const ORDERS: usize = 12;
const FRESH: usize = 3;
const GAP: Duration = Duration::from_millis(500);
/// The drain's limit on creates (`drain::Setup`), so that a quiet day is quiet against
/// the same provider: 2 orders a second is a fifth of it.
const LIMIT_PER_S: f64 = 10.0;
const STORE_LATENCY: Duration = Duration::from_millis(5);

/// One contender's latencies over every round, in ms.
#[derive(Default)]
struct Latencies {
    fresh: Vec<f64>,
    warm: Vec<f64>,
    /// charge-once only: the pacing waits its metric lines recorded, and their sum.
    pacing_waits: usize,
    pacing_wait_ms: f64,
}

pub struct Quiet {
    rounds: usize,
    by_contender: Vec<(Contender, Latencies)>,
    /// The provider's own answer time to a create, in ms, over every round.
    provider: Vec<f64>,
    elapsed: Duration,
}

impl Quiet {
    pub async fn run(rounds: usize) -> Self {
        let started = Instant::now();
        set_limits(Limits {
            per_endpoint_per_s: Some(LIMIT_PER_S),
            lock_ms: Some(20),
            lock_wait_ms: Some(200),
        })
        .await;
        let mut by_contender: Vec<(Contender, Latencies)> = CONTENDERS
            .iter()
            .map(|c| (*c, Latencies::default()))
            .collect();
        let mut provider = Vec::new();
        let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
        for round in 0..rounds {
            for i in 0..CONTENDERS.len() {
                let contender = CONTENDERS[(i + round) % CONTENDERS.len()];
                let prefix = format!("{}-quiet-{run}-{round}", contender.tag());
                let (latencies, answers) = environment(contender, &prefix).await;
                let entry = &mut by_contender
                    .iter_mut()
                    .find(|(c, _)| *c == contender)
                    .unwrap()
                    .1;
                entry.fresh.extend_from_slice(&latencies.fresh);
                entry.warm.extend_from_slice(&latencies.warm);
                entry.pacing_waits += latencies.pacing_waits;
                entry.pacing_wait_ms += latencies.pacing_wait_ms;
                provider.extend(answers);
            }
            eprintln!("bench: quiet day round {} of {rounds}", round + 1);
        }
        set_limits(Limits::OFF).await;
        Self {
            rounds,
            by_contender,
            provider,
            elapsed: started.elapsed(),
        }
    }

    pub fn markdown(&self) -> String {
        let provider = median(&self.provider);
        let mut md = vec![
            "## A quiet day".to_owned(),
            String::new(),
            format!(
                "Each of {} rounds, each contender (order rotated per round) in a new \
                 execution environment (a process under its own Runtime API; its table on \
                 dynalite behind a {} ms proxy) pays {ORDERS} orders, one record per \
                 invocation, {} ms apart: {:.0} orders a second ({:.0} creates a second with \
                 the provider's timed ones below) against localstripe's limit of \
                 {LIMIT_PER_S:.0} creates a second (its layer, the customer lock on). The \
                 first {FRESH} orders are the fresh environment's, the other {} the warm \
                 one's. Latency: the invocation's wall time. The provider's answer: one \
                 PaymentIntent of the same shape created and confirmed straight at the \
                 layer after each order, timed ({} answers, p50 {provider:.1} ms, p99 {:.1} \
                 ms). Took {:.0?}.",
                self.rounds,
                STORE_LATENCY.as_millis(),
                GAP.as_millis(),
                1000.0 / GAP.as_millis() as f64,
                2000.0 / GAP.as_millis() as f64,
                ORDERS - FRESH,
                self.provider.len(),
                percentile(&self.provider, 99.0),
                self.elapsed
            ),
            String::new(),
            "| contender | fresh p50 / p99 ms | warm p50 / p99 ms | warm p50 over the provider's p50 ms | pacing waits (ms in all) |".into(),
            "| --- | --- | --- | --- | --- |".into(),
        ];
        for (contender, l) in &self.by_contender {
            let pacing = if *contender == Contender::ChargeOnce {
                format!("{} ({:.0})", l.pacing_waits, l.pacing_wait_ms)
            } else {
                "no pacer".to_owned()
            };
            md.push(format!(
                "| {} | {:.1} / {:.1} | {:.1} / {:.1} | {:+.1} | {pacing} |",
                contender.name(),
                median(&l.fresh),
                percentile(&l.fresh, 99.0),
                median(&l.warm),
                percentile(&l.warm, 99.0),
                median(&l.warm) - provider,
            ));
        }
        md.join("\n") + "\n"
    }

    pub fn json(&self) -> Value {
        let contenders: serde_json::Map<String, Value> = self
            .by_contender
            .iter()
            .map(|(c, l)| {
                let mut figures = json!({
                    "fresh_ms": {"p50": median(&l.fresh), "p99": percentile(&l.fresh, 99.0),
                                 "orders": l.fresh.len()},
                    "warm_ms": {"p50": median(&l.warm), "p99": percentile(&l.warm, 99.0),
                                "orders": l.warm.len()},
                    "warm_p50_over_provider_p50_ms": median(&l.warm) - median(&self.provider),
                });
                if *c == Contender::ChargeOnce {
                    figures["pacing_waits"] = l.pacing_waits.into();
                    figures["pacing_wait_ms"] = l.pacing_wait_ms.into();
                }
                (c.name().to_owned(), figures)
            })
            .collect();
        json!({
            "setup": {
                "rounds": self.rounds,
                "orders_per_environment": ORDERS,
                "fresh_orders": FRESH,
                "gap_ms": GAP.as_millis() as u64,
                "limit_per_s": LIMIT_PER_S,
                "store_latency_ms": STORE_LATENCY.as_millis() as u64,
            },
            "provider_ms": {"p50": median(&self.provider), "p99": percentile(&self.provider, 99.0),
                            "answers": self.provider.len()},
            "elapsed_s": self.elapsed.as_secs_f64(),
            "contenders": contenders,
        })
    }
}

/// One fresh environment of `contender`: its orders' latencies, and the provider's
/// answers timed between them.
async fn environment(contender: Contender, prefix: &str) -> (Latencies, Vec<f64>) {
    let rig = Rig::new(Backend::Dynalite, STORE_LATENCY).await;
    let payer = localstripe::payer(Card::Visa).await;
    let direct = localstripe::payer(Card::Visa).await;
    let log = harness::log_dir().join(format!("bench-quiet-{}.log", contender.name()));
    let _ = std::fs::remove_file(&log); // this environment's lines only
    let lane = Lane::spawn_logged(
        contender,
        contender.command(),
        &rig,
        localstripe_url(),
        RuntimeApi::start().await,
        log.clone(),
    );
    let mut latencies = Latencies::default();
    let mut answers = Vec::new();
    for n in 0..ORDERS {
        let arrival = Instant::now();
        let body = json!({"id": format!("{prefix}-{n}"), "amount": 500 + n, "currency": "EUR",
                          "customer": payer.customer, "payment_method": payer.card});
        let (elapsed, failures) = lane.invoke(crate::rig::event_of(&[body.to_string()])).await;
        assert_eq!(
            failures,
            0,
            "{}: order {n} failed; see {}",
            contender.name(),
            log.display()
        );
        let ms = elapsed.as_secs_f64() * 1000.0;
        if n < FRESH {
            latencies.fresh.push(ms);
        } else {
            latencies.warm.push(ms);
        }
        answers.push(provider_answer(&direct, &format!("{prefix}-direct-{n}")).await);
        tokio::time::sleep(GAP.saturating_sub(arrival.elapsed())).await;
    }
    drop(lane);
    let charges = charges_by_order(prefix).await;
    let orders = charges.keys().filter(|o| !o.contains("-direct-")).count();
    let double = charges.values().filter(|c| c.len() > 1).count();
    assert_eq!(
        (orders, double),
        (ORDERS, 0),
        "{}: every order charged once",
        contender.name()
    );
    if contender == Contender::ChargeOnce {
        (latencies.pacing_waits, latencies.pacing_wait_ms) = pacing_waits(&log);
    }
    (latencies, answers)
}

/// One create and confirm straight at the layer, in ms.
async fn provider_answer(payer: &Payer, order_id: &str) -> f64 {
    let started = Instant::now();
    let intent = localstripe::charge_directly(payer, 500, order_id).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(intent["status"], "succeeded", "a direct charge: {intent}");
    ms
}

/// The pacing waits charge-once's metric lines in `log` recorded: how many, and their
/// sum in ms (a histogram's values are one number or a list).
fn pacing_waits(log: &std::path::Path) -> (usize, f64) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut waits = 0;
    let mut sum = 0.0;
    for line in text.lines() {
        let Ok(doc) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match &doc["pacing_wait_ms"] {
            Value::Number(n) => {
                waits += 1;
                sum += n.as_f64().unwrap();
            }
            Value::Array(values) => {
                waits += values.len();
                sum += values.iter().filter_map(Value::as_f64).sum::<f64>();
            }
            _ => {}
        }
    }
    (waits, sum)
}
