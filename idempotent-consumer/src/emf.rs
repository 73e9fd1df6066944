//! Metrics, one CloudWatch embedded-metric-format (EMF) document per invocation, also
//! when one process serves several invocations at once (Lambda Managed Instances,
//! `AWS_LAMBDA_MAX_CONCURRENCY`).
//!
//! The code records through the `metrics` facade (`metrics::counter!`, ...). The
//! process-wide recorder installed here hands every metric to the invocation that is
//! running it: [`Emf::measure`] runs an invocation's future with its own counters in a
//! tokio task-local, so two invocations interleaved on the same threads never see each
//! other's counts. A metric recorded outside any invocation belongs to none and is
//! dropped (a consumer records none there).
//!
//! Why not `metrics_cloudwatch_embedded`: its collector can only be the one global
//! recorder (its `Builder::init`; `Collector::new` takes a private config), flushed as
//! a whole, so concurrent invocations would share one set of counts.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use serde_json::{Map, Value, json};

/// EMF takes at most 100 values per metric in one document; more are written as
/// further documents.
const MAX_VALUES: usize = 100;

tokio::task_local! {
    static CURRENT: Arc<Recorded>;
}

/// What one invocation recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    values: Mutex<BTreeMap<String, Series>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Series {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves a map of numbers, still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorded {
    /// A counter's value in this invocation (0 when it was never incremented).
    pub fn counter(&self, name: &str) -> u64 {
        match lock(&self.values).get(name) {
            Some(Series::Counter(n)) => *n,
            _ => 0,
        }
    }

    /// A histogram's values in this invocation, in the order they were recorded.
    pub fn histogram(&self, name: &str) -> Vec<f64> {
        match lock(&self.values).get(name) {
            Some(Series::Histogram(v)) => v.clone(),
            _ => Vec::new(),
        }
    }
}

/// The process-wide EMF recorder: the namespace and the units of described metrics.
#[derive(Debug)]
pub struct Emf {
    namespace: String,
    units: Mutex<HashMap<String, Unit>>,
}

/// [`Emf::install`] failed: the process has one installed already.
#[derive(Debug, thiserror::Error)]
#[error("the metrics recorder could not be installed (one per process)")]
pub struct InstallError(#[source] metrics::SetRecorderError<Router>);

/// The recorder installed in the `metrics` facade: hands each metric to the running
/// invocation.
#[derive(Debug)]
pub struct Router(&'static Emf);

/// A series' value in document `page`: counters and gauges in the first, each
/// histogram's values `MAX_VALUES` a page (EMF's limit per metric).
fn page_value(series: &Series, page: usize) -> Option<Value> {
    match series {
        Series::Counter(n) if page == 0 => Some(json!(n)),
        Series::Gauge(g) if page == 0 => Some(json!(g)),
        Series::Histogram(v) => v.chunks(MAX_VALUES).nth(page).map(|chunk| {
            // Microseconds are the precision that means anything here; seventeen
            // significant digits of a float are bytes paid at every invocation.
            let rounded: Vec<f64> = chunk
                .iter()
                .map(|x| (x * 1000.0).round() / 1000.0)
                .collect();
            json!(rounded)
        }),
        _ => None,
    }
}

impl Emf {
    /// Installs the process-wide recorder (once per process; a second call fails).
    pub fn install(namespace: &str) -> Result<&'static Emf, InstallError> {
        // Leaked once: the facade needs a recorder for the life of the process.
        let emf: &'static Emf = Box::leak(Box::new(Emf {
            namespace: namespace.to_owned(),
            units: Mutex::new(HashMap::new()),
        }));
        metrics::set_global_recorder(Router(emf)).map_err(InstallError)?;
        Ok(emf)
    }

    /// Runs one invocation's `work`; every metric it records is its own.
    pub async fn measure<F: Future>(&self, work: F) -> (F::Output, Arc<Recorded>) {
        let recorded = Arc::new(Recorded::default());
        let output = CURRENT.scope(Arc::clone(&recorded), work).await;
        (output, recorded)
    }

    /// Writes `recorded` as EMF documents (none when nothing was recorded), each with
    /// `properties` (the request id, ...), in one write so that concurrent
    /// invocations' documents do not interleave.
    pub fn write(
        &self,
        recorded: &Recorded,
        properties: &[(&str, &str)],
        timestamp_ms: i64,
        mut out: impl Write,
    ) -> std::io::Result<()> {
        let mut buffer = Vec::new();
        for document in self.documents(recorded, properties, timestamp_ms) {
            serde_json::to_writer(&mut buffer, &document)?;
            buffer.push(b'\n');
        }
        if buffer.is_empty() {
            return Ok(());
        }
        out.write_all(&buffer)?;
        out.flush()
    }

    /// Writes one invocation's documents on stdout, where Lambda's CloudWatch agent
    /// reads them (with the logs on stderr); a failed write is a warning, never a
    /// failed invocation.
    pub fn write_invocation(&self, recorded: &Recorded, request_id: &str) {
        let written = self.write(
            recorded,
            &[("RequestId", request_id)],
            crate::clock::wall_ms(),
            std::io::stdout().lock(),
        );
        if let Err(e) = written {
            tracing::warn!(error = %e, "metrics could not be written");
        }
    }

    fn documents(
        &self,
        recorded: &Recorded,
        properties: &[(&str, &str)],
        timestamp_ms: i64,
    ) -> Vec<Value> {
        let values = lock(&recorded.values);
        let units = lock(&self.units);
        let pages = values
            .values()
            .map(|s| match s {
                Series::Histogram(v) => v.len().div_ceil(MAX_VALUES),
                _ => 1,
            })
            .max()
            .unwrap_or(0);
        (0..pages)
            .filter_map(|page| {
                let mut document = Map::new();
                let mut declared = Vec::new();
                for (name, series) in values.iter() {
                    let Some(value) = page_value(series, page) else {
                        continue;
                    };
                    let mut metric = Map::new();
                    metric.insert("Name".into(), json!(name));
                    if let Some(unit) = units.get(name) {
                        metric.insert("Unit".into(), json!(cloudwatch_unit(*unit)));
                    }
                    declared.push(Value::Object(metric));
                    document.insert(name.clone(), value);
                }
                if declared.is_empty() {
                    return None;
                }
                for (name, value) in properties {
                    document.insert((*name).to_owned(), json!(value));
                }
                document.insert(
                    "_aws".into(),
                    json!({
                        "Timestamp": timestamp_ms,
                        "CloudWatchMetrics": [{
                            "Namespace": self.namespace,
                            "Dimensions": [[]],
                            "Metrics": declared,
                        }],
                    }),
                );
                Some(Value::Object(document))
            })
            .collect()
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>) {
        if let Some(unit) = unit {
            lock(&self.units).insert(key.as_str().to_owned(), unit);
        }
    }
}

