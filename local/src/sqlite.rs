//! The embedded store for local runs: the idempotency table in one SQLite file, with
//! the same contract and semantics as DynamoDB. Each operation is one immediate
//! transaction holding one conditional statement (`INSERT … ON CONFLICT DO UPDATE …
//! WHERE` / `UPDATE … WHERE`, `RETURNING *`); when the condition fails, the old row is
//! read in the same transaction, as DynamoDB's `ALL_OLD` would return it.
//!
//! Columns are the attribute names of ARCHITECTURE.md, "The table". SQL `NULL` comparisons are false, as
//! comparisons with missing attributes are in DynamoDB condition expressions.

use std::path::Path;

use async_trait::async_trait;
use rusqlite::types::{Type, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, named_params};

use crate::sqlite_file::{CallError, OpenMode, SharedConnection};
use charge_once::contracts::schema::{self, Problem, Value};
use charge_once::contracts::store::{
    AwaitingCursor, IdempotencyStore, ReleaseKind, Settled, StoreError, Write, WriteOutcome,
};
use charge_once::domain::clock::Time;
use charge_once::domain::{Key, Record};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempotency (
    pk             TEXT PRIMARY KEY NOT NULL,
    estado         TEXT NOT NULL,
    creado         INTEGER,
    expira         INTEGER,
    recibo         TEXT,
    huella         TEXT,
    titular        TEXT,
    en_curso_hasta INTEGER,
    intento        INTEGER,
    enviado        INTEGER,
    rechazos       INTEGER,
    pago           TEXT,
    espera_hasta   INTEGER,
    huella_pagada  TEXT
) STRICT";
/// Columns a local file made by an earlier build may lack, each added when missing
/// (absent reads as the attribute's absence, as in DynamoDB).
const LATER_COLUMNS: [(&str, &str); 4] = [
    ("rechazos", "INTEGER"),
    ("pago", "TEXT"),
    ("espera_hasta", "INTEGER"),
    ("huella_pagada", "TEXT"),
];

const RESERVE: &str = "INSERT INTO idempotency
        (pk, estado, titular, en_curso_hasta, huella, expira, creado, intento, enviado)
    VALUES (:pk, :in_progress, :owner, :lease_until, :fingerprint, :expires, :now_ms, 1, :now_ms)
    ON CONFLICT (pk) DO UPDATE SET
        estado = :in_progress, titular = :owner, en_curso_hasta = :lease_until,
        huella = :fingerprint, expira = :expires,
        creado = COALESCE(creado, :now_ms), intento = COALESCE(intento, 1),
        enviado = COALESCE(enviado, :now_ms)
    WHERE (estado <> :done AND estado <> :awaiting AND estado <> :uncertain AND expira < :now_s
           AND huella IS NOT NULL)
       OR ((huella = :fingerprint OR estado = :failed)
           AND (rechazos IS NULL OR rechazos < :max_declines)
           AND (estado = :free OR estado = :failed
                OR (estado = :in_progress AND en_curso_hasta < :now_ms)))
    RETURNING *";
const COMPLETE: &str = "UPDATE idempotency
    SET estado = :done, recibo = :receipt, expira = :expires, titular = NULL, en_curso_hasta = NULL,
        intento = NULL, enviado = NULL, rechazos = NULL, pago = NULL, espera_hasta = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const COMPLETE_ATTEMPT: &str = "UPDATE idempotency
    SET estado = :done, recibo = :receipt, expira = :expires, titular = NULL, en_curso_hasta = NULL,
        intento = NULL, enviado = NULL, rechazos = NULL, pago = NULL, espera_hasta = NULL
    WHERE pk = :pk AND intento = :attempt AND estado <> :done
    RETURNING *";
