//! `make bench`: charge-once against Powertools for AWS Lambda (Python and TypeScript),
//! side by side, doing the same work on the same backend (docs/performance.md:
//! the figures to beat). Its own binary, not a test: `make bench` builds the release
//! binary and runs this. It asserts nothing about speed; it asserts only that every
//! contender did the work (no unexpected item failures), so a broken peer cannot pass
//! for a fast one.
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
//! explains the batch latencies on it (see docs/performance.md).
//!
//! The whole bill (`whole.rs`): every part of what a million orders cost on AWS for
//! each contender (DynamoDB units, the record's bytes kept for the retention, SQS
//! requests, log bytes, Lambda from the bill), at one dated table of list prices, with
//! the floor and the goals; `bench/results/<stem>-whole.svg`.
//!
//! Instructions: the release binary under callgrind (valgrind), batch 1 and 10 of fresh
//! orders, per invocation and per record (`BENCH_INSTRUCTIONS=0` skips them).
//!
//! The drain (`drain.rs`), the headline: a backlog of orders cleared by several
//! execution environments against localstripe's rate limit on creates, per contender:
//! the rate against the limit, the share of creates refused, nothing twice, nothing
//! lost; `bench/results/<date>-drain.{md,json}`, and the first section of the report.
//!
//! Traces (`traces.rs`): charge-once with export off and on (to the harness's OTLP/HTTP
//! receiver), init, CPU per record and the bill side by side, export off held against
//! the previous committed run; `bench/results/<date>-traces.{md,json}`.
//!
//! The settler and the audit (`settle.rs`): how many waits one settler run settles and
//! how many orders a day the audit's one run holds, beside a shop of a million orders
//! a day; `bench/results/<date>-settle.{md,json}` (`BENCH_ONLY=settle` only,
//! `BENCH_SETTLE_WAITS` waits, default 1000).
//!
//! A quiet day (`quiet.rs`): one order's latency in a fresh execution environment and
//! a warm one, orders arriving well below the provider's limit, per contender, beside
//! the provider's own answer time, and charge-once's pacing waits;
//! `bench/results/<date>-quiet.{md,json}` (`BENCH_ONLY=quiet` only).
//!
//! A refund beside a charge (`refunds.rs`): the CPU of a refund record of the refund
//! function beside a charge record of the consumer, the same binary in two processes;
//! `bench/results/<date>-refunds.{md,json}` (`BENCH_ONLY=refunds` only).
//!
//! Knobs: `BENCH_ONLY=drain` runs only the drain (minutes), `BENCH_ONLY=traces` only
//! the traces' comparison (minutes), `BENCH_DRAIN_ORDERS` its
//! backlog (default 300), `BENCH_DRAIN_SECONDS` its time limit per contender (180);
//! `FULL=1` runs the full matrix; `BENCH_ROUNDS` (default 5, at least 5 for
//! figures worth quoting), `BENCH_RECORDS` (records per contender per round, default
//! 100) and `BENCH_CELLS=<slug>,<slug>` (cells of the full matrix, e.g.
//! `fresh-b10-s0-p0`) shorten a development run. `BENCH_REPRICE=<results .json>`
//! runs nothing: it prices that run's whole bill again from its measured figures
//! (`whole.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

mod bill;
mod chart;
mod drain;
mod quiet;
mod refunds;
mod report;
mod rig;
mod scenarios;
mod settle;
mod statistics;
mod traces;
mod whole;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use report::{Report, today};
use scenarios::{
    Cell, cold_starts, dynalite_cost_per_call, instructions, matrix, run_cell, store_calls,
};

pub const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Orders charged once before the rounds, which the duplicate scenarios send again.
pub const SEEDS: usize = 10;
pub const COLD_STARTS: usize = 5;

pub fn root() -> &'static Path {
    harness::root()
}

