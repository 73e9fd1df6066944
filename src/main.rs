//! The binary that ships: wiring only. Logs (and in Lambda the traces, when `OTEL_*`
//! asks for them), config, clients built once; then the Lambda runtime (inside
//! Lambda) or one of the operator's commands against the real parts (outside). A start that cannot be completed logs
//! one line naming what is wrong and exits non-zero.

mod cli;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::emf::Emf;
use charge_once::config::{Config, Function};
use charge_once::drivers::batch::Consumer;
use charge_once::drivers::charge::Settings;
use charge_once::traces::Traces;
use charge_once::wiring::WiringError;
use charge_once::{telemetry, wiring};
use clap::Parser as _;
use lambda_runtime::layers::TracingLayer;
use lambda_runtime::{LambdaEvent, Runtime, service_fn};

// mimalloc rather than glibc's malloc: an invocation allocates and frees thousands of
// small buffers (the SDK's requests, headers, JSON), and a record's CPU is mostly user
// time spent with cold caches. Measured in `make bench` (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Traces first, before the async runtime: their exporter's HTTP client is blocking
    // and must not start inside it (traces.rs).
    let in_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    let traces = if in_lambda {
        wiring::traces()
    } else {
        Ok(None)
    };
    // Classic Lambda runs one invocation at a time: a runtime on this one thread wakes
    // no worker threads, which is most of an invocation's fixed cost in CPU. Lambda
    // Managed Instances run several at once (`AWS_LAMBDA_MAX_CONCURRENCY` > 1): one
    // worker thread per core there.
    let concurrent = std::env::var("AWS_LAMBDA_MAX_CONCURRENCY")
        .ok()
        .and_then(|n| n.trim().parse::<u32>().ok())
        .is_some_and(|n| n > 1);
    let mut builder = if concurrent {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    #[allow(clippy::expect_used)] // cold start: nothing runs without a runtime
    let runtime = builder
        .enable_all()
        .build()
        .expect("the tokio runtime could not be built");
    runtime.block_on(start(in_lambda, traces));
}

async fn start(in_lambda: bool, traces: Result<Option<Traces>, WiringError>) {
    telemetry::init_with(traces.as_ref().ok().and_then(Option::as_ref));
    let mut failure = 1;
    let result = if in_lambda {
        match traces {
            Ok(traces) => run_lambda(traces).await.map(|()| 0),
            Err(e) => Err(e.into()),
        }
    } else {
        let cli = cli::Cli::parse();
        failure = cli.command.failure_status();
        match Config::from_env() {
            Ok(config) => cli::run(cli, &config).await,
            Err(e) => Err(e.into()),
        }
    };
    match result {
        Ok(0) => {}
        Ok(status) => std::process::exit(status),
        Err(e) => {
            // `{:#}` keeps the whole cause chain on one line.
            tracing::error!(error = format!("{e:#}"), "charge-once stopped");
            std::process::exit(failure);
        }
    }
}

async fn run_lambda(traces: Option<Traces>) -> anyhow::Result<()> {
    let config = Config::from_env()?;
    config.require_table()?;
    config.require_payment_api_url()?;
    if matches!(config.function, Function::Consume | Function::Refund) {
        config.require_dead_letter_queue_url()?;
    }
    let tls = wiring::tls(&config)?;
    let sdk = wiring::sdk_config(&tls).await;
    let provider = wiring::http_provider(&config, &sdk, &tls).await?;
    let store = wiring::dynamo_store(&config, &sdk)?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    // With traces, every deadline keeps room for their flush before the response.
    let flush_reserve = match traces {
        Some(_) => charge_once::traces::FLUSH_RESERVE,
        None => Duration::ZERO,
    };
    match config.function {
        Function::Consume => {
            let queue = wiring::sqs_queue(&config, &sdk)?;
            let consumer = Arc::new(
                wiring::consumer(&config, store, provider)
                    .with_flush_reserve(flush_reserve)
                    .with_queue(queue)
                    .with_reports(wiring::reports(&config, &sdk)),
            );
            consume(consumer, metrics, traces).await
        }
        Function::Refund => {
            // The library's consumer: one outcome line per record, dead letters with
            // their notes; no EMF metrics and no traces of its own.
            let queue = wiring::sqs_queue(&config, &sdk)?;
            wiring::refund_consumer(&config, store, provider, Some(queue))
                .serve()
                .await
                .map_err(|e| anyhow::anyhow!(e))
        }
        Function::Audit => {
            let scheduled = charge_once::audit_lambda::Scheduled {
                since: config.audit_since,
                stuck_after: config.audit_stuck_after,
                store,
                refunds: provider.clone(),
                audit_refunds: config.audit_refunds,
                provider,
                reports: wiring::reports(&config, &sdk),
                settings: Settings::from(&config),
                flush_reserve,
            };
            charge_once::audit_lambda::serve(scheduled, metrics)
                .await
                .map_err(|e| anyhow::anyhow!(e))
        }
    }
    .context("Lambda runtime stopped")
}

async fn consume(
    consumer: Arc<Consumer>,
    metrics: &'static Emf,
    traces: Option<Traces>,
) -> anyhow::Result<()> {
    // On Lambda Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY` > 1) several
    // invocations run at once in this process; elsewhere one at a time. The consumer
    // and its clients are shared by all; each invocation's metrics are its own.
    let traced = traces.clone();
    let handler = service_fn(move |event: LambdaEvent<SqsEvent>| {
        let consumer = Arc::clone(&consumer);
        let traces = traces.clone();
        async move {
            let request_id = event.context.request_id.clone();
            let deadline = event.context.deadline;
            let (response, recorded) = metrics.measure(consumer.handle(event)).await;
            metrics.write_invocation(&recorded, &request_id);
            if let Some(traces) = &traces {
                traces.flush_before(deadline).await;
            }
            response.map_err(lambda_runtime::Error::from)
        }
    });
    match traced {
        None => lambda_runtime::run_concurrent(handler).await,
        // The invocation's span (lambda_runtime's layer) around the runtime's own.
        Some(traces) => {
            Runtime::new(handler)
                .layer(TracingLayer::new())
                .layer(traces.runtime_layer())
                .run_concurrent()
                .await
        }
    }
    .map_err(|e| anyhow::anyhow!(e))
}
