//! The cost of traces (docs/performance.md, "Traces"): charge-once with export off
//! and with export on (`OTEL_EXPORTER_OTLP_ENDPOINT` at the harness's OTLP/HTTP
//! receiver on 127.0.0.1), side by side in one run: init (spawn → first `next`), CPU
//! per fresh record at batch 10 (5 ms store, 50 ms payment, the default matrix's
//! first cell), and the Lambda bill at 128 MB, batch 10, under the bill's emulated CPU
//! share, and instructions per record at batch 10 (callgrind: the figure this shared
//! machine does not disturb). Export off is held against the previous committed run
//! (`bench/results/<date>.json`): within noise when its median lies inside that run's
//! range of rounds, or within [`NOISE`] of its median (instructions: within 2 %). `make bench BENCH_ONLY=traces`
//! runs only this (`<date>-traces.{md,json}`); every `make bench` runs it after the
//! bill. `BENCH_BASELINE=<path>` adds a third variant, another charge-once binary
//! (say, the commit before traces) with export off, measured in the same run: the
//! timed figures are then held against it as well, on the same machine at the same
//! time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use harness::otlp::Receiver;
use harness::runtime_api::RuntimeApi;
use harness::servers::Backend;
use serde_json::{Value, json};

use crate::bill::{self, BillCell, Measured, Prices};
use crate::rig::{Contender, Lane, Rig, event, payment_stub};
use crate::statistics::{fmt_spread, median, percentile, spread};
use crate::{COLD_STARTS, root};

/// A figure of export off is within noise of the previous run's when it is within
/// this share of its median (or inside its range of rounds).
pub const NOISE: f64 = 0.10;
/// Instructions are counted, not timed: the same binary on the same input differs by
/// far less than this.
pub const INSTRUCTIONS_NOISE: f64 = 0.02;
const STORE_MS: u64 = 5;
const PAYMENT_MS: u64 = 50;
const BATCH: usize = 10;
/// The bill's cell: the template's default memory, Lambda's CFS period, batch 10.
const BILL_CELL: BillCell = BillCell {
    memory_mb: 128,
    period_ms: 100,
    batch: BATCH,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Export {
    Off,
    On,
    /// `BENCH_BASELINE`'s binary, export off.
    Baseline,
}

/// The variants of this run: off and on, and the baseline when `BENCH_BASELINE` names
/// one.
fn variants() -> Vec<Export> {
    let mut all = vec![Export::Off, Export::On];
    if baseline().is_some() {
        all.push(Export::Baseline);
    }
    all
}

fn baseline() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("BENCH_BASELINE")?);
    assert!(
        path.exists(),
        "BENCH_BASELINE={} does not exist",
        path.display()
    );
    Some(path)
}