const RELEASE: &str = "UPDATE idempotency
    SET estado = :free, titular = NULL, en_curso_hasta = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const RELEASE_DECLINED: &str = "UPDATE idempotency
    SET estado = :free, titular = NULL, en_curso_hasta = NULL, intento = intento + 1, enviado = NULL,
        rechazos = COALESCE(rechazos, 0) + 1
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const RELEASE_UNCERTAIN: &str = "UPDATE idempotency
    SET estado = :uncertain, titular = NULL, en_curso_hasta = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const RELEASE_NEXT: &str = "UPDATE idempotency
    SET estado = :free, titular = NULL, en_curso_hasta = NULL, intento = intento + 1, enviado = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const RELEASE_NEXT_RESET: &str = "UPDATE idempotency
    SET estado = :free, titular = NULL, en_curso_hasta = NULL, intento = intento + 1, enviado = NULL,
        rechazos = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const NEXT_ATTEMPT: &str = "UPDATE idempotency
    SET intento = intento + 1, enviado = :now_ms
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const CORRECT: &str = "UPDATE idempotency
    SET huella = :fingerprint, intento = COALESCE(intento, 0) + 1, enviado = NULL, rechazos = NULL
    WHERE pk = :pk AND (estado = :free OR estado = :failed) AND enviado IS NULL
      AND huella <> :fingerprint
    RETURNING *";
const ADOPT: &str = "UPDATE idempotency
    SET estado = :done, recibo = :receipt, expira = :expires, titular = NULL, en_curso_hasta = NULL,
        intento = NULL, enviado = NULL, rechazos = NULL, pago = NULL, espera_hasta = NULL
    WHERE pk = :pk AND (estado = :free OR estado = :failed
        OR (estado = :in_progress AND en_curso_hasta < :now_ms))
      AND huella = :fingerprint
    RETURNING *";
const RESOLVE: &str = "UPDATE idempotency
    SET estado = :in_progress, titular = :owner, en_curso_hasta = :lease_until,
        huella = COALESCE(huella, :fingerprint), intento = COALESCE(intento, 1),
        enviado = COALESCE(enviado, :now_ms), creado = COALESCE(creado, :now_ms)
    WHERE pk = :pk AND estado <> :done AND estado <> :awaiting
      AND (estado <> :in_progress OR en_curso_hasta IS NULL OR en_curso_hasta < :now_ms)
      AND (huella IS NULL OR huella = :fingerprint)
    RETURNING *";
const AWAIT: &str = "UPDATE idempotency
    SET estado = :awaiting, pago = :payment, espera_hasta = :wait_until, expira = :expires,
        titular = NULL, en_curso_hasta = NULL
    WHERE pk = :pk AND estado = :in_progress AND titular = :owner
    RETURNING *";
const SETTLE_PAID: &str = "UPDATE idempotency
    SET estado = :done, recibo = :payment, expira = :expires, pago = NULL, espera_hasta = NULL,
        intento = NULL, enviado = NULL, rechazos = NULL, huella_pagada = :done_fingerprint
    WHERE pk = :pk AND estado = :awaiting AND pago = :payment
    RETURNING *";
const SETTLE_ENDED: &str = "UPDATE idempotency
    SET estado = :failed, intento = intento + 1, pago = NULL, espera_hasta = NULL, enviado = NULL
    WHERE pk = :pk AND estado = :awaiting AND pago = :payment
    RETURNING *";
const SETTLE_ENDING: &str = "UPDATE idempotency
    SET espera_hasta = :at
    WHERE pk = :pk AND estado = :awaiting AND pago = :payment
    RETURNING *";
const AWAITING: &str = "SELECT * FROM idempotency
    WHERE estado = :awaiting AND espera_hasta < :until
      AND (:after_pk IS NULL OR espera_hasta > :after_until
           OR (espera_hasta = :after_until AND pk > :after_pk))
    ORDER BY espera_hasta, pk LIMIT :limit";
/// Where the settler's last run stopped (`idempotent-consumer/src/schema.rs`, the settle cursor): a
/// table of its own, one row.
const CURSOR_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS settle_cursor (
    name      TEXT PRIMARY KEY NOT NULL,
    tras_hasta INTEGER NOT NULL,
    tras_pk    TEXT NOT NULL
) STRICT";
const CURSOR_GET: &str = "SELECT tras_hasta, tras_pk FROM settle_cursor WHERE name = :name";
const CURSOR_SET: &str = "INSERT INTO settle_cursor (name, tras_hasta, tras_pk)
    VALUES (:name, :until, :pk)
    ON CONFLICT (name) DO UPDATE SET tras_hasta = excluded.tras_hasta, tras_pk = excluded.tras_pk";
