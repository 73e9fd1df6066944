//! A local payment provider for runs without a real one, speaking as Stripe's
//! PaymentIntents do where it matters here: it stores the outcome of every idempotency
//! key and replays it, refuses a key reused with other parameters, leaves a declined
//! payment open until it is cancelled, and answers `find_payment` and `cancel`. Its
//! ledger is the SQLite file given to it: `charges` has one row per call outcome,
//! `payment_intents` one row per payment and its status.
//!
//! Stripe's test payment methods choose the behaviour, so the same `events/` replay
//! unchanged against a Stripe test-mode account:
//!
//! | payment method | behaviour |
//! | --- | --- |
//! | `pm_card_visa`, `pm_card_mastercard`, any other `pm_…` | succeeds |
//! | `pm_card_chargeDeclined` (and the `pm_card_chargeDeclined…` family) | 402 declined; the payment stays open until cancelled |
//! | `pm_card_authenticationRequired` | 402 `authentication_required`: only the customer, on-session, can confirm that payment ([`SimulatedProvider::authenticate`] plays them) |
//!
//! and one test customer, `cus_timeout_after_charge`: the payment succeeds, then the
//! answer is lost (a timeout); a replay of the key returns that payment.
//!
//! It refuses what the provider refuses, as far as Stripe's documented rules go (a 400
//! that stores nothing under the key, as Stripe stores no result for a request that
//! failed validation): a currency Stripe does not take, an amount below the currency's
//! minimum charge, a customer id that is not a customer's (`cus_…`), a payment method
//! that is not one (`pm_…`).
//!
//! What the customer does next is played here too: [`SimulatedProvider::authenticate`]
//! confirms a payment that awaits them, and [`event`] renders the event Stripe then
//! sends (its EventBridge envelope, in an SQS record of the orders queue).
//!
//! Refunds (`refunds.rs`) are made on its succeeded payments, as Stripe's are.

use std::path::Path;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, named_params};

pub mod event;
mod refunds;
mod refusal;

use refusal::refusal;

use crate::sqlite_file::{OpenError, OpenMode, SharedConnection};
use charge_once::contracts::payment::{
    Cancel, ChargePath, Confirmation, FailureKind, ListedPayment, Lookup, PaymentError,
    PaymentListing, Receipt,
};
use charge_once::domain::clock::Time;
use charge_once::domain::order::Order;

pub const TIMEOUT_AFTER_CHARGE_CUSTOMER: &str = "cus_timeout_after_charge";
/// Stripe's test payment method that always asks for authentication.
pub const AUTHENTICATION_REQUIRED: &str = "pm_card_authenticationRequired";
/// Stripe's test payment methods that decline start so.
const DECLINED_PREFIX: &str = "pm_card_chargeDeclined";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS calls (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms           INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    amount          INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    customer        TEXT NOT NULL,
    payment_method  TEXT,
    status          TEXT NOT NULL,
    payment_id      TEXT,
    charged         INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS calls_by_key ON calls (idempotency_key);
CREATE INDEX IF NOT EXISTS calls_by_order ON calls (order_id);
CREATE TABLE IF NOT EXISTS payment_intents (
    id              TEXT PRIMARY KEY,
    order_id        TEXT NOT NULL,
    amount          INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    customer        TEXT NOT NULL,
    payment_method  TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_ms      INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS payment_intents_by_order ON payment_intents (order_id)";

/// One ledger row.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LedgerRow {
    pub seq: i64,
    pub at_ms: i64,
    pub idempotency_key: String,
    pub order_id: String,
    pub amount: i64,
    pub currency: String,
    pub customer: String,
    pub payment_method: Option<String>,
    /// `succeeded`, `declined`, `authentication_required`, `succeeded_response_lost`,
    /// `replayed`, `key_reused`, `canceled`, `authenticated`.
    pub status: String,
    /// The payment (`pi_sim_…`) the call made or answered with.
    pub payment_id: Option<String>,
    /// 1 when this call took money, else 0.
    pub charged: i64,
}

#[derive(Clone)]
pub struct SimulatedProvider {
    conn: SharedConnection,
}

impl std::fmt::Debug for SimulatedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimulatedProvider")
    }
}

