//! The real servers the suites run against, started once per test binary on a free
//! 127.0.0.1 port: moto behind its one-lock wrapper, dynalite, stripe-stateful-mock and
//! localstripe behind its layer.
//! A fresh table per test. A missing server is a failure that says how to install it,
//! never a skip.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, Projection, ProjectionType, ScalarAttributeType, TableStatus,
};
use charge_once::adapters::dynamodb::DynamoStore;
use charge_once::contracts::schema::{self, Value};
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::clock::Time;
use charge_once::domain::{Key, Record, State};

/// The DynamoDB-compatible servers the suites run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// moto_server behind one lock (stock moto lets two conditional writes both win).
    Moto,
    /// dynalite: stricter validation; ignores ALL_OLD, so the GetItem fallback runs.
    Dynalite,
}

struct Server {
    url: String,
    // Kept for the life of the test binary: its stdin closes when the binary exits,
    // and the server exits with it.
    _child: Child,
}

static MOTO: OnceLock<Server> = OnceLock::new();
static DYNALITE: OnceLock<Server> = OnceLock::new();
static STRIPE_MOCK: OnceLock<Server> = OnceLock::new();
static LOCALSTRIPE: OnceLock<Server> = OnceLock::new();

use crate::root;

impl Backend {
    pub fn url(self) -> &'static str {
        match self {
            Self::Moto => &MOTO.get_or_init(start_moto).url,
            Self::Dynalite => &DYNALITE.get_or_init(start_dynalite).url,
        }
    }

    /// A client with fixed test credentials, bounded timeouts and the standard retries.
    pub fn client(self) -> Client {
        Self::client_at(self.url())
    }

    /// The same client for another endpoint (a proxy in front of a backend).
    pub fn client_at(url: &str) -> Client {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .endpoint_url(url)
            .http_client(crate::sdk_http_client())
            .timeout_config(
                aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_secs(10))
                    .operation_timeout(Duration::from_secs(30))
                    .build(),
            )
            .build();
        Client::from_conf(config)
    }

    /// A store on a fresh, empty table.
    pub async fn fresh_table(self) -> Table {
        let client = self.client();
        let name = format!("idem-{}", uuid::Uuid::new_v4().simple());
        create_table(&client, &name)
            .await
            .unwrap_or_else(|e| panic!("{self:?}: creating table {name}: {e}"));
        let store = DynamoStore::new(client.clone(), name.clone());
        Table {
            client,
            name,
            store: Arc::new(store),
        }
    }
}

/// An item as the legacy consumer (the pattern card's TypeScript consumer) writes it: `pk`, `estado`,
/// `creado`, `expira` and, once done, `recibo`; no fingerprint, no lease, no attempt.
pub fn legacy_item(
    pk: &Key,
    state: State,
    receipt: Option<&str>,
    expires: Time,
) -> Vec<(&'static str, Value)> {
    schema::attributes(&Record {
        created: Some(Time::from_ms(1_700_000_000_000)),
        expires: Some(expires),
        receipt: receipt.map(str::to_owned),
        ..Record::new(pk.clone(), state)
    })
}

/// Creates an idempotency table as `template.yaml` does (on demand, `pk` S, the sparse
/// awaiting index on `estado` + `espera_hasta`) and waits until it is ACTIVE: writes
/// fail while it is CREATING. Bounded: 200 × 50 ms.
async fn create_table(client: &Client, name: &str) -> Result<(), String> {
    let definition = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .map_err(|e| e.to_string())
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .map_err(|e| e.to_string())
    };
    let awaiting = GlobalSecondaryIndex::builder()
        .index_name(schema::AWAITING_INDEX)
        .key_schema(key(schema::attr::STATE, KeyType::Hash)?)
        .key_schema(key(schema::attr::WAIT_UNTIL, KeyType::Range)?)
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::All)
                .build(),
        )
        .build()
        .map_err(|e| e.to_string())?;
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(definition(schema::attr::PK, ScalarAttributeType::S)?)
        .attribute_definitions(definition(schema::attr::STATE, ScalarAttributeType::S)?)
        .attribute_definitions(definition(
            schema::attr::WAIT_UNTIL,
            ScalarAttributeType::N,
        )?)
        .key_schema(key(schema::attr::PK, KeyType::Hash)?)
        .global_secondary_indexes(awaiting)
        .send()
        .await
        .map_err(|e| charge_once::error_chain(&e))?;
    for _ in 0..200 {
        let described = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| charge_once::error_chain(&e))?;
        if described.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the table did not become ACTIVE within 10 s".to_owned())
}

