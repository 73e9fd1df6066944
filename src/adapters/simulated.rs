//! A local payment provider for runs without a real one. It behaves like a
//! Stripe-compatible provider where it matters here: it stores the outcome of every
//! idempotency key and replays it, refuses a key reused with other parameters, and
//! answers `find_charge`. Its ledger is the `charges` table of the SQLite file given
//! to it: one row per call outcome.
//!
//! Test customers (anything else is charged):
//!
//! | customer | behaviour |
//! | --- | --- |
//! | `cus_declined` | 402 Declined (`card_declined` / `generic_decline`), stored under the key |
//! | `cus_timeout_after_charge` | charges, then the response is lost (a timeout); a replay of the key returns that charge |
//!
//! It refuses what the provider refuses, as far as Stripe's documented rules go (a 400
//! that stores nothing under the key, as Stripe stores no result for a request that
//! failed validation): a currency Stripe does not take, an amount below the currency's
//! minimum charge, a customer id that is not a customer's (`cus_…`).

use std::path::Path;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, named_params};

use crate::adapters::sqlite_file::{OpenError, OpenMode, SharedConnection};
use crate::contracts::payment::{
    ChargeListing, ChargePath, FailureKind, KeyHistory, ListedCharge, Lookup, PaymentError, Receipt,
};
use crate::domain::clock::Time;
use crate::domain::order::Order;

pub const DECLINED_CUSTOMER: &str = "cus_declined";
pub const TIMEOUT_AFTER_CHARGE_CUSTOMER: &str = "cus_timeout_after_charge";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms           INTEGER NOT NULL,
    idempotency_key TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    amount          INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    customer        TEXT NOT NULL,
    status          TEXT NOT NULL,
    charge_id       TEXT,
    charged         INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS charges_by_key ON charges (idempotency_key);
CREATE INDEX IF NOT EXISTS charges_by_order ON charges (order_id)";

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
    /// `succeeded`, `declined`, `succeeded_response_lost`, `replayed`, `key_reused`.
    pub status: String,
    pub charge_id: Option<String>,
    /// 1 when this call took money (a new charge), else 0.
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
    /// Opens the ledger in `path` (creating the file and its `charges` table if
    /// missing).
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        Self::open_in(path, OpenMode::Create)
    }

    /// Opens the ledger; with [`OpenMode::Existing`] the file must exist and hold it.
    pub fn open_in(path: &Path, mode: OpenMode) -> Result<Self, OpenError> {
        Ok(Self {
            conn: SharedConnection::open(path, SCHEMA, "charges", mode)?,
        })
    }

    /// The ledger rows of one order, oldest first.
    pub fn ledger(&self, order_id: &str) -> Result<Vec<LedgerRow>, rusqlite::Error> {
        self.conn.call_here(|conn| ledger_rows(conn, order_id))
    }
}

fn ledger_rows(conn: &mut Connection, order_id: &str) -> Result<Vec<LedgerRow>, rusqlite::Error> {
    let mut stmt = conn.prepare("SELECT * FROM charges WHERE order_id = :order ORDER BY seq")?;
    let rows = stmt.query_map(named_params! {":order": order_id}, |row| {
        Ok(LedgerRow {
            seq: row.get("seq")?,
            at_ms: row.get("at_ms")?,
            idempotency_key: row.get("idempotency_key")?,
            order_id: row.get("order_id")?,
            amount: row.get("amount")?,
            currency: row.get("currency")?,
            customer: row.get("customer")?,
            status: row.get("status")?,
            charge_id: row.get("charge_id")?,
            charged: row.get("charged")?,
        })
    })?;
    rows.collect()
}

/// The first call under `key`: its parameters, status and charge id (what a replay
/// answers with).
type FirstUse = ((String, i64, String, String), String, Option<String>);

