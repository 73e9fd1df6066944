//! The system under test, whole: the real binary in Lambda mode under a Runtime API
//! emulator (one per execution environment, so a process can be SIGKILLed and
//! restarted), an event source mapping emulator polling moto's SQS, fault proxies in
//! front of moto's DynamoDB and stripe-stateful-mock, producers that duplicate,
//! fan out, conflict and redrive, and the invariant check once the queue drains.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::{Backend, stripe};

// --- Runtime API emulator ---------------------------------------------------------

/// What an invocation ended with.
#[derive(Debug)]
pub enum Reply {
    Response(Bytes),
    Error,
    /// No answer before the function timeout (the process died or hung).
    Timeout,
}

struct Invocation {
    id: String,
    event: String,
    deadline_ms: u64,
    reply: oneshot::Sender<Reply>,
}

#[derive(Clone)]
struct RuntimeState {
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Invocation>>>,
    inflight: Arc<Mutex<HashMap<String, oneshot::Sender<Reply>>>>,
    first_next: Arc<Mutex<Option<Instant>>>,
}

/// One execution environment's Runtime API (the documented HTTP protocol: next,
/// response, error, init error), served on 127.0.0.1.
pub struct RuntimeApi {
    pub addr: String,
    tx: mpsc::Sender<Invocation>,
    inflight: Arc<Mutex<HashMap<String, oneshot::Sender<Reply>>>>,
    first_next: Arc<Mutex<Option<Instant>>>,
}

fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

async fn next(State(state): State<RuntimeState>) -> Response {
    state
        .first_next
        .lock()
        .unwrap()
        .get_or_insert_with(Instant::now);
    loop {
        let invocation = {
            let mut queue = state.queue.lock().await;
            match queue.recv().await {
                Some(i) => i,
                None => return StatusCode::GONE.into_response(),
            }
        };
        // The ESM gave up on it (timeout) before any process took it.
        if invocation.reply.is_closed() {
            continue;
        }
        state
            .inflight
            .lock()
            .unwrap()
            .insert(invocation.id.clone(), invocation.reply);
        let mut headers = HeaderMap::new();
        headers.insert(
            "lambda-runtime-aws-request-id",
            HeaderValue::from_str(&invocation.id).unwrap(),
        );
        headers.insert(
            "lambda-runtime-deadline-ms",
            HeaderValue::from(invocation.deadline_ms),
        );
        headers.insert(
            "lambda-runtime-invoked-function-arn",
            HeaderValue::from_static("arn:aws:lambda:us-east-1:123456789012:function:charge-once"),
        );
        headers.insert(
            "lambda-runtime-trace-id",
            HeaderValue::from_static("Root=1-00000000-000000000000000000000000"),
        );
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        return (StatusCode::OK, headers, invocation.event).into_response();
    }
}

async fn respond(
    State(state): State<RuntimeState>,
    Path(id): Path<String>,
    body: Bytes,
) -> StatusCode {
    if let Some(reply) = state.inflight.lock().unwrap().remove(&id) {
        let _ = reply.send(Reply::Response(body));
    }
    StatusCode::ACCEPTED
}

async fn error(State(state): State<RuntimeState>, Path(id): Path<String>) -> StatusCode {
    if let Some(reply) = state.inflight.lock().unwrap().remove(&id) {
        let _ = reply.send(Reply::Error);
    }
    StatusCode::ACCEPTED
}

