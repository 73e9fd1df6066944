//! The binary: wiring only. Logs, config, clients built once, then the Lambda runtime.
//! A cold start that cannot be completed logs one line naming what is wrong and exits.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::batch::Consumer;
use charge_once::config::Config;
use charge_once::payment::{api_key, http::HttpProvider};
use charge_once::store::dynamodb::DynamoStore;
use charge_once::telemetry;
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main]
async fn main() {
    telemetry::init();
    if let Err(e) = run().await {
        // `{:#}` keeps the whole cause chain on one line.
        tracing::error!(error = format!("{e:#}"), "charge-once stopped");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        // STUB: the local `invoke` / `inspect` commands are the "Local run" issue.
        bail!(
            "not running inside Lambda (AWS_LAMBDA_RUNTIME_API is unset); the local \
             `invoke` command is not built yet"
        );
    }
    let config = Config::from_env()?;
    let table = config.require_table()?.to_owned();
    let api_url = config.require_payment_api_url()?.to_owned();
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let key = api_key::load(&config, &sdk).await?;
    let provider = Arc::new(HttpProvider::new(&api_url, &key, config.payment_timeout)?);
    let store = Arc::new(DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk), table));
    let consumer = Arc::new(Consumer::new(
        store,
        provider,
        config.settings(),
        config.max_concurrency,
        config.deadline_margin,
    ));
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let consumer = Arc::clone(&consumer);
        async move {
            consumer
                .handle_lambda_event(event)
                .await
                .map_err(lambda_runtime::Error::from)
        }
    }))
    .await
    .map_err(|e| anyhow::anyhow!(e))
    .context("Lambda runtime stopped")
}