/// CloudWatch's unit names.
fn cloudwatch_unit(unit: Unit) -> &'static str {
    match unit {
        Unit::Count => "Count",
        Unit::Percent => "Percent",
        Unit::Seconds => "Seconds",
        Unit::Milliseconds => "Milliseconds",
        Unit::Microseconds => "Microseconds",
        Unit::Nanoseconds => "None",
        Unit::Tebibytes => "Terabytes",
        Unit::Gibibytes => "Gigabytes",
        Unit::Mebibytes => "Megabytes",
        Unit::Kibibytes => "Kilobytes",
        Unit::Bytes => "Bytes",
        Unit::TerabitsPerSecond => "Terabits/Second",
        Unit::GigabitsPerSecond => "Gigabits/Second",
        Unit::MegabitsPerSecond => "Megabits/Second",
        Unit::KilobitsPerSecond => "Kilobits/Second",
        Unit::BitsPerSecond => "Bits/Second",
        Unit::CountPerSecond => "Count/Second",
    }
}

/// One metric of one invocation, as the facade's handles see it.
struct Handle {
    recorded: Arc<Recorded>,
    name: String,
}

impl Handle {
    /// The running invocation's handle for `key`, if there is an invocation and the
    /// key has no labels (EMF dimensions: the consumer records none, and one would
    /// change the metric's identity in CloudWatch).
    fn current(key: &Key) -> Option<Arc<Handle>> {
        if key.labels().next().is_some() {
            tracing::warn!(metric = key.name(), "a metric with labels is not recorded");
            return None;
        }
        CURRENT
            .try_with(|recorded| {
                Arc::new(Handle {
                    recorded: Arc::clone(recorded),
                    name: key.name().to_owned(),
                })
            })
            .ok()
    }

    fn update(&self, f: impl FnOnce(&mut Series)) {
        let mut values = lock(&self.recorded.values);
        if let Some(series) = values.get_mut(&self.name) {
            f(series);
        }
    }

    fn start(&self, series: Series) {
        lock(&self.recorded.values)
            .entry(self.name.clone())
            .or_insert(series);
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|s| {
            if let Series::Counter(n) = s {
                *n = n.saturating_add(value);
            }
        });
    }

    fn absolute(&self, value: u64) {
        self.update(|s| {
            if let Series::Counter(n) = s {
                *n = (*n).max(value);
            }
        });
    }
}