impl RuntimeApi {
    pub async fn start() -> Self {
        let (tx, rx) = mpsc::channel(16);
        let inflight = Arc::new(Mutex::new(HashMap::new()));
        let first_next = Arc::new(Mutex::new(None));
        let state = RuntimeState {
            queue: Arc::new(tokio::sync::Mutex::new(rx)),
            inflight: inflight.clone(),
            first_next: first_next.clone(),
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(respond),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route(
                "/2018-06-01/runtime/init/error",
                post(|| async { StatusCode::ACCEPTED }),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            tx,
            inflight,
            first_next,
        }
    }

    /// When a process first asked for an invocation (the end of its init).
    pub fn first_next(&self) -> Option<Instant> {
        *self.first_next.lock().unwrap()
    }

    /// Invokes the function with `event`; waits until the deadline plus a little.
    pub async fn invoke(&self, event: String, timeout: Duration) -> Reply {
        let id = uuid::Uuid::new_v4().to_string();
        let (reply, answer) = oneshot::channel();
        let deadline_ms = now_ms() + u64::try_from(timeout.as_millis()).unwrap();
        let invocation = Invocation {
            id: id.clone(),
            event,
            deadline_ms,
            reply,
        };
        if self.tx.send(invocation).await.is_err() {
            return Reply::Error;
        }
        match tokio::time::timeout(timeout + Duration::from_millis(500), answer).await {
            Ok(Ok(reply)) => reply,
            _ => {
                self.inflight.lock().unwrap().remove(&id);
                Reply::Timeout
            }
        }
    }
}

// --- Consumer processes -------------------------------------------------------------

pub struct Endpoints {
    pub dynamodb: String,
    pub payment: String,
    pub table: String,
}

/// A clean environment for a function process: what Lambda sets (Runtime API, name,
/// memory, version, region), test credentials, and the function's own settings
/// pointing at `endpoints` (also used by `make bench` for every contender).
pub fn lambda_environment<'a>(
    command: &'a mut Command,
    runtime: &str,
    endpoints: &Endpoints,
) -> &'a mut Command {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_LAMBDA_RUNTIME_API", runtime)
        .env("AWS_LAMBDA_FUNCTION_NAME", "charge-once")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoints.dynamodb)
        .env("IDEMPOTENCY_TABLE", &endpoints.table)
        .env("PAYMENT_API_URL", &endpoints.payment)
        .env("PAYMENT_API_KEY", stripe::TEST_KEY)
        .env("PAYMENT_TIMEOUT", "1s")
        .env("MAX_CONCURRENCY", "10")
}

/// The real binary in Lambda mode, attached to one Runtime API.
pub struct ConsumerProcess {
    child: Child,
    runtime: String,
    log: PathBuf,
}

impl ConsumerProcess {
    pub fn spawn(runtime: &RuntimeApi, endpoints: &Endpoints, log: PathBuf) -> Self {
        Self {
            child: Self::start(&runtime.addr, endpoints, &log),
            runtime: runtime.addr.clone(),
            log,
        }
    }

    fn start(runtime: &str, endpoints: &Endpoints, log: &PathBuf) -> Child {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        lambda_environment(
            &mut Command::new(env!("CARGO_BIN_EXE_charge-once")),
            runtime,
            endpoints,
        )
        .env("DEADLINE_MARGIN", "1500ms")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn charge-once")
    }

    /// SIGKILL, wherever it is, and a fresh process on the same environment.
    pub fn kill_and_restart(&mut self, endpoints: &Endpoints) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::start(&self.runtime, endpoints, &self.log);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// --- Fault proxies ------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    DynamoDb,
    Payment,
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
}