/// The release binary `make bench` builds first.
pub fn charge_once_bin() -> PathBuf {
    let bin = root().join("target/release/charge-once");
    assert!(
        bin.exists(),
        "{} is missing: run `make bench` (it builds the release binary first)",
        bin.display()
    );
    bin
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
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // BENCH_REPRICE=<results .json>: that run's whole bill priced again, nothing run.
    if let Ok(path) = std::env::var("BENCH_REPRICE") {
        whole::reprice(Path::new(&path));
        return;
    }
    let full = std::env::var("FULL").is_ok_and(|v| v == "1");
    let rounds = env_usize("BENCH_ROUNDS", 5);
    let records = env_usize("BENCH_RECORDS", 100);
    assert!(
        rounds >= 1 && records >= 10,
        "BENCH_ROUNDS ≥ 1, BENCH_RECORDS ≥ 10"
    );
    let started = Instant::now();

    // BENCH_ONLY=drain: the drain alone, in its own files (development, or the
    // headline figure on its own); BENCH_ONLY=traces: the traces' comparison alone.
    let only = std::env::var("BENCH_ONLY").ok();
    let only_drain = match only.as_deref() {
        Some("drain") => true,
        Some("traces") => {
            let traces = traces::Traces::run(rounds, records).await;
            eprintln!("bench: traces done ({:.0?})", started.elapsed());
            write_traces(&traces, &traces_command_line(true, rounds, records));
            return;
        }
        Some("settle") => {
            let waits = env_usize("BENCH_SETTLE_WAITS", 1000);
            let reach = settle::Reach::run(waits).await;
            eprintln!("bench: settle done ({:.0?})", started.elapsed());
            let mut command = "make bench BENCH_ONLY=settle".to_owned();
            if waits != 1000 {
                command.push_str(&format!(" BENCH_SETTLE_WAITS={waits}"));
            }
            write_settle(&reach, &command);
            return;
        }
        Some("quiet") => {
            let quiet = quiet::Quiet::run(rounds).await;
            eprintln!("bench: quiet day done ({:.0?})", started.elapsed());
            let mut command = "make bench BENCH_ONLY=quiet".to_owned();
            if rounds != 5 {
                command.push_str(&format!(" BENCH_ROUNDS={rounds}"));
            }
            write_part("quiet", &quiet.markdown(), quiet.json(), &command);
            return;
        }
        Some("refunds") => {
            let refunds = refunds::Refunds::run(rounds, records).await;
            eprintln!("bench: refunds done ({:.0?})", started.elapsed());
            let mut command = "make bench BENCH_ONLY=refunds".to_owned();
            if rounds != 5 || records != 100 {
                command.push_str(&format!(" BENCH_ROUNDS={rounds} BENCH_RECORDS={records}"));
            }
            write_part("refunds", &refunds.markdown(), refunds.json(), &command);
            return;
        }
        Some(v) => {
            panic!("BENCH_ONLY takes `drain`, `traces`, `settle`, `quiet` or `refunds`, not {v:?}")
        }
        None => false,
    };
    let drain = drain::Drain::run(drain::Setup::from_env()).await;
    eprintln!("bench: drain done ({:.0?})", started.elapsed());
    let drain_command = drain_command_line(only_drain, &drain.setup);
    write_drain(&drain, &drain_command);
    if only_drain {
        return;
    }

    let dynalite_cost = dynalite_cost_per_call().await;
    let calls = store_calls().await;
    eprintln!("bench: store calls done ({:.0?})", started.elapsed());
    let cold = cold_starts().await;
    eprintln!("bench: cold starts done ({:.0?})", started.elapsed());
    // BENCH_INSTRUCTIONS=0 leaves the callgrind runs out (a few minutes).
    let instructions = if std::env::var("BENCH_INSTRUCTIONS").is_ok_and(|v| v == "0") {
        Vec::new()
    } else {
        instructions().await
    };
    eprintln!("bench: instructions done ({:.0?})", started.elapsed());
    let mut cells = Vec::new();
    let (only, chosen) = chosen_cells(full);
    for cell in chosen {
        let figures = run_cell(cell, rounds, records).await;
        eprintln!("bench: {} done ({:.0?})", cell.label(), started.elapsed());
        cells.push((cell, figures));
    }

    // The bill: each contender under Lambda's CPU share (BENCH_BILL=0 leaves it out).
    let bill = if std::env::var("BENCH_BILL").is_ok_and(|v| v == "0") {
        None
    } else {
        let (measured, share) = bill::bill(&bill::grid(full)).await;
        eprintln!("bench: bill done ({:.0?})", started.elapsed());
        Some(bill::Bill {
            measured,
            share,
            prices: bill::Prices::from_env(),
        })
    };

    // The whole bill: every part, for every contender (BENCH_WHOLE=0 leaves it out).
    let whole = if std::env::var("BENCH_WHOLE").is_ok_and(|v| v == "0") {
        None
    } else {
        let whole = whole::Whole::run().await;
        eprintln!("bench: whole bill done ({:.0?})", started.elapsed());
        Some(whole)
    };

    // Traces off and on (BENCH_TRACES=0 leaves them out).
    let traces = if std::env::var("BENCH_TRACES").is_ok_and(|v| v == "0") {
        None
    } else {
        let traces = traces::Traces::run(rounds, records).await;
        eprintln!("bench: traces done ({:.0?})", started.elapsed());
        write_traces(&traces, &traces_command_line(false, rounds, records));
        Some(traces)
    };

    // The settler's and the audit's reach (BENCH_SETTLE=0 leaves it out).
    if !std::env::var("BENCH_SETTLE").is_ok_and(|v| v == "0") {
        let reach = settle::Reach::run(env_usize("BENCH_SETTLE_WAITS", 1000)).await;
        eprintln!("bench: settle done ({:.0?})", started.elapsed());
        write_settle(&reach, "make bench");
    }

    let command = command_line(full, &only, rounds, records);
    let report = Report {
        command,
        dynalite_cost,
        rounds,
        records,
        calls,
        cold,
        cells,
        instructions,
        drain: Some(drain),
        elapsed: started.elapsed(),
    };
    write_results(
        &report,
        bill.as_ref(),
        whole.as_ref(),
        traces.as_ref(),
        &only,
        full,
    );
}