const CURSOR_CLEAR: &str = "DELETE FROM settle_cursor WHERE name = :name";
const GET: &str = "SELECT * FROM idempotency WHERE pk = :pk";

/// The idempotency table in a SQLite file. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    conn: SharedConnection,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteStore")
    }
}

impl SqliteStore {
    /// Opens the file and creates the `idempotency` table if missing (adding columns
    /// a file from an older version lacks).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_in(path, OpenMode::Create)
    }

    /// Opens the file; with [`OpenMode::Existing`] it must exist and hold the table
    /// (the read-only commands never create a database).
    pub fn open_in(path: &Path, mode: OpenMode) -> Result<Self, StoreError> {
        let conn = SharedConnection::open(path, SCHEMA, "idempotency", mode)
            .map_err(|e| StoreError::backend("open", &path.display().to_string(), e))?;
        conn.call_here(|c| {
            for (column, kind) in LATER_COLUMNS {
                if c.prepare(&format!("SELECT {column} FROM idempotency LIMIT 0"))
                    .is_err()
                {
                    c.execute_batch(&format!(
                        "ALTER TABLE idempotency ADD COLUMN {column} {kind}"
                    ))?;
                }
            }
            c.execute_batch(CURSOR_SCHEMA)?;
            Ok(())
        })
        .map_err(|e| StoreError::backend("add columns", "idempotency", e))?;
        Ok(Self { conn })
    }

    /// Runs one conditional statement in an immediate transaction; on a failed
    /// condition, reads the old row in the same transaction.
    async fn conditional(
        &self,
        operation: &'static str,
        pk: &Key,
        sql: &'static str,
        params: Vec<(&'static str, rusqlite::types::Value)>,
    ) -> Result<WriteOutcome, StoreError> {
        let pk_text = pk.to_string();
        let run = move |conn: &mut Connection| -> Result<WriteOutcome, rusqlite::Error> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut bound: Vec<(&str, &dyn rusqlite::ToSql)> = vec![(":pk", &pk_text)];
            for (name, value) in &params {
                bound.push((name, value));
            }
            // SQLite refuses a parameter its statement does not name: bind only the
            // state values this one uses.
            for (name, value) in &STATES {
                if sql.contains(name) {
                    bound.push((name, value));
                }
            }
            let written = tx
                .query_row(sql, bound.as_slice(), row_to_record)
                .optional()?;
            let outcome = match written {
                Some(record) => WriteOutcome::Applied(record),
                None => WriteOutcome::Refused(
                    tx.query_row(GET, named_params! {":pk": pk_text}, row_to_record)
                        .optional()?,
                ),
            };
            tx.commit()?;
            Ok(outcome)
        };
        self.conn
            .call(run)
            .await
            .map_err(|e| store_error(operation, pk.as_str(), e))
    }
}

/// The `estado` values the statements bind (never SQL literals): one mapping, the
/// schema's.
const STATES: [(&str, &str); 6] = [
    (":in_progress", schema::state::IN_PROGRESS),
    (":done", schema::state::DONE),
    (":free", schema::state::FREE),
    (":awaiting", schema::state::AWAITING),
    (":failed", schema::state::FAILED),
    (":uncertain", schema::state::UNCERTAIN),
];

/// A malformed row is `Malformed`, as DynamoDB's adapter reports it; anything else
/// failed in SQLite.
fn store_error(operation: &'static str, target: &str, error: CallError) -> StoreError {
    match error {
        CallError::Sqlite(rusqlite::Error::FromSqlConversionFailure(_, _, inner)) => {
            match inner.downcast::<StoreError>() {
                Ok(malformed) => *malformed,
                Err(other) => StoreError::Backend {
                    operation,
                    target: target.to_owned(),
                    source: other,
                },
            }
        }
        other => StoreError::backend(operation, target, other),
    }
}

