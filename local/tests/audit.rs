//! `charge-once-local audit` on SQLite and the simulator: the audit's scenario of
//! `harness::audit` (the same as on moto and localstripe, `tests/audit.rs`). A clean
//! run audits clean; each tampered order is then named, one way at a time; a declined
//! order left `libre`, its payment cancelled, is never a finding.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use async_trait::async_trait;
use charge_once::contracts::payment::PaymentProvider;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::Key;
use charge_once_local::simulated::SimulatedProvider;
use charge_once_local::sqlite::SqliteStore;
use harness::audit::{AuditPair, clean_then_tampered_one_way_at_a_time};

const BIN: &str = env!("CARGO_BIN_EXE_charge-once-local");

/// The SQLite file `db` and the simulator's ledger in it, through the local binary.
struct Local {
    db: PathBuf,
}

impl Local {
    fn connection(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.db).unwrap()
    }
}

#[async_trait]
impl AuditPair for Local {
    fn command(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .arg("--db")
            .arg(&self.db)
            .current_dir(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")))
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("AWS_LAMBDA_FUNCTION_NAME")
            .env_remove("IDEMPOTENCY_TABLE")
            .env_remove("PAYMENT_API_URL")
            .output()
            .expect("run charge-once-local")
    }

    fn store(&self) -> Arc<dyn IdempotencyStore> {
        Arc::new(SqliteStore::open(&self.db).unwrap())
    }

    fn provider(&self) -> Box<dyn PaymentProvider> {
        Box::new(SimulatedProvider::open(&self.db).unwrap())
    }

    async fn delete(&self, key: &Key) {
        let deleted = self
            .connection()
            .execute("DELETE FROM idempotency WHERE pk = ?1", [key.as_str()])
            .unwrap();
        assert_eq!(deleted, 1);
    }

    async fn overwrite(&self, key: &Key, attribute: &str, value: &str) {
        // The column is the attribute's name (schema.rs); not user input.
        let sql = format!("UPDATE idempotency SET {attribute} = ?1 WHERE pk = ?2");
        assert_eq!(
            self.connection()
                .execute(&sql, [value, key.as_str()])
                .unwrap(),
            1
        );
    }
}

#[tokio::test]
async fn sqlite_and_the_simulator_audit_clean_then_name_each_tampered_order() {
    let dir = tempfile::tempdir().unwrap();
    let pair = Local {
        db: dir.path().join("audit.sqlite3"),
    };
    clean_then_tampered_one_way_at_a_time(
        &pair,
        ("cus_audit", "pm_card_visa"),
        ("cus_audit", "pm_card_chargeDeclined"),
    )
    .await;
}