/// The command that reproduces a traces' comparison, as its files name it.
fn traces_command_line(only: bool, rounds: usize, records: usize) -> String {
    let mut command = "make bench".to_owned();
    if only {
        command.push_str(" BENCH_ONLY=traces");
    }
    if let Some(baseline) = std::env::var_os("BENCH_BASELINE") {
        command.push_str(&format!(" BENCH_BASELINE={}", baseline.to_string_lossy()));
    }
    if rounds != 5 || records != 100 {
        command.push_str(&format!(" BENCH_ROUNDS={rounds} BENCH_RECORDS={records}"));
    }
    command
}

/// Writes `bench/results/<date>-settle.{json,md}`: the settler's and the audit's reach.
fn write_settle(reach: &settle::Reach, command: &str) {
    write_part("settle", &reach.markdown(), reach.json(), command);
}

/// Writes `bench/results/<date>-traces.{json,md}`: the traces' comparison on its own.
fn write_traces(traces: &traces::Traces, command: &str) {
    write_part("traces", &traces.markdown(), traces.json(), command);
}

/// Writes `bench/results/<date>-<part>.{json,md}`: one part of the bench on its own,
/// with the command and the versions.
fn write_part(part: &str, markdown: &str, mut json: serde_json::Value, command: &str) {
    let dir = root().join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    let date = today();
    let stem = format!("{date}-{part}");
    let markdown = format!(
        "# `{command}`, {date}\n\n{markdown}\n## Versions\n\n```json\n{}\n```\n",
        serde_json::to_string_pretty(&report::versions()).unwrap()
    );
    json["date"] = date.clone().into();
    json["command"] = command.into();
    json["versions"] = report::versions();
    println!("\n{markdown}");
    std::fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&json).unwrap() + "\n",
    )
    .unwrap();
    std::fs::write(dir.join(format!("{stem}.md")), markdown).unwrap();
    eprintln!("bench: wrote bench/results/{stem}.{{json,md}}");
}

