//! The parts the Lambda function and the operator's commands build at start, once:
//! the AWS SDK settings, the DynamoDB store, the HTTP provider (its key read once),
//! the queue, the consumer over a store and a provider, and in Lambda the traces
//! when `OTEL_*` asks for them. `main.rs` (Lambda) and
//! `cli.rs` (the commands outside Lambda) only choose; the local member's binary
//! (`local/`) builds its consumer here too, over its own store and simulator.

use std::sync::Arc;

use crate::adapters::api_key::{self, ApiKeyError};
use crate::adapters::dynamodb::DynamoStore;
use crate::adapters::payment_http::{HttpProvider, HttpSetupError};
use crate::adapters::sqs::{SqsQueue, SqsReports};
use crate::adapters::tls::{Tls, TlsError};
use crate::config::{Config, ConfigError};
use crate::contracts::payment::{ChargePath, RefundPath};
use crate::contracts::queue::{NOTE_ATTRIBUTE, Reports, Unreported};
use crate::contracts::store::IdempotencyStore;
use crate::drivers::batch::Consumer;
use crate::drivers::charge::Settings;
use crate::drivers::refund::Refunds;
use crate::drivers::spans;
use crate::policy::deadline;
use crate::traces::{self, Traces, TracesError};
use idempotent_consumer::effect;
use idempotent_consumer::executor::Safeguards;
use idempotent_consumer::queue::Queue;

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
    #[error(transparent)]
    Traces(#[from] TracesError),
    /// Outside Lambda, the SDK's credential chain found nothing (its own error lists
    /// every provider it tried; the line names what to set instead).
    #[error(
        "no AWS credentials: configure a profile (aws configure, AWS_PROFILE) or set \
         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )]
    NoCredentials,
}

impl From<ApiKeyError> for WiringError {
    fn from(error: ApiKeyError) -> Self {
        Self::ApiKey(Box::new(error))
    }
}

/// Traces in Lambda, when the `OTEL_*` settings ask for them (`traces.rs`); `None`:
/// off. Built before the async runtime starts: the exporter's HTTP client is a
/// blocking one, which must not be started inside it. `AWS_CA_BUNDLE` and the names
/// the spans give the table and the provider come from the configuration; a
/// configuration that does not read is the start's own error, reported after this.
pub fn traces() -> Result<Option<Traces>, WiringError> {
    let Some(settings) = traces::Settings::from_lookup(|k| std::env::var(k).ok())? else {
        return Ok(None);
    };
    let config = Config::from_env().ok();
    let tls = Tls::new(config.as_ref().and_then(|c| c.ca_bundle.as_deref()))?;
    let names = spans::Names {
        table: config.as_ref().and_then(|c| c.table.clone()),
        endpoint: config
            .as_ref()
            .and_then(|c| c.payment_api_url.as_deref())
            .and_then(|u| url::Url::parse(u).ok())
            .and_then(|u| u.host_str().map(str::to_owned)),
    };
    Ok(Some(Traces::start(&settings, &tls, names)?))
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

/// How long the credential chain may take outside Lambda before a command says it has
/// none (the instance metadata service answers within a second where there is one).
const CREDENTIALS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Outside Lambda: the operator's credentials, resolved once before any command, so a
/// terminal without any says so in one line instead of every call's SDK error.
pub async fn require_credentials(sdk: &aws_config::SdkConfig) -> Result<(), WiringError> {
    use aws_credential_types::provider::ProvideCredentials as _;
    let provider = sdk
        .credentials_provider()
        .ok_or(WiringError::NoCredentials)?;
    match tokio::time::timeout(CREDENTIALS_TIMEOUT, provider.provide_credentials()).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(WiringError::NoCredentials),
    }
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
    Ok(Arc::new(SqsQueue::new(
        aws_sdk_sqs::Client::new(sdk),
        dlq,
        NOTE_ATTRIBUTE,
    )))
}

/// Where ended waits are reported: the queue at AUTHENTICATION_ENDED_QUEUE_URL, or
/// nowhere but the log line and the metric when it is unset.
pub fn reports(config: &Config, sdk: &aws_config::SdkConfig) -> Arc<dyn Reports> {
    match &config.authentication_ended_queue_url {
        Some(url) => Arc::new(SqsReports::new(aws_sdk_sqs::Client::new(sdk), url)),
        None => Arc::new(Unreported),
    }
}

/// The Stripe-compatible provider at PAYMENT_API_URL, its key read once.
pub async fn http_provider(
    config: &Config,
    sdk: &aws_config::SdkConfig,
    tls: &Tls,
) -> Result<Arc<HttpProvider>, WiringError> {
    let url = config.require_payment_api_url()?;
    let key = api_key::load(config, sdk).await?;
    Ok(Arc::new(
        HttpProvider::new(url, &key, config.payment_timeout, tls)?
            .with_stored_credential_usage(config.stored_credential_usage),
    ))
}

/// The refund function: the library's consumer of an effect at a provider, the effect
/// a refund ([`Refunds`]) on the orders' table and the provider, dead letters to
/// DEAD_LETTER_QUEUE_URL (none locally: a record no retry can fix then fails), under
/// the configuration's safeguards and waits.
pub fn refund_consumer(
    config: &Config,
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn RefundPath>,
    dead_letters: Option<Arc<dyn Queue>>,
) -> effect::Consumer<Refunds> {
    let settings = Settings::from(config);
    let safeguards = Safeguards {
        clock: settings.clock.clone(),
        budget: settings.budget,
        breakers: settings.breakers.clone(),
    };
    let refunds = Refunds::new(provider, store.clone(), config.max_declines);
    let consumer = effect::Consumer::new(store, refunds, safeguards, settings.policy());
    match dead_letters {
        Some(queue) => consumer.with_dead_letters(queue),
        None => consumer,
    }
}

/// The consumer over a store and a provider, with the configuration's settings.
pub fn consumer(
    config: &Config,
    store: Arc<dyn IdempotencyStore>,
    provider: Arc<dyn ChargePath>,
) -> Consumer {
    Consumer::new(store, provider, Settings::from(config), config.into())
}