impl SimulatedProvider {
    /// Opens the ledger in `path` (creating the file and its tables if missing).
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        Self::open_in(path, OpenMode::Create)
    }

    /// Opens the ledger; with [`OpenMode::Existing`] the file must exist and hold it.
    pub fn open_in(path: &Path, mode: OpenMode) -> Result<Self, OpenError> {
        let schema = format!("{SCHEMA};\n{}", refunds::SCHEMA);
        let conn = SharedConnection::open(path, &schema, "calls", mode)?;
        Ok(Self { conn })
    }

    /// The ledger rows of one order, oldest first.
    pub fn ledger(&self, order_id: &str) -> Result<Vec<LedgerRow>, rusqlite::Error> {
        self.conn.call_here(|conn| ledger_rows(conn, order_id))
    }

    /// The refunds of one order, oldest first: (refund `re_sim_…`, refund request id,
    /// amount, status).
    pub fn refunds(
        &self,
        order_id: &str,
    ) -> Result<Vec<(String, String, i64, String)>, rusqlite::Error> {
        self.conn
            .call_here(|conn| refunds::refunds_of(conn, order_id))
    }

    /// Plays the customer back on the shop's page: they authenticate and confirm the
    /// open payment `payment_id`, which succeeds. `false` when it is not open.
    pub fn authenticate(&self, payment_id: &str) -> Result<bool, rusqlite::Error> {
        self.conn.call_here(|conn| {
            let changed = conn.execute(
                "UPDATE payment_intents SET status = 'succeeded'
                     WHERE id = :id AND status IN ('requires_payment_method', 'requires_action')",
                named_params! {":id": payment_id},
            )?;
            if changed == 1 {
                conn.execute(
                    "INSERT INTO calls (at_ms, idempotency_key, order_id, amount, currency,
                         customer, payment_method, status, payment_id, charged)
                     SELECT :at, '', order_id, amount, currency, customer, payment_method,
                         'authenticated', id, 1 FROM payment_intents WHERE id = :id",
                    named_params! {":at": charge_once::domain::clock::wall_ms(), ":id": payment_id},
                )?;
            }
            Ok(changed == 1)
        })
    }
}

fn ledger_rows(conn: &mut Connection, order_id: &str) -> Result<Vec<LedgerRow>, rusqlite::Error> {
    let mut stmt = conn.prepare("SELECT * FROM calls WHERE order_id = :order ORDER BY seq")?;
    let rows = stmt.query_map(named_params! {":order": order_id}, |row| {
        Ok(LedgerRow {
            seq: row.get("seq")?,
            at_ms: row.get("at_ms")?,
            idempotency_key: row.get("idempotency_key")?,
            order_id: row.get("order_id")?,
            amount: row.get("amount")?,
            currency: row.get("currency")?,
            customer: row.get("customer")?,
            payment_method: row.get("payment_method")?,
            status: row.get("status")?,
            payment_id: row.get("payment_id")?,
            charged: row.get("charged")?,
        })
    })?;
    rows.collect()
}

/// What a call under a key asked for: what a replay must match.
type Params = (String, i64, String, String, Option<String>);

/// The first call under `key`: its parameters, status and payment id (what a replay
/// answers with).
type FirstUse = (Params, String, Option<String>);