/// The cells to run: the default or full matrix, or the cells `BENCH_CELLS=<slug>,…`
/// picks from the full one (development); and those slugs.
fn chosen_cells(full: bool) -> (Vec<String>, Vec<Cell>) {
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
    (only, chosen)
}

/// The command that reproduces this run, as the results name it.
fn command_line(full: bool, only: &[String], rounds: usize, records: usize) -> String {
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
    command
}

/// The command that reproduces a drain, as its files name it.
fn drain_command_line(only: bool, setup: &drain::Setup) -> String {
    let mut command = "make bench".to_owned();
    if only {
        command.push_str(" BENCH_ONLY=drain");
    }
    if setup.orders != 300 {
        command.push_str(&format!(" BENCH_DRAIN_ORDERS={}", setup.orders));
    }
    if setup.time_limit.as_secs() != 180 {
        command.push_str(&format!(
            " BENCH_DRAIN_SECONDS={}",
            setup.time_limit.as_secs()
        ));
    }
    command
}

/// Writes `bench/results/<date>-drain.{json,md}`: the drain on its own, whichever run
/// made it (a backlog other than the default's writes `<date>-drain-<orders>.*`).
fn write_drain(drain: &drain::Drain, command: &str) {
    let dir = root().join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    let date = today();
    let stem = if drain.setup.orders == 300 {
        format!("{date}-drain")
    } else {
        format!("{date}-drain-{}", drain.setup.orders)
    };
    let markdown = format!(
        "# `{command}`, {date}\n\n{}\n\n## Versions\n\n```json\n{}\n```\n",
        drain.markdown(),
        serde_json::to_string_pretty(&report::versions()).unwrap()
    );
    let mut json = drain.json();
    json["date"] = date.clone().into();
    json["command"] = command.into();
    json["versions"] = report::versions();
    println!("\n{markdown}");
    std::fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&json).unwrap() + "\n",
    )
    .unwrap();
    std::fs::write(dir.join(format!("{stem}.md")), markdown).unwrap();
    eprintln!("bench: wrote bench/results/{stem}.{{json,md}}");
}

/// Writes `bench/results/<stem>.{json,md,svg}` (and the bill's chart) and prints the
/// report; a full or partial run never overwrites the default run's files of the day.
fn write_results(
    report: &Report,
    bill: Option<&bill::Bill>,
    whole: Option<&whole::Whole>,
    traces: Option<&traces::Traces>,
    only: &[String],
    full: bool,
) {
    let dir = root().join("bench/results");
    std::fs::create_dir_all(&dir).unwrap();
    let date = today();
    let stem = if !only.is_empty() {
        format!("{date}-cells")
    } else if full {
        format!("{date}-full")
    } else {
        date.clone()
    };
    let mut markdown = report.markdown(&date);
    let mut json = report.json(&date);
    if let Some(whole) = whole {
        markdown.push_str("\n\n");
        markdown.push_str(&whole.markdown(bill));
        markdown.push('\n');
        json["whole_bill"] = whole.json(bill);
        whole.chart(&dir.join(format!("{stem}-whole.svg")), bill);
    }
    if let Some(bill) = bill {
        markdown.push_str("\n\n");
        markdown.push_str(&bill.markdown());
        markdown.push('\n');
        json["bill"] = bill.json();
        bill.chart(&dir.join(format!("{stem}-bill.svg")));
    }
    if let Some(traces) = traces {
        markdown.push_str("\n\n");
        markdown.push_str(&traces.markdown());
        json["traces"] = traces.json();
    }
    println!("\n{markdown}");
    std::fs::write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(&json).unwrap() + "\n",
    )
    .unwrap();
    std::fs::write(dir.join(format!("{stem}.md")), markdown).unwrap();
    report.chart(&dir.join(format!("{stem}.svg")));
    eprintln!("bench: wrote bench/results/{stem}.{{json,md,svg}}");
}
