//! The report: the JSON and markdown of a run, the verdicts against the targets, and
//! the versions of every contender.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::chart::draw_bars;
use crate::rig::{CONTENDERS, Contender, PEERS};
use crate::scenarios::{Cell, Instructions, Scenario};
use crate::statistics::{
    Calls, CellFigures, batch_p50, calls_per_record, fmt_spread, median, per_record, percentile,
    spread,
};
use crate::{COLD_STARTS, root};

// --- Versions -----------------------------------------------------------------------

pub fn output_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

pub fn npm_version(dir: &str, package: &str) -> String {
    let manifest = root().join(dir).join(package).join("package.json");
    std::fs::read_to_string(manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

pub fn versions() -> Value {
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
        "charge-once": output_of(crate::charge_once_bin().to_str().unwrap(), &["--version"]),
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

pub struct Report {
    /// The command line that produced it.
    pub command: String,
    pub dynalite_cost: BTreeMap<&'static str, f64>,
    pub rounds: usize,
    pub records: usize,
    pub calls: BTreeMap<Contender, [Calls; 3]>,
    pub cold: BTreeMap<Contender, (Vec<f64>, Vec<f64>, f64)>,
    pub cells: Vec<(Cell, CellFigures)>,
    pub instructions: Vec<Instructions>,
    /// The drain, the headline (its own section first).
    pub drain: Option<crate::drain::Drain>,
    pub elapsed: Duration,
}

/// A target of the bench (docs/performance.md): what it asks, what was measured, and whether it holds.
pub struct Verdict {
    pub target: &'static str,
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

impl Report {
    pub fn headline(&self) -> Option<&CellFigures> {
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

    pub fn verdicts(&self) -> Vec<Verdict> {
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
        let batch_ratio = median(&head.ratios(Contender::PowertoolsPython, batch_p50));
        self.cpu_verdicts(head, &mut verdicts);
        verdicts.push(Verdict {
            target: "init, spawn → first `next` (stricter goal)",
            goal: "≤ 10 ms".into(),
            measured: format!("{init:.1} ms"),
            met: init <= 10.0,
        });
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

    /// CPU per fresh record against the best peer: the first target at batch 10 (it
    /// leads the table), and the stricter goals at batch 10 and batch 1.
    fn cpu_verdicts(&self, head: &CellFigures, verdicts: &mut Vec<Verdict>) {
        let co = Contender::ChargeOnce;
        let fresh_b1 = self.cells.iter().find(|(c, _)| {
            c.scenario == Scenario::Fresh && c.batch == 1 && c.store_ms == 5 && c.payment_ms == 50
        });
        // CPU per fresh record against the best peer: the first target at batch 10,
        // and the stricter goals at batch 10 and batch 1.
        let cases = [
            ("handler CPU per fresh record", Some(head), 5.0),
            (
                "CPU per fresh record, batch 10 (stricter goal)",
                Some(head),
                10.0,
            ),
            (
                "CPU per fresh record, batch 1 (stricter goal)",
                fresh_b1.map(|(_, f)| f),
                5.0,
            ),
        ];
        for (i, (target, cell, goal)) in cases.into_iter().enumerate() {
            let Some(cell) = cell else { continue };
            let cpu = |c| median(&cell.series(c, |r| r.cpu_ms_per_record));
            let best = PEERS
                .into_iter()
                .min_by(|a, b| cpu(*a).total_cmp(&cpu(*b)))
                .unwrap();
            let ratio = median(&cell.ratios(best, |r| r.cpu_ms_per_record));
            let verdict = Verdict {
                target,
                goal: format!("≥ {goal:.0}× less than the best peer"),
                measured: format!(
                    "{:.3} ms vs {} {:.3} ms: {ratio:.1}× (median of per-round ratios)",
                    cpu(co),
                    best.name(),
                    cpu(best)
                ),
                met: ratio >= goal,
            };
            // The first target leads the table.
            if i == 0 {
                verdicts.insert(0, verdict);
            } else {
                verdicts.push(verdict);
            }
        }
    }

    pub fn markdown(&self, date: &str) -> String {
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
        ];
        if let Some(drain) = &self.drain {
            md.extend([drain.markdown(), String::new()]);
        }
        md.extend([
            "## Targets".into(),
            String::new(),
            "| target | goal | measured | met |".into(),
            "| --- | --- | --- | --- |".into(),
        ]);
        for v in self.verdicts() {
            md.push(format!(
                "| {} | {} | {} | {} |",
                v.target,
                v.goal,
                v.measured,
                if v.met { "yes" } else { "**no**" }
            ));
        }
        self.steady_state_md(&mut md);
        self.cold_start_md(&mut md);
        self.instructions_md(&mut md);
        self.store_calls_md(&mut md);
        self.dynalite_cost_md(&mut md);
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

    /// The steady state table: every cell, every contender.
    fn steady_state_md(&self, md: &mut Vec<String>) {
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
    }

    /// The cold start table.
    fn cold_start_md(&self, md: &mut Vec<String>) {
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
    }

    /// The callgrind table, when it was measured.
    fn instructions_md(&self, md: &mut Vec<String>) {
        if !self.instructions.is_empty() {
            md.extend([
                String::new(),
                "## Instructions (callgrind; fresh orders, dynalite, the payment stub)".into(),
                String::new(),
                "The same for the same binary and input whatever else the machine does: the \
                 stable figure beside the CPU times. Per invocation = (a process serving 16 \
                 invocations − one serving 4) ÷ 12, so the cold start and the exit are left out."
                    .into(),
                String::new(),
                "| batch | instructions per invocation | per record |".into(),
                "| --- | --- | --- |".into(),
            ]);
            for i in &self.instructions {
                md.push(format!(
                    "| {} | {} | {} |",
                    i.batch,
                    thousands(i.per_invocation),
                    thousands(i.per_record)
                ));
            }
        }
    }

    /// Store calls per record by scenario.
    fn store_calls_md(&self, md: &mut Vec<String>) {
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
    }

    /// What one store call costs dynalite.
    fn dynalite_cost_md(&self, md: &mut Vec<String>) {
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
    }

    pub fn json(&self, date: &str) -> Value {
        let cells: Vec<Value> = self
            .cells
            .iter()
            .map(|(cell, f)| cell_json(*cell, f))
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
            "instructions": self.instructions.iter().map(|i| json!({
                "batch": i.batch,
                "per_invocation": i.per_invocation,
                "per_record": i.per_record,
                "method": "callgrind; fresh orders on dynalite and the payment stub; (16 invocations - 4) / 12 in two processes",
            })).collect::<Vec<_>>(),
            "cells": cells,
            "drain": self.drain.as_ref().map(crate::drain::Drain::json),
        })
    }

    /// Three panels of grouped bars, one bar per contender: CPU per record and batch
    /// p50 per cell, and the cold start.
    pub fn chart(&self, path: &Path) {
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
/// Today's date (UTC) as YYYY-MM-DD.
pub fn today() -> String {
    humantime::format_rfc3339(std::time::SystemTime::now()).to_string()[..10].to_owned()
}

/// `1234567` as `1 234 567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// One cell's figures as JSON: every contender's series, and its ratios to
/// charge-once.
fn cell_json(cell: Cell, f: &CellFigures) -> Value {
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
}
