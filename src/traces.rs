//! Traces in Lambda (ARCHITECTURE.md, "Traces"): the `OTEL_*` settings read and
//! checked once at cold start, the tracer provider that sends spans over OTLP/HTTP
//! (protobuf bodies, no gRPC), the layer that turns `tracing`'s spans into
//! OpenTelemetry's, the invocation's span (`lambda_runtime`'s own layer), and the
//! flushes: before the response, within the deadline, and once the response is
//! posted (the invocation's span ends only then).
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces-only
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: then there is no tracer provider, no
//! OpenTelemetry layer and no span beyond the logs' own (`drivers/spans.rs` makes
//! none), so a run without traces pays nothing for them. A setting that is set and
//! wrong stops the cold start with one line naming it.
//!
//! The SDK's batch processor exports on its own thread through a blocking reqwest
//! client (its own small runtime), on the TLS settings of the other clients
//! (`adapters/tls.rs`). A flush is asked of one more thread, started with them, which
//! waits for the processor: the handler waits for its answer with a bound and walks
//! away from it, so a slow collector costs at most the bound, never the batch.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use lambda_runtime::layers::{OpenTelemetryFaasTrigger, OpenTelemetryLayer};
use lambda_runtime::{LambdaInvocation, Service};
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::registry::LookupSpan;

use crate::adapters::tls::{Tls, TlsError};
use crate::drivers::spans;

/// The room kept before the invocation deadline for the flush before the response:
/// the deadline budget's flush reserve when traces are on (`idempotent-consumer/src/deadline.rs`,
/// `Budget::answer_by`), so the records, the queue calls and the settler leave it free.
pub const FLUSH_RESERVE: Duration = Duration::from_millis(500);
/// The flush after the response (the invocation's span) waits at most this; the
/// response is posted already, so it costs billed time only.
pub const LATE_FLUSH: Duration = Duration::from_millis(500);
/// OpenTelemetry's default export timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest export timeout accepted: a Lambda invocation is minutes at most.
const MOST_TIMEOUT: Duration = Duration::from_secs(60);
/// The path of traces under a base endpoint (OTLP/HTTP).
const TRACES_PATH: &str = "v1/traces";

/// A setting of traces that is set and wrong: the cold start stops on it.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("{var}={value:?} is invalid: {problem}")]
    Invalid {
        var: &'static str,
        value: String,
        problem: &'static str,
    },
    /// A value that may hold a secret (headers carry credentials): never printed.
    #[error("{var} is invalid: {problem}")]
    InvalidSecret {
        var: &'static str,
        problem: &'static str,
    },
    #[error("the OTLP exporter's HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("the OTLP exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    #[error("the OTLP exporter's TLS settings")]
    Tls(#[from] TlsError),
    #[error("the thread that flushes the traces")]
    Thread(#[source] std::io::Error),
}

/// The traces' settings, from the standard `OTEL_*` variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Where spans are posted (the traces endpoint itself, `…/v1/traces`).
    pub endpoint: String,
    /// The exporter's timeout per request.
    pub timeout: Duration,
}

impl Settings {
    /// `None`: traces are off (no endpoint, `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TracesError> {
        let get = |var: &str| get(var).filter(|v| !v.trim().is_empty());
        let invalid = |var, value: String, problem| TracesError::Invalid {
            var,
            value,
            problem,
        };
        if let Some(value) = get("OTEL_SDK_DISABLED") {
            match value.trim().to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                _ => return Err(invalid("OTEL_SDK_DISABLED", value, "true or false")),
            }
        }
        if let Some(value) = get("OTEL_TRACES_EXPORTER") {
            match value.trim() {
                "none" => return Ok(None),
                "otlp" => {}
                _ => {
                    return Err(invalid(
                        "OTEL_TRACES_EXPORTER",
                        value,
                        "only otlp (or none) is built in",
                    ));
                }
            }
        }
        let endpoint = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(url), _) => checked_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, false)?,
            (None, Some(url)) => checked_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", &url, true)?,
            (None, None) => return Ok(None),
        };
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = get(var)
                && value.trim() != "http/protobuf"
            {
                return Err(invalid(
                    var,
                    value,
                    "only http/protobuf is built in (no gRPC, no JSON)",
                ));
            }
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ] {
            if let Some(value) = get(var)
                && value.trim() != "none"
            {
                return Err(invalid(var, value, "only none is built in"));
            }
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ] {
            if let Some(value) = get(var) {
                check_headers(var, &value)?;
            }
        }
        let timeout = match (
            get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", v)),
            get("OTEL_EXPORTER_OTLP_TIMEOUT").map(|v| ("OTEL_EXPORTER_OTLP_TIMEOUT", v)),
        ) {
            (Some((var, value)), _) | (None, Some((var, value))) => {
                let ms = value.trim().parse::<u64>().ok().filter(|ms| *ms > 0);
                match ms.map(Duration::from_millis) {
                    Some(timeout) if timeout <= MOST_TIMEOUT => timeout,
                    _ => {
                        return Err(invalid(
                            var,
                            value,
                            "milliseconds, a whole number from 1 to 60000",
                        ));
                    }
                }
            }
            (None, None) => DEFAULT_TIMEOUT,
        };
        check_sampler(&get)?;
        Ok(Some(Self { endpoint, timeout }))
    }
}

