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
use crate::adapters::sqlite_file::OpenError;
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
}

impl From<ApiKeyError> for WiringError {
    fn from(error: ApiKeyError) -> Self {
        Self::ApiKey(Box::new(error))
    }
}

/// Where idempotency records live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// The embedded SQLite file.
    Sqlite(PathBuf),
    /// DynamoDB: the table in IDEMPOTENCY_TABLE, endpoints from the AWS SDK settings.
    Dynamodb,
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
        StoreChoice::Sqlite(path) => {
            let store = SqliteStore::open(path).map_err(|source| WiringError::SqliteStore {
                path: path.display().to_string(),
                source,
            })?;
            Arc::new(store)
        }
        StoreChoice::Dynamodb => dynamo_store(config, &sdk_config(&tls(config)?).await)?,
    })
}

/// The simulator on the ledger in `db`, when it is the provider: PAYMENT_API_URL unset.
pub fn simulator(config: &Config, db: &Path) -> Result<Option<SimulatedProvider>, WiringError> {
    if config.payment_api_url.is_some() {
        return Ok(None);
    }
    let simulated = SimulatedProvider::open(db).map_err(|source| WiringError::Simulator {
        path: db.display().to_string(),
        source: Box::new(source),
    })?;
    Ok(Some(simulated))
}

/// The provider of a local command: the HTTP client when PAYMENT_API_URL is set, else
/// the simulator on the ledger in `db`.
pub async fn provider(config: &Config, db: &Path) -> Result<Arc<dyn PaymentProvider>, WiringError> {
    Ok(match simulator(config, db)? {
        Some(simulated) => Arc::new(simulated),
        None => {
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