fn first_use_of(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<FirstUse>> {
    tx.query_row(
        "SELECT order_id, amount, currency, customer, payment_method, status, payment_id
             FROM calls WHERE idempotency_key = :key ORDER BY seq LIMIT 1",
        named_params! {":key": key},
        |row| {
            let params = (
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            );
            Ok((params, row.get(5)?, row.get(6)?))
        },
    )
    .optional()
}

fn amount_of(order: &Order) -> i64 {
    i64::try_from(order.amount()).unwrap_or(i64::MAX)
}

fn params_of(order: &Order) -> Params {
    (
        order.id().to_owned(),
        amount_of(order),
        order.currency().to_owned(),
        order.customer().to_owned(),
        Some(order.payment_method().to_owned()),
    )
}

/// The charge a payment made (`latest_charge`).
fn receipt(payment_id: String) -> Receipt {
    Receipt {
        charge: Some(payment_id.replacen("pi_", "ch_", 1)),
        id: payment_id,
    }
}

/// What a stored first answer replays as.
fn replay(status: &str, payment_id: Option<String>) -> Result<Receipt, PaymentError> {
    match (status, payment_id) {
        ("authentication_required", id) => {
            Err(PaymentError::AuthenticationRequired { payment_id: id })
        }
        ("succeeded" | "succeeded_response_lost", Some(id)) => Ok(receipt(id)),
        _ => Err(declined()),
    }
}

fn charge_blocking(
    conn: &mut Connection,
    order: &Order,
    key: &str,
) -> Result<Result<Receipt, PaymentError>, rusqlite::Error> {
    if let Some(refused) = refusal(order) {
        return Ok(Err(refused));
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let first = first_use_of(&tx, key)?;
    let insert = |status: &str, payment_id: Option<&str>, charged: bool| {
        tx.execute(
            "INSERT INTO calls (at_ms, idempotency_key, order_id, amount, currency, customer,
                 payment_method, status, payment_id, charged)
             VALUES (:at, :key, :order, :amount, :currency, :customer, :method, :status,
                 :payment_id, :charged)",
            named_params! {
                ":at": charge_once::domain::clock::wall_ms(), ":key": key, ":order": order.id(),
                ":amount": amount_of(order), ":currency": order.currency(),
                ":customer": order.customer(), ":method": order.payment_method(),
                ":status": status, ":payment_id": payment_id, ":charged": i64::from(charged),
            },
        )
    };
    let outcome = match first {
        Some((params, _, _)) if params != params_of(order) => {
            insert("key_reused", None, false)?;
            Err(PaymentError::KeyReused)
        }
        Some((_, status, payment_id)) => {
            insert("replayed", payment_id.as_deref(), false)?;
            replay(&status, payment_id)
        }
        None => {
            let (status, answer) = first_answer(order);
            let payment_id = new_payment(&tx, order, status)?;
            let charged = matches!(status, "succeeded" | "succeeded_response_lost");
            insert(status, Some(&payment_id), charged)?;
            answer
                .map(|()| receipt(payment_id.clone()))
                .map_err(|e| match e {
                    PaymentError::AuthenticationRequired { .. } => {
                        PaymentError::AuthenticationRequired {
                            payment_id: Some(payment_id.clone()),
                        }
                    }
                    other => other,
                })
        }
    };
    tx.commit()?;
    Ok(outcome)
}

/// The payment a new key makes: succeeded, or left open (`requires_payment_method`)
/// after a decline or an authentication request. Its id.
fn new_payment(
    tx: &rusqlite::Transaction<'_>,
    order: &Order,
    status: &str,
) -> rusqlite::Result<String> {
    let payment_id = format!("pi_sim_{}", uuid::Uuid::new_v4().simple());
    // As localstripe answers an off-session payment that needs authentication:
    // `requires_action` (Stripe leaves it `requires_payment_method` with the error
    // code; both read as awaiting the customer).
    let intent_status = match status {
        "succeeded" | "succeeded_response_lost" => "succeeded",
        "authentication_required" => "requires_action",
        _ => "requires_payment_method",
    };
    tx.execute(
        "INSERT INTO payment_intents (id, order_id, amount, currency, customer,
             payment_method, status, created_ms)
         VALUES (:id, :order, :amount, :currency, :customer, :method, :status, :at)",
        named_params! {
            ":id": payment_id, ":order": order.id(), ":amount": amount_of(order),
            ":currency": order.currency(), ":customer": order.customer(),
            ":method": order.payment_method(), ":status": intent_status,
            ":at": charge_once::domain::clock::wall_ms(),
        },
    )?;
    Ok(payment_id)
}

/// A new key's answer, by the test payment method (and the one test customer).
fn first_answer(order: &Order) -> (&'static str, Result<(), PaymentError>) {
    let method = order.payment_method();
    if method == AUTHENTICATION_REQUIRED {
        let answer = Err(PaymentError::AuthenticationRequired { payment_id: None });
        return ("authentication_required", answer);
    }
    if method.starts_with(DECLINED_PREFIX) {
        return ("declined", Err(declined()));
    }
    if order.customer() == TIMEOUT_AFTER_CHARGE_CUSTOMER {
        let lost = Err(PaymentError::retryable(FailureKind::Timeout));
        return ("succeeded_response_lost", lost);
    }
    ("succeeded", Ok(()))
}

/// The order's payment: a succeeded one wins, then an open one; cancelled ones do
/// not count. The simulator settles every payment at once: none is in flight.
fn find_blocking(conn: &mut Connection, order: &Order) -> Result<Lookup, rusqlite::Error> {
    conn.query_row(
        "SELECT id, status FROM payment_intents WHERE order_id = :order AND amount = :amount
             AND currency = :currency AND status <> 'canceled'
             ORDER BY status = 'succeeded' DESC, created_ms LIMIT 1",
        named_params! {
            ":order": order.id(), ":amount": amount_of(order), ":currency": order.currency(),
        },
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
    )
    .optional()
    .map(|found| match found {
        Some((id, status)) if status == "succeeded" => Lookup::Succeeded(receipt(id)),
        Some((payment_id, status)) => Lookup::Open {
            awaits_customer: status == charge_once::contracts::payment::AWAITS_CUSTOMER,
            payment_id,
            status,
        },
        None => Lookup::NotFound,
    })
}