/// A collector's URL: `https://`, or `http://` to a loopback address (a collector
/// extension in the execution environment), as the payment API's URL is checked
/// (`config.rs`). A base endpoint gets the traces path.
fn checked_endpoint(var: &'static str, value: &str, base: bool) -> Result<String, TracesError> {
    // An endpoint may carry credentials (`user:token@`, a query): the error line shows
    // its scheme, host and path only, or nothing of a value that is not a URL.
    let shown = match url::Url::parse(value.trim()) {
        Ok(url) => format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default(),
            url.path()
        ),
        Err(_) => "(not shown)".to_owned(),
    };
    let invalid = |problem| TracesError::Invalid {
        var,
        value: shown.clone(),
        problem,
    };
    let url = url::Url::parse(value.trim()).map_err(|_| invalid("not a URL"))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(name)) => name == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(invalid("a URL with a host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => return Err(invalid("http:// only to a loopback address; else https://")),
        _ => return Err(invalid("an http:// or https:// URL")),
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a URL without a query or fragment"));
    }
    if !base {
        return Ok(url.to_string());
    }
    let mut text = url.to_string();
    if !text.ends_with('/') {
        text.push('/');
    }
    text.push_str(TRACES_PATH);
    Ok(text)
}

/// `key=value` pairs separated by commas (W3C baggage's format, as the
/// specification says); the value may hold a credential, so it is never printed.
fn check_headers(var: &'static str, value: &str) -> Result<(), TracesError> {
    for pair in value.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((key, _)) = pair.split_once('=') else {
            return Err(TracesError::InvalidSecret {
                var,
                problem: "key=value pairs separated by commas",
            });
        };
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(TracesError::InvalidSecret {
                var,
                problem: "a header name is empty or not a token",
            });
        }
    }
    Ok(())
}

/// `OTEL_TRACES_SAMPLER` (and its argument) as the specification names them; the
/// SDK reads them itself, and would fall back silently on a name it does not know.
fn check_sampler(get: &impl Fn(&str) -> Option<String>) -> Result<(), TracesError> {
    const SAMPLERS: &[&str] = &[
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ];
    if let Some(value) = get("OTEL_TRACES_SAMPLER")
        && !SAMPLERS.contains(&value.trim())
    {
        return Err(TracesError::Invalid {
            var: "OTEL_TRACES_SAMPLER",
            value,
            problem: "one of always_on, always_off, traceidratio, parentbased_always_on, \
                      parentbased_always_off, parentbased_traceidratio",
        });
    }
    if let Some(value) = get("OTEL_TRACES_SAMPLER_ARG")
        && !value
            .trim()
            .parse::<f64>()
            .is_ok_and(|ratio| (0.0..=1.0).contains(&ratio))
    {
        return Err(TracesError::Invalid {
            var: "OTEL_TRACES_SAMPLER_ARG",
            value,
            problem: "a ratio from 0 to 1",
        });
    }
    Ok(())
}

/// What a flush answers: to the handler's task (before the response) or to the
/// runtime's thread (after it).
type Answer = Box<dyn FnOnce(bool) + Send>;

/// How many flushes may wait for the flushing thread; one more asked meanwhile is
/// not needed (the waiting ones take its spans) and is dropped.
const FLUSHES_WAITING: usize = 2;

