//! Medians, percentiles and spreads of the figures of interleaved rounds.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::rig::Contender;

pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Nearest-rank percentile.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let v = sorted(v);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank - 1]
}

pub fn median(v: &[f64]) -> f64 {
    let v = sorted(v);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median and range of a series, with the series.
pub fn spread(v: &[f64]) -> Value {
    let s = sorted(v);
    json!({"median": median(v), "min": s[0], "max": s[s.len() - 1], "rounds": v})
}

pub fn fmt_spread(v: &[f64], digits: usize) -> String {
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
pub struct RoundFigures {
    pub cpu_ms_per_record: f64,
    pub records_per_s: f64,
    pub batches_ms: Vec<f64>,
    pub failures: usize,
}

#[derive(Default)]
pub struct CellFigures {
    pub rounds: BTreeMap<Contender, Vec<RoundFigures>>,
    pub peak_rss_mb: BTreeMap<Contender, f64>,
    /// Store calls by operation over the recorded rounds, and the records they served.
    pub store_calls: BTreeMap<Contender, (Calls, usize)>,
}

impl CellFigures {
    pub fn series(&self, c: Contender, f: impl Fn(&RoundFigures) -> f64) -> Vec<f64> {
        self.rounds[&c].iter().map(f).collect()
    }

    pub fn batches(&self, c: Contender) -> Vec<f64> {
        self.rounds[&c]
            .iter()
            .flat_map(|r| r.batches_ms.iter().copied())
            .collect()
    }

    /// `f(peer) / f(charge-once)` inside each round.
    pub fn ratios(&self, peer: Contender, f: impl Fn(&RoundFigures) -> f64) -> Vec<f64> {
        self.rounds[&peer]
            .iter()
            .zip(&self.rounds[&Contender::ChargeOnce])
            .map(|(p, c)| f(p) / f(c))
            .collect()
    }
}

pub fn batch_p50(r: &RoundFigures) -> f64 {
    median(&r.batches_ms)
}

/// Store calls by operation (`X-Amz-Target`), as a proxy counted them.
pub type Calls = BTreeMap<String, u64>;

pub fn calls_per_record(calls: &Calls, records: usize) -> BTreeMap<String, f64> {
    calls
        .iter()
        .map(|(op, n)| (op.clone(), *n as f64 / records as f64))
        .collect()
}

pub fn per_record(calls: &Calls) -> String {
    let total: u64 = calls.values().sum();
    let ops = calls
        .iter()
        .map(|(op, n)| format!("{op} {}", *n as f64 / 10.0))
        .collect::<Vec<_>>()
        .join(" + ");
    format!("**{}** ({ops})", total as f64 / 10.0)
}
