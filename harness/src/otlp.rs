//! An OTLP/HTTP receiver on 127.0.0.1: `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest` (the collector's own messages, `opentelemetry-proto`,
//! decoded with prost), answered as a collector answers. It keeps every span it was
//! sent, flattened for the tests' asserts, with the resource's attributes beside them;
//! `make bench` points the "export on" variant at it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;

/// One span as the receiver got it: ids in lower-case hex, attributes as text.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind` (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    /// `(trace_id, span_id)` of each link.
    pub links: Vec<(String, String)>,
    /// OTLP's status code (0 unset, 1 ok, 2 error) and message.
    pub status: (i32, String),
    /// The resource's attributes (`service.name`, ...).
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The receiver: where it listens and what it got.
pub struct Receiver {
    /// The base endpoint, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub url: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<u64>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

#[derive(Clone)]
struct ReceiverState {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<u64>>,
}

async fn traces(State(state): State<ReceiverState>, body: Bytes) -> impl IntoResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    *state.requests.lock().unwrap() += 1;
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    status: span.status.map(|s| (s.code, s.message)).unwrap_or_default(),
                    resource: resource.clone(),
                });
            }
        }
    }
    state.spans.lock().unwrap().extend(received);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (StatusCode::OK, answer)
}

impl Receiver {
    pub async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(0));
        let state = ReceiverState {
            spans: spans.clone(),
            requests: requests.clone(),
        };
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            spans,
            requests,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// The export requests received so far.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().unwrap()
    }

    /// Waits (at most `timeout`) until `done` holds for the spans received; they are
    /// returned either way.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) || started.elapsed() >= timeout {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
