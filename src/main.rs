//! The binary: wiring only. Logs, config, clients built once; then the Lambda runtime
//! (inside Lambda) or one CLI command (outside). A start that cannot be completed logs
//! one line naming what is wrong and exits non-zero.

mod cli;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::batch::Consumer;
use charge_once::config::Config;
use charge_once::payment::PaymentProvider;
use charge_once::payment::{api_key, http::HttpProvider};
use charge_once::store::dynamodb::DynamoStore;
use charge_once::telemetry;
use clap::Parser as _;
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main]
async fn main() {
    telemetry::init();
    let result = if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        run_lambda().await
    } else {
        let cli = cli::Cli::parse();
        match Config::from_env() {
            Ok(config) => cli::run(cli, &config).await,
            Err(e) => Err(e.into()),
        }
    };
    if let Err(e) = result {
        // `{:#}` keeps the whole cause chain on one line.
        tracing::error!(error = format!("{e:#}"), "charge-once stopped");
        std::process::exit(1);
    }
}

/// The AWS SDK settings, with bounded calls: a hung connection must fail the record
/// (and release the lease) well before the invocation deadline, not hang it.
async fn sdk_config() -> aws_config::SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_attempt_timeout(Duration::from_secs(2))
        .operation_timeout(charge_once::config::STORE_TIMEOUT)
        .build();
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(timeouts)
        .load()
        .await
}

/// The Stripe-compatible provider at PAYMENT_API_URL, its key read once.
async fn http_provider(
    config: &Config,
    sdk: &aws_config::SdkConfig,
) -> anyhow::Result<Arc<dyn PaymentProvider>> {
    let url = config.require_payment_api_url()?;
    let key = api_key::load(config, sdk).await?;
    Ok(Arc::new(HttpProvider::new(
        url,
        &key,
        config.payment_timeout,
    )?))
}

async fn run_lambda() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    let table = config.require_table()?.to_owned();
    config.require_payment_api_url()?;
    let sdk = sdk_config().await;
    let provider = http_provider(&config, &sdk).await?;
    let store = Arc::new(DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), table));
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let consumer = Arc::new(Consumer::new(
        store,
        provider,
        config.settings(),
        config.limits(),
    ));
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let consumer = Arc::clone(&consumer);
        async move {
            let request_id = event.context.request_id.clone();
            let response = consumer.handle_lambda_event(event).await;
            // One EMF document per invocation, on stdout (CloudWatch reads both).
            metrics.set_property("RequestId", request_id);
            if let Err(e) = metrics.flush(std::io::stdout()) {
                tracing::warn!(error = %e, "metrics could not be written");
            }
            response.map_err(lambda_runtime::Error::from)
        }
    }))
    .await
    .map_err(|e| anyhow::anyhow!(e))
    .context("Lambda runtime stopped")
}