impl metrics::GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|s| {
            if let Series::Gauge(g) = s {
                *g += value;
            }
        });
    }

    fn decrement(&self, value: f64) {
        self.update(|s| {
            if let Series::Gauge(g) = s {
                *g -= value;
            }
        });
    }

    fn set(&self, value: f64) {
        self.update(|s| {
            if let Series::Gauge(g) = s {
                *g = value;
            }
        });
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.update(|s| {
            if let Series::Histogram(v) = s {
                v.push(value);
            }
        });
    }
}

impl metrics::Recorder for Router {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0.describe(key, unit);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0.describe(key, unit);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0.describe(key, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Handle::current(key).map_or_else(Counter::noop, |h| {
            h.start(Series::Counter(0));
            Counter::from_arc(h)
        })
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Handle::current(key).map_or_else(Gauge::noop, |h| {
            h.start(Series::Gauge(0.0));
            Gauge::from_arc(h)
        })
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Handle::current(key).map_or_else(Histogram::noop, |h| {
            h.start(Series::Histogram(Vec::new()));
            Histogram::from_arc(h)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;
    use std::time::Duration;

    use super::*;

    /// The facade's recorder is process-wide: every test of this binary shares it.
    fn emf() -> &'static Emf {
        static EMF: OnceLock<&'static Emf> = OnceLock::new();
        EMF.get_or_init(|| {
            let emf = Emf::install("test-namespace").unwrap();
            metrics::describe_histogram!("t_latency_ms", Unit::Milliseconds, "");
            emf
        })
    }

    fn documents(recorded: &Recorded, request_id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        emf()
            .write(
                recorded,
                &[("RequestId", request_id)],
                1_700_000_000_000,
                &mut out,
            )
            .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn invocation(records: u64, pause: Duration) {
        for _ in 0..records {
            metrics::counter!("t_done").increment(1);
            metrics::histogram!("t_latency_ms").record(2.5);
            tokio::time::sleep(pause).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_invocations_at_once_each_count_only_their_own_records() {
        let emf = emf();
        // Interleaved on one task's polls: each sleeps between records.
        let ((_, three), (_, five)) = tokio::join!(
            emf.measure(invocation(3, Duration::from_millis(3))),
            emf.measure(invocation(5, Duration::from_millis(2))),
        );
        assert_eq!(three.counter("t_done"), 3);
        assert_eq!(five.counter("t_done"), 5);
        assert_eq!(five.histogram("t_latency_ms").len(), 5);

        // And across threads: tasks moving between the runtime's workers.
        let tasks: Vec<_> = (1..=4)
            .map(|n| {
                tokio::spawn(async move {
                    let (_, recorded) = emf.measure(invocation(n, Duration::from_millis(1))).await;
                    (n, recorded.counter("t_done"))
                })
            })
            .collect();
        for task in tasks {
            let (n, counted) = task.await.unwrap();
            assert_eq!(counted, n);
        }
    }

    #[tokio::test]
    async fn the_document_is_emf_with_units_values_and_the_request_id() {
        let (_, recorded) = emf().measure(invocation(2, Duration::ZERO)).await;
        let docs = documents(&recorded, "req-1");
        assert_eq!(docs.len(), 1, "{docs:?}");
        let doc = &docs[0];
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "test-namespace");
        assert_eq!(directive["Dimensions"], json!([[]]));
        assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_000_i64);
        assert_eq!(
            directive["Metrics"],
            json!([
                {"Name": "t_done"},
                {"Name": "t_latency_ms", "Unit": "Milliseconds"},
            ])
        );
        assert_eq!(doc["t_done"], 2);
        assert_eq!(doc["t_latency_ms"], json!([2.5, 2.5]));
        assert_eq!(doc["RequestId"], "req-1");
    }

    #[tokio::test]
    async fn more_than_a_hundred_values_go_on_in_further_documents() {
        let (_, recorded) = emf().measure(invocation(230, Duration::ZERO)).await;
        let docs = documents(&recorded, "req-2");
        let lengths: Vec<usize> = docs
            .iter()
            .map(|d| d["t_latency_ms"].as_array().unwrap().len())
            .collect();
        assert_eq!(lengths, [100, 100, 30]);
        // The counter is counted once, in the first document.
        assert_eq!(docs[0]["t_done"], 230);
        assert!(docs[1].get("t_done").is_none());
        assert!(docs.iter().all(|d| d["RequestId"] == "req-2"));
    }

    #[tokio::test]
    async fn nothing_recorded_writes_nothing_and_nothing_outside_an_invocation_is_kept() {
        let emf = emf();
        metrics::counter!("t_done").increment(7);
        let (_, recorded) = emf.measure(async {}).await;
        assert!(documents(&recorded, "req-3").is_empty());
    }
}
