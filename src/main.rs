//! The binary: wiring only. Logs, config, clients built once, then the Lambda runtime.

use std::sync::Arc;

use anyhow::{Context as _, bail};
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::batch::Consumer;
use charge_once::config::Config;
use charge_once::payment::PaymentProvider;
use charge_once::store::dynamodb::DynamoStore;
use charge_once::telemetry;
use lambda_runtime::{LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        // STUB: the local `invoke` / `inspect` commands are the "Local run" issue.
        bail!(
            "not running inside Lambda (AWS_LAMBDA_RUNTIME_API is unset); the local \
             `invoke` command is not built yet"
        );
    }
    let config = Config::from_env()?;
    let table = config.require_table()?.to_owned();
    let provider = http_provider(&config)?;
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
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

/// STUB: the Stripe-compatible HTTP client is the "Payment provider" issue. Until it
/// exists the function refuses to start, so no message is consumed and none is lost.
fn http_provider(config: &Config) -> anyhow::Result<Arc<dyn PaymentProvider>> {
    config.require_payment_api_url()?;
    bail!(
        "PAYMENT_API_URL is set but the HTTP payment provider is not built yet; \
         refusing to start rather than consume messages"
    )
}
