//! The commands outside Lambda (ARCHITECTURE.md, "Settings"), against the real parts
//! with the operator's credentials: the DynamoDB table in IDEMPOTENCY_TABLE and the
//! provider at PAYMENT_API_URL. `invoke` runs the real handler once on an SQS event
//! file, `inspect` prints an order's (or a refund's) record, `resolve` settles one with
//! the provider (`resolve-refund` a refund's),
//! `audit` holds the table against the provider's payments. Local runs on an SQLite
//! file with the simulator are the local member's binary (`local/`). Edge code: errors
//! are `anyhow`. stdout carries only the command's JSON; logs go to stderr.

use charge_once::domain::OrderKey;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use charge_once::adapters::dynamodb::DynamoStore;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::commands::{read_event, record_json, resolution_json};
use charge_once::config::Config;
use charge_once::contracts::payment::RefundPath;
use charge_once::contracts::store::IdempotencyStore as _;
use charge_once::domain::Key;
use charge_once::domain::clock;
use charge_once::domain::order::{Order, validate_id};
use charge_once::domain::refund::RefundRequest;
use charge_once::drivers::audit;
use charge_once::drivers::charge::{self, Settings};
use charge_once::drivers::refund::Refunds;
use charge_once::policy::resolve::Confirmed;
use charge_once::telemetry;
use charge_once::wiring;
use clap::{Parser, Subcommand};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "charge-once",
    version,
    about = "Charges each order exactly once in effect",
    long_about = "Charges each order exactly once in effect. Outside Lambda its commands run \
                  against the real parts with the operator's credentials: the DynamoDB table \
                  in IDEMPOTENCY_TABLE (endpoints from the AWS SDK settings) and the \
                  Stripe-compatible provider at PAYMENT_API_URL (with PAYMENT_API_KEY or \
                  PAYMENT_API_KEY_SECRET_ARN). Local runs on an SQLite file with the \
                  simulator: `cargo run -p charge-once-local -- --help`."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the handler once on an SQS event file and print the SQSBatchResponse.
    ///
    /// On the table in IDEMPOTENCY_TABLE and the provider at PAYMENT_API_URL, as the
    /// function runs it.
    Invoke {
        /// An SQS event (the `events/` files work).
        event: PathBuf,
        /// Tell SQS what becomes of the failed records, as in Lambda: each one's retry
        /// delay (ChangeMessageVisibilityBatch on its eventSourceARN's queue) and the
        /// dead letters (DEAD_LETTER_QUEUE_URL). Endpoints from the AWS SDK settings
        /// (AWS_ENDPOINT_URL_SQS). Without it nothing is sent and the log says what
        /// would be.
        #[arg(long)]
        sqs: bool,
    },
    /// Print an order's idempotency record (it calls no provider); with `--refund`, a
    /// refund request's (`reembolso#<id>`).
    Inspect {
        order_id: String,
        /// The id is a refund request's, not an order's.
        #[arg(long)]
        refund: bool,
    },
    /// Settle an order's record by asking the provider: succeeded → `hecho` with that
    /// charge; pending → nothing (run again once final); not found → `libre` with the
    /// next attempt. Refuses a live lease.
    ///
    /// The order's fields (from the DLQ message) are needed to find its payment. A new
    /// key is given only when the provider the function sends every key to
    /// (PAYMENT_API_URL and its key, as the function has them) says for certain that
    /// nothing was charged.
    Resolve {
        order_id: String,
        /// Amount in minor units, as in the message.
        #[arg(long)]
        amount: u64,
        #[arg(long)]
        currency: String,
        #[arg(long)]
        customer: String,
        /// The saved payment method (`pm_…`), as in the message.
        #[arg(long)]
        payment_method: String,
        /// For records written by the legacy consumer: you checked the provider by hand.
        #[arg(long)]
        legacy_format_checked: bool,
        /// The customer fixed their card: reset the order's decline count (MAX_DECLINES)
        /// so the next delivery may try the card again.
        #[arg(long)]
        retry_declined: bool,
    },
    /// Settle a refund request's record by asking the provider: its refund found →
    /// `hecho` with it; none (certain: while its order is not charged none can exist) →
    /// `libre` with the next attempt. Refuses a live lease. The request's fields (from
    /// the DLQ message) are needed to find its refund.
    ResolveRefund {
        refund_id: String,
        /// The order it refunds.
        #[arg(long)]
        order: String,
        /// Amount in minor units, as in the message (none: the rest of the order).
        #[arg(long)]
        amount: Option<u64>,
        /// `duplicate`, `fraudulent` or `requested_by_customer`, as in the message.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Hold the table against the provider's payments: one JSON line per finding on
    /// stdout, a summary on stderr. Exit 0: clean; 1: findings; 2: the audit could
    /// not read everything (never "clean" after a partial read).
    Audit {
        /// How far back: payments and records created since then.
        #[arg(long, default_value = "1d", value_parser = humantime::parse_duration)]
        since: Duration,
        /// An `en-curso` record whose lease ended longer ago than this is stuck.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        stuck_after: Duration,
    },
}