impl Faults {
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.calls.lock().unwrap().clone()
    }

    pub fn reset_calls(&self) {
        self.calls.lock().unwrap().clear();
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
        .entry(operation)
        .or_default() += 1;
    if !state.faults.latency.is_zero() {
        tokio::time::sleep(state.faults.latency).await;
    }
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

/// Starts a fault-injecting HTTP proxy to `upstream` on 127.0.0.1; returns its URL.
pub async fn start_proxy(upstream: &str, target: Target, faults: Arc<Faults>) -> String {
    let state = ProxyState {
        upstream: upstream.to_owned(),
        target,
        faults,
        client: reqwest::Client::new(),
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

// --- Event source mapping emulator --------------------------------------------------

pub struct Queues {
    pub client: aws_sdk_sqs::Client,
    pub url: String,
    pub arn: String,
    pub dlq_url: String,
}

impl Queues {
    pub async fn create(visibility: Duration, max_receive_count: u32) -> Self {
        let client = aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::Config::builder()
                .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
                .region(aws_sdk_sqs::config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                    "test", "test", None, None, "tests",
                ))
                .endpoint_url(Backend::Moto.url())
                .build(),
        );
        let name = format!("orders-{}", uuid::Uuid::new_v4().simple());
        let dlq_url = client
            .create_queue()
            .queue_name(format!("{name}-dlq"))
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let dlq_arn = queue_arn(&client, &dlq_url).await;
        let redrive = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count.to_string()});
        let url = client
            .create_queue()
            .queue_name(&name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                visibility.as_secs().to_string(),
            )
            .attributes(QueueAttributeName::RedrivePolicy, redrive.to_string())
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let arn = queue_arn(&client, &url).await;
        Self {
            client,
            url,
            arn,
            dlq_url,
        }
    }

    pub async fn send(&self, bodies: &[String]) {
        for chunk in bodies.chunks(10) {
            let mut batch = self.client.send_message_batch().queue_url(&self.url);
            for (i, body) in chunk.iter().enumerate() {
                batch = batch.entries(
                    aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .build()
                        .unwrap(),
                );
            }
            let out = batch.send().await.unwrap();
            assert!(out.failed.is_empty(), "send failed: {:?}", out.failed);
        }
    }

    /// Sends `bodies` in waves, keeping at most about `max_pending` messages in the
    /// queue: moto's SQS slows down with queue depth, and producers in real life do
    /// not dump hours of traffic at once.
    pub async fn send_paced(&self, bodies: &[String], max_pending: u64) {
        for wave in bodies.chunks(50) {
            for _ in 0..600 {
                if self.pending().await < max_pending {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            self.send(wave).await;
        }
    }

    /// Messages visible or in flight in the source queue.
    pub async fn pending(&self) -> u64 {
        let attrs = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        attrs
            .attributes()
            .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0)
    }

    /// Takes every message out of the DLQ (a redrive re-sends them as new messages).
    pub async fn drain_dlq(&self) -> Vec<String> {
        let mut bodies = Vec::new();
        for _ in 0..1000 {
            let out = self
                .client
                .receive_message()
                .queue_url(&self.dlq_url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .send()
                .await
                .unwrap();
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                bodies.push(m.body.clone().unwrap_or_default());
                self.client
                    .delete_message()
                    .queue_url(&self.dlq_url)
                    .receipt_handle(m.receipt_handle.unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
        bodies
    }
}

async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> String {
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap();
    attrs.attributes().unwrap()[&QueueAttributeName::QueueArn].clone()
}

#[derive(Default)]
pub struct EsmStats {
    pub deliveries: AtomicU64,
    pub invocations: AtomicU64,
    pub batch_failures: AtomicU64,
}

/// One poller per environment, as Lambda's event source mapping: receive up to
/// `batch` messages, build the SQS event, invoke, delete what was not reported failed.
/// A malformed response, an unknown or empty identifier, an error or a timeout fails
/// the whole batch (nothing deleted).
pub async fn poll(
    queues: Arc<Queues>,
    runtime: Arc<RuntimeApi>,
    stats: Arc<EsmStats>,
    stop: Arc<AtomicBool>,
    function_timeout: Duration,
) {
    while !stop.load(Ordering::Relaxed) {
        let received = queues
            .client
            .receive_message()
            .queue_url(&queues.url)
            .max_number_of_messages(10)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await;
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        stats
            .deliveries
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        stats.invocations.fetch_add(1, Ordering::Relaxed);
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                let attributes: BTreeMap<String, String> = m
                    .attributes()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "messageId": m.message_id(),
                    "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "attributes": attributes,
                    "messageAttributes": {},
                    "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": queues.arn,
                    "awsRegion": "us-east-1",
                })
            })
            .collect();
        let event = json!({ "Records": records }).to_string();
        let ids: HashSet<&str> = messages.iter().filter_map(|m| m.message_id()).collect();
        let failed: Option<HashSet<String>> = match runtime.invoke(event, function_timeout).await {
            Reply::Response(body) => parse_failures(&body, &ids),
            Reply::Error | Reply::Timeout => None,
        };
        let Some(failed) = failed else {
            stats.batch_failures.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        for m in &messages {
            if !failed.contains(m.message_id().unwrap_or_default()) {
                let _ = queues
                    .client
                    .delete_message()
                    .queue_url(&queues.url)
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .send()
                    .await;
            }
        }
    }
}

/// The failed ids of a partial batch response, or `None` when Lambda would fail the
/// whole batch.
fn parse_failures(body: &[u8], ids: &HashSet<&str>) -> Option<HashSet<String>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let failures = value.get("batchItemFailures")?.as_array()?;
    let mut out = HashSet::new();
    for f in failures {
        let id = f.get("itemIdentifier")?.as_str()?;
        if id.is_empty() || !ids.contains(id) {
            return None;
        }
        out.insert(id.to_owned());
    }
    Some(out)
}

// --- The run ------------------------------------------------------------------------