/// A fresh table and the store on it.
pub struct Table {
    pub client: Client,
    pub name: String,
    pub store: Arc<DynamoStore>,
}

impl Table {
    pub fn dyn_store(&self) -> Arc<dyn IdempotencyStore> {
        self.store.clone()
    }

    /// Writes an item as the legacy consumer (the pattern card's TypeScript consumer) does (see
    /// [`legacy_item`]).
    pub async fn put_legacy_item(
        &self,
        pk: &Key,
        state: State,
        receipt: Option<&str>,
        expires: Time,
    ) {
        self.put_item(legacy_item(pk, state, receipt, expires))
            .await;
    }

    /// Writes an item as another program would, attribute by attribute.
    pub async fn put_item(&self, item: Vec<(&'static str, Value)>) {
        let mut put = self.client.put_item().table_name(&self.name);
        for (name, value) in item {
            let value = match value {
                Value::S(s) => AttributeValue::S(s),
                Value::N(n) => AttributeValue::N(n.to_string()),
            };
            put = put.item(name, value);
        }
        put.send().await.expect("put item");
    }
}

fn start_moto() -> Server {
    let python = root().join(".venv/bin/python");
    if !python.exists() {
        panic!(
            "moto is not installed: {} is missing. Run `make test` (it creates .venv with \
             moto[server]), or `python3 -m venv .venv && .venv/bin/pip install -r \
             requirements-test.txt`",
            python.display()
        );
    }
    spawn_server(
        "moto",
        Command::new(python).arg(root().join("harness/servers/moto_locked.py")),
    )
}

fn start_dynalite() -> Server {
    if !root().join("node_modules/dynalite").exists() {
        panic!(
            "dynalite is not installed: node_modules/dynalite is missing. Run `make test` \
             (it runs `npm ci`), or `npm install` in {}",
            root().display()
        );
    }
    spawn_server(
        "dynalite",
        Command::new("node").arg(root().join("harness/servers/dynalite_server.js")),
    )
}

fn start_stripe_mock() -> Server {
    if !root().join("node_modules/stripe-stateful-mock").exists() {
        panic!(
            "stripe-stateful-mock is not installed: node_modules/stripe-stateful-mock is \
             missing. Run `make test` (it runs `npm ci`), or `npm install` in {}",
            root().display()
        );
    }
    spawn_server(
        "stripe-mock",
        Command::new("node").arg(root().join("harness/servers/stripe_mock_server.js")),
    )
}

/// The stripe-stateful-mock base URL (started on first use): only the reference that
/// localstripe's layer is held against.
pub fn stripe_mock_url() -> &'static str {
    &STRIPE_MOCK.get_or_init(start_stripe_mock).url
}

fn start_localstripe() -> Server {
    if !root().join(".venv/bin/localstripe").exists() {
        panic!(
            "localstripe is not installed: .venv/bin/localstripe is missing. Run `make deps` \
             (it installs requirements-test.txt into .venv), or `.venv/bin/pip install -r \
             requirements-test.txt` in {}",
            root().display()
        );
    }
    spawn_server(
        "localstripe",
        Command::new(root().join(".venv/bin/python"))
            .arg(root().join("harness/servers/localstripe_server.py")),
    )
}

