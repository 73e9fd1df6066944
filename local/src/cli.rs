//! The local commands: `invoke` runs the real handler once on an SQS event file,
//! `refund` the refund function, `inspect` prints an order's record and the
//! simulator's ledger and refund rows, `resolve`
//! settles one with the simulator, `audit` holds the table against the simulator's
//! payments, `confirm` plays the customer of an order that awaits them and delivers
//! Stripe's event to the handler, `settle` runs the scheduled settler; all on the
//! `--db` SQLite file. Only `invoke` and `refund` create it. Edge code: errors are `anyhow`.
//! stdout carries only the command's JSON; logs go to stderr.

use charge_once::domain::OrderKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::emf::Recorded;
use charge_once::audit_lambda::SETTLE_LIMIT;
use charge_once::commands::{read_event, record_json, resolution_json};
use charge_once::config::Config;
use charge_once::contracts::payment::ChargePath as _;
use charge_once::contracts::queue::Unreported;
use charge_once::contracts::schema;
use charge_once::contracts::store::IdempotencyStore as _;
use charge_once::domain::clock::{self, Time};
use charge_once::domain::order::{Order, validate_id};
use charge_once::domain::{Key, State};
use charge_once::drivers::audit;
use charge_once::drivers::charge::{self, Settings};
use charge_once::drivers::settle::Settler;
use charge_once::policy::outcome_kind::{DECLARED, OutcomeKind};
use charge_once::policy::resolve::Confirmed;
use charge_once::{telemetry, wiring as product};
use charge_once_local::simulated::{SimulatedProvider, event};
use charge_once_local::sqlite::SqliteStore;
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
                  pm_card_authenticationRequired awaits the customer (`confirm` plays \
                  them and delivers Stripe's event); the customer \
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
    /// Run the refund function once on an SQS event file of refund requests
    /// (`events/sqs-refunds.json`) and print the SQSBatchResponse: each request refunded
    /// once, on its order's payment at the simulator, after the order is charged. No
    /// queue is called.
    Refund {
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
    /// Play the customer of an order that awaits them, then Stripe: confirm the
    /// PaymentIntent its record names at the simulator (it succeeds), deliver the
    /// `payment_intent.succeeded` event to the handler in an SQS record, as the orders
    /// queue carries it, and print what became of it. Exit 0: `reconciled`.
    Confirm {
        order_id: String,
        /// Only confirm the payment: no event is delivered (as when the events never
        /// arrive), and `settle` finds the payment succeeded.
        #[arg(long)]
        no_event: bool,
        #[command(flatten)]
        db: Db,
    },
    /// Run the scheduled settler once: every awaiting order's payment is looked up by
    /// id; succeeded → `hecho`; past the wait's end → cancelled, then `fallido`.
    /// Prints the run's summary. Exit 0: every awaiting order was read and settled or
    /// left waiting.
    Settle {
        /// Run as if this much later than now (`8d`: past the default 7-day
        /// AUTHENTICATION_WAIT).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        later: Duration,
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
        Command::Refund { event, db } => refund(config, &event, &db.db).await.map(|()| 0),
        Command::Inspect { order_id, db } => inspect(&order_id, &db.db).await,
        Command::Confirm {
            order_id,
            no_event,
            db,
        } => confirm(config, &order_id, no_event, &db.db).await,
        Command::Settle { later, db } => settle(config, later, &db.db).await,
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
    let (response, _) = handle(config, store, simulator, &event).await?;
    println!("{response}");
    Ok(())
}

/// `refund`: the refund function once on `event`, its response on stdout; one line per
/// record on stderr.
async fn refund(config: &Config, path: &Path, db: &Path) -> anyhow::Result<()> {
    let event = read_event(path)?;
    let store = Arc::new(wiring::store(db, OpenMode::Create)?);
    let simulator = Arc::new(wiring::simulator(db, OpenMode::Create)?);
    let consumer = product::refund_consumer(config, store, simulator, None);
    let deadline = Time::from_ms(clock::wall_ms()) + Duration::from_secs(60);
    let response = consumer.run(&event, deadline).await;
    println!("{}", serde_json::to_string(&response)?);
    Ok(())
}

/// Runs the handler once on `event`, as `invoke` does: its response, and what it
/// counted. The EMF document joins the logs on stderr (stdout is the command's).
async fn handle(
    config: &Config,
    store: SqliteStore,
    simulator: SimulatedProvider,
    event: &SqsEvent,
) -> anyhow::Result<(String, Arc<Recorded>)> {
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let consumer = product::consumer(config, Arc::new(store), Arc::new(simulator));
    let deadline = consumer.default_deadline();
    let (response, recorded) = metrics.measure(consumer.run(event, deadline)).await;
    let response = serde_json::to_string(&response?)?;
    metrics.write(&recorded, &[], clock::wall_ms(), std::io::stderr())?;
    Ok((response, recorded))
}

/// Stripe's event for a payment the customer confirmed.
const SUCCEEDED: &str = "payment_intent.succeeded";

/// Exit 0 when the event completed the order (`reconciled`), or with `--no-event`
/// when the payment is confirmed; 1 otherwise.
async fn confirm(
    config: &Config,
    order_id: &str,
    no_event: bool,
    db: &Path,
) -> anyhow::Result<ExitStatus> {
    validate_id(order_id).context("order id")?;
    let store = wiring::store(db, OpenMode::Existing)?;
    let simulator = wiring::simulator(db, OpenMode::Existing)?;
    let record = store.get(&Key::for_order_id(order_id)).await?;
    let payment_id = match record {
        Some(r) if r.state == State::Awaiting => r
            .awaited
            .with_context(|| format!("{order_id} awaits its customer but names no payment"))?,
        Some(r) => anyhow::bail!(
            "{order_id} does not await its customer: its record is {} {}",
            schema::attr::STATE,
            schema::state_value(&r.state)
        ),
        None => anyhow::bail!("{order_id} has no record: no order of this file awaits it"),
    };
    // The customer authenticates on the shop's page. A payment already confirmed (its
    // event was not delivered: `--no-event`, or a run that stopped) is delivered now.
    simulator.authenticate(&payment_id)?;
    let payment = simulator
        .payment_by_id(&payment_id)
        .await?
        .with_context(|| format!("{payment_id}: not in the simulator's ledger"))?;
    if !payment.succeeded() {
        anyhow::bail!(
            "{payment_id} is {}: the customer can no longer confirm it",
            payment.status
        );
    }
    if no_event {
        println!(
            "{}",
            json!({"order_id": order_id, "payment_id": payment_id, "payment": payment.status})
        );
        return Ok(0);
    }
    let now = Time::from_ms(clock::wall_ms());
    let stripe = event::stripe_event(SUCCEEDED, &payment, now);
    let sqs = serde_json::from_value(event::sqs_event(&event::envelope(&stripe, now), now))?;
    let (_, recorded) = handle(config, store, simulator, &sqs).await?;
    let outcome = outcome_of(&recorded);
    println!(
        "{}",
        json!({
            "order_id": order_id, "payment_id": payment_id, "event": SUCCEEDED,
            "event_id": stripe["id"], "outcome": outcome,
        })
    );
    Ok(i32::from(outcome != Some(OutcomeKind::Reconciled.name())))
}

/// The outcome the handler counted for the one record it ran.
fn outcome_of(recorded: &Recorded) -> Option<&'static str> {
    DECLARED
        .iter()
        .map(|declared| declared.name)
        .find(|name| recorded.counter(name) > 0)
}

/// How long one local settler run may take: the scheduled function's own timeout (the
/// template's `AuditFunction`).
const SETTLE_TIME: Duration = Duration::from_secs(900);

/// Exit 0 when every awaiting order was read and handled; 1 when some failed (they are
/// read again next run).
async fn settle(config: &Config, later: Duration, db: &Path) -> anyhow::Result<ExitStatus> {
    let store = wiring::store(db, OpenMode::Existing)?;
    let simulator = wiring::simulator(db, OpenMode::Existing)?;
    let metrics = telemetry::init_metrics(&config.metrics_namespace)?;
    let settings = Settings {
        clock: Arc::new(move || Time::from_ms(clock::wall_ms()) + later),
        ..Settings::from(config)
    };
    let settler = Settler {
        store: &store,
        provider: &simulator,
        refunds: None,
        // Locally no shop's queue is called: the log line reports an ended wait.
        reports: &Unreported,
        settings: &settings,
        time: SETTLE_TIME,
        limit: SETTLE_LIMIT,
        per_run: usize::MAX,
    };
    let (run, recorded) = metrics.measure(settler.run()).await;
    let run = run.context("the settler could not read the awaiting orders")?;
    metrics.write(&recorded, &[], clock::wall_ms(), std::io::stderr())?;
    println!("{}", run.summary());
    Ok(i32::from(run.failed > 0))
}

/// Exit 1 when the file holds no record of the order.
async fn inspect(order_id: &str, db: &Path) -> anyhow::Result<ExitStatus> {
    validate_id(order_id).context("order id")?;
    let store = wiring::store(db, OpenMode::Existing)?;
    let simulator = wiring::simulator(db, OpenMode::Existing)?;
    let record = store.get(&Key::for_order_id(order_id)).await?;
    let out = json!({
        "record": record.as_ref().map(record_json),
        "ledger": simulator.ledger(order_id)?,
        "refunds": simulator.refunds(order_id)?,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(charge_once::commands::unknown_order(
        order_id,
        record.is_none(),
    ))
}

/// Exit 0, 1 or 2 (see [`Command::Audit`]); every error is a 2.
async fn audit(since: Duration, stuck_after: Duration, db: &Path) -> ExitStatus {
    let window = audit::Window::ending_now(since, stuck_after);
    let report = async {
        let store = wiring::store(db, OpenMode::Existing)?;
        let simulator = wiring::simulator(db, OpenMode::Existing)?;
        anyhow::Ok(audit::audit(&store, &simulator, Some(&simulator), window).await?)
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
