//! The simulator's refunds, as Stripe's Refunds API keeps them where it matters here:
//! a refund is made on a succeeded payment only, takes at most what remains of it (the
//! rest when no amount is named), is refused whole otherwise (a 400, nothing stored
//! under the key), and the first answer under a key is replayed (another request under
//! it: `idempotency_error`). Its ledger is the `refunds` table of the same file.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, named_params};

use super::{SimulatedProvider, ledger_error};
use charge_once::contracts::payment::{
    ListedRefund, Lookup, PaymentError, Receipt, RefundPath, RefundSeen,
};
use charge_once::domain::clock::Time;
use charge_once::domain::refund::RefundRequest;

/// The refunds table, created with the rest of the ledger.
pub(super) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS refunds (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    payment_id      TEXT NOT NULL,
    refund_id       TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    amount          INTEGER NOT NULL,
    asked           INTEGER,
    status          TEXT NOT NULL,
    created_ms      INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS refunds_by_key ON refunds (idempotency_key);
CREATE INDEX IF NOT EXISTS refunds_by_payment ON refunds (payment_id)";

fn rejected(code: Option<&str>) -> PaymentError {
    PaymentError::Rejected {
        status: 400,
        code: code.map(str::to_owned),
    }
}

fn asked(request: &RefundRequest) -> Option<i64> {
    request
        .amount()
        .map(|amount| i64::try_from(amount).unwrap_or(i64::MAX))
}

fn refund_blocking(
    conn: &mut Connection,
    request: &RefundRequest,
    payment_id: &str,
    key: &str,
) -> rusqlite::Result<Result<Receipt, PaymentError>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let first: Option<(String, String, String, Option<i64>)> = tx
        .query_row(
            "SELECT id, payment_id, refund_id, asked FROM refunds
                 WHERE idempotency_key = :key",
            named_params! {":key": key},
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .optional()?;
    if let Some((id, payment, refund_id, first_asked)) = first {
        let same =
            payment == payment_id && refund_id == request.id() && first_asked == asked(request);
        return Ok(if same {
            Ok(Receipt::new(id))
        } else {
            Err(PaymentError::KeyReused)
        });
    }
    let paid: Option<(i64, String)> = tx
        .query_row(
            "SELECT amount, status FROM payment_intents WHERE id = :id",
            named_params! {":id": payment_id},
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let Some((charged, status)) = paid else {
        return Ok(Err(PaymentError::Rejected {
            status: 404,
            code: Some("resource_missing".to_owned()),
        }));
    };
    if status != "succeeded" {
        return Ok(Err(rejected(None)));
    }
    let refunded: i64 = tx.query_row(
        "SELECT COALESCE(SUM(amount), 0) FROM refunds
             WHERE payment_id = :id AND status IN ('succeeded', 'pending')",
        named_params! {":id": payment_id},
        |row| row.get(0),
    )?;
    let remaining = charged - refunded;
    if remaining <= 0 {
        return Ok(Err(rejected(Some("charge_already_refunded"))));
    }
    let amount = asked(request).unwrap_or(remaining);
    if amount > remaining {
        return Ok(Err(rejected(None)));
    }
    let id = format!("re_sim_{}", uuid::Uuid::new_v4().simple());
    tx.execute(
        "INSERT INTO refunds (id, idempotency_key, payment_id, refund_id, order_id, amount,
             asked, status, created_ms)
         VALUES (:id, :key, :payment, :refund, :order, :amount, :asked, 'succeeded', :at)",
        named_params! {
            ":id": id, ":key": key, ":payment": payment_id, ":refund": request.id(),
            ":order": request.order_id(), ":amount": amount, ":asked": asked(request),
            ":at": charge_once::domain::clock::wall_ms(),
        },
    )?;
    tx.commit()?;
    Ok(Ok(Receipt::new(id)))
}

fn find_blocking(
    conn: &mut Connection,
    refund_id: &str,
    payment_id: &str,
) -> rusqlite::Result<Lookup> {
    let found: Option<(String, String)> = conn
        .query_row(
            "SELECT id, status FROM refunds
                 WHERE payment_id = :payment AND refund_id = :refund
                   AND status IN ('succeeded', 'pending')",
            named_params! {":payment": payment_id, ":refund": refund_id},
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    Ok(match found {
        Some((id, status)) if status == "succeeded" => Lookup::Succeeded(Receipt::new(id)),
        Some((id, status)) => Lookup::Pending {
            payment_id: id,
            status,
        },
        None => Lookup::NotFound,
    })
}

fn seen_blocking(conn: &mut Connection, id: &str) -> rusqlite::Result<Option<RefundSeen>> {
    conn.query_row(
        "SELECT status, refund_id, order_id FROM refunds WHERE id = :id",
        named_params! {":id": id},
        |row| {
            Ok(RefundSeen {
                status: row.get(0)?,
                refund_id: row.get(1)?,
                order_id: row.get(2)?,
                failure_reason: None,
            })
        },
    )
    .optional()
}

/// The refunds created since `since`, or of `payment`, as the audit
/// reads them.
fn listed_blocking(
    conn: &mut Connection,
    since: Option<Time>,
    payment: Option<&str>,
) -> rusqlite::Result<Vec<ListedRefund>> {
    let mut stmt = conn.prepare(
        "SELECT id, refund_id, order_id, payment_id, amount, status, created_ms FROM refunds
             WHERE (:since IS NULL OR created_ms >= :since)
               AND (:payment IS NULL OR payment_id = :payment)
             ORDER BY created_ms, id",
    )?;
    let rows = stmt.query_map(
        named_params! {":since": since.map(Time::as_ms), ":payment": payment},
        |row| {
            Ok(ListedRefund {
                id: row.get(0)?,
                refund_id: row.get(1)?,
                order_id: row.get(2)?,
                payment_id: row.get(3)?,
                amount: u64::try_from(row.get::<_, i64>(4)?).unwrap_or_default(),
                status: row.get(5)?,
                created: Time::from_ms(row.get(6)?),
            })
        },
    )?;
    rows.collect()
}

/// The refunds rows of `order_id`, oldest first: (refund, request, amount, status).
pub(super) fn refunds_of(
    conn: &mut Connection,
    order_id: &str,
) -> rusqlite::Result<Vec<(String, String, i64, String)>> {
    let mut stmt = conn.prepare(
        "SELECT id, refund_id, amount, status FROM refunds
             WHERE order_id = :order ORDER BY created_ms, id",
    )?;
    let rows = stmt.query_map(named_params! {":order": order_id}, |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
    })?;
    rows.collect()
}

#[async_trait]
impl RefundPath for SimulatedProvider {
    async fn refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
        idempotency_key: &str,
    ) -> Result<Receipt, PaymentError> {
        let (request, payment, key) = (
            request.clone(),
            payment_id.to_owned(),
            idempotency_key.to_owned(),
        );
        self.conn
            .call(move |conn| refund_blocking(conn, &request, &payment, &key))
            .await
            .map_err(ledger_error)?
    }

    async fn find_refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
    ) -> Result<Lookup, PaymentError> {
        let (refund, payment) = (request.id().to_owned(), payment_id.to_owned());
        self.conn
            .call(move |conn| find_blocking(conn, &refund, &payment))
            .await
            .map_err(ledger_error)
    }

    async fn refunds_since(&self, since: Time) -> Result<Vec<ListedRefund>, PaymentError> {
        self.conn
            .call(move |conn| listed_blocking(conn, Some(since), None))
            .await
            .map_err(ledger_error)
    }

    async fn refunds_of_payment(
        &self,
        payment_id: &str,
    ) -> Result<Vec<ListedRefund>, PaymentError> {
        let payment = payment_id.to_owned();
        self.conn
            .call(move |conn| listed_blocking(conn, None, Some(&payment)))
            .await
            .map_err(ledger_error)
    }

    async fn refund_by_id(&self, id: &str) -> Result<Option<RefundSeen>, PaymentError> {
        let id = id.to_owned();
        self.conn
            .call(move |conn| seen_blocking(conn, &id))
            .await
            .map_err(ledger_error)
    }
}