fn first_use_of(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<FirstUse>> {
    tx.query_row(
        "SELECT order_id, amount, currency, customer, status, charge_id FROM charges
             WHERE idempotency_key = :key ORDER BY seq LIMIT 1",
        named_params! {":key": key},
        |row| {
            let params = (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
            Ok((params, row.get(4)?, row.get(5)?))
        },
    )
    .optional()
}

/// Stripe's presentment currencies (lower case), as its supported-currencies page
/// lists them.
const CURRENCIES: &[&str] = &[
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf", "chf",
    "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb", "eur",
    "fjd", "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg", "huf",
    "idr", "ils", "inr", "isk", "jmd", "jpy", "kes", "kgs", "khr", "kmf", "krw", "kyd", "kzt",
    "lak", "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk", "mnt", "mop", "mur",
    "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr", "nzd", "pab", "pen",
    "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub", "rwf", "sar", "sbd", "scr",
    "sek", "sgd", "shp", "sle", "sos", "srd", "std", "szl", "thb", "tjs", "top", "try", "ttd",
    "twd", "tzs", "uah", "ugx", "usd", "uyu", "uzs", "vnd", "vuv", "wst", "xaf", "xcd", "xof",
    "xpf", "yer", "zar", "zmw",
];

/// Stripe's minimum charge per settlement currency, in the currency's minor units (a
/// zero-decimal currency's units for JPY). Other currencies: at least one minor unit,
/// as the order's own rule.
const MINIMUMS: &[(&str, u64)] = &[
    ("usd", 50),
    ("aed", 200),
    ("aud", 50),
    ("bgn", 100),
    ("brl", 50),
    ("cad", 50),
    ("chf", 50),
    ("czk", 1500),
    ("dkk", 250),
    ("eur", 50),
    ("gbp", 30),
    ("hkd", 400),
    ("huf", 17500),
    ("inr", 50),
    ("jpy", 50),
    ("mxn", 1000),
    ("myr", 200),
    ("nok", 300),
    ("nzd", 50),
    ("pln", 200),
    ("ron", 200),
    ("sek", 300),
    ("sgd", 50),
    ("thb", 1000),
];

/// What Stripe refuses before charging (a 400, stored under no key), or `None`.
fn refusal(order: &Order) -> Option<PaymentError> {
    let currency = order.currency().to_ascii_lowercase();
    let refused = |code: &str| PaymentError::Rejected {
        status: 400,
        code: Some(code.to_owned()),
    };
    if !CURRENCIES.contains(&currency.as_str()) {
        return Some(refused("charge_invalid_parameter"));
    }
    let minimum = MINIMUMS
        .iter()
        .find(|(c, _)| *c == currency)
        .map_or(1, |(_, m)| *m);
    if order.amount() < minimum {
        return Some(refused("amount_too_small"));
    }
    if !order.customer().starts_with("cus_") {
        return Some(refused("resource_missing"));
    }
    None
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
    let amount = i64::try_from(order.amount()).unwrap_or(i64::MAX);
    let this_params = (
        order.id().to_owned(),
        amount,
        order.currency().to_owned(),
        order.customer().to_owned(),
    );
    let insert = |status: &str, charge_id: Option<&str>, charged: bool| {
        tx.execute(
                "INSERT INTO charges (at_ms, idempotency_key, order_id, amount, currency, customer, status, charge_id, charged)
                 VALUES (:at, :key, :order, :amount, :currency, :customer, :status, :charge_id, :charged)",
                named_params! {
                    ":at": crate::domain::clock::wall_ms(), ":key": key, ":order": order.id(), ":amount": amount,
                    ":currency": order.currency(), ":customer": order.customer(),
                    ":status": status, ":charge_id": charge_id, ":charged": i64::from(charged),
                },
            )
    };
    let outcome = match first {
        Some((params, _, _)) if params != this_params => {
            insert("key_reused", None, false)?;
            Err(PaymentError::KeyReused)
        }
        Some((_, status, charge_id)) => {
            insert("replayed", charge_id.as_deref(), false)?;
            match (status.as_str(), charge_id) {
                ("declined", _) | (_, None) => Err(declined()),
                (_, Some(id)) => Ok(Receipt { id }),
            }
        }
        None if order.customer() == DECLINED_CUSTOMER => {
            insert("declined", None, false)?;
            Err(declined())
        }
        None => {
            let id = format!("ch_sim_{}", uuid::Uuid::new_v4().simple());
            if order.customer() == TIMEOUT_AFTER_CHARGE_CUSTOMER {
                insert("succeeded_response_lost", Some(&id), true)?;
                Err(PaymentError::retryable(FailureKind::Timeout))
            } else {
                insert("succeeded", Some(&id), true)?;
                Ok(Receipt { id })
            }
        }
    };
    tx.commit()?;
    Ok(outcome)
}

/// The simulator settles every charge at once: a charge is succeeded or absent.
fn find_blocking(conn: &mut Connection, order: &Order) -> Result<Lookup, rusqlite::Error> {
    conn.query_row(
        "SELECT charge_id FROM charges WHERE order_id = :order AND amount = :amount
             AND currency = :currency AND charged = 1 ORDER BY seq LIMIT 1",
        named_params! {
            ":order": order.id(),
            ":amount": i64::try_from(order.amount()).unwrap_or(i64::MAX),
            ":currency": order.currency(),
        },
        |row| row.get::<_, String>(0),
    )
    .optional()
    .map(|id| id.map_or(Lookup::NotFound, |id| Lookup::Succeeded(Receipt { id })))
}

/// Whether any of the order's keys reached this ledger.
fn history_blocking(conn: &mut Connection, order: &Order) -> Result<KeyHistory, rusqlite::Error> {
    let received: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM charges WHERE order_id = :order)",
        named_params! {":order": order.id()},
        |row| row.get(0),
    )?;
    Ok(if received {
        KeyHistory::Received
    } else {
        KeyHistory::NeverReceived
    })
}

