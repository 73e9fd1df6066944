//! The parts both entry points build at start, once: the AWS SDK settings, the store
//! and the provider (the HTTP client with its key read once, or the local simulator),
//! and the consumer over them. `main.rs` (Lambda) and `cli.rs` (local commands) only
//! choose; everything they share is built here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::adapters::api_key::{self, ApiKeyError};
use crate::adapters::dynamodb::DynamoStore;
use crate::adapters::payment_http::{HttpProvider, HttpSetupError};
use crate::adapters::simulated::SimulatedProvider;
use crate::adapters::sqlite::SqliteStore;
use crate::adapters::sqlite_file::{OpenError, OpenMode};
use crate::adapters::sqs::SqsQueue;
use crate::adapters::tls::{Tls, TlsError};
use crate::config::{Config, ConfigError};
use crate::contracts::payment::{ChargePath, PaymentProvider};
use crate::contracts::store::{IdempotencyStore, StoreError};
use crate::drivers::batch::Consumer;
use crate::drivers::charge::Settings;
use crate::policy::deadline;

/// A part could not be built: the start stops with this, naming what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Boxed: the SDK error inside is large, and a start error is rare.
    #[error(transparent)]
    ApiKey(Box<ApiKeyError>),
    #[error("the payment API client")]
    Http(#[from] HttpSetupError),
    #[error("--db {path}: opening the SQLite store")]
    SqliteStore {
        path: String,
        #[source]
        source: StoreError,
    },
    #[error("--db {path}: opening the simulator's ledger")]
    Simulator {
        path: String,
        #[source]
        source: Box<OpenError>,
    },
    /// A local command refused to start: what it was asked would risk a real order.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// Why a local command will not start. Each says what to set instead. The CLI exits 2
/// on these (nothing was done).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "no payment provider: set PAYMENT_API_URL (and PAYMENT_API_KEY or \
         PAYMENT_API_KEY_SECRET_ARN) for the real provider, or pass --provider simulator for \
         a local run on --store sqlite"
    )]
    NoProvider,
    #[error(
        "--provider simulator is for local runs on --store sqlite only, never a DynamoDB \
         table: set PAYMENT_API_URL (and its key) and drop --provider simulator"
    )]
    SimulatorOnDynamodb,
    #[error(
        "--provider simulator cannot run inside Lambda (AWS_LAMBDA_FUNCTION_NAME is set): \
         set PAYMENT_API_URL (and its key)"
    )]
    SimulatorInLambda,
    #[error(
        "--provider simulator and PAYMENT_API_URL are both set: unset PAYMENT_API_URL for a \
         local run, or drop --provider simulator to use the real provider"
    )]
    TwoProviders,
    #[error(
        "--db {path}: no such file; nothing was created (only invoke creates a local database)"
    )]
    NoDatabase { path: String },
    #[error(
        "--db {path}: holds no simulator ledger, so the simulator never charged an order \
         of this file: use the provider its orders were charged at (PAYMENT_API_URL and \
         its key)"
    )]
    NoLedger { path: String },
    #[error(
        "--db {path}: the simulator's ledger holds this order's keys, so it was charged by \
         the simulator, not at PAYMENT_API_URL: resolve it with --provider simulator"
    )]
    ChargedBySimulator { path: String },
}

/// The payment provider a local command asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderChoice {
    /// The Stripe-compatible provider at PAYMENT_API_URL.
    Http,
    /// The local simulator, its ledger in the `--db` file.
    Simulator,
}

impl ProviderChoice {
    /// The provider of a local command (pure): the simulator only when named, and
    /// only beside the local SQLite store, outside Lambda, with no provider URL set;
    /// the HTTP provider only with its URL. Nothing falls back to the simulator: an
    /// order it "charges" or "cannot find" was never at the real provider.
    pub fn decide(
        requested: Option<Self>,
        url_set: bool,
        store: &StoreChoice,
        in_lambda: bool,
    ) -> Result<Self, Refusal> {
        match requested {
            Some(Self::Simulator) if in_lambda => Err(Refusal::SimulatorInLambda),
            Some(Self::Simulator) if matches!(store, StoreChoice::Dynamodb) => {
                Err(Refusal::SimulatorOnDynamodb)
            }
            Some(Self::Simulator) if url_set => Err(Refusal::TwoProviders),
            Some(Self::Simulator) => Ok(Self::Simulator),
            Some(Self::Http) | None if url_set => Ok(Self::Http),
            Some(Self::Http) | None => Err(Refusal::NoProvider),
        }
    }
}

