//! What is measured: the scenarios and the cells of the matrix, and the runs that
//! fill them (cells, cold starts, store calls, the store's own cost per request).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::runtime_api::RuntimeApi;
use harness::servers::Backend;

use crate::rig::{CONTENDERS, Contender, Lane, REFUSED, Rig, event, payment_stub};
use crate::statistics::{Calls, CellFigures, RoundFigures};
use crate::{COLD_STARTS, SEEDS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Fresh,
    TenPercentDuplicates,
    InBatchDuplicates,
    TenPercentFailures,
    AllDuplicates,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Self::Fresh => "all fresh",
            Self::TenPercentDuplicates => "10% duplicates",
            Self::InBatchDuplicates => "in-batch duplicates",
            Self::TenPercentFailures => "10% payment failures",
            Self::AllDuplicates => "all duplicates",
        }
    }

    pub fn slug(self) -> &'static str {
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
    pub fn ids(self, prefix: &str, seed: &str, b: usize, size: usize) -> Vec<String> {
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
    pub fn all_succeed(self) -> bool {
        matches!(
            self,
            Self::Fresh | Self::TenPercentDuplicates | Self::AllDuplicates
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub scenario: Scenario,
    pub batch: usize,
    pub store_ms: u64,
    pub payment_ms: u64,
}

impl Cell {
    pub fn slug(&self) -> String {
        format!(
            "{}-b{}-s{}-p{}",
            self.scenario.slug(),
            self.batch,
            self.store_ms,
            self.payment_ms
        )
    }

    pub fn label(&self) -> String {
        format!(
            "{}, batch {}, store {} ms, payment {} ms",
            self.scenario.name(),
            self.batch,
            self.store_ms,
            self.payment_ms
        )
    }
}

pub const SCENARIOS: [Scenario; 4] = [
    Scenario::Fresh,
    Scenario::TenPercentDuplicates,
    Scenario::InBatchDuplicates,
    Scenario::TenPercentFailures,
];

pub fn matrix(full: bool) -> Vec<Cell> {
    if !full {
        // Every scenario at batch 10, and fresh orders at batch 1: many queues run at
        // batch size 1, where the fixed cost of an invocation is the cost of a record.
        return SCENARIOS
            .iter()
            .map(|&scenario| Cell {
                scenario,
                batch: 10,
                store_ms: 5,
                payment_ms: 50,
            })
            .chain([Cell {
                scenario: Scenario::Fresh,
                batch: 1,
                store_ms: 5,
                payment_ms: 50,
            }])
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

// --- The cells ----------------------------------------------------------------------

pub async fn run_cell(cell: Cell, rounds: usize, records: usize) -> CellFigures {
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

/// Instructions the release binary executes, from callgrind: per invocation and per
/// record, fresh orders, at one batch size.
#[derive(Clone, Copy, Debug)]
pub struct Instructions {
    pub batch: usize,
    pub per_invocation: u64,
    pub per_record: u64,
}

/// Invocations of the short and the long process of [`instructions`].
const FEW: usize = 4;
const MANY: usize = 16;

/// Instructions per invocation and per record of the release binary, counted by
/// callgrind (the same for the same binary and input, whatever else the machine does),
/// for fresh orders at batch 1 and batch 10 on dynalite and the payment stub: one
/// process serves `FEW` invocations and another `MANY`, each under callgrind, and the
/// difference over `MANY - FEW` invocations leaves the cold start and the exit out.
/// The callgrind files stay in the log directory for `callgrind_annotate`.
pub async fn instructions() -> Vec<Instructions> {
    let payment = payment_stub(Duration::ZERO).await;
    let mut out = Vec::new();
    for batch in [1, 10] {
        out.push(instructions_at(&payment, &crate::charge_once_bin(), batch, &[]).await);
    }
    out
}

/// [`instructions`] at one batch size, with `env` added to charge-once's environment
/// (traces exported, `traces.rs`).
pub async fn instructions_at(
    payment: &str,
    bin: &std::path::Path,
    batch: usize,
    env: &[(&'static str, String)],
) -> Instructions {
    let few = callgrind_total(payment, bin, batch, FEW, env).await;
    let many = callgrind_total(payment, bin, batch, MANY, env).await;
    let per_invocation = many.saturating_sub(few) / (MANY - FEW) as u64;
    Instructions {
        batch,
        per_invocation,
        per_record: per_invocation / batch as u64,
    }
}

/// Every instruction of one charge-once process that serves `invocations` batches of
/// `batch` fresh orders and then gets SIGTERM (callgrind writes its counts on exit).
async fn callgrind_total(
    payment: &str,
    bin: &std::path::Path,
    batch: usize,
    invocations: usize,
    env: &[(&'static str, String)],
) -> u64 {
    let contender = Contender::ChargeOnce;
    let rig = Rig::new(Backend::Dynalite, Duration::ZERO).await;
    let tag = format!(
        "-{}{}",
        bin.file_name().unwrap_or_default().to_string_lossy(),
        if env.is_empty() { "" } else { "-env" }
    );
    let file = harness::log_dir().join(format!("callgrind-b{batch}-x{invocations}{tag}.out"));
    let _ = std::fs::remove_file(&file);
    let mut command = Command::new("valgrind");
    command
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(bin);
    let log = harness::log_dir().join(format!("bench-callgrind{tag}.log"));
    let lane = Lane::spawn_with_env(
        contender,
        command,
        &rig,
        payment,
        RuntimeApi::start().await,
        log,
        env,
    );
    let run = uuid::Uuid::new_v4().simple().to_string();
    for i in 0..invocations {
        let ids: Vec<String> = (0..batch).map(|r| format!("ci-{run}-{i}-{r}")).collect();
        let (_, failures) = lane.invoke(event(&ids)).await;
        assert_eq!(failures, 0, "under callgrind: see {}", lane.log.display());
    }
    let pid = lane.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success(), "kill -TERM {pid}");
    // callgrind writes its file as the process ends: bounded wait (valgrind is slow).
    for _ in 0..600 {
        if let Some(total) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| callgrind_summary(&text))
        {
            return total;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no callgrind summary in {} within 60 s; see {}",
        file.display(),
        lane.log.display()
    )
}

/// The `summary:` (or `totals:`) line of a callgrind file: instructions executed.
fn callgrind_summary(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Spawn → first `next`, and spawn → the answer to a first batch of 10 fresh orders
/// (queued before the spawn) at 5 ms store and 50 ms payment.
pub async fn cold_starts() -> BTreeMap<Contender, (Vec<f64>, Vec<f64>, f64)> {
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
pub async fn dynalite_cost_per_call() -> BTreeMap<&'static str, f64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    use charge_once::contracts::store::IdempotencyStore;
    pub const CALLS: u32 = 200;
    let table = Backend::Dynalite.fresh_table().await;
    let now = charge_once::domain::clock::Time::from_ms(1_764_460_800_000);
    let started = Instant::now();
    for i in 0..CALLS {
        let order = charge_once::domain::order::Order::new(
            &format!("cost-{i}"),
            1000,
            "EUR",
            "cus_bench",
            "pm_card_visa",
        )
        .unwrap();
        let lease = harness::lease::Lease::of(&order, "bench", now)
            .expiring(now + Duration::from_secs(86_400));
        table
            .store
            .write(&charge_once::contracts::store::Write::Reserve(
                lease.request(),
            ))
            .await
            .unwrap();
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

/// Store calls for 10 fresh, 10 duplicate and 10 failed records, on moto.
pub async fn store_calls() -> BTreeMap<Contender, [Calls; 3]> {
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
