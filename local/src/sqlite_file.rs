//! One SQLite file shared by the local store and the simulator's ledger: opened once
//! (WAL, and a busy timeout so two connections wait for each other instead of
//! failing), one connection used from async code on the blocking pool.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

/// Whether opening may create the file. Only the commands that write a local run's
/// records (`invoke`, `make run`) create it; the others read what is there, and a
/// mistyped path must be an error, not a new empty database that reads as "clean".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the file (and its directory) when missing, and its table.
    Create,
    /// The file must exist and hold the table; nothing is created.
    Existing,
}

/// The file could not be opened or given its table.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: no such file (nothing was created; check the path)")]
    Missing { path: String },
    #[error("{path}: holds no `{table}` table (not a charge-once database, or nothing ran on it)")]
    NoTable { path: String, table: &'static str },
    #[error("{path}: creating its directory")]
    Dir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: opening the database")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: creating table {table}")]
    Schema {
        path: String,
        table: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

/// What opening `path` needs first: its directory made ([`OpenMode::Create`]), or the
/// file there already ([`OpenMode::Existing`]: nothing is created).
fn prepare(path: &Path, mode: OpenMode) -> Result<(), OpenError> {
    let shown = || path.display().to_string();
    match mode {
        OpenMode::Create => match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => std::fs::create_dir_all(dir).map_err(|source| OpenError::Dir {
                path: shown(),
                source,
            }),
            None => Ok(()),
        },
        OpenMode::Existing if !path.is_file() => Err(OpenError::Missing { path: shown() }),
        OpenMode::Existing => Ok(()),
    }
}

/// Why a call on a [`SharedConnection`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("SQLite")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the blocking task failed")]
    Join(#[from] tokio::task::JoinError),
}

/// One SQLite connection shared by async callers (the store and the simulator):
/// every use holds the lock on the blocking pool, never on the async runtime.
#[derive(Clone)]
pub struct SharedConnection(Arc<Mutex<Connection>>);

impl SharedConnection {
    /// Opens the file at `path` and, with [`OpenMode::Create`], creates it and runs
    /// `schema` (idempotent DDL for `table`) on it. With [`OpenMode::Existing`] the file
    /// must exist and hold `table`.
    pub fn open(
        path: &Path,
        schema: &str,
        table: &'static str,
        mode: OpenMode,
    ) -> Result<Self, OpenError> {
        let shown = || path.display().to_string();
        prepare(path, mode)?;
        // Without SQLITE_OPEN_CREATE, SQLite itself refuses a file that vanished since.
        let flags = match mode {
            OpenMode::Create => rusqlite::OpenFlags::default(),
            OpenMode::Existing => {
                rusqlite::OpenFlags::default() - rusqlite::OpenFlags::SQLITE_OPEN_CREATE
            }
        };
        let conn = Connection::open_with_flags(path, flags)
            .and_then(|conn| {
                conn.busy_timeout(std::time::Duration::from_secs(5))?;
                // WAL is a property of the file, set once by the command that creates it.
                if mode == OpenMode::Create {
                    conn.pragma_update(None, "journal_mode", "WAL")?;
                }
                Ok(conn)
            })
            .map_err(|source| OpenError::Open {
                path: shown(),
                source,
            })?;
        let schema_error = |source| OpenError::Schema {
            path: shown(),
            table,
            source,
        };
        let has_table = match mode {
            OpenMode::Create => conn.execute_batch(schema).map(|()| true),
            OpenMode::Existing => conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
                [table],
                |row| row.get(0),
            ),
        };
        if !has_table.map_err(schema_error)? {
            return Err(OpenError::NoTable {
                path: shown(),
                table,
            });
        }
        Ok(Self(Arc::new(Mutex::new(conn))))
    }

    /// Runs `f` with the connection on the blocking pool.
    pub async fn call<T, F>(&self, f: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.0);
        Ok(tokio::task::spawn_blocking(move || f(&mut lock(&conn))).await??)
    }

    /// Runs `f` with the connection on this thread (for synchronous callers).
    pub fn call_here<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        f(&mut lock(&self.0))
    }
}

fn lock(conn: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    // A panic while holding the lock leaves no half-done write: every use is one
    // transaction, rolled back when its guard dropped.
    conn.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
