//! The binary: wiring only. Logs, config, clients built once; then the Lambda runtime
//! (inside Lambda) or one CLI command (outside). A start that cannot be completed logs
//! one line naming what is wrong and exits non-zero.

mod cli;

use std::sync::Arc;

use anyhow::Context as _;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::config::Config;
use charge_once::{clock, telemetry, wiring};
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

async fn run_lambda() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    config.require_table()?;
    config.require_payment_api_url()?;
    let sdk = wiring::sdk_config().await;
    let provider = wiring::http_provider(&config, &sdk).await?;
    let store = wiring::dynamo_store(&config, &sdk)?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let consumer = Arc::new(wiring::consumer(&config, store, provider));
    // On Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY` > 1) several
    // invocations run at once in this process; elsewhere one at a time. The consumer
    // and its clients are shared by all; each invocation's metrics are its own.
    lambda_runtime::run_concurrent(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let consumer = Arc::clone(&consumer);
        async move {
            let request_id = event.context.request_id.clone();
            let (response, recorded) = metrics.measure(consumer.handle_lambda_event(event)).await;
            // One EMF document per invocation, on stdout (CloudWatch reads both).
            let written = metrics.write(
                &recorded,
                &[("RequestId", &request_id)],
                clock::wall_ms(),
                std::io::stdout().lock(),
            );
            if let Err(e) = written {
                tracing::warn!(error = %e, "metrics could not be written");
            }
            response.map_err(lambda_runtime::Error::from)
        }
    }))
    .await
    .map_err(|e| anyhow::anyhow!(e))
    .context("Lambda runtime stopped")
}