impl From<ApiKeyError> for WiringError {
    fn from(error: ApiKeyError) -> Self {
        Self::ApiKey(Box::new(error))
    }
}

/// Where idempotency records live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// The embedded SQLite file; created when missing only with [`OpenMode::Create`].
    Sqlite(PathBuf, OpenMode),
    /// DynamoDB: the table in IDEMPOTENCY_TABLE, endpoints from the AWS SDK settings.
    Dynamodb,
}

impl StoreChoice {
    /// The SQLite file, when the records live in one.
    pub fn sqlite_file(&self) -> Option<&Path> {
        match self {
            Self::Sqlite(path, _) => Some(path),
            Self::Dynamodb => None,
        }
    }
}

/// A read-only command's `--db` must exist: a mistyped path is refused, never created.
pub fn existing_db(path: &Path) -> Result<(), Refusal> {
    if path.is_file() {
        Ok(())
    } else {
        Err(Refusal::NoDatabase {
            path: path.display().to_string(),
        })
    }
}

/// The TLS settings of both HTTPS clients (Mozilla's roots and `AWS_CA_BUNDLE`'s).
pub fn tls(config: &Config) -> Result<Tls, WiringError> {
    Ok(Tls::new(config.ca_bundle.as_deref())?)
}

/// The AWS SDK settings, with bounded calls: a hung connection must fail the record
/// (and release the lease) well before the invocation deadline, not hang it.
pub async fn sdk_config(tls: &Tls) -> aws_config::SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(deadline::SDK_CONNECT_TIMEOUT)
        .operation_attempt_timeout(deadline::SDK_ATTEMPT_TIMEOUT)
        .operation_timeout(deadline::STORE_TIMEOUT)
        .build();
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(crate::adapters::sdk_http::client(tls))
        .timeout_config(timeouts)
        .load()
        .await
}