/// The ledger's charges (rows that took money), as the provider lists them.
fn listed_blocking(
    conn: &mut Connection,
    since: Option<Time>,
    charge_id: Option<&str>,
) -> Result<Vec<ListedCharge>, rusqlite::Error> {
    let mut stmt = conn.prepare(
        "SELECT charge_id, order_id, amount, currency, customer, at_ms FROM charges
             WHERE charged = 1 AND at_ms >= :since AND (:id IS NULL OR charge_id = :id)
             ORDER BY seq",
    )?;
    let since = since.map_or(i64::MIN, Time::as_ms);
    let rows = stmt.query_map(named_params! {":since": since, ":id": charge_id}, |row| {
        Ok(ListedCharge {
            id: row.get(0)?,
            order_id: Some(row.get(1)?),
            amount: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
            currency: row.get(3)?,
            customer: Some(row.get(4)?),
            status: "succeeded".to_owned(),
            created: Time::from_ms(row.get(5)?),
        })
    })?;
    rows.collect()
}

fn declined() -> PaymentError {
    PaymentError::Declined {
        code: "card_declined".to_owned(),
        decline_code: Some("generic_decline".to_owned()),
    }
}

fn ledger_error(e: impl std::error::Error + Send + Sync + 'static) -> PaymentError {
    PaymentError::Retryable {
        kind: FailureKind::Connection,
        source: Some(Box::new(e)),
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

    async fn find_charge(&self, order: &Order) -> Result<Lookup, PaymentError> {
        let order = order.clone();
        self.conn
            .call(move |conn| find_blocking(conn, &order))
            .await
            .map_err(ledger_error)
    }

    /// The ledger knows every key it received: an order it never saw was charged
    /// elsewhere, if at all.
    async fn key_history(&self, order: &Order) -> Result<KeyHistory, PaymentError> {
        let order = order.clone();
        self.conn
            .call(move |conn| history_blocking(conn, &order))
            .await
            .map_err(ledger_error)
    }
}

#[async_trait]
impl ChargeListing for SimulatedProvider {
    async fn charges_since(&self, since: Time) -> Result<Vec<ListedCharge>, PaymentError> {
        self.conn
            .call(move |conn| listed_blocking(conn, Some(since), None))
            .await
            .map_err(ledger_error)
    }

    async fn charge_by_id(&self, id: &str) -> Result<Option<ListedCharge>, PaymentError> {
        let id = id.to_owned();
        let mut found = self
            .conn
            .call(move |conn| listed_blocking(conn, None, Some(&id)))
            .await
            .map_err(ledger_error)?;
        Ok(found.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(customer: &str) -> Order {
        Order::new("ord-sim", 500, "EUR", customer).unwrap()
    }

    fn provider() -> (tempfile::TempDir, SimulatedProvider) {
        let dir = tempfile::tempdir().unwrap();
        let provider = SimulatedProvider::open(&dir.path().join("sim.sqlite3")).unwrap();
        (dir, provider)
    }

    #[tokio::test]
    async fn a_key_replays_its_charge_and_the_ledger_holds_one_charge() {
        let (_dir, p) = provider();
        let first = p.charge(&order("cus_1"), "k#1").await.unwrap();
        assert_eq!(p.charge(&order("cus_1"), "k#1").await.unwrap(), first);
        let ledger = p.ledger("ord-sim").unwrap();
        let statuses: Vec<_> = ledger.iter().map(|r| r.status.as_str()).collect();
        assert_eq!(statuses, ["succeeded", "replayed"]);
        assert_eq!(ledger.iter().map(|r| r.charged).sum::<i64>(), 1);
        assert_eq!(
            p.find_charge(&order("cus_1")).await.unwrap(),
            Lookup::Succeeded(first)
        );
    }

    #[tokio::test]
    async fn the_declined_customer_is_declined_and_the_decline_is_replayed() {
        let (_dir, p) = provider();
        for _ in 0..2 {
            let result = p.charge(&order(DECLINED_CUSTOMER), "k#1").await;
            assert!(
                matches!(result, Err(PaymentError::Declined { .. })),
                "{result:?}"
            );
        }
        assert_eq!(
            p.find_charge(&order(DECLINED_CUSTOMER)).await.unwrap(),
            Lookup::NotFound
        );
    }

    #[tokio::test]
    async fn timeout_after_charge_charges_then_the_replay_returns_the_charge() {
        let (_dir, p) = provider();
        let lost = p.charge(&order(TIMEOUT_AFTER_CHARGE_CUSTOMER), "k#1").await;
        assert!(matches!(
            lost,
            Err(PaymentError::Retryable {
                kind: FailureKind::Timeout,
                ..
            })
        ));
        let replay = p
            .charge(&order(TIMEOUT_AFTER_CHARGE_CUSTOMER), "k#1")
            .await
            .unwrap();
        let ledger = p.ledger("ord-sim").unwrap();
        assert_eq!(ledger[0].charge_id.as_deref(), Some(replay.id.as_str()));
        assert_eq!(ledger.iter().map(|r| r.charged).sum::<i64>(), 1);
    }

    #[tokio::test]
    async fn it_refuses_what_stripe_refuses_and_stores_nothing_under_the_key() {
        let (_dir, p) = provider();
        for (order, code) in [
            (
                Order::new("ord-x", 500, "ZZZ", "cus_1"),
                "charge_invalid_parameter",
            ),
            (Order::new("ord-x", 49, "EUR", "cus_1"), "amount_too_small"),
            (Order::new("ord-x", 29, "gbp", "cus_1"), "amount_too_small"),
            (
                Order::new("ord-x", 1499, "CZK", "cus_1"),
                "amount_too_small",
            ),
            (
                Order::new("ord-x", 500, "EUR", "pm_card_visa"),
                "resource_missing",
            ),
        ] {
            let order = order.unwrap();
            match p.charge(&order, "k#1").await {
                Err(PaymentError::Rejected {
                    status: 400,
                    code: Some(c),
                }) => assert_eq!(c, code),
                other => panic!("{order:?}: {other:?}"),
            }
        }
        assert!(p.ledger("ord-x").unwrap().is_empty());
        assert_eq!(
            p.key_history(&order("cus_1")).await.unwrap(),
            KeyHistory::NeverReceived
        );
        // At the minimum, and in a currency without a listed minimum, it charges.
        for (amount, currency) in [(50, "EUR"), (30, "GBP"), (1, "ISK")] {
            let order = Order::new("ord-x", amount, currency, "cus_1").unwrap();
            let key = format!("k#{currency}");
            assert!(p.charge(&order, &key).await.is_ok(), "{amount} {currency}");
        }
        let received = Order::new("ord-x", 50, "EUR", "cus_1").unwrap();
        assert_eq!(
            p.key_history(&received).await.unwrap(),
            KeyHistory::Received
        );
    }

    #[tokio::test]
    async fn a_key_reused_with_other_parameters_is_refused() {
        let (_dir, p) = provider();
        p.charge(&order("cus_1"), "k#1").await.unwrap();
        let other = Order::new("ord-sim", 999, "EUR", "cus_1").unwrap();
        assert!(matches!(
            p.charge(&other, "k#1").await,
            Err(PaymentError::KeyReused)
        ));
    }
}
