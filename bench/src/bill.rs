//! The bill (docs/performance.md, "The bill"): what a Lambda user pays for each contender, with
//! Lambda's CPU share emulated. Each contender process (and its children) runs in a
//! cgroup v1 whose CFS quota is `memory_mb / 1769` of one CPU and whose memory limit is
//! the size itself; the servers, proxies and the payment stub stay unthrottled. Billed
//! duration is the Runtime API's hand-out → response, rounded up to the ms; INIT is
//! billed too, once per `BENCH_INVOCATIONS_PER_COLD_START` invocations. The floor is
//! the request fee plus what waiting alone costs at 128 MB: the store and payment
//! latencies on one invocation's critical path (concurrent groups of at most
//! `MAX_CONCURRENCY`), divided by the batch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::runtime_api::RuntimeApi;
use harness::servers::Backend;
use serde_json::{Value, json};

use crate::rig::{CONTENDERS, Contender, Lane, PEERS, Rig, event, payment_stub};
use crate::statistics::percentile;

/// One vCPU per 1,769 MB (Lambda's documented share).
const MB_PER_VCPU: f64 = 1769.0;
/// The kernel refuses a CFS quota below 1 ms.
const MIN_QUOTA_US: u64 = 1000;
const STORE_MS: u64 = 5;
const PAYMENT_MS: u64 = 50;
/// Records processed at once by charge-once (`MAX_CONCURRENCY`): the floor's critical
/// path is one store round trip twice and a payment per round of this many.
const CONCURRENCY: usize = 10;
/// Orders each contender charges per cell (so a batch-40 cell has two invocations).
const ORDERS_PER_CELL: usize = 80;

/// List prices (parameters with today's defaults).
#[derive(Clone, Copy, Debug)]
pub struct Prices {
    pub arm64_gb_s: f64,
    pub x86_gb_s: f64,
    pub per_request: f64,
    pub invocations_per_cold_start: f64,
}

impl Prices {
    pub fn from_env() -> Self {
        let f = |name: &str, default: f64| {
            std::env::var(name)
                .ok()
                .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
                .unwrap_or(default)
        };
        Self {
            arm64_gb_s: f("BENCH_PRICE_ARM64_GB_S", 0.000_013_333_4),
            x86_gb_s: f("BENCH_PRICE_X86_GB_S", 0.000_016_666_7),
            per_request: f("BENCH_PRICE_REQUEST", 0.000_000_2),
            invocations_per_cold_start: f("BENCH_INVOCATIONS_PER_COLD_START", 100.0),
        }
    }
}

/// One cell of the bill: a memory size, a CFS period, a batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BillCell {
    pub memory_mb: u64,
    pub period_ms: u64,
    pub batch: usize,
}

/// The default grid: 128 MB at both periods, 1024 MB at the kernel's, batches 1, 10
/// and the template's largest (40). `FULL=1`: 128, 256, 512 and 1024 MB at both.
/// `BENCH_MEMORY=128,256,…` (MB): those sizes, each at both periods.
pub fn grid(full: bool) -> Vec<BillCell> {
    const BOTH: &[u64] = &[100, 20];
    let sizes: Vec<(u64, &[u64])> = match std::env::var("BENCH_MEMORY") {
        Ok(list) => list
            .split(',')
            .map(|mb| {
                let mb = mb.trim().parse().unwrap_or_else(|_| {
                    panic!("BENCH_MEMORY takes sizes in MB (128,256,…), got {list:?}")
                });
                (mb, BOTH)
            })
            .collect(),
        Err(_) if full => [128, 256, 512, 1024].map(|mb| (mb, BOTH)).to_vec(),
        Err(_) => vec![(128, BOTH), (1024, &[100])],
    };
    let mut cells = Vec::new();
    for (memory_mb, periods) in sizes {
        for &period_ms in periods {
            for batch in [1, 10, 40] {
                cells.push(BillCell {
                    memory_mb,
                    period_ms,
                    batch,
                });
            }
        }
    }
    cells
}

/// What one contender did in one cell.
#[derive(Clone, Debug)]
pub enum Measured {
    Ran {
        /// Billed ms per invocation (rounded up), in order.
        billed_ms: Vec<f64>,
        init_ms: f64,
        failed_records: usize,
        records: usize,
    },
    /// Killed by the memory limit (or died) before answering.
    DoesNotRun { reason: String },
}

/// The emulated share, or why there is none.
enum Share {
    Cgroup(Cgroup),
    Unthrottled(String),
}

/// A cgroup v1 pair (`cpu`, `memory`) for one contender process.
struct Cgroup {
    cpu: PathBuf,
    memory: PathBuf,
}