/// The exit status of a command that ran to its end.
pub type ExitStatus = i32;

impl Command {
    /// The exit status when the command cannot start or stops on an error: the
    /// audit's "could not read everything", 1 for the others.
    pub fn failure_status(&self) -> ExitStatus {
        match self {
            Command::Audit { .. } => 2,
            _ => 1,
        }
    }
}

pub async fn run(cli: Cli, config: &Config) -> anyhow::Result<ExitStatus> {
    match cli.command {
        Command::Invoke { event, sqs } => invoke(config, &event, sqs).await.map(|()| 0),
        Command::Inspect { order_id, refund } => inspect(config, &order_id, refund).await,
        Command::Audit { since, stuck_after } => Ok(audit(config, since, stuck_after).await),
        Command::Resolve {
            order_id,
            amount,
            currency,
            customer,
            payment_method,
            legacy_format_checked,
            retry_declined,
        } => {
            let order = Order::new(&order_id, amount, &currency, &customer, &payment_method)
                .context("the order")?;
            let confirmed = Confirmed {
                legacy_format_checked,
                retry_declined,
            };
            resolve(config, &order, confirmed).await.map(|()| 0)
        }
        Command::ResolveRefund {
            refund_id,
            order,
            amount,
            reason,
        } => {
            // The message's own rules, so the fingerprint is the record's.
            let body = json!({"id": refund_id, "order_id": order, "amount": amount,
                              "reason": reason});
            let request = RefundRequest::parse(&body.to_string()).context("the refund request")?;
            resolve_refund(config, &request).await.map(|()| 0)
        }
    }
}

/// The real parts the commands run against: the SDK settings (and their TLS) once.
struct Parts {
    tls: charge_once::adapters::tls::Tls,
    sdk: aws_config::SdkConfig,
}

/// What a command needs besides the table, checked before any client is built: a
/// missing setting stops the start with one line naming it, as a cold start does.
#[derive(Clone, Copy)]
struct Needs {
    provider: bool,
    queue: bool,
}

impl Parts {
    async fn new(config: &Config, needs: Needs) -> anyhow::Result<Self> {
        config.require_table()?;
        if needs.provider {
            config.require_payment_api_url()?;
        }
        if needs.queue {
            config.require_dead_letter_queue_url()?;
        }
        let tls = wiring::tls(config)?;
        let sdk = wiring::sdk_config(&tls).await;
        wiring::require_credentials(&sdk).await?;
        Ok(Self { tls, sdk })
    }

    fn store(&self, config: &Config) -> anyhow::Result<std::sync::Arc<DynamoStore>> {
        Ok(wiring::dynamo_store(config, &self.sdk)?)
    }

    async fn provider(&self, config: &Config) -> anyhow::Result<std::sync::Arc<HttpProvider>> {
        Ok(wiring::http_provider(config, &self.sdk, &self.tls).await?)
    }