fn cancel_blocking(conn: &mut Connection, payment_id: &str) -> Result<Cancel, rusqlite::Error> {
    let changed = conn.execute(
        "UPDATE payment_intents SET status = 'canceled'
             WHERE id = :id AND status IN ('requires_payment_method', 'requires_action')",
        named_params! {":id": payment_id},
    )?;
    if changed == 0 {
        return Ok(Cancel::NotCancellable);
    }
    conn.execute(
        "INSERT INTO calls (at_ms, idempotency_key, order_id, amount, currency, customer,
             payment_method, status, payment_id, charged)
         SELECT :at, '', order_id, amount, currency, customer, payment_method, 'canceled', id, 0
             FROM payment_intents WHERE id = :id",
        named_params! {":at": charge_once::domain::clock::wall_ms(), ":id": payment_id},
    )?;
    Ok(Cancel::Cancelled)
}

/// The ledger's payments, as the provider lists them.
fn listed_blocking(
    conn: &mut Connection,
    since: Option<Time>,
    payment_id: Option<&str>,
) -> Result<Vec<ListedPayment>, rusqlite::Error> {
    let mut stmt = conn.prepare(
        "SELECT id, order_id, amount, currency, customer, payment_method, status, created_ms
             FROM payment_intents
             WHERE created_ms >= :since AND (:id IS NULL OR id = :id) ORDER BY created_ms",
    )?;
    let since = since.map_or(i64::MIN, Time::as_ms);
    let rows = stmt.query_map(named_params! {":since": since, ":id": payment_id}, |row| {
        Ok(ListedPayment {
            id: row.get(0)?,
            order_id: Some(row.get(1)?),
            amount: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
            currency: row.get(3)?,
            customer: Some(row.get(4)?),
            payment_method: Some(row.get(5)?),
            status: row.get(6)?,
            created: Time::from_ms(row.get(7)?),
        })
    })?;
    rows.collect()
}

fn declined() -> PaymentError {
    PaymentError::Declined {
        code: "card_declined".to_owned(),
        decline_code: Some("generic_decline".to_owned()),
        payment_id: None,
    }
}

fn ledger_error(e: impl std::error::Error + Send + Sync + 'static) -> PaymentError {
    PaymentError::Retryable {
        kind: FailureKind::Connection,
        source: Some(Box::new(e)),
        should_retry: None,
    }
}

#[async_trait]
impl ChargePath for SimulatedProvider {
    async fn charge(&self, order: &Order, idempotency_key: &str) -> Result<Receipt, PaymentError> {
        let order = order.clone();
        let key = idempotency_key.to_owned();
        self.conn
            .call(move |conn| charge_blocking(conn, &order, &key))
            .await
            .map_err(ledger_error)?
    }

    async fn find_payment(&self, order: &Order, _since: Time) -> Result<Lookup, PaymentError> {
        let order = order.clone();
        self.conn
            .call(move |conn| find_blocking(conn, &order))
            .await
            .map_err(ledger_error)
    }

    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError> {
        let id = payment_id.to_owned();
        self.conn
            .call(move |conn| cancel_blocking(conn, &id))
            .await
            .map_err(ledger_error)
    }

    async fn payment_by_id(&self, id: &str) -> Result<Option<ListedPayment>, PaymentError> {
        let id = id.to_owned();
        let mut found = self
            .conn
            .call(move |conn| listed_blocking(conn, None, Some(&id)))
            .await
            .map_err(ledger_error)?;
        Ok(found.pop())
    }
}

#[async_trait]
impl PaymentListing for SimulatedProvider {
    async fn payments_since(&self, since: Time) -> Result<Vec<ListedPayment>, PaymentError> {
        self.conn
            .call(move |conn| listed_blocking(conn, Some(since), None))
            .await
            .map_err(ledger_error)
    }

    /// The payments of the window that succeeded, confirmed at their creation. The
    /// ledger keeps a payment's status, not when it changed, so a payment created
    /// before the window and authenticated in it is not here: local runs are short
    /// and audited over a window that holds them whole, and the late confirmation is
    /// audited on localstripe's events (`tests/audit.rs`).
    async fn confirmed_since(&self, since: Time) -> Result<Vec<Confirmation>, PaymentError> {
        let listed = self.payments_since(since).await?;
        Ok(listed
            .into_iter()
            .filter(ListedPayment::succeeded)
            .map(|payment| Confirmation {
                at: payment.created,
                payment,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