/// The DynamoDB store on IDEMPOTENCY_TABLE.
pub fn dynamo_store(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<DynamoStore>, WiringError> {
    let table = config.require_table()?.to_owned();
    Ok(Arc::new(DynamoStore::new(
        aws_sdk_dynamodb::Client::new(sdk),
        table,
    )))
}

/// The queue calls (visibility, dead letters to DEAD_LETTER_QUEUE_URL).
pub fn sqs_queue(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> Result<Arc<SqsQueue>, WiringError> {
    let dlq = config.require_dead_letter_queue_url()?;
    Ok(Arc::new(SqsQueue::new(aws_sdk_sqs::Client::new(sdk), dlq)))
}

/// The Stripe-compatible provider at PAYMENT_API_URL, its key read once.
pub async fn http_provider(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    tls: &Tls,
) -> Result<Arc<HttpProvider>, WiringError> {
    let url = config.require_payment_api_url()?;
    let key = api_key::load(config, sdk).await?;
    Ok(Arc::new(HttpProvider::new(
        url,
        &key,
        config.payment_timeout,
        tls,
    )?))
}

/// The store a local command asked for.
pub async fn store(
    config: &Config,
    choice: &StoreChoice,
) -> Result<Arc<dyn IdempotencyStore>, WiringError> {
    Ok(match choice {
        StoreChoice::Sqlite(path, mode) => {
            if *mode == OpenMode::Existing {
                existing_db(path)?;
            }
            let store =
                SqliteStore::open_in(path, *mode).map_err(|source| WiringError::SqliteStore {
                    path: path.display().to_string(),
                    source,
                })?;
            Arc::new(store)
        }
        StoreChoice::Dynamodb => dynamo_store(config, &sdk_config(&tls(config)?).await)?,
    })
}

/// The simulator's ledger in `db`; with [`OpenMode::Existing`] the file must exist and
/// hold it.
pub fn simulator(db: &Path, mode: OpenMode) -> Result<SimulatedProvider, WiringError> {
    if mode == OpenMode::Existing {
        existing_db(db)?;
    }
    let path = db.display().to_string();
    SimulatedProvider::open_in(db, mode).map_err(|source| match source {
        OpenError::NoTable { .. } => Refusal::NoLedger { path }.into(),
        source => WiringError::Simulator {
            path,
            source: Box::new(source),
        },
    })
}

/// The provider of a local command, as [`ProviderChoice::decide`] chose it: the HTTP
/// client at PAYMENT_API_URL, or the simulator on the ledger in the store's SQLite
/// file (created only with [`OpenMode::Create`]).
pub async fn provider(
    config: &Config,
    choice: ProviderChoice,
    store: &StoreChoice,
) -> Result<Arc<dyn PaymentProvider>, WiringError> {
    Ok(match (choice, store) {
        (ProviderChoice::Simulator, StoreChoice::Sqlite(db, mode)) => {
            Arc::new(simulator(db, *mode)?)
        }
        (ProviderChoice::Simulator, StoreChoice::Dynamodb) => {
            return Err(Refusal::SimulatorOnDynamodb.into());
        }
        (ProviderChoice::Http, _) => {
            let tls = tls(config)?;
            http_provider(config, &sdk_config(&tls).await, &tls).await?
        }
    })
}

/// The consumer over a store and a provider, with the configuration's settings.
pub fn consumer(
    config: &Config,
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn ChargePath>,
) -> Consumer {
    Consumer::new(store, provider, Settings::from(config), config.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite() -> StoreChoice {
        StoreChoice::Sqlite(PathBuf::from("x.sqlite3"), OpenMode::Create)
    }

    #[test]
    fn the_simulator_runs_only_when_named_beside_sqlite_outside_lambda_without_a_url() {
        use ProviderChoice::{Http, Simulator};
        let dynamo = StoreChoice::Dynamodb;
        let decide = ProviderChoice::decide;
        assert_eq!(
            decide(Some(Simulator), false, &sqlite(), false),
            Ok(Simulator)
        );
        assert_eq!(
            decide(Some(Simulator), false, &dynamo, false),
            Err(Refusal::SimulatorOnDynamodb)
        );
        assert_eq!(
            decide(Some(Simulator), false, &sqlite(), true),
            Err(Refusal::SimulatorInLambda)
        );
        assert_eq!(
            decide(Some(Simulator), true, &sqlite(), false),
            Err(Refusal::TwoProviders)
        );
        // No fallback: without a URL and without the flag, nothing runs.
        for store in [sqlite(), dynamo.clone()] {
            assert_eq!(decide(None, false, &store, false), Err(Refusal::NoProvider));
            assert_eq!(
                decide(Some(Http), false, &store, false),
                Err(Refusal::NoProvider)
            );
            assert_eq!(decide(None, true, &store, false), Ok(Http));
            assert_eq!(decide(None, true, &store, true), Ok(Http));
        }
    }

    #[test]
    fn a_refusal_is_one_line_that_says_what_to_set() {
        for refusal in [
            Refusal::NoProvider,
            Refusal::SimulatorOnDynamodb,
            Refusal::SimulatorInLambda,
            Refusal::TwoProviders,
            Refusal::NoDatabase { path: "x".into() },
            Refusal::NoLedger { path: "x".into() },
            Refusal::ChargedBySimulator { path: "x".into() },
        ] {
            let text = refusal.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(
                ["PAYMENT_API_URL", "--provider", "--db"]
                    .iter()
                    .any(|s| text.contains(s)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_missing_db_is_refused_and_not_created_by_a_read_only_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.sqlite3");
        assert!(matches!(
            simulator(&path, OpenMode::Existing),
            Err(WiringError::Refused(Refusal::NoDatabase { .. }))
        ));
        assert!(!path.parent().unwrap().exists());
    }
}
