//! One execution environment's Runtime API emulator (the documented HTTP protocol:
//! next, response, error, init error) on 127.0.0.1, and the real binary in Lambda mode
//! attached to it (one per environment, so a process can be SIGKILLed and restarted).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::{mpsc, oneshot};

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

/// An invocation handed out: where its reply goes, and when it was handed out.
type InFlight = Arc<Mutex<HashMap<String, (oneshot::Sender<Reply>, Instant)>>>;

#[derive(Clone)]
struct RuntimeState {
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Invocation>>>,
    inflight: InFlight,
    billed: Arc<Mutex<Vec<Duration>>>,
    first_next: Arc<Mutex<Option<Instant>>>,
    most_in_flight: Arc<AtomicUsize>,
}

/// One execution environment's Runtime API (the documented HTTP protocol: next,
/// response, error, init error), served on 127.0.0.1.
pub struct RuntimeApi {
    pub addr: String,
    tx: mpsc::Sender<Invocation>,
    inflight: InFlight,
    billed: Arc<Mutex<Vec<Duration>>>,
    first_next: Arc<Mutex<Option<Instant>>>,
    most_in_flight: Arc<AtomicUsize>,
}

fn now_ms() -> u64 {
    u64::try_from(charge_once::domain::clock::wall_ms()).unwrap()
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
        let in_flight = {
            let mut inflight = state.inflight.lock().unwrap();
            inflight.insert(invocation.id.clone(), (invocation.reply, Instant::now()));
            inflight.len()
        };
        state.most_in_flight.fetch_max(in_flight, Ordering::Relaxed);
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
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    if let Some((reply, handed_out)) = state.inflight.lock().unwrap().remove(&id) {
        state.billed.lock().unwrap().push(handed_out.elapsed());
        let _ = reply.send(Reply::Response(body));
    }
    StatusCode::ACCEPTED
}

async fn error(State(state): State<RuntimeState>, UrlPath(id): UrlPath<String>) -> StatusCode {
    if let Some((reply, handed_out)) = state.inflight.lock().unwrap().remove(&id) {
        state.billed.lock().unwrap().push(handed_out.elapsed());
        let _ = reply.send(Reply::Error);
    }
    StatusCode::ACCEPTED
}

impl RuntimeApi {
    pub async fn start() -> Self {
        let (tx, rx) = mpsc::channel(16);
        let inflight: InFlight = Arc::new(Mutex::new(HashMap::new()));
        let billed = Arc::new(Mutex::new(Vec::new()));
        let first_next = Arc::new(Mutex::new(None));
        let most_in_flight = Arc::new(AtomicUsize::new(0));
        let state = RuntimeState {
            queue: Arc::new(tokio::sync::Mutex::new(rx)),
            inflight: inflight.clone(),
            billed: billed.clone(),
            first_next: first_next.clone(),
            most_in_flight: most_in_flight.clone(),
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
            billed,
            first_next,
            most_in_flight,
        }
    }

    /// The most invocations handed out and not yet answered at one time: above 1 only
    /// when a process served several at once.
    pub fn most_in_flight(&self) -> usize {
        self.most_in_flight.load(Ordering::Relaxed)
    }

    /// What Lambda bills of each answered invocation so far, taken: from the event
    /// handed out to the response (or error) posted.
    pub fn take_billed(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.billed.lock().unwrap())
    }

    /// When a process first asked for an invocation (the end of its init).
    pub fn first_next(&self) -> Option<Instant> {
        *self.first_next.lock().unwrap()
    }

    /// Invokes the function with `event`; waits until the deadline plus a little.
    pub async fn invoke(&self, event: String, timeout: Duration) -> Reply {
        self.invoke_as(uuid::Uuid::new_v4().to_string(), event, timeout)
            .await
    }

    /// [`Self::invoke`] with the request id `id`.
    pub async fn invoke_as(&self, id: String, event: String, timeout: Duration) -> Reply {
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
    /// SQS (`AWS_ENDPOINT_URL_SQS`) and the dead-letter queue's URL.
    pub sqs: String,
    pub dead_letter_queue: String,
}

/// A loopback port nothing listens on: a queue call there is refused at once.
const NO_QUEUE: &str = "http://127.0.0.1:9";

