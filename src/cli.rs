//! The commands outside Lambda (ARCHITECTURE.md, "Settings"): `invoke` runs the real handler once on an
//! SQS event file, `inspect` prints an order's record, `resolve` settles one with the
//! provider. Edge code: errors are `anyhow`.
//! stdout carries only the command's JSON; logs go to stderr.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::simulated::SimulatedProvider;
use charge_once::adapters::sqlite_file::{OpenError, OpenMode};
use charge_once::config::Config;
use charge_once::contracts::payment::{ChargePath as _, KeyHistory};
use charge_once::contracts::schema;
use charge_once::domain::clock;
use charge_once::domain::order::{Order, validate_id};
use charge_once::domain::{Key, Record};
use charge_once::drivers::audit;
use charge_once::drivers::charge::{self, Settings};
use charge_once::policy::resolve::{Confirmed, Resolution};
use charge_once::telemetry;
use charge_once::wiring::{self, ProviderChoice, StoreChoice};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "charge-once",
    version,
    about = "Charges each order exactly once in effect"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// The embedded SQLite file (`--db`).
    Sqlite,
    /// DynamoDB: the table in IDEMPOTENCY_TABLE, endpoints from the AWS SDK settings.
    Dynamodb,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// The Stripe-compatible provider at PAYMENT_API_URL (the default).
    Http,
    /// The local simulator (its ledger in `--db`): local runs on `--store sqlite` only.
    Simulator,
}

#[derive(clap::Args)]
pub struct Backing {
    /// Where idempotency records live.
    #[arg(long, value_enum, default_value_t = StoreKind::Sqlite)]
    store: StoreKind,
    /// The SQLite file: the store (with `--store sqlite`) and the simulator's ledger.
    /// Only `invoke` creates it; the other commands refuse a file that does not exist.
    #[arg(long, default_value = ".local/charge-once.sqlite3")]
    db: PathBuf,
    /// The payment provider: `http` (PAYMENT_API_URL, the default) or `simulator`
    /// (local runs on `--store sqlite` only; test customers cus_declined,
    /// cus_timeout_after_charge). Nothing falls back to the simulator.
    #[arg(long, value_enum)]
    provider: Option<ProviderKind>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the handler once on an SQS event file and print the SQSBatchResponse.
    ///
    /// The provider is the HTTP client at PAYMENT_API_URL, or the local simulator with
    /// `--provider simulator` (test customers: cus_declined, cus_timeout_after_charge).
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
        #[command(flatten)]
        backing: Backing,
    },
    /// Print an order's idempotency record and, with `--provider simulator`, its ledger
    /// rows.
    Inspect {
        order_id: String,
        #[command(flatten)]
        backing: Backing,
    },
    /// Settle an order's record by asking the provider: succeeded → `hecho` with that
    /// charge; pending → nothing (run again once final); not found → `libre` with the
    /// next attempt. Refuses a live lease.
    ///
    /// The order's fields (from the DLQ message) are needed to find its charge. A new
    /// key is given only when the provider that holds the order's keys (PAYMENT_API_URL
    /// and its key, as the function has them) says for certain that nothing was charged.
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
        #[command(flatten)]
        backing: Backing,
    },
    /// Hold the table against the provider's charges: one JSON line per finding on
    /// stdout, a summary on stderr. Exit 0: clean; 1: findings; 2: the audit could
    /// not read everything (never "clean" after a partial read).
    Audit {
        /// How far back: charges and records created since then.
        #[arg(long, default_value = "1d", value_parser = humantime::parse_duration)]
        since: Duration,
        /// An `en-curso` record whose lease ended longer ago than this is stuck.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        stuck_after: Duration,
        #[command(flatten)]
        backing: Backing,
    },
}

/// The exit status of a command that ran to its end.
pub type ExitStatus = i32;

impl Command {
    /// The exit status when the command cannot start (a bad setting): the audit's
    /// "could not read everything", 1 for the others.
    pub fn failure_status(&self) -> ExitStatus {
        match self {
            Command::Audit { .. } => 2,
            _ => 1,
        }
    }
}