impl Cgroup {
    fn create(name: &str, cell: BillCell) -> Result<Self, String> {
        let root = Path::new("/sys/fs/cgroup");
        let cpu = root.join("cpu/charge-once-bench").join(name);
        let memory = root.join("memory/charge-once-bench").join(name);
        for dir in [&cpu, &memory] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let period_us = cell.period_ms * 1000;
        let quota_us =
            ((period_us as f64 * cell.memory_mb as f64 / MB_PER_VCPU) as u64).max(MIN_QUOTA_US);
        let write = |path: PathBuf, value: String| {
            std::fs::write(&path, &value).map_err(|e| format!("{}: {e}", path.display()))
        };
        write(cpu.join("cpu.cfs_period_us"), period_us.to_string())?;
        write(cpu.join("cpu.cfs_quota_us"), quota_us.to_string())?;
        let bytes = cell.memory_mb * 1024 * 1024;
        write(memory.join("memory.limit_in_bytes"), bytes.to_string())?;
        // No swap to hide in: a contender that does not fit is killed.
        let _ = write(
            memory.join("memory.memsw.limit_in_bytes"),
            bytes.to_string(),
        );
        Ok(Self { cpu, memory })
    }

    /// `command` started inside this cgroup: a shell joins it, then execs the
    /// contender, so the contender and its children are inside from their first
    /// instruction.
    fn wrap(&self, command: &Command) -> Command {
        let mut wrapped = Command::new("sh");
        wrapped
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.cpu.display(),
                self.memory.display()
            ))
            .arg("sh")
            .arg(command.get_program())
            .args(command.get_args());
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// Whether the memory controller killed a process of this cgroup.
    fn oom_killed(&self) -> bool {
        std::fs::read_to_string(self.memory.join("memory.oom_control"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .is_some_and(|n| n > 0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cpu);
        let _ = std::fs::remove_dir(&self.memory);
    }
}

/// Every contender in every cell; plus the line that says whether the share was
/// emulated.
pub async fn bill(cells: &[BillCell]) -> (BTreeMap<(BillCell, Contender), Measured>, String) {
    let payment = payment_stub(Duration::from_millis(PAYMENT_MS)).await;
    let mut out = BTreeMap::new();
    let mut share_note =
        "CPU share emulated with cgroup v1 (cpu.cfs_quota_us, memory.limit_in_bytes)".to_owned();
    for (n, cell) in cells.iter().enumerate() {
        for contender in CONTENDERS {
            let name = format!("{}-{}-{n}", contender.tag(), std::process::id());
            let share = match Cgroup::create(&name, *cell) {
                Ok(cgroup) => Share::Cgroup(cgroup),
                Err(why) => Share::Unthrottled(why),
            };
            if let Share::Unthrottled(why) = &share {
                share_note = format!(
                    "UNTHROTTLED: cgroups could not be written ({why}); every figure is without Lambda's CPU share"
                );
            }
            let measured = measure(contender, *cell, &share, &payment, n, &[]).await;
            eprintln!(
                "bench: bill {} {cell:?}: {}",
                contender.name(),
                summary(&measured)
            );
            out.insert((*cell, contender), measured);
        }
    }
    (out, share_note)
}

fn summary(m: &Measured) -> String {
    match m {
        Measured::Ran {
            billed_ms,
            init_ms,
            failed_records,
            ..
        } => format!(
            "billed p50 {:.0} ms, init {:.0} ms, {failed_records} failed",
            percentile(billed_ms, 50.0),
            init_ms
        ),
        Measured::DoesNotRun { reason } => format!("does not run: {reason}"),
    }
}

/// charge-once alone in `cell`, with `env` added to its environment (the traces'
/// comparison, `traces.rs`), under the same emulated share as [`bill`]; and the line
/// that says whether the share was emulated.
pub async fn charge_once_with(
    cell: BillCell,
    bin: PathBuf,
    env: &[(&'static str, String)],
    n: usize,
) -> (Measured, String) {
    let payment = payment_stub(Duration::from_millis(PAYMENT_MS)).await;
    let name = format!("co-traces-{}-{n}", std::process::id());
    let (share, note) = match Cgroup::create(&name, cell) {
        Ok(cgroup) => (
            Share::Cgroup(cgroup),
            "CPU share emulated with cgroup v1 (cpu.cfs_quota_us, memory.limit_in_bytes)"
                .to_owned(),
        ),
        Err(why) => (
            Share::Unthrottled(why.clone()),
            format!("UNTHROTTLED: cgroups could not be written ({why})"),
        ),
    };
    let measured = measure_command(
        Contender::ChargeOnce,
        Command::new(bin),
        cell,
        &share,
        &payment,
        n,
        env,
    )
    .await;
    (measured, note)
}

async fn measure(
    contender: Contender,
    cell: BillCell,
    share: &Share,
    payment: &str,
    n: usize,
    env: &[(&'static str, String)],
) -> Measured {
    measure_command(contender, contender.command(), cell, share, payment, n, env).await
}

/// [`measure`] with the command that starts the contender.
async fn measure_command(
    contender: Contender,
    start: Command,
    cell: BillCell,
    share: &Share,
    payment: &str,
    n: usize,
    env: &[(&'static str, String)],
) -> Measured {
    let rig = Rig::new(Backend::Dynalite, Duration::from_millis(STORE_MS)).await;
    let command = match share {
        Share::Cgroup(cgroup) => cgroup.wrap(&start),
        Share::Unthrottled(_) => start,
    };
    let runtime = RuntimeApi::start().await;
    let log = harness::log_dir().join(format!("bench-{}.log", contender.name()));
    let mut lane = Lane::spawn_with_env(contender, command, &rig, payment, runtime, log, env);
    let invocations = ORDERS_PER_CELL.div_ceil(cell.batch);
    let mut failed_records = 0;
    for i in 0..invocations {
        let ids: Vec<String> = (0..cell.batch)
            .map(|r| {
                format!(
                    "{}-bill-{n}-{i}-{r}-{}",
                    contender.tag(),
                    uuid::Uuid::new_v4().simple()
                )
            })
            .collect();
        match lane.try_invoke(event(&ids)).await {
            Some(failures) => failed_records += failures,
            None => {
                let oom = matches!(share, Share::Cgroup(c) if c.oom_killed());
                let reason = if oom {
                    format!("killed by the {} MB memory limit", cell.memory_mb)
                } else {
                    format!(
                        "no answer within the function timeout; see {}",
                        lane.log.display()
                    )
                };
                return Measured::DoesNotRun { reason };
            }
        }
    }
    let init_ms = lane.runtime.first_next().map_or(f64::NAN, |t| {
        t.duration_since(lane.spawned).as_secs_f64() * 1000.0
    });
    let billed_ms = lane
        .runtime
        .take_billed()
        .iter()
        .map(|d| (d.as_secs_f64() * 1000.0).ceil())
        .collect();
    let _ = lane.child.kill();
    let _ = lane.child.wait();
    Measured::Ran {
        billed_ms,
        init_ms,
        failed_records,
        records: invocations * cell.batch,
    }
}

/// The bill of one contender in one cell, per million orders, at the p50 billed
/// duration: (arm64, x86_64).
pub fn cost_per_million(m: &Measured, cell: BillCell, prices: &Prices) -> Option<(f64, f64)> {
    let Measured::Ran {
        billed_ms, init_ms, ..
    } = m
    else {
        return None;
    };
    let gb = cell.memory_mb as f64 / 1024.0;
    let seconds = percentile(billed_ms, 50.0) / 1000.0
        + init_ms.max(0.0) / 1000.0 / prices.invocations_per_cold_start;
    let per_invocation = |price: f64| seconds * gb * price + prices.per_request;
    let invocations = 1e6 / cell.batch as f64;
    Some((
        per_invocation(prices.arm64_gb_s) * invocations,
        per_invocation(prices.x86_gb_s) * invocations,
    ))
}

/// The floor per million orders at `batch` (arm64, x86_64): the request fee plus what
/// the cell's I/O wait alone costs at 128 MB.
pub fn floor_per_million(batch: usize, prices: &Prices) -> (f64, f64) {
    let rounds = batch.div_ceil(CONCURRENCY) as f64;
    let wait_s = rounds * (2 * STORE_MS + PAYMENT_MS) as f64 / 1000.0;
    let per_invocation = |price: f64| wait_s * 0.125 * price + prices.per_request;
    let invocations = 1e6 / batch as f64;
    (
        per_invocation(prices.arm64_gb_s) * invocations,
        per_invocation(prices.x86_gb_s) * invocations,
    )
}

/// The bill's figures and verdicts.
pub struct Bill {
    pub measured: BTreeMap<(BillCell, Contender), Measured>,
    pub share: String,
    pub prices: Prices,
}

/// A contender's cheapest configuration: (cost per million at arm64, the cell).
pub fn cheapest(
    bill: &Bill,
    contender: Contender,
    batch: Option<usize>,
) -> Option<(f64, BillCell)> {
    bill.measured
        .iter()
        .filter(|((cell, c), _)| *c == contender && batch.is_none_or(|b| cell.batch == b))
        .filter(|((_, _), m)| {
            matches!(
                m,
                Measured::Ran {
                    failed_records: 0,
                    ..
                }
            )
        })
        .filter_map(|((cell, _), m)| cost_per_million(m, *cell, &bill.prices).map(|c| (c.0, *cell)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

impl Bill {
    /// The goals of the bill: 5× below the best peer's cheapest configuration; within
    /// 1.25× of the floor at each batch size that carries a ratio goal (above 10).
    /// `None`: reported, no goal.
    pub fn verdicts(&self) -> Vec<(String, String, String, Option<bool>)> {
        let mut out = Vec::new();
        if let Some((ours, cell)) = cheapest(self, Contender::ChargeOnce, None) {
            let best_peer = PEERS
                .iter()
                .filter_map(|p| cheapest(self, *p, None).map(|(c, cell)| (c, cell, *p)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((theirs, their_cell, peer)) = best_peer {
                let ratio = theirs / ours;
                out.push((
                    "cost per million orders, cheapest configurations".to_owned(),
                    "≥ 5× below the best peer".to_owned(),
                    format!(
                        "{ratio:.1}× (charge-once ${ours:.3} at {} MB, batch {}; {} ${theirs:.3} at {} MB, batch {})",
                        cell.memory_mb, cell.batch, peer.name(), their_cell.memory_mb, their_cell.batch
                    ),
                    Some(ratio >= 5.0),
                ));
            }
        }
        for batch in [1, 10, 40] {
            let Some((ours, cell)) = cheapest(self, Contender::ChargeOnce, Some(batch)) else {
                continue;
            };
            let floor = floor_per_million(batch, &self.prices).0;
            let multiple = ours / floor;
            let goal = batch > 10;
            out.push((
                format!("charge-once's bill against the floor, batch {batch}"),
                if goal {
                    "≤ 1.25× the floor".to_owned()
                } else {
                    "reported (no ratio goal)".to_owned()
                },
                format!(
                    "{multiple:.2}× (${ours:.3} at {} MB; floor ${floor:.3})",
                    cell.memory_mb
                ),
                goal.then_some(multiple <= 1.25),
            ));
        }
        out
    }

    /// One measured cell's row of the bill.
    fn row(&self, cell: BillCell, contender: Contender, m: &Measured) -> String {
        let floor = floor_per_million(cell.batch, &self.prices).0;
        match m {
            Measured::Ran {
                billed_ms,
                init_ms,
                failed_records,
                records,
            } => {
                let (arm, x86) =
                    cost_per_million(m, cell, &self.prices).unwrap_or((f64::NAN, f64::NAN));
                format!(
                    "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {failed_records}/{records} | {arm:.3} | {x86:.3} | {:.2} |",
                    contender.name(),
                    cell.memory_mb,
                    cell.period_ms,
                    cell.batch,
                    percentile(billed_ms, 50.0),
                    percentile(billed_ms, 99.0),
                    init_ms,
                    arm / floor
                )
            }
            Measured::DoesNotRun { reason } => format!(
                "| {} | {} | {} | {} | does not run at {} MB: {reason} | | | | | | |",
                contender.name(),
                cell.memory_mb,
                cell.period_ms,
                cell.batch,
                cell.memory_mb,
            ),
        }
    }

    /// Each contender's smallest size that runs every record, and its cheapest
    /// configuration.
    fn sizes_md(&self, md: &mut Vec<String>) {
        for contender in CONTENDERS {
            let smallest = self
                .measured
                .iter()
                .filter(|((_, c), m)| {
                    *c == contender
                        && matches!(
                            m,
                            Measured::Ran {
                                failed_records: 0,
                                ..
                            }
                        )
                })
                .map(|((cell, _), _)| cell.memory_mb)
                .min()
                .map_or("none of the sizes measured".to_owned(), |mb| {
                    format!("{mb} MB")
                });
            let cheapest =
                cheapest(self, contender, None).map_or("—".to_owned(), |(cost, cell)| {
                    format!(
                        "${cost:.3}: {} MB, batch {}, {} ms period",
                        cell.memory_mb, cell.batch, cell.period_ms
                    )
                });
            md.push(format!(
                "| {} | {smallest} | {cheapest} |",
                contender.name()
            ));
        }
    }

    pub fn markdown(&self) -> String {
        let mut md = vec![
            "## The bill".to_owned(),
            String::new(),
            format!(
                "{}. Prices: ${} per GB-s arm64, ${} x86_64, ${} per request; INIT billed once per {} invocations (BENCH_INVOCATIONS_PER_COLD_START). Store {STORE_MS} ms, payment {PAYMENT_MS} ms, {ORDERS_PER_CELL} fresh orders per contender per cell.",
                self.share,
                self.prices.arm64_gb_s,
                self.prices.x86_gb_s,
                self.prices.per_request,
                self.prices.invocations_per_cold_start
            ),
            String::new(),
            "| contender | MB | period ms | batch | billed p50 ms | p99 ms | init ms | failed | $/M orders arm64 | x86_64 | × floor |".to_owned(),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".to_owned(),
        ];
        for ((cell, contender), m) in &self.measured {
            md.push(self.row(*cell, *contender, m));
        }
        md.push(String::new());
        md.push("| the floor (request fee + the critical path's waiting at 128 MB) | batch | $/M orders arm64 | x86_64 |".to_owned());
        md.push("| --- | --- | --- | --- |".to_owned());
        for batch in [1, 10, 40] {
            let (arm, x86) = floor_per_million(batch, &self.prices);
            md.push(format!("| | {batch} | {arm:.3} | {x86:.3} |"));
        }
        md.push(String::new());
        md.push("| contender | smallest size it runs at (no failed record) | cheapest configuration, $/M orders arm64 |".to_owned());
        md.push("| --- | --- | --- |".to_owned());
        self.sizes_md(&mut md);
        md.push(String::new());
        md.push("| bill goal | goal | measured | met |".to_owned());
        md.push("| --- | --- | --- | --- |".to_owned());
        for (target, goal, measured, met) in self.verdicts() {
            let met = match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            md.push(format!("| {target} | {goal} | {measured} | {met} |"));
        }
        md.join("\n")
    }

    pub fn json(&self) -> Value {
        let cells: Vec<Value> = self
            .measured
            .iter()
            .map(|((cell, contender), m)| {
                let cost = cost_per_million(m, *cell, &self.prices);
                json!({
                    "contender": contender.name(),
                    "memory_mb": cell.memory_mb,
                    "period_ms": cell.period_ms,
                    "batch": cell.batch,
                    "measured": match m {
                        Measured::Ran { billed_ms, init_ms, failed_records, records } => json!({
                            "billed_ms": billed_ms, "init_ms": init_ms,
                            "failed_records": failed_records, "records": records,
                        }),
                        Measured::DoesNotRun { reason } => json!({"does_not_run": reason}),
                    },
                    "cost_per_million": cost.map(|(a, x)| json!({"arm64": a, "x86_64": x})),
                })
            })
            .collect();
        json!({
            "share": self.share,
            "cells": cells,
            "verdicts": self.verdicts().into_iter().map(|(t, g, m, met)| json!({"target": t, "goal": g, "measured": m, "met": met})).collect::<Vec<_>>(),
        })
    }

    /// Cost per million orders (arm64) against memory size, one line per contender,
    /// for batch 1 and batch 10 at the kernel's period, with the floor.
    pub fn chart(&self, path: &Path) {
        use plotters::prelude::*;
        let colors = crate::chart::COLORS;
        let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        let areas = root.split_evenly((2, 1));
        for (area, batch) in areas.iter().zip([1usize, 10]) {
            let series: Vec<(Contender, Vec<(f64, f64)>)> = CONTENDERS
                .iter()
                .map(|c| {
                    let points = self
                        .measured
                        .iter()
                        .filter(|((cell, k), _)| {
                            k == c && cell.batch == batch && cell.period_ms == 100
                        })
                        .filter_map(|((cell, _), m)| {
                            cost_per_million(m, *cell, &self.prices)
                                .map(|cost| (cell.memory_mb as f64, cost.0))
                        })
                        .collect();
                    (*c, points)
                })
                .collect();
            let floor = floor_per_million(batch, &self.prices).0;
            let top = series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
                .fold(floor, f64::max)
                * 1.2;
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("cost per million orders (arm64, $) against memory (MB), batch {batch}, 100 ms period"),
                    ("sans-serif", 18),
                )
                .margin(12)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..1100.0, 0.0..top)
                .unwrap();
            chart.configure_mesh().draw().unwrap();
            for (k, (contender, points)) in series.into_iter().enumerate() {
                let color = colors[k];
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        points.clone(),
                        color.stroke_width(2),
                    )))
                    .unwrap()
                    .label(contender.name())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], color));
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(|p| Circle::new(p, 4, color.filled())),
                    )
                    .unwrap();
            }
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, floor), (1100.0, floor)],
                    BLACK.stroke_width(1),
                )))
                .unwrap()
                .label("the floor")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK));
            crate::chart::draw_legend(&mut chart);
        }
        root.present().unwrap();
    }
}