/// The base URL of localstripe behind the layer that adds Stripe's idempotency and the
/// PaymentIntent list's `customer` filter (`harness/servers/localstripe_server.py`),
/// started on first use.
pub fn localstripe_url() -> &'static str {
    &LOCALSTRIPE.get_or_init(start_localstripe).url
}

/// The account of every process the tests start: one region, static credentials.
pub fn test_account(command: &mut Command) -> &mut Command {
    command
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
}

/// A CLI command of the real binary on moto's `table` and localstripe (`api_key`),
/// outside Lambda.
pub fn cli_on_moto_and_localstripe<'a>(
    command: &'a mut Command,
    table: &str,
    api_key: &str,
) -> &'a mut Command {
    test_account(command)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_PROFILE")
        .env("AWS_ENDPOINT_URL", Backend::Moto.url())
        .env("IDEMPOTENCY_TABLE", table)
        .env("PAYMENT_API_URL", localstripe_url())
        .env("PAYMENT_API_KEY", api_key)
}

/// An SDK config for moto (Secrets Manager and the rest).
pub fn moto_sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            Credentials::new("test", "test", None, None, "tests"),
        ))
        .endpoint_url(Backend::Moto.url())
        .http_client(crate::sdk_http_client())
        .build()
}

/// Starts a server that prints `PORT=<n>` and exits when its stdin closes.
fn spawn_server(name: &str, command: &mut Command) -> Server {
    let log = log_path(name);
    let stderr = std::fs::File::create(&log).expect("server log file");
    let mut child = command
        .current_dir(root())
        // Fixed ports and detached mode are for `make watch`, never for tests.
        .env_remove("PORT")
        .env_remove("DETACHED")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {name} ({command:?}): {e}. Run `make test` to install it")
        });
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            if let Some(port) = line.strip_prefix("PORT=") {
                let _ = tx.send(port.trim().to_owned());
                break;
            }
        }
        // Keep draining so the server never blocks on a full pipe.
        for _ in lines {}
    });
    let port = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "{name} did not report its port within 60 s; its log ({}):\n{text}",
                log.display()
            )
        });
    Server {
        url: format!("http://127.0.0.1:{port}"),
        _child: child,
    }
}

fn log_path(name: &str) -> PathBuf {
    let dir = root().join("target/test-servers");
    std::fs::create_dir_all(&dir).expect("target/test-servers");
    dir.join(format!("{name}-{}.log", std::process::id()))
}

/// An HTTPS server on loopback whose certificate is self-signed (a leaf for
/// 127.0.0.1), so no root trusts it unless `cert` is added as one: `openssl s_server`
/// (Debian's openssl) with a key made for it. It answers any request with a 200 HTML
/// page. Stopped when dropped.
pub struct SelfSignedTls {
    child: Child,
    pub url: String,
    /// The certificate, PEM: an `AWS_CA_BUNDLE` that trusts this server.
    pub cert: PathBuf,
}

impl SelfSignedTls {
    pub fn start() -> Self {
        let dir = root().join("target/test-servers");
        std::fs::create_dir_all(&dir).expect("target/test-servers");
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (key, cert) = (
            dir.join(format!("{tag}.key")),
            dir.join(format!("{tag}.crt")),
        );
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1"])
            .args(["-addext", "subjectAltName=IP:127.0.0.1"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(Stdio::null())
            .status()
            .expect("openssl is needed for the TLS tests: apt-get install openssl");
        assert!(made.success(), "openssl req failed");
        // The port is picked here and freed for s_server: another test could take it in
        // between, which fails this test loudly, never silently.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new("openssl")
            .args(["s_server", "-www", "-accept", &format!("127.0.0.1:{port}")])
            .arg("-key")
            .arg(&key)
            .arg("-cert")
            .arg(&cert)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("ACCEPT") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("openssl s_server did not start within 10 s");
        Self {
            child,
            url: format!("https://127.0.0.1:{port}"),
            cert,
        }
    }
}

impl Drop for SelfSignedTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