/// The traces of this process: the tracer provider and the thread that flushes it.
/// Built once at cold start, shared by every invocation.
#[derive(Clone)]
pub struct Traces {
    flushes: std::sync::mpsc::SyncSender<Answer>,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl Traces {
    /// The provider sending to `settings.endpoint`, and the spans of
    /// `drivers/spans.rs` turned on, naming `names`' table and endpoint.
    pub fn start(settings: &Settings, tls: &Tls, names: spans::Names) -> Result<Self, TracesError> {
        let client = reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(tls.client_config())
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(1)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(TracesError::Client)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .with_timeout(settings.timeout)
            .build()
            .map_err(TracesError::Exporter)?;
        let provider = SdkTracerProvider::builder()
            .with_resource(resource())
            .with_batch_exporter(exporter)
            .build();
        let (flushes, asked) = std::sync::mpsc::sync_channel::<Answer>(FLUSHES_WAITING);
        let flushed = provider.clone();
        // It serves the process's flushes for its whole life: the loop ends when the
        // channel closes, with the process. Each flush is bounded by the SDK's own
        // timeout.
        std::thread::Builder::new()
            .name("traces-flush".into())
            .spawn(move || {
                for answer in asked {
                    answer(flushed.force_flush().is_ok());
                }
            })
            .map_err(TracesError::Thread)?;
        let tracer = provider.tracer("charge-once");
        spans::enable(names);
        Ok(Self { flushes, tracer })
    }

    /// The layer that makes OpenTelemetry spans of `tracing`'s: the invocation's
    /// (`lambda_runtime`'s layer), and charge-once's record, call and wait spans.
    /// Neither the batch's own `invocation` span (the logs' request id) nor the
    /// runtime's plain one are exported: the record's span is the invocation's child.
    /// Events stay in the logs.
    pub fn layer<S>(&self) -> Filtered<impl Layer<S>, FilterFn, S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.clone())
            .with_filter(FilterFn::new(|meta| {
                meta.is_span()
                    && (meta.target() == "lambda_runtime::layers::otel"
                        || (meta.target().starts_with("charge_once")
                            && meta.name() != "invocation"))
            }))
    }

    /// Exports the spans ended so far before the response, waiting at most until the
    /// invocation `deadline` (ms since the epoch) less the safety margin, and never
    /// more than [`FLUSH_RESERVE`]: a slow collector delays the answer by that at
    /// most. Spans not sent in time go with the next flush.
    pub async fn flush_before(&self, deadline_ms: u64) {
        let now = crate::domain::clock::wall_ms();
        let left = i64::try_from(deadline_ms)
            .unwrap_or(i64::MAX)
            .saturating_sub(now)
            .saturating_sub(
                i64::try_from(crate::policy::deadline::SAFETY.as_millis()).unwrap_or(0),
            );
        let Ok(left) = u64::try_from(left) else {
            return;
        };
        let bound = FLUSH_RESERVE.min(Duration::from_millis(left));
        let (done, flushed) = tokio::sync::oneshot::channel();
        let answer: Answer = Box::new(move |ok| {
            let _ = done.send(ok);
        });
        if self.flushes.try_send(answer).is_err() {
            tracing::debug!("traces flush already waiting");
            return;
        }
        match tokio::time::timeout(bound, flushed).await {
            Ok(Ok(true)) => {}
            Ok(_) => tracing::debug!("traces not flushed"),
            Err(_) => tracing::debug!(
                bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                "traces flush cut short"
            ),
        }
    }

    /// The flush after the response has been posted, for the invocation's span,
    /// waiting at most [`LATE_FLUSH`] (on this thread: the runtime has nothing else to
    /// do before it asks for the next event).
    fn flush_late(&self) {
        let (done, flushed) = std::sync::mpsc::sync_channel(1);
        let answer: Answer = Box::new(move |ok| {
            let _ = done.send(ok);
        });
        if self.flushes.try_send(answer).is_ok() && flushed.recv_timeout(LATE_FLUSH).is_err() {
            tracing::debug!("traces flush after the response cut short");
        }
    }

    /// `lambda_runtime`'s layer of the invocation's span (`faas.trigger = pubsub`),
    /// flushing once the response is posted, shareable by the runtime's workers (Lambda
    /// Managed Instances run several).
    pub fn runtime_layer(&self) -> SharedLayer<impl Fn() + Clone + Send + Sync + 'static> {
        let traces = self.clone();
        SharedLayer(
            OpenTelemetryLayer::new(move || traces.flush_late())
                .with_trigger(OpenTelemetryFaasTrigger::PubSub),
        )
    }
}

/// What the spans say about where they come from: the function (Lambda's own
/// variables) and the cloud, beside what the SDK reads (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`). The service is the function's name unless
/// `OTEL_SERVICE_NAME` says otherwise.
fn resource() -> Resource {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut attributes = vec![
        KeyValue::new("cloud.provider", "aws"),
        KeyValue::new("cloud.platform", "aws_lambda"),
    ];
    for (key, name) in [
        ("cloud.region", "AWS_REGION"),
        ("faas.name", "AWS_LAMBDA_FUNCTION_NAME"),
        ("faas.version", "AWS_LAMBDA_FUNCTION_VERSION"),
    ] {
        if let Some(value) = var(name) {
            attributes.push(KeyValue::new(key, value));
        }
    }
    let builder = Resource::builder().with_attributes(attributes);
    match (var("OTEL_SERVICE_NAME"), var("AWS_LAMBDA_FUNCTION_NAME")) {
        (None, Some(function)) => builder.with_service_name(function).build(),
        _ => builder.build(),
    }
}

/// [`OpenTelemetryLayer`] for a runtime that clones its service per worker: one
/// service behind a lock, so every worker shares it (and its cold-start flag).
pub struct SharedLayer<F>(OpenTelemetryLayer<F>);

impl<S, F> lambda_runtime::tower::Layer<S> for SharedLayer<F>
where
    F: Fn() + Clone,
{
    type Service =
        SharedService<<OpenTelemetryLayer<F> as lambda_runtime::tower::Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedService(Arc::new(Mutex::new(self.0.layer(inner))))
    }
}

/// A service shared by the runtime's workers; the lock is held only to start a call.
pub struct SharedService<S>(Arc<Mutex<S>>);

impl<S> Clone for SharedService<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<S> Service<LambdaInvocation> for SharedService<S>
where
    S: Service<LambdaInvocation>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .poll_ready(cx)
    }

    fn call(&mut self, request: LambdaInvocation) -> Self::Future {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .call(request)
    }
}

#[cfg(test)]
mod tests;