/// The exit status of a command that stopped on `error`: 2 when it refused to start
/// (a missing `--db`, a provider it may not use: nothing was done), else the command's
/// own failure status.
pub fn exit_status(command_failure: ExitStatus, error: &anyhow::Error) -> ExitStatus {
    if is_refusal(error) {
        2
    } else {
        command_failure
    }
}

pub async fn run(cli: Cli, config: &Config) -> anyhow::Result<ExitStatus> {
    match cli.command {
        Command::Invoke {
            event,
            sqs,
            backing,
        } => invoke(config, &event, sqs, &backing).await.map(|()| 0),
        Command::Inspect { order_id, backing } => {
            inspect(config, &order_id, &backing).await.map(|()| 0)
        }
        Command::Audit {
            since,
            stuck_after,
            backing,
        } => Ok(audit(config, since, stuck_after, &backing).await),
        Command::Resolve {
            order_id,
            amount,
            currency,
            customer,
            payment_method,
            legacy_format_checked,
            retry_declined,
            backing,
        } => {
            let order = Order::new(&order_id, amount, &currency, &customer, &payment_method)
                .context("the order")?;
            let confirmed = Confirmed {
                legacy_format_checked,
                retry_declined,
            };
            resolve(config, &order, confirmed, &backing)
                .await
                .map(|()| 0)
        }
    }
}

/// Exit 0, 1 or 2 (see [`Command::Audit`]); every error is a 2.
async fn audit(
    config: &Config,
    since: Duration,
    stuck_after: Duration,
    backing: &Backing,
) -> ExitStatus {
    let window = audit::Window::ending_now(since, stuck_after);
    let report = async {
        let (store_choice, provider_choice) = backing.choose(config, OpenMode::Existing)?;
        let store = wiring::store(config, &store_choice).await?;
        let provider = wiring::provider(config, provider_choice, &store_choice).await?;
        anyhow::Ok(audit::audit(store.as_ref(), provider.as_ref(), window).await?)
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
            let audit = if is_refusal(&e) {
                "refused"
            } else {
                "incomplete"
            };
            eprintln!(
                "{}",
                json!({"audit": audit, "since_ms": window.since.as_ms(), "error": format!("{e:#}")})
            );
            2
        }
    }
}

fn is_refusal(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<wiring::Refusal>().is_some()
            || matches!(
                cause.downcast_ref::<wiring::WiringError>(),
                Some(wiring::WiringError::Refused(_))
            )
    })
}

impl Backing {
    /// The store and the provider this command may use; `mode` says whether a missing
    /// SQLite file may be created (only `invoke` creates one).
    fn choose(
        &self,
        config: &Config,
        mode: OpenMode,
    ) -> Result<(StoreChoice, ProviderChoice), wiring::Refusal> {
        let store = match self.store {
            StoreKind::Sqlite => StoreChoice::Sqlite(self.db.clone(), mode),
            StoreKind::Dynamodb => StoreChoice::Dynamodb,
        };
        let requested = self.provider.map(|kind| match kind {
            ProviderKind::Http => ProviderChoice::Http,
            ProviderKind::Simulator => ProviderChoice::Simulator,
        });
        let provider = ProviderChoice::decide(
            requested,
            config.payment_api_url.is_some(),
            &store,
            in_lambda(),
        )?;
        Ok((store, provider))
    }
}

/// Inside a Lambda execution environment (a function's own shell, a Lambda-hosted
/// job): the simulator must never run there.
fn in_lambda() -> bool {
    ["AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_RUNTIME_API"]
        .iter()
        .any(|var| std::env::var_os(var).is_some())
}