fn row_to_record(row: &Row<'_>) -> Result<Record, rusqlite::Error> {
    // A malformed row is reported as DynamoDB reports a malformed item; the error
    // crosses rusqlite's row callback whole and is unwrapped in `conditional`/`get`.
    schema::read(&Columns(row))
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, Type::Null, Box::new(e)))
}

/// A row as the schema reads it.
struct Columns<'a, 'r>(&'a Row<'r>);

impl schema::Item for Columns<'_, '_> {
    fn value(&self, attribute: &'static str) -> Result<Option<Value>, Problem> {
        match self.0.get_ref(attribute) {
            Ok(ValueRef::Null) => Ok(None),
            Ok(ValueRef::Text(bytes)) => std::str::from_utf8(bytes)
                .map(|text| Some(Value::S(text.to_owned())))
                .map_err(|_| Problem::NotAString),
            Ok(ValueRef::Integer(n)) => Ok(Some(Value::N(n))),
            // A column of the table is always there; any other answer is a bad value.
            Ok(ValueRef::Real(_) | ValueRef::Blob(_)) | Err(_) => Err(Problem::NotAString),
        }
    }
}

fn text(value: &str) -> rusqlite::types::Value {
    rusqlite::types::Value::Text(value.to_owned())
}

fn int(value: i64) -> rusqlite::types::Value {
    rusqlite::types::Value::Integer(value)
}

