//! Fault proxies in front of DynamoDB, SQS and the payment API: fault rates, added
//! latency, a count of calls per operation and, on request, the capacity DynamoDB
//! reports for each call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use rand::Rng;
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    DynamoDb,
    /// Counted only: no faults are injected in front of SQS.
    Sqs,
    Payment,
}

/// The DynamoDB operations that take `ReturnConsumedCapacity`.
const CAPACITY_OPERATIONS: &[&str] = &[
    "GetItem",
    "PutItem",
    "UpdateItem",
    "DeleteItem",
    "Query",
    "Scan",
    "BatchGetItem",
    "BatchWriteItem",
    "TransactGetItems",
    "TransactWriteItems",
];

/// The capacity of one operation's calls: the units the store reported, and the calls
/// it reported none for (an error, such as a refused conditional write).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Consumed {
    pub units: f64,
    pub reported: u64,
    pub unreported: u64,
}

/// What a proxy does besides forwarding: fault rates (per request) and the switch
/// that turns them off, an added round-trip latency, and a count of calls per
/// operation (`X-Amz-Target`, or method and path).
#[derive(Default)]
pub struct Faults {
    pub enabled: AtomicBool,
    pub rate: f64,
    pub injected: AtomicU64,
    pub payment_delay: Duration,
    pub latency: Duration,
    pub calls: Mutex<BTreeMap<String, u64>>,
    /// When set, every DynamoDB call that takes it asks for `ReturnConsumedCapacity:
    /// TOTAL`, and the units in each answer are added up per operation in `capacity`.
    pub ask_capacity: AtomicBool,
    pub capacity: Mutex<BTreeMap<String, Consumed>>,
    /// An outage of the payment API: while set, every request is refused with a 503,
    /// half of them only after hanging for `outage_hang`; counted in `outage_calls`.
    pub outage: AtomicBool,
    pub outage_hang: Duration,
    pub outage_calls: AtomicU64,
    /// The payment requests sent under these `Idempotency-Key`s are forwarded and
    /// their answers held back for `payment_delay`: a charge made whose answer the
    /// client gave up on.
    pub late_answers: Mutex<Vec<String>>,
}

impl Faults {
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.calls.lock().unwrap().clone()
    }

    pub fn capacity(&self) -> BTreeMap<String, Consumed> {
        self.capacity.lock().unwrap().clone()
    }

    /// Forgets the calls and the capacity counted so far.
    pub fn reset_calls(&self) {
        self.calls.lock().unwrap().clear();
        self.capacity.lock().unwrap().clear();
    }
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    target: Target,
    faults: Arc<Faults>,
    client: reqwest::Client,
}

fn dynamo_error(status: StatusCode, kind: &str) -> Response {
    let body = json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"), "message": "injected"});
    (
        status,
        [("content-type", "application/x-amz-json-1.0")],
        body.to_string(),
    )
        .into_response()
}

/// A response whose body dies mid-way: the connection is cut after the upstream
/// applied the request.
fn cut() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected cut",
        ))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-length", "1000")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn proxy(
    State(state): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let operation = match headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        Some(target) => target.rsplit('.').next().unwrap_or(target).to_owned(),
        None => format!("{method} {}", uri.path()),
    };
    *state
        .faults
        .calls
        .lock()
        .unwrap()
        .entry(operation.clone())
        .or_default() += 1;
    if !state.faults.latency.is_zero() {
        tokio::time::sleep(state.faults.latency).await;
    }
    if state.target == Target::Payment && state.faults.outage.load(Ordering::Relaxed) {
        state.faults.outage_calls.fetch_add(1, Ordering::Relaxed);
        if rand::rng().random_bool(0.5) {
            tokio::time::sleep(state.faults.outage_hang).await;
        }
        let body = json!({"error": {"type": "api_error", "message": "injected outage"}});
        return (StatusCode::SERVICE_UNAVAILABLE, body.to_string()).into_response();
    }
    let late = state.target == Target::Payment
        && headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|key| {
                state
                    .faults
                    .late_answers
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|k| k == key)
            });
    let fault =
        state.faults.enabled.load(Ordering::Relaxed) && rand::rng().random_bool(state.faults.rate);
    let kind = rand::rng().random_range(0..3);
    if fault {
        state.faults.injected.fetch_add(1, Ordering::Relaxed);
        match (state.target, kind) {
            (Target::DynamoDb, 0) => {
                return dynamo_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError");
            }
            (Target::DynamoDb, 1) => {
                return dynamo_error(
                    StatusCode::BAD_REQUEST,
                    "ProvisionedThroughputExceededException",
                );
            }
            (Target::Payment, 0) => {
                let body = json!({"error": {"type": "api_error", "message": "injected"}});
                return (StatusCode::INTERNAL_SERVER_ERROR, body.to_string()).into_response();
            }
            _ => {} // forwarded, then the answer is lost or late (below)
        }
    }
    let counted = state.target == Target::DynamoDb
        && state.faults.ask_capacity.load(Ordering::Relaxed)
        && CAPACITY_OPERATIONS.contains(&operation.as_str());
    let body = if counted { asking_capacity(body) } else { body };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut request = state
        .client
        .request(method, format!("{}{path}", state.upstream))
        .body(body);
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let upstream = match request.send().await {
        Ok(r) => r,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let status = upstream.status();
    let mut out_headers = HeaderMap::new();
    for (name, value) in upstream.headers() {
        if name != "content-length" && name != "transfer-encoding" && name != "connection" {
            out_headers.insert(name, value.clone());
        }
    }
    let bytes = upstream.bytes().await.unwrap_or_default();
    if counted {
        let units = reported_units(&bytes);
        let mut capacity = state.faults.capacity.lock().unwrap();
        let entry = capacity.entry(operation).or_default();
        match units {
            Some(units) => {
                entry.units += units;
                entry.reported += 1;
            }
            None => entry.unreported += 1,
        }
    }
    if late {
        tokio::time::sleep(state.faults.payment_delay).await;
    }
    if fault {
        if state.target == Target::Payment && kind == 1 {
            // The charge was made; the answer comes after the client gave up.
            tokio::time::sleep(state.faults.payment_delay).await;
        } else {
            return cut();
        }
    }
    (status, out_headers, bytes).into_response()
}

/// The request with `ReturnConsumedCapacity: TOTAL` (the stores do not check the
/// signature over the body).
fn asking_capacity(body: Bytes) -> Bytes {
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(mut request)) => {
            request.insert("ReturnConsumedCapacity".to_owned(), json!("TOTAL"));
            Bytes::from(serde_json::Value::Object(request).to_string())
        }
        _ => body,
    }
}

/// The capacity units an answer reports (one `ConsumedCapacity`, or a list of them
/// for batch and transaction calls); `None` when it reports none.
fn reported_units(body: &[u8]) -> Option<f64> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    match answer.get("ConsumedCapacity")? {
        serde_json::Value::Array(list) => Some(
            list.iter()
                .filter_map(|c| c["CapacityUnits"].as_f64())
                .sum(),
        ),
        one => one["CapacityUnits"].as_f64(),
    }
}

/// Starts a fault-injecting HTTP proxy to `upstream` on 127.0.0.1; returns its URL.
pub async fn start_proxy(upstream: &str, target: Target, faults: Arc<Faults>) -> String {
    let state = ProxyState {
        upstream: upstream.to_owned(),
        target,
        faults,
        client: crate::http_client(),
    };
    let app = Router::new()
        .route("/{*path}", any(proxy))
        .route("/", any(proxy))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}