impl Export {
    fn name(self) -> &'static str {
        match self {
            Self::Off => "export off",
            Self::On => "export on",
            Self::Baseline => "baseline binary, export off",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Baseline => "baseline",
        }
    }

    fn bin(self) -> PathBuf {
        match self {
            Self::Baseline => baseline().unwrap_or_else(crate::charge_once_bin),
            _ => crate::charge_once_bin(),
        }
    }

    /// The environment charge-once gets on top of the bench's.
    fn env(self, receiver: &Receiver) -> Vec<(&'static str, String)> {
        match self {
            Self::Off | Self::Baseline => Vec::new(),
            Self::On => vec![("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.clone())],
        }
    }
}

/// charge-once's figures in the previous committed run.
pub struct Previous {
    pub file: String,
    pub init_ms: Vec<f64>,
    pub cpu_ms_per_record: Vec<f64>,
    pub bill_arm64: Option<f64>,
    pub instructions_per_record: Option<u64>,
}

/// The comparison's figures.
pub struct Traces {
    pub rounds: usize,
    pub records: usize,
    pub init_ms: BTreeMap<Export, Vec<f64>>,
    pub cpu_ms_per_record: BTreeMap<Export, Vec<f64>>,
    pub bill: BTreeMap<Export, Measured>,
    pub share: String,
    /// Instructions per record at batch 10 (empty with `BENCH_INSTRUCTIONS=0`).
    pub instructions_per_record: BTreeMap<Export, u64>,
    pub spans_received: usize,
    pub export_requests: u64,
    pub previous: Option<Previous>,
    /// The machine's load average (1 min) when the run started and ended: timed
    /// figures move with it, instructions do not.
    pub load: (f64, f64),
}

/// Whether `now` is within noise of the rounds `before`: inside their range, or within
/// [`NOISE`] of their median.
fn within(now: f64, before: &[f64]) -> bool {
    let (low, high) = (
        before.iter().copied().fold(f64::INFINITY, f64::min),
        before.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    (low..=high).contains(&now) || (now - median(before)).abs() <= NOISE * median(before)
}

/// The 1-minute load average (`/proc/loadavg`).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn lane(
    export: Export,
    rig: &Rig,
    payment: &str,
    receiver: &Receiver,
    runtime: RuntimeApi,
) -> Lane {
    let log = harness::log_dir().join(format!("bench-traces-{}.log", export.tag()));
    Lane::spawn_with_env(
        Contender::ChargeOnce,
        Command::new(export.bin()),
        rig,
        payment,
        runtime,
        log,
        &export.env(receiver),
    )
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

impl Traces {
    pub async fn run(rounds: usize, records: usize) -> Self {
        let previous = previous_run();
        let load_before = load_average();
        let receiver = Receiver::start().await;
        let payment = payment_stub(Duration::from_millis(PAYMENT_MS)).await;

        // Init: spawn → first `next`, the two interleaved, each answering a first batch.
        let all = variants();
        let mut init_ms: BTreeMap<Export, Vec<f64>> = BTreeMap::new();
        let rig = Rig::new(Backend::Dynalite, Duration::from_millis(STORE_MS)).await;
        for i in 0..COLD_STARTS {
            for k in 0..all.len() {
                let export = all[(k + i) % all.len()];
                let lane = lane(export, &rig, &payment, &receiver, RuntimeApi::start().await);
                let batch = ids(&format!("co-traces-cold-{}-{i}", export.tag()), BATCH);
                let (_, failures) = lane.invoke(event(&batch)).await;
                assert_eq!(failures, 0, "{}: cold batch failed", export.name());
                let first_next = lane
                    .runtime
                    .first_next()
                    .unwrap()
                    .duration_since(lane.spawned)
                    .as_secs_f64()
                    * 1000.0;
                init_ms.entry(export).or_default().push(first_next);
            }
        }

        // CPU per fresh record: one process each, a warm-up round, then rounds in
        // alternating order.
        let mut lanes = Vec::new();
        for &export in &all {
            let rig = Rig::new(Backend::Dynalite, Duration::from_millis(STORE_MS)).await;
            let lane = lane(export, &rig, &payment, &receiver, RuntimeApi::start().await);
            lanes.push((export, lane, rig));
        }
        let batches = records.div_ceil(BATCH);
        let mut cpu_ms_per_record: BTreeMap<Export, Vec<f64>> = BTreeMap::new();
        for round in 0..=rounds {
            for k in 0..lanes.len() {
                let (export, lane, _) = &lanes[(k + round) % lanes.len()];
                let before = lane.cpu();
                for b in 0..batches {
                    let batch = ids(&format!("co-traces-{}-r{round}-b{b}", export.tag()), BATCH);
                    let (_, failures) = lane.invoke(event(&batch)).await;
                    assert_eq!(
                        failures,
                        0,
                        "{}: item failures; see {}",
                        export.name(),
                        lane.log.display()
                    );
                }
                let per_record = lane.cpu().since(&before) / (batches * BATCH) as f64;
                if round > 0 {
                    cpu_ms_per_record
                        .entry(*export)
                        .or_default()
                        .push(per_record);
                }
            }
        }
        drop(lanes);

        // The bill, under Lambda's CPU share.
        let mut bill = BTreeMap::new();
        let mut share = String::new();
        for (n, &export) in all.iter().enumerate() {
            let (measured, note) =
                bill::charge_once_with(BILL_CELL, export.bin(), &export.env(&receiver), n).await;
            share = note;
            bill.insert(export, measured);
        }

        // Instructions (callgrind), unless BENCH_INSTRUCTIONS=0.
        let mut instructions_per_record = BTreeMap::new();
        if !std::env::var("BENCH_INSTRUCTIONS").is_ok_and(|v| v == "0") {
            let stub = payment_stub(Duration::ZERO).await;
            for &export in &all {
                let counted = crate::scenarios::instructions_at(
                    &stub,
                    &export.bin(),
                    BATCH,
                    &export.env(&receiver),
                )
                .await;
                instructions_per_record.insert(export, counted.per_record);
            }
        }

        // Export on must have exported: the receiver got the spans.
        let spans_received = receiver.spans().len();
        assert!(
            spans_received > 0,
            "export on sent no span to the receiver at {}",
            receiver.url
        );
        Self {
            rounds,
            records,
            init_ms,
            cpu_ms_per_record,
            bill,
            share,
            instructions_per_record,
            spans_received,
            export_requests: receiver.requests(),
            previous,
            load: (load_before, load_average()),
        }
    }

    /// The variants this run measured.
    fn variants(&self) -> Vec<Export> {
        self.init_ms.keys().copied().collect()
    }

    /// Export off against the baseline binary measured in this run, figure by figure
    /// (the same rule as against the previous run).
    fn against_baseline(&self) -> Option<Vec<(&'static str, f64, f64, bool)>> {
        let before_init = self.init_ms.get(&Export::Baseline)?;
        let before_cpu = &self.cpu_ms_per_record[&Export::Baseline];
        let init = median(&self.init_ms[&Export::Off]);
        let cpu = median(&self.cpu_ms_per_record[&Export::Off]);
        let mut out = vec![
            (
                "init ms",
                init,
                median(before_init),
                within(init, before_init),
            ),
            (
                "CPU ms per record",
                cpu,
                median(before_cpu),
                within(cpu, before_cpu),
            ),
        ];
        if let (Some(&now), Some(&before)) = (
            self.instructions_per_record.get(&Export::Off),
            self.instructions_per_record.get(&Export::Baseline),
        ) {
            let (now, before) = (now as f64, before as f64);
            out.push((
                "instructions per record",
                now,
                before,
                (now - before).abs() <= INSTRUCTIONS_NOISE * before,
            ));
        }
        if let (Some((now, _)), Some((before, _))) =
            (self.bill_of(Export::Off), self.bill_of(Export::Baseline))
        {
            out.push((
                "bill $ per million orders (arm64)",
                now,
                before,
                within(now, &[before]),
            ));
        }
        Some(out)
    }

    fn bill_of(&self, export: Export) -> Option<(f64, f64)> {
        let measured = &self.bill[&export];
        let cost = bill::cost_per_million(measured, BILL_CELL, &Prices::from_env())?;
        let Measured::Ran { billed_ms, .. } = measured else {
            return None;
        };
        Some((cost.0, percentile(billed_ms, 50.0)))
    }

    /// Whether export off is within noise of the previous run, figure by figure.
    fn against_previous(&self) -> Option<Vec<(&'static str, f64, f64, bool)>> {
        let previous = self.previous.as_ref()?;
        let init = median(&self.init_ms[&Export::Off]);
        let cpu = median(&self.cpu_ms_per_record[&Export::Off]);
        let mut out = vec![
            (
                "init ms",
                init,
                median(&previous.init_ms),
                within(init, &previous.init_ms),
            ),
            (
                "CPU ms per record",
                cpu,
                median(&previous.cpu_ms_per_record),
                within(cpu, &previous.cpu_ms_per_record),
            ),
        ];
        if let (Some(before), Some(&now)) = (
            previous.instructions_per_record,
            self.instructions_per_record.get(&Export::Off),
        ) {
            let (now, before) = (now as f64, before as f64);
            out.push((
                "instructions per record",
                now,
                before,
                (now - before).abs() <= INSTRUCTIONS_NOISE * before,
            ));
        }
        if let (Some(before), Some((now, _))) = (previous.bill_arm64, self.bill_of(Export::Off)) {
            out.push((
                "bill $ per million orders (arm64)",
                now,
                before,
                within(now, &[before]),
            ));
        }
        Some(out)
    }

    pub fn markdown(&self) -> String {
        let mut md = format!(
            "## Traces: export off and on\n\ncharge-once (release) with `OTEL_EXPORTER_OTLP_ENDPOINT` unset and set to an OTLP/HTTP receiver on 127.0.0.1; init of {COLD_STARTS} cold starts each, CPU per fresh record over {} rounds of {} records after a warm-up (batch {BATCH}, store {STORE_MS} ms, payment {PAYMENT_MS} ms), the bill at {} MB, batch {BATCH} ({}). Median [range].\n\n",
            self.rounds, self.records, BILL_CELL.memory_mb, self.share
        );
        md.push_str("| charge-once | init ms (spawn → first `next`) | CPU ms per record | instructions per record | billed ms p50 | bill $ per million orders, arm64 |\n| --- | --- | --- | --- | --- | --- |\n");
        let counted = |n: Option<u64>| n.map_or("—".to_owned(), |n| n.to_string());
        for export in self.variants() {
            let (bill, billed) = self
                .bill_of(export)
                .map_or(("—".to_owned(), "—".to_owned()), |(c, b)| {
                    (format!("{c:.4}"), format!("{b:.0}"))
                });
            md.push_str(&format!(
                "| {} | {} | {} | {} | {billed} | {bill} |\n",
                export.name(),
                fmt_spread(&self.init_ms[&export], 1),
                fmt_spread(&self.cpu_ms_per_record[&export], 3),
                counted(self.instructions_per_record.get(&export).copied()),
            ));
        }
        if let Some(previous) = &self.previous {
            md.push_str(&format!(
                "| export off, previous run (`{}`) | {} | {} | {} | — | {} |\n",
                previous.file,
                fmt_spread(&previous.init_ms, 1),
                fmt_spread(&previous.cpu_ms_per_record, 3),
                counted(previous.instructions_per_record),
                previous
                    .bill_arm64
                    .map_or("—".to_owned(), |c| format!("{c:.4}"))
            ));
        }
        let on = median(&self.cpu_ms_per_record[&Export::On]);
        let off = median(&self.cpu_ms_per_record[&Export::Off]);
        md.push_str(&format!(
            "\nExport on costs {:+.3} ms of CPU per record ({:.2}× export off); the receiver got {} spans in {} requests.\n",
            on - off,
            on / off,
            self.spans_received,
            self.export_requests
        ));
        match self.against_previous() {
            Some(figures) => {
                // Instructions are the figure this shared machine does not move: when
                // counted they decide; the timed figures are reported beside them.
                let counted = figures.iter().find(|f| f.0 == "instructions per record");
                let all = counted.map_or_else(|| figures.iter().all(|f| f.3), |f| f.3);
                let each: Vec<String> = figures
                    .iter()
                    .map(|(name, now, before, ok)| {
                        format!(
                            "{name} {now:.3} vs {before:.3} ({})",
                            if *ok {
                                "within noise"
                            } else {
                                "**outside noise**"
                            }
                        )
                    })
                    .collect();
                md.push_str(&format!(
                    "\nExport off against the previous committed run: {}{}: {}. (Within noise: inside the previous run's range of rounds, or within {:.0} % of its median; instructions within {:.0} %. Load average during this run: {:.1} at the start, {:.1} at the end, on 2 cores.)\n",
                    if all { "within noise" } else { "**not within noise**" },
                    if counted.is_some() { " by its instructions" } else { "" },
                    each.join("; "),
                    NOISE * 100.0,
                    INSTRUCTIONS_NOISE * 100.0,
                    self.load.0,
                    self.load.1
                ));
            }
            None => md.push_str("\nNo previous committed run to compare export off with.\n"),
        }
        if let Some(figures) = self.against_baseline() {
            let all = figures.iter().all(|f| f.3);
            let each: Vec<String> = figures
                .iter()
                .map(|(name, now, before, ok)| {
                    format!(
                        "{name} {now:.3} vs {before:.3} ({})",
                        if *ok {
                            "within noise"
                        } else {
                            "**outside noise**"
                        }
                    )
                })
                .collect();
            md.push_str(&format!(
                "\nExport off against the baseline binary in this run: {}: {}.\n",
                if all {
                    "within noise"
                } else {
                    "**not within noise**"
                },
                each.join("; ")
            ));
        }
        md
    }

    pub fn json(&self) -> Value {
        let per = |f: &dyn Fn(Export) -> Value| -> Value {
            self.variants()
                .into_iter()
                .map(|e| (e.tag().to_owned(), f(e)))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        json!({
            "rounds": self.rounds,
            "records_per_round": self.records,
            "bill_cell": {"memory_mb": BILL_CELL.memory_mb, "period_ms": BILL_CELL.period_ms, "batch": BILL_CELL.batch},
            "share": self.share,
            "init_ms": per(&|e| spread(&self.init_ms[&e])),
            "cpu_ms_per_record": per(&|e| spread(&self.cpu_ms_per_record[&e])),
            "bill": per(&|e| match self.bill_of(e) {
                Some((arm64, billed_p50)) => json!({"arm64_per_million": arm64, "billed_ms_p50": billed_p50}),
                None => Value::Null,
            }),
            "instructions_per_record": per(&|e| self.instructions_per_record.get(&e).map_or(Value::Null, |n| json!(n))),
            "spans_received": self.spans_received,
            "export_requests": self.export_requests,
            "previous": self.previous.as_ref().map(|p| json!({
                "file": p.file,
                "init_ms": spread(&p.init_ms),
                "cpu_ms_per_record": spread(&p.cpu_ms_per_record),
                "bill_arm64_per_million": p.bill_arm64,
                "instructions_per_record": p.instructions_per_record,
            })),
            "export_off_against_previous": self.against_previous().map(|figures| figures
                .iter()
                .map(|(name, now, before, ok)| json!({"figure": name, "now": now, "previous": before, "within_noise": ok}))
                .collect::<Vec<_>>()),
            "export_off_against_baseline": self.against_baseline().map(|figures| figures
                .iter()
                .map(|(name, now, before, ok)| json!({"figure": name, "now": now, "baseline": before, "within_noise": ok}))
                .collect::<Vec<_>>()),
            "noise": NOISE,
            "instructions_noise": INSTRUCTIONS_NOISE,
            "load_average": {"start": self.load.0, "end": self.load.1},
        })
    }
}

/// charge-once's figures in the latest committed `bench/results/<date>.json`.
fn previous_run() -> Option<Previous> {
    let dir = root().join("bench/results");
    let mut runs: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| {
            name.len() == "2026-12-01.json".len()
                && name.ends_with(".json")
                && name.as_bytes()[4] == b'-'
        })
        .collect();
    runs.sort();
    let file = runs.pop()?;
    let run: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(&file)).ok()?).ok()?;
    let rounds = |v: &Value| -> Vec<f64> {
        v["rounds"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let init_ms = rounds(&run["cold_start"]["charge-once"]["spawn_to_first_next_ms"]);
    let cell = run["cells"]
        .as_array()?
        .iter()
        .find(|c| c["cell"] == "fresh-b10-s5-p50")?;
    let cpu_ms_per_record = rounds(&cell["contenders"]["charge-once"]["cpu_ms_per_record"]);
    let bill_arm64 = run["bill"]["cells"].as_array().and_then(|cells| {
        cells
            .iter()
            .find(|c| {
                c["contender"] == "charge-once"
                    && c["memory_mb"] == BILL_CELL.memory_mb
                    && c["period_ms"] == BILL_CELL.period_ms
                    && c["batch"] == BILL_CELL.batch
            })
            .and_then(|c| c["cost_per_million"]["arm64"].as_f64())
    });
    let instructions_per_record = run["instructions"].as_array().and_then(|runs| {
        runs.iter()
            .find(|r| r["batch"] == BATCH)
            .and_then(|r| r["per_record"].as_u64())
    });
    (!init_ms.is_empty() && !cpu_ms_per_record.is_empty()).then_some(Previous {
        file,
        init_ms,
        cpu_ms_per_record,
        bill_arm64,
        instructions_per_record,
    })
}
