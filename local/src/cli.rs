//! The local commands: `invoke` runs the real handler once on an SQS event file,
//! `inspect` prints an order's record and the simulator's ledger rows, `resolve`
//! settles one with the simulator, `audit` holds the table against the simulator's
//! payments; all on the `--db` SQLite file. Only `invoke` creates it. Edge code:
//! errors are `anyhow`. stdout carries only the command's JSON; logs go to stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use charge_once::commands::{read_event, record_json, resolution_json};
use charge_once::config::Config;
use charge_once::contracts::store::IdempotencyStore as _;
use charge_once::domain::Key;
use charge_once::domain::clock;
use charge_once::domain::order::{Order, validate_id};
use charge_once::drivers::audit;
use charge_once::drivers::charge::{self, Settings};
use charge_once::policy::resolve::Confirmed;
use charge_once::{telemetry, wiring as product};
use charge_once_local::sqlite_file::OpenMode;
use charge_once_local::wiring::{self, Refusal};
use clap::{Parser, Subcommand};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "charge-once-local",
    version,
    about = "charge-once on a local SQLite file with the payment simulator",
    long_about = "charge-once on a local SQLite file with the payment simulator: the real \
                  handler, `resolve` and the audit, with nothing but cargo. Never the real \
                  parts: it refuses to run inside Lambda or beside IDEMPOTENCY_TABLE or \
                  PAYMENT_API_URL (the operator's commands on the real table and provider \
                  are charge-once's). The simulator answers as Stripe's test payment \
                  methods do: pm_card_visa succeeds, pm_card_chargeDeclined declines, \
                  pm_card_authenticationRequired awaits the customer; the customer \
                  cus_timeout_after_charge is charged, then the answer is lost."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Args)]
pub struct Db {
    /// The SQLite file: the idempotency records and the simulator's ledger. Only
    /// `invoke` creates it; the other commands refuse a file that does not exist.
    #[arg(long, default_value = ".local/charge-once.sqlite3")]
    db: PathBuf,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the handler once on an SQS event file and print the SQSBatchResponse.
    ///
    /// No queue is called: the log says what would become of each failed record.
    Invoke {
        /// An SQS event (the `events/` files work).
        event: PathBuf,
        #[command(flatten)]
        db: Db,
    },
    /// Print an order's idempotency record and the simulator's ledger rows for it.
    Inspect {
        order_id: String,
        #[command(flatten)]
        db: Db,
    },
    /// Settle an order's record by asking the simulator: succeeded → `hecho` with that
    /// charge; open → cancelled, then looked up again; not found → `libre` with the
    /// next attempt. Refuses a live lease.
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
        db: Db,
    },
    /// Hold the table against the simulator's payments: one JSON line per finding on
    /// stdout, a summary on stderr. Exit 0: clean; 1: findings; 2: the audit could
    /// not read everything, or refused to start.
    Audit {
        /// How far back: payments and records created since then.
        #[arg(long, default_value = "1d", value_parser = humantime::parse_duration)]
        since: Duration,
        /// An `en-curso` record whose lease ended longer ago than this is stuck.
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        stuck_after: Duration,
        #[command(flatten)]
        db: Db,
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
/// (nothing was done), else the command's own failure status.
pub fn exit_status(command_failure: ExitStatus, error: &anyhow::Error) -> ExitStatus {
    if is_refusal(error) {
        2
    } else {
        command_failure
    }
}

fn is_refusal(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<Refusal>().is_some()
            || matches!(
                cause.downcast_ref::<wiring::LocalError>(),
                Some(wiring::LocalError::Refused(_))
            )
    })
}

pub async fn run(cli: Cli, config: &Config) -> anyhow::Result<ExitStatus> {
    wiring::check_environment(
        wiring::in_lambda(),
        config.table.is_some(),
        config.payment_api_url.is_some(),
    )?;
    match cli.command {
        Command::Invoke { event, db } => invoke(config, &event, &db.db).await.map(|()| 0),
        Command::Inspect { order_id, db } => inspect(&order_id, &db.db).await.map(|()| 0),
        Command::Audit {
            since,
            stuck_after,
            db,
        } => Ok(audit(since, stuck_after, &db.db).await),
        Command::Resolve {
            order_id,
            amount,
            currency,
            customer,
            payment_method,
            legacy_format_checked,
            retry_declined,
            db,
        } => {
            let order = Order::new(&order_id, amount, &currency, &customer, &payment_method)
                .context("the order")?;
            let confirmed = Confirmed {
                legacy_format_checked,
                retry_declined,
            };
            resolve(config, &order, confirmed, &db.db).await.map(|()| 0)
        }
    }
}

async fn invoke(config: &Config, path: &Path, db: &Path) -> anyhow::Result<()> {
    let event = read_event(path)?;
    let store = wiring::store(db, OpenMode::Create)?;
    let simulator = wiring::simulator(db, OpenMode::Create)?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let consumer = product::consumer(config, Arc::new(store), Arc::new(simulator));
    let deadline = consumer.default_deadline();
    let (response, recorded) = metrics.measure(consumer.run(&event, deadline)).await;
    let response = response?;
    // stdout is only the response; the EMF document joins the logs on stderr.
    metrics.write(&recorded, &[], clock::wall_ms(), std::io::stderr())?;
    println!("{}", serde_json::to_string(&response)?);
    Ok(())
}

async fn inspect(order_id: &str, db: &Path) -> anyhow::Result<()> {
    validate_id(order_id).context("order id")?;
    let store = wiring::store(db, OpenMode::Existing)?;
    let simulator = wiring::simulator(db, OpenMode::Existing)?;
    let record = store.get(&Key::for_order_id(order_id)).await?;
    let out = json!({
        "record": record.as_ref().map(record_json),
        "ledger": simulator.ledger(order_id)?,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// Exit 0, 1 or 2 (see [`Command::Audit`]); every error is a 2.
async fn audit(since: Duration, stuck_after: Duration, db: &Path) -> ExitStatus {
    let window = audit::Window::ending_now(since, stuck_after);
    let report = async {
        let store = wiring::store(db, OpenMode::Existing)?;
        let simulator = wiring::simulator(db, OpenMode::Existing)?;
        anyhow::Ok(audit::audit(&store, &simulator, window).await?)
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

async fn resolve(
    config: &Config,
    order: &Order,
    confirmed: Confirmed,
    db: &Path,
) -> anyhow::Result<()> {
    let store = wiring::store(db, OpenMode::Existing)?;
    let simulator = wiring::simulator(db, OpenMode::Existing)?;
    let settings = Settings::from(config);
    let done = charge::resolve(&store, &simulator, &settings, order, confirmed)
        .await
        .with_context(|| format!("resolve {}", order.id()))?;
    println!("{}", resolution_json(order.id(), &done));
    Ok(())
}
