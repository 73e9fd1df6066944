//! The binary outside Lambda, as a newcomer runs it: `invoke` on the SQLite store and
//! the simulator, twice; `inspect`; the crash-after-charge customer; bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");

fn charge_once(db: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--db")
        .arg(db)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // Outside Lambda, with the simulator: no provider URL, no runtime API.
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("PAYMENT_API_URL")
        .output()
        .expect("run charge-once")
}

/// Runs `invoke` and returns the failed message ids from stdout, which must hold
/// nothing but the SQSBatchResponse JSON.
fn invoke(db: &Path, event: &str) -> Vec<String> {
    let out = charge_once(db, &["invoke", event]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    harness::failed_ids(&out.stdout)
}

fn message_ids(event: &str, positions: &[usize]) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(event)).unwrap();
    let event: Value = serde_json::from_str(&text).unwrap();
    positions
        .iter()
        .map(|&i| {
            event["Records"][i]["messageId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// Charges that took money, per order id, from the simulator's ledger.
fn charges(db: &Path) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT order_id, SUM(charged) FROM charges GROUP BY order_id HAVING SUM(charged) > 0 ORDER BY order_id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn make_run_charges_three_orders_once_and_a_second_run_charges_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.sqlite3");
    let invalid = message_ids("events/sqs-batch.json", &[5]);

    assert_eq!(invoke(&db, "events/sqs-batch.json"), invalid);
    let after_first = charges(&db);
    assert_eq!(
        after_first,
        [
            ("ord-3001".to_owned(), 1),
            ("ord-3002".to_owned(), 1),
            ("ord-3003".to_owned(), 1)
        ]
    );

    assert_eq!(
        invoke(&db, "events/sqs-batch.json"),
        invalid,
        "the same failures"
    );
    assert_eq!(charges(&db), after_first, "nothing new charged");

    // What make run left audits clean: every charge recorded, every record charged.
    let audit = charge_once(&db, &["audit"]);
    assert_eq!(
        audit.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    assert!(audit.stdout.is_empty(), "no finding");
    let summary: Value = serde_json::from_str(
        String::from_utf8_lossy(&audit.stderr)
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (summary["audit"].as_str(), summary["charges"].as_u64()),
        (Some("clean"), Some(3))
    );
}

#[test]
fn timeout_after_charge_fails_first_then_succeeds_with_one_charge_in_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("timeout.sqlite3");
    let event = "events/sqs-timeout-after-charge.json";
    assert_eq!(invoke(&db, event), message_ids(event, &[0]));
    assert_eq!(invoke(&db, event), Vec::<String>::new());
    assert_eq!(charges(&db), [("ord-5101".to_owned(), 1)]);

    let out = charge_once(&db, &["inspect", "ord-5101"]);
    assert!(out.status.success());
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["record"]["estado"], "hecho");
    let ledger = shown["ledger"].as_array().unwrap();
    let statuses: Vec<&str> = ledger
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["succeeded_response_lost", "replayed"]);
    assert_eq!(
        ledger[0]["idempotency_key"], ledger[1]["idempotency_key"],
        "the retry replayed the key"
    );
    assert_eq!(shown["record"]["recibo"], ledger[0]["charge_id"]);
}

#[test]
fn declined_customer_fails_and_moves_to_the_next_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("declined.sqlite3");
    let event = "events/sqs-declined.json";
    assert_eq!(invoke(&db, event), message_ids(event, &[0]));
    let out = charge_once(&db, &["inspect", "ord-5001"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["record"]["estado"], "libre");
    assert_eq!(shown["record"]["intento"], 2);
    assert!(charges(&db).is_empty());
}

#[test]
fn declines_stop_at_the_limit_until_resolve_retry_declined_resets_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("declined.sqlite3");
    let event = "events/sqs-declined.json";
    let provider_calls = || {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row(
            "SELECT COUNT(*) FROM charges WHERE order_id = 'ord-5001'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    };
    for _ in 0..4 {
        assert_eq!(invoke(&db, event), message_ids(event, &[0]));
    }
    assert_eq!(
        provider_calls(),
        3,
        "MAX_DECLINES (3): the fourth delivery calls nothing"
    );
    let out = charge_once(&db, &["inspect", "ord-5001"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["record"]["rechazos"], 3);

    let resolve = [
        "resolve",
        "ord-5001",
        "--amount",
        "2500",
        "--currency",
        "EUR",
        "--customer",
        "cus_declined",
        "--retry-declined",
    ];
    let out = charge_once(&db, &resolve);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resolved["resolution"], "released");
    let out = charge_once(&db, &["inspect", "ord-5001"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["record"]["rechazos"].is_null(), "{shown}");
    // The card is tried again (the simulator still declines this customer).
    assert_eq!(invoke(&db, event), message_ids(event, &[0]));
    assert_eq!(provider_calls(), 4);
}

#[test]
fn inspect_of_an_unknown_order_prints_a_null_record() {
    let dir = tempfile::tempdir().unwrap();
    let out = charge_once(&dir.path().join("empty.sqlite3"), &["inspect", "ord-none"]);
    assert!(out.status.success());
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["record"].is_null());
    assert_eq!(shown["ledger"], Value::Array(vec![]));
}

#[test]
fn a_bad_setting_stops_the_start_with_one_line_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["invoke", "events/sqs-single.json", "--db"])
        .arg(dir.path().join("x.sqlite3"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env("MAX_CONCURRENCY", "zero")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("MAX_CONCURRENCY=\\\"zero\\\" is invalid"),
        "{stderr}"
    );
}

/// Settings that would reopen double charging stop `invoke` and `resolve` before any
/// record is touched, with one line naming the variable.
#[test]
fn settings_that_reopen_double_charging_stop_invoke_and_resolve() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    let commands: [&[&str]; 2] = [
        &["invoke", "events/sqs-single.json"],
        &[
            "resolve",
            "ord-1001",
            "--amount",
            "5000",
            "--currency",
            "EUR",
            "--customer",
            "cus_123",
        ],
    ];
    for (var, value) in [("IDEMPOTENCY_RETENTION", "1d"), ("PROVIDER_KEY_TTL", "48h")] {
        for args in commands {
            let out = Command::new(BIN)
                .args(args)
                .arg("--db")
                .arg(&db)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env_remove("AWS_LAMBDA_RUNTIME_API")
                .env_remove("PAYMENT_API_URL")
                .env(var, value)
                .output()
                .unwrap();
            let stderr = String::from_utf8(out.stderr).unwrap();
            assert_eq!(
                out.status.code(),
                Some(1),
                "{var}={value} {args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{var}={value} {args:?}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains(&format!("{var}=")), "{stderr}");
        }
    }
    assert!(!db.exists(), "nothing was opened, let alone charged");
}

#[test]
fn a_file_that_is_not_an_sqs_event_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = charge_once(&dir.path().join("x.sqlite3"), &["invoke", "Cargo.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("Cargo.toml is not an SQS event"),
        "{stderr}"
    );
}