    /// The parts of a command that calls the provider (and the queue, with `queue`),
    /// with the store and the provider built on them.
    async fn with_provider(
        config: &Config,
        queue: bool,
    ) -> anyhow::Result<(
        Self,
        std::sync::Arc<DynamoStore>,
        std::sync::Arc<HttpProvider>,
    )> {
        let needs = Needs {
            provider: true,
            queue,
        };
        let parts = Self::new(config, needs).await?;
        let store = parts.store(config)?;
        let provider = parts.provider(config).await?;
        Ok((parts, store, provider))
    }
}

/// Exit 0, 1 or 2 (see [`Command::Audit`]); every error is a 2.
async fn audit(config: &Config, since: Duration, stuck_after: Duration) -> ExitStatus {
    let window = audit::Window::ending_now(since, stuck_after);
    let report = async {
        let (_, store, provider) = Parts::with_provider(config, false).await?;
        anyhow::Ok(
            audit::audit(
                store.as_ref(),
                provider.as_ref(),
                config
                    .audit_refunds
                    .then_some(provider.as_ref() as &dyn RefundPath),
                window,
            )
            .await?,
        )
    };
    match report.await {
        Ok(report) => {
            for finding in &report.findings {
                println!("{}", finding.to_json());
            }
            eprintln!("{}", report.summary(&window));
            i32::from(!report.findings.is_empty())
        }
        Err(e) => {
            eprintln!(
                "{}",
                json!({"audit": "incomplete", "since_ms": window.since.as_ms(), "error": format!("{e:#}")})
            );
            2
        }
    }
}

async fn invoke(config: &Config, path: &Path, sqs: bool) -> anyhow::Result<()> {
    let event = read_event(path)?;
    let (parts, store, provider) = Parts::with_provider(config, sqs).await?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let mut consumer = wiring::consumer(config, store, provider);
    if sqs {
        consumer = consumer.with_queue(wiring::sqs_queue(config, &parts.sdk)?);
    }
    let deadline = consumer.default_deadline();
    let (response, recorded) = metrics.measure(consumer.run(&event, deadline)).await;
    let response = response?;
    // stdout is only the response; the EMF document joins the logs on stderr.
    metrics.write(&recorded, &[], clock::wall_ms(), std::io::stderr())?;
    println!("{}", serde_json::to_string(&response)?);
    Ok(())
}

/// `inspect` reads the record and calls no provider. Exit 1 when the table holds no
/// record of the order (or refund: a mistyped id, or a record past its retention).
async fn inspect(config: &Config, order_id: &str, refund: bool) -> anyhow::Result<ExitStatus> {
    validate_id(order_id).context(if refund { "refund id" } else { "order id" })?;
    let needs = Needs {
        provider: false,
        queue: false,
    };
    let store = Parts::new(config, needs).await?.store(config)?;
    let key = if refund {
        Key::new(charge_once::domain::refund::REFUND_PREFIX, order_id)
    } else {
        Key::for_order_id(order_id)
    };
    let record = store.get(&key).await?;
    let out = json!({ "record": record.as_ref().map(record_json) });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(charge_once::commands::unknown_order(
        order_id,
        record.is_none(),
    ))
}

async fn resolve_refund(config: &Config, request: &RefundRequest) -> anyhow::Result<()> {
    let (_, store, provider) = Parts::with_provider(config, false).await?;
    let refunds = Refunds::new(provider, store, config.max_declines);
    let done = refunds
        .resolve(&Settings::from(config), request, Confirmed::default())
        .await
        .with_context(|| format!("resolve refund {}", request.id()))?;
    let mut line = resolution_json(request.id(), &done);
    if let Some(object) = line.as_object_mut()
        && let Some(id) = object.remove("order_id")
    {
        object.insert("refund_id".to_owned(), id);
    }
    println!("{line}");
    Ok(())
}

async fn resolve(config: &Config, order: &Order, confirmed: Confirmed) -> anyhow::Result<()> {
    let (_, store, provider) = Parts::with_provider(config, false).await?;
    let settings = Settings::from(config);
    let done = charge::resolve(
        store.as_ref(),
        provider.as_ref(),
        &settings,
        order,
        confirmed,
    )
    .await
    .with_context(|| format!("resolve {}", order.id()))?;
    println!("{}", resolution_json(order.id(), &done));
    Ok(())
}