/// What the producers sent, to check the outcome against.
#[derive(Default)]
pub struct Plan {
    /// Order id → the body that must be charged (once).
    pub must_charge: BTreeMap<String, String>,
    /// Orders whose customer declines: never charged, in the DLQ.
    pub declined: BTreeSet<String>,
    /// Bodies that must end in the DLQ (invalid).
    pub invalid: Vec<String>,
    /// Order id → its two conflicting bodies: one charged, the other in the DLQ.
    pub conflicting: BTreeMap<String, (String, String)>,
    /// Everything sent, duplicates included.
    pub messages: Vec<String>,
}

use std::collections::BTreeSet;

fn order_body(id: &str, amount: u64, customer: &str) -> String {
    json!({"id": id, "amount": amount, "currency": "EUR", "customer": customer, "sent_by": "system-test"}).to_string()
}

fn sns(body: &str) -> String {
    json!({"Type": "Notification", "MessageId": uuid::Uuid::new_v4().to_string(), "Message": body})
        .to_string()
}

/// `orders` orders from several producers: plain, retried (same body twice), fanned
/// out (raw + SNS copy), declining, invalid, conflicting.
pub async fn produce(run: &str, orders: usize) -> Plan {
    let good = [
        stripe::customer("tok_visa").await,
        stripe::customer("tok_visa").await,
        stripe::customer("tok_visa").await,
    ];
    let declining = stripe::customer("tok_chargeCustomerFail").await;
    let mut rng = rand::rng();
    let mut plan = Plan::default();
    for n in 0..orders {
        let id = format!("{run}-{n}");
        let amount = rng.random_range(100..100_000);
        let customer = good.choose(&mut rng).unwrap();
        let body = order_body(&id, amount, customer);
        match rng.random_range(0..100) {
            0..5 => {
                let bad = order_body(&id, amount, &declining);
                plan.declined.insert(id);
                plan.messages.push(bad);
            }
            5..10 => {
                let invalid = json!({"id": id, "amount": amount as f64 + 0.5, "currency": "EUR", "customer": customer}).to_string();
                plan.invalid.push(invalid.clone());
                plan.messages.push(invalid);
            }
            10..15 => {
                let other = order_body(&id, amount + 1, customer);
                plan.conflicting.insert(id, (body.clone(), other.clone()));
                plan.messages.push(body);
                plan.messages.push(other);
            }
            15..35 => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(body.clone());
                plan.messages.push(body);
            }
            35..55 => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(sns(&body));
                plan.messages.push(body);
            }
            _ => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(body);
            }
        }
    }
    // Interleave producers: duplicates and conflicts do not arrive side by side.
    use rand::seq::SliceRandom;
    plan.messages.shuffle(&mut rng);
    plan
}

/// Succeeded charges in the mock per order id of this run.
pub async fn charges_by_order(run: &str) -> BTreeMap<String, Vec<(u64, String)>> {
    let client = reqwest::Client::new();
    let mut by_order: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let mut query = vec![("limit", "100".to_owned())];
        if let Some(a) = &after {
            query.push(("starting_after", a.clone()));
        }
        let page: Value = client
            .get(format!("{}/v1/charges", super::stripe_mock_url()))
            .bearer_auth(stripe::TEST_KEY)
            .query(&query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = page["data"].as_array().unwrap();
        for charge in data {
            let order = charge["metadata"]["order_id"].as_str().unwrap_or_default();
            if order.starts_with(run) && charge["status"] == "succeeded" {
                by_order.entry(order.to_owned()).or_default().push((
                    charge["amount"].as_u64().unwrap(),
                    charge["id"].as_str().unwrap().to_owned(),
                ));
            }
        }
        match data.last() {
            Some(last) if page["has_more"] == true => {
                after = last["id"].as_str().map(str::to_owned)
            }
            _ => break,
        }
    }
    by_order
}

/// Waits until the source queue is empty twice in a row, at most `limit`.
pub async fn drain(queues: &Queues, limit: Duration) -> bool {
    let started = Instant::now();
    let mut empty_in_a_row = 0;
    while started.elapsed() < limit {
        if queues.pending().await == 0 {
            empty_in_a_row += 1;
            if empty_in_a_row >= 3 {
                return true;
            }
        } else {
            empty_in_a_row = 0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

pub fn log_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/system-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