/// The statement of one write and the values it binds (besides `:pk` and the states).
fn statement(write: &Write<'_>) -> (&'static str, Vec<(&'static str, rusqlite::types::Value)>) {
    match write {
        Write::Reserve(req) => (
            RESERVE,
            vec![
                (":owner", text(req.owner)),
                (":lease_until", int(req.lease_until.as_ms())),
                (":fingerprint", text(req.fingerprint)),
                (":expires", int(req.expires.as_secs())),
                (":now_ms", int(req.now.as_ms())),
                (":now_s", int(req.now.as_secs())),
                (":max_declines", int(i64::from(req.max_refusals))),
            ],
        ),
        Write::Complete(req) => (
            COMPLETE,
            vec![
                (":owner", text(req.owner)),
                (":receipt", text(req.receipt)),
                (":expires", int(req.expires.as_secs())),
            ],
        ),
        Write::CompleteAttempt(req) => (
            COMPLETE_ATTEMPT,
            vec![
                (":attempt", int(i64::from(req.attempt))),
                (":receipt", text(req.receipt)),
                (":expires", int(req.expires.as_secs())),
            ],
        ),
        Write::Release(req) => (release_sql(req.kind), vec![(":owner", text(req.owner))]),
        Write::NextAttempt { owner, now, .. } => (
            NEXT_ATTEMPT,
            vec![(":owner", text(owner)), (":now_ms", int(now.as_ms()))],
        ),
        Write::LeaseForResolve(req) => (
            RESOLVE,
            vec![
                (":owner", text(req.owner)),
                (":lease_until", int(req.lease_until.as_ms())),
                (":fingerprint", text(req.fingerprint)),
                (":now_ms", int(req.now.as_ms())),
            ],
        ),
        Write::Await(req) => (
            AWAIT,
            vec![
                (":owner", text(req.owner)),
                (":payment", text(req.awaited)),
                (":wait_until", int(req.wait_until.as_secs())),
                (":expires", int(req.expires.as_secs())),
            ],
        ),
        Write::Correct(req) => (CORRECT, vec![(":fingerprint", text(req.fingerprint))]),
        Write::Adopt(req) => (
            ADOPT,
            vec![
                (":receipt", text(req.receipt)),
                (":fingerprint", text(req.fingerprint)),
                (":now_ms", int(req.now.as_ms())),
                (":expires", int(req.expires.as_secs())),
            ],
        ),
        Write::Settle(req) => match &req.settled {
            Settled::Done {
                expires,
                done_fingerprint,
            } => (
                SETTLE_PAID,
                vec![
                    (":payment", text(req.awaited)),
                    (":expires", int(expires.as_secs())),
                    (
                        ":done_fingerprint",
                        done_fingerprint
                            .as_ref()
                            .map_or(rusqlite::types::Value::Null, |f| text(f)),
                    ),
                ],
            ),
            Settled::Ended => (SETTLE_ENDED, vec![(":payment", text(req.awaited))]),
            Settled::Ending { at } => (
                SETTLE_ENDING,
                vec![(":payment", text(req.awaited)), (":at", int(at.as_secs()))],
            ),
        },
    }
}

/// The statement of a release: what it does to the key and the decline count.
fn release_sql(kind: ReleaseKind) -> &'static str {
    match kind {
        ReleaseKind::KeepKey => RELEASE,
        ReleaseKind::Uncertain => RELEASE_UNCERTAIN,
        ReleaseKind::Refused => RELEASE_DECLINED,
        ReleaseKind::NextKey {
            reset_refusals: false,
        } => RELEASE_NEXT,
        ReleaseKind::NextKey {
            reset_refusals: true,
        } => RELEASE_NEXT_RESET,
    }
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn write(&self, write: &Write<'_>) -> Result<WriteOutcome, StoreError> {
        let (sql, params) = statement(write);
        self.conditional(write.operation(), write.pk(), sql, params)
            .await
    }

    async fn get(&self, pk: &Key) -> Result<Option<Record>, StoreError> {
        let pk_text = pk.to_string();
        self.conn
            .call(move |conn| {
                conn.query_row(GET, named_params! {":pk": pk_text}, row_to_record)
                    .optional()
            })
            .await
            .map_err(|e| store_error("get", pk.as_str(), e))
    }

    async fn awaiting(
        &self,
        after: Option<&AwaitingCursor>,
        until: Time,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after_until = after.map(|a| a.wait_until.as_secs());
        let after_pk = after.map(|a| a.pk.to_string());
        self.conn
            .call(move |conn| {
                let mut stmt = conn.prepare(AWAITING)?;
                let params = named_params! {
                    ":awaiting": schema::state::AWAITING,
                    ":until": until.as_secs(),
                    ":after_until": after_until,
                    ":after_pk": after_pk,
                    ":limit": limit,
                };
                let rows = stmt.query_map(params, row_to_record)?;
                rows.collect()
            })
            .await
            .map_err(|e| store_error("query", "idempotency", e))
    }

    async fn settle_cursor(&self) -> Result<Option<AwaitingCursor>, StoreError> {
        let row: Option<(i64, String)> = self
            .conn
            .call(move |conn| {
                let mut stmt = conn.prepare(CURSOR_GET)?;
                let mut rows = stmt.query(named_params! { ":name": schema::SETTLE_CURSOR_PK })?;
                match rows.next()? {
                    Some(row) => Ok(Some((row.get(0)?, row.get(1)?))),
                    None => Ok(None),
                }
            })
            .await
            .map_err(|e| store_error("get", schema::SETTLE_CURSOR_PK, e))?;
        Ok(row.and_then(|(secs, pk)| {
            Some(AwaitingCursor {
                wait_until: Time::from_secs(secs),
                pk: Key::from_stored(&pk)?,
            })
        }))
    }

    async fn save_settle_cursor(&self, cursor: Option<&AwaitingCursor>) -> Result<(), StoreError> {
        let cursor = cursor.map(|c| (c.wait_until.as_secs(), c.pk.to_string()));
        self.conn
            .call(move |conn| {
                match cursor {
                    Some((until, pk)) => conn.execute(
                        CURSOR_SET,
                        named_params! {
                            ":name": schema::SETTLE_CURSOR_PK, ":until": until, ":pk": pk,
                        },
                    )?,
                    None => conn.execute(
                        CURSOR_CLEAR,
                        named_params! { ":name": schema::SETTLE_CURSOR_PK },
                    )?,
                };
                Ok(())
            })
            .await
            .map_err(|e| store_error("update", schema::SETTLE_CURSOR_PK, e))
    }
}

#[cfg(test)]
mod tests;