impl Endpoints {
    /// For a run that needs no queue calls (no record is meant to fail): SQS is a
    /// loopback port nothing listens on, so a queue call fails at once and its record
    /// comes back at the queue's visibility, as when SQS cannot be reached.
    pub fn without_queue(dynamodb: String, payment: String, table: String) -> Self {
        Self {
            dynamodb,
            payment,
            table,
            sqs: NO_QUEUE.to_owned(),
            dead_letter_queue: format!("{NO_QUEUE}/000000000000/no-dead-letter-queue"),
        }
    }
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
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    crate::servers::test_account(command)
        .env("AWS_LAMBDA_RUNTIME_API", runtime)
        .env("AWS_LAMBDA_FUNCTION_NAME", "charge-once")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        // What the template's LoggingConfig (LogFormat: JSON) makes Lambda set.
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .env("AWS_ENDPOINT_URL_DYNAMODB", &endpoints.dynamodb)
        .env("AWS_ENDPOINT_URL_SQS", &endpoints.sqs)
        .env("DEAD_LETTER_QUEUE_URL", &endpoints.dead_letter_queue)
        .env("IDEMPOTENCY_TABLE", &endpoints.table)
        .env("PAYMENT_API_URL", &endpoints.payment)
        .env("PAYMENT_API_KEY", crate::localstripe::TEST_KEY)
        .env("PAYMENT_TIMEOUT", "1s")
        .env("MAX_CONCURRENCY", "10")
}

/// How a consumer process is started besides its environment.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Its stderr (the logs), appended to.
    pub log: PathBuf,
    /// Its stdout (the EMF documents), appended to; dropped when `None`.
    pub metrics: Option<PathBuf>,
    /// `AWS_LAMBDA_MAX_CONCURRENCY`, as Lambda Managed Instances set it; unset when
    /// `None` (classic Lambda: one invocation at a time).
    pub max_concurrency: Option<u32>,
    /// More of the function's settings (`CHARGE_ONCE_FUNCTION`, ...).
    pub env: Vec<(&'static str, String)>,
}

impl Launch {
    pub fn logging_to(log: PathBuf) -> Self {
        Self {
            log,
            metrics: None,
            max_concurrency: None,
            env: Vec::new(),
        }
    }
}

/// The real binary in Lambda mode, attached to one Runtime API.
pub struct ConsumerProcess {
    child: Child,
    bin: PathBuf,
    runtime: String,
    launch: Launch,
}

fn append_to(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

impl ConsumerProcess {
    /// `bin` is the binary under test: a test passes `env!("CARGO_BIN_EXE_charge-once")`.
    pub fn spawn(bin: &Path, runtime: &RuntimeApi, endpoints: &Endpoints, log: PathBuf) -> Self {
        Self::launch(bin, runtime, endpoints, Launch::logging_to(log))
    }

    pub fn launch(bin: &Path, runtime: &RuntimeApi, endpoints: &Endpoints, launch: Launch) -> Self {
        Self {
            child: Self::start(bin, &runtime.addr, endpoints, &launch),
            bin: bin.to_owned(),
            runtime: runtime.addr.clone(),
            launch,
        }
    }

    fn start(bin: &Path, runtime: &str, endpoints: &Endpoints, launch: &Launch) -> Child {
        let mut command = Command::new(bin);
        lambda_environment(&mut command, runtime, endpoints)
            .env("DEADLINE_MARGIN", "1500ms")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(
                launch
                    .metrics
                    .as_deref()
                    .map_or_else(Stdio::null, |p| append_to(p).into()),
            )
            .stderr(append_to(&launch.log));
        if let Some(n) = launch.max_concurrency {
            command.env("AWS_LAMBDA_MAX_CONCURRENCY", n.to_string());
        }
        command.envs(launch.env.iter().map(|(k, v)| (k, v)));
        command.spawn().expect("spawn charge-once")
    }

    /// SIGKILL, wherever it is, and a fresh process on the same environment.
    pub fn kill_and_restart(&mut self, endpoints: &Endpoints) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::start(&self.bin, &self.runtime, endpoints, &self.launch);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