async fn invoke(config: &Config, path: &Path, sqs: bool, backing: &Backing) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let event: SqsEvent = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an SQS event", path.display()))?;
    let (store_choice, provider_choice) = backing.choose(config, OpenMode::Create)?;
    let store = wiring::store(config, &store_choice).await?;
    let provider = wiring::provider(config, provider_choice, &store_choice).await?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let mut consumer = wiring::consumer(config, store, provider);
    if sqs {
        let tls = wiring::tls(config)?;
        let queue = wiring::sqs_queue(config, &wiring::sdk_config(&tls).await)?;
        consumer = consumer.with_queue(queue);
    }
    let deadline = consumer.default_deadline();
    let (response, recorded) = metrics.measure(consumer.run(&event, deadline)).await;
    let response = response?;
    // stdout is only the response; the EMF document joins the logs on stderr.
    metrics.write(&recorded, &[], clock::wall_ms(), std::io::stderr())?;
    println!("{}", serde_json::to_string(&response)?);
    Ok(())
}

async fn inspect(config: &Config, order_id: &str, backing: &Backing) -> anyhow::Result<()> {
    validate_id(order_id).context("order id")?;
    let (store_choice, provider_choice) = inspect_choice(config, backing)?;
    let store = wiring::store(config, &store_choice).await?;
    let record = store.get(&Key::for_order_id(order_id)).await?;
    let mut out = json!({ "record": record.as_ref().map(record_json) });
    if provider_choice == Some(ProviderChoice::Simulator) {
        let simulated = wiring::simulator(&backing.db, OpenMode::Existing)?;
        out["ledger"] = serde_json::to_value(simulated.ledger(order_id)?)?;
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// `inspect` reads the record and calls no provider: it needs one only to show the
/// simulator's ledger, when named.
fn inspect_choice(
    config: &Config,
    backing: &Backing,
) -> Result<(StoreChoice, Option<ProviderChoice>), wiring::Refusal> {
    if backing.provider.is_some() {
        let (store, provider) = backing.choose(config, OpenMode::Existing)?;
        return Ok((store, Some(provider)));
    }
    let store = match backing.store {
        StoreKind::Sqlite => StoreChoice::Sqlite(backing.db.clone(), OpenMode::Existing),
        StoreKind::Dynamodb => StoreChoice::Dynamodb,
    };
    Ok((store, None))
}

/// With the real provider on a local file, the simulator's ledger in that file must
/// not hold the order: if it does, the order's keys went to the simulator, and the real
/// provider's "not found" would say nothing about them.
async fn charged_by_simulator(store: &StoreChoice, order: &Order) -> anyhow::Result<()> {
    let Some(db) = store.sqlite_file() else {
        return Ok(());
    };
    let ledger = match SimulatedProvider::open_in(db, OpenMode::Existing) {
        Ok(ledger) => ledger,
        // No ledger in the file: the simulator never ran on it.
        Err(OpenError::NoTable { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if ledger.key_history(order).await? == KeyHistory::Received {
        let path = db.display().to_string();
        return Err(wiring::Refusal::ChargedBySimulator { path }.into());
    }
    Ok(())
}

async fn resolve(
    config: &Config,
    order: &Order,
    confirmed: Confirmed,
    backing: &Backing,
) -> anyhow::Result<()> {
    let (store_choice, provider_choice) = backing.choose(config, OpenMode::Existing)?;
    let store = wiring::store(config, &store_choice).await?;
    if provider_choice == ProviderChoice::Http {
        charged_by_simulator(&store_choice, order).await?;
    }
    let provider = wiring::provider(config, provider_choice, &store_choice).await?;
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
    let out = match done {
        Resolution::Completed { receipt, attempt } => {
            json!({"order_id": order.id(), "resolution": "completed", "receipt": receipt, "attempt": attempt})
        }
        Resolution::Released { next_attempt } => {
            json!({"order_id": order.id(), "resolution": "released", "next_attempt": next_attempt})
        }
        Resolution::AlreadyDone { receipt } => {
            json!({"order_id": order.id(), "resolution": "already_done", "receipt": receipt})
        }
    };
    println!("{out}");
    Ok(())
}

/// A record under its table attribute names (ARCHITECTURE.md, "The table").
fn record_json(r: &Record) -> serde_json::Value {
    let attributes = schema::attributes(r).into_iter().map(|(name, value)| {
        let value = match value {
            schema::Value::S(s) => json!(s),
            schema::Value::N(n) => json!(n),
        };
        (name.to_owned(), value)
    });
    serde_json::Value::Object(attributes.collect())
}
