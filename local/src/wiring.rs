//! What a local command may open, and the refusals that keep a local run local: the
//! simulator never runs inside Lambda, never beside the production settings (a table
//! name or a provider URL in the shell means the operator wanted `charge-once`), and a
//! read-only command never creates a database. Then the SQLite store and the
//! simulator's ledger in the `--db` file, opened once per command.

use std::path::Path;

use charge_once::contracts::store::StoreError;

use crate::simulated::SimulatedProvider;
use crate::sqlite::SqliteStore;
use crate::sqlite_file::{OpenError, OpenMode};

/// Why a local command will not start. Each says what to set instead. The binary
/// exits 2 on these (nothing was done).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "charge-once-local cannot run inside Lambda (AWS_LAMBDA_FUNCTION_NAME or \
         AWS_LAMBDA_RUNTIME_API is set): the function is charge-once, on the real provider"
    )]
    InLambda,
    #[error(
        "IDEMPOTENCY_TABLE is set, but the simulator never meets a DynamoDB table (local \
         records live in --db): unset it for a local run, or use charge-once on the table"
    )]
    TableSet,
    #[error(
        "PAYMENT_API_URL is set, but charge-once-local always uses the simulator: unset it \
         for a local run, or use charge-once for the real provider"
    )]
    ProviderUrlSet,
    #[error(
        "--db {path}: no such file; nothing was created (only invoke creates a local database)"
    )]
    NoDatabase { path: String },
    #[error(
        "--db {path}: holds no simulator ledger, so the simulator charged no order of this \
         file: it is not a database charge-once-local invoke made"
    )]
    NoLedger { path: String },
}

/// A local part could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("--db {path}: opening the SQLite store")]
    Store {
        path: String,
        #[source]
        source: StoreError,
    },
    #[error("--db {path}: opening the simulator's ledger")]
    Simulator {
        path: String,
        #[source]
        source: Box<OpenError>,
    },
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// Where a local command runs (pure): refused inside Lambda, and beside either of the
/// production settings. Nothing here falls back: an order the simulator "charges" or
/// "cannot find" was never at the real provider, so it must never stand in for it.
pub fn check_environment(in_lambda: bool, table_set: bool, url_set: bool) -> Result<(), Refusal> {
    if in_lambda {
        Err(Refusal::InLambda)
    } else if table_set {
        Err(Refusal::TableSet)
    } else if url_set {
        Err(Refusal::ProviderUrlSet)
    } else {
        Ok(())
    }
}

/// Inside a Lambda execution environment (a function's own shell, a Lambda-hosted
/// job): the simulator must never run there.
pub fn in_lambda() -> bool {
    ["AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_RUNTIME_API"]
        .iter()
        .any(|var| std::env::var_os(var).is_some())
}

/// A read-only command's `--db` must exist: a mistyped path is refused, never created.
pub fn existing_db(path: &Path) -> Result<(), Refusal> {
    if path.is_file() {
        Ok(())
    } else {
        Err(Refusal::NoDatabase {
            path: path.display().to_string(),
        })
    }
}

/// The SQLite store in `db`; with [`OpenMode::Existing`] the file must exist.
pub fn store(db: &Path, mode: OpenMode) -> Result<SqliteStore, LocalError> {
    if mode == OpenMode::Existing {
        existing_db(db)?;
    }
    SqliteStore::open_in(db, mode).map_err(|source| LocalError::Store {
        path: db.display().to_string(),
        source,
    })
}

/// The simulator's ledger in `db`; with [`OpenMode::Existing`] the file must exist and
/// hold it.
pub fn simulator(db: &Path, mode: OpenMode) -> Result<SimulatedProvider, LocalError> {
    if mode == OpenMode::Existing {
        existing_db(db)?;
    }
    let path = db.display().to_string();
    SimulatedProvider::open_in(db, mode).map_err(|source| match source {
        OpenError::NoTable { .. } => Refusal::NoLedger { path }.into(),
        source => LocalError::Simulator {
            path,
            source: Box::new(source),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_run_is_refused_inside_lambda_and_beside_the_production_settings() {
        assert_eq!(check_environment(false, false, false), Ok(()));
        assert_eq!(
            check_environment(true, false, false),
            Err(Refusal::InLambda)
        );
        assert_eq!(
            check_environment(false, true, false),
            Err(Refusal::TableSet)
        );
        assert_eq!(
            check_environment(false, false, true),
            Err(Refusal::ProviderUrlSet)
        );
        // Lambda comes first: there, nothing local may run at all.
        assert_eq!(check_environment(true, true, true), Err(Refusal::InLambda));
    }

    #[test]
    fn a_refusal_is_one_line_that_says_what_to_set() {
        for refusal in [
            Refusal::InLambda,
            Refusal::TableSet,
            Refusal::ProviderUrlSet,
            Refusal::NoDatabase { path: "x".into() },
            Refusal::NoLedger { path: "x".into() },
        ] {
            let text = refusal.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(
                ["charge-once", "--db"].iter().any(|s| text.contains(s)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_missing_db_is_refused_and_not_created_by_a_read_only_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.sqlite3");
        assert!(matches!(
            simulator(&path, OpenMode::Existing),
            Err(LocalError::Refused(Refusal::NoDatabase { .. }))
        ));
        assert!(matches!(
            store(&path, OpenMode::Existing),
            Err(LocalError::Refused(Refusal::NoDatabase { .. }))
        ));
        assert!(!path.parent().unwrap().exists());
    }
}
