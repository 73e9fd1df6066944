//! The local binary as a newcomer runs it: `invoke` on the SQLite file and the
//! simulator, twice (`make run`); `inspect`; the crash-after-charge customer; the
//! decline limit and `resolve --retry-declined`; the audit of what `make run` left; and
//! the refusals that keep the simulator away from real parts (never inside Lambda,
//! never beside the production settings) and the read-only commands from creating
//! files.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once-local");

/// The checkout's root, where `make run` runs (the `events/` files are there).
fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The local binary outside Lambda with none of the production settings: the command
/// as given, on `db`.
fn bare(db: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .arg("--db")
        .arg(db)
        .current_dir(root())
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .env_remove("IDEMPOTENCY_TABLE")
        .env_remove("PAYMENT_API_URL");
    command
}

/// A local run, as `make run` makes it.
fn charge_once(db: &Path, args: &[&str]) -> Output {
    bare(db, args).output().expect("run charge-once-local")
}

/// Asserts a refusal: exit 2, nothing on stdout, one line on stderr holding `says`.
fn assert_refused(out: &Output, says: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
    assert!(out.stdout.is_empty(), "{what}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    assert!(stderr.contains(says), "{what}: {stderr}");
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
    let text = std::fs::read_to_string(root().join(event)).unwrap();
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
        .prepare("SELECT order_id, SUM(charged) FROM calls GROUP BY order_id HAVING SUM(charged) > 0 ORDER BY order_id")
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
    // The invalid body and the declined card; the order whose card needs
    // authentication is acknowledged and awaits its customer.
    let invalid = message_ids("events/sqs-batch.json", &[5, 6]);

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
        (summary["audit"].as_str(), summary["payments"].as_u64()),
        // Three succeeded, two declined (cancelled) and one awaiting authentication.
        (Some("clean"), Some(6))
    );
}

#[test]
fn make_run_shows_charged_declined_and_authentication_required() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.sqlite3");
    let out = charge_once(&db, &["invoke", "events/sqs-batch.json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let outcome = |id: &str| {
        stderr
            .lines()
            .find(|l| l.contains(&format!("cobro#{id}\"")) && l.contains("outcome="))
            .unwrap_or_else(|| panic!("no line for {id}:\n{stderr}"))
            .to_owned()
    };
    assert!(outcome("ord-3001").contains("outcome=\"charged\""));
    assert!(outcome("ord-3005").contains("outcome=\"declined\""));
    let strong = outcome("ord-3006");
    assert!(
        strong.contains("outcome=\"authentication_required\""),
        "{strong}"
    );
    // The line names the payment the customer must confirm.
    assert!(strong.contains("payment=\"pi_sim_"), "{strong}");
    // The declined payment was cancelled before the next attempt may make another.
    let shown: Value =
        serde_json::from_slice(&charge_once(&db, &["inspect", "ord-3005"]).stdout).unwrap();
    let statuses: Vec<String> = shown["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["declined", "canceled"]);
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
    assert_eq!(shown["record"]["recibo"], ledger[0]["payment_id"]);
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
            "SELECT COUNT(*) FROM calls WHERE order_id = 'ord-5001' AND idempotency_key <> ''",
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
        "--payment-method",
        "pm_card_chargeDeclined",
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
    let db = dir.path().join("run.sqlite3");
    invoke(&db, "events/sqs-single.json");
    let out = charge_once(&db, &["inspect", "ord-none"]);
    assert!(out.status.success());
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["record"].is_null());
    assert_eq!(shown["ledger"], Value::Array(vec![]));
}

const RESOLVE: [&str; 10] = [
    "resolve",
    "ord-1001",
    "--amount",
    "5000",
    "--currency",
    "EUR",
    "--customer",
    "cus_123",
    "--payment-method",
    "pm_card_visa",
];

#[test]
fn the_simulator_never_runs_inside_lambda_nor_beside_the_production_settings() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.sqlite3");
    invoke(&db, "events/sqs-single.json");
    let before = std::fs::read(&db).unwrap();
    let never = dir.path().join("never.sqlite3");
    let commands = [
        &["invoke", "events/sqs-single.json"][..],
        &RESOLVE[..],
        &["inspect", "ord-1001"][..],
        &["audit"][..],
    ];
    // (environment, the refusal's words)
    let refusals = [
        (
            ("AWS_LAMBDA_FUNCTION_NAME", "charge-once"),
            "cannot run inside Lambda",
        ),
        (
            ("IDEMPOTENCY_TABLE", "orders-idempotency"),
            "never meets a DynamoDB table",
        ),
        (
            ("PAYMENT_API_URL", "https://api.stripe.com"),
            "always uses the simulator",
        ),
    ];
    for file in [&db, &never] {
        for args in commands {
            for ((name, value), words) in refusals {
                let out = bare(file, args).env(name, value).output().unwrap();
                assert_refused(&out, words, &format!("{args:?} {name}"));
            }
        }
    }
    assert_eq!(std::fs::read(&db).unwrap(), before, "nothing written");
    assert!(!never.exists(), "nothing was created");
}

#[test]
fn read_only_commands_refuse_a_missing_db_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for db in [
        dir.path().join("mistyped.sqlite3"),
        dir.path().join("no-such-dir").join("x.sqlite3"),
    ] {
        for args in [&["audit"][..], &["inspect", "ord-1001"][..], &RESOLVE[..]] {
            let out = charge_once(&db, args);
            let what = format!("{args:?} {}", db.display());
            assert_refused(&out, "no such file", &what);
            assert!(
                !String::from_utf8_lossy(&out.stderr).contains("\"clean\""),
                "{what}"
            );
        }
        assert!(!db.exists(), "{} was created", db.display());
    }
    assert!(
        !dir.path().join("no-such-dir").exists(),
        "a directory was created"
    );
}

#[test]
fn a_file_without_the_simulators_ledger_is_refused_by_every_read_only_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("records-only.sqlite3");
    // Records, but no ledger: not a file `invoke` made, so the simulator charged none
    // of its orders and its "not found" would say nothing about them.
    charge_once_local::sqlite::SqliteStore::open(&db).unwrap();
    for args in [&["audit"][..], &["inspect", "ord-1001"][..], &RESOLVE[..]] {
        let out = charge_once(&db, args);
        assert_refused(&out, "holds no simulator ledger", &format!("{args:?}"));
    }
}

#[test]
fn the_simulator_refuses_what_stripe_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("refused.sqlite3");
    let event = dir.path().join("event.json");
    let bodies = [
        r#"{"id":"ord-zzz","amount":4200,"currency":"ZZZ","customer":"cus_123","payment_method":"pm_card_visa"}"#,
        r#"{"id":"ord-cent","amount":1,"currency":"EUR","customer":"cus_123","payment_method":"pm_card_visa"}"#,
        r#"{"id":"ord-kind","amount":4200,"currency":"EUR","customer":"pm_card_visa","payment_method":"pm_card_visa"}"#,
    ];
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(n, body)| {
            serde_json::json!({
                "messageId": format!("m-{n}"), "receiptHandle": "h", "body": body,
                "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1"},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
            })
        })
        .collect();
    std::fs::write(
        &event,
        serde_json::json!({ "Records": records }).to_string(),
    )
    .unwrap();
    let out = charge_once(&db, &["invoke", event.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(harness::failed_ids(&out.stdout), ["m-0", "m-1", "m-2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for code in [
        "charge_invalid_parameter",
        "amount_too_small",
        "resource_missing",
    ] {
        assert!(stderr.contains(code), "{code}: {stderr}");
    }
    assert!(charges(&db).is_empty(), "nothing charged");
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

/// What README's "Try it" says of the first two `make run`s: the outcome counts of
/// its table (outcome → first run, second run) and the partial batch response it shows.
fn readme_says(readme: &str) -> (Vec<(String, u32, u32)>, Value) {
    let section = readme
        .split("## Try it")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has a Try it section");
    let counts = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let outcome = cells.first()?.strip_suffix('`')?;
            Some((
                outcome.to_owned(),
                cells.get(1)?.parse().ok()?,
                cells.get(2)?.parse().ok()?,
            ))
        })
        .collect();
    let response = section
        .split("```json\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("README shows the response");
    (counts, serde_json::from_str(response).unwrap())
}

/// How many records of each outcome a run's log lines name, and its stdout.
fn run_shows(db: &Path) -> (BTreeMap<String, u32>, Value) {
    let out = charge_once(db, &["invoke", "events/sqs-batch.json"]);
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        if let Some(rest) = line.split("outcome=\"").nth(1) {
            let outcome = rest.split('"').next().unwrap().to_owned();
            *counts.entry(outcome).or_insert(0) += 1;
        }
    }
    (counts, serde_json::from_slice(&out.stdout).unwrap())
}

/// Where README and the runs disagree, one line each (empty: they agree).
fn disagreements(readme: &str, runs: [&(BTreeMap<String, u32>, Value); 2]) -> Vec<String> {
    let (counts, response) = readme_says(readme);
    let mut found = Vec::new();
    for (run, shown) in runs.iter().enumerate() {
        let said: BTreeMap<String, u32> = counts
            .iter()
            .map(|(o, first, second)| (o.clone(), if run == 0 { *first } else { *second }))
            .filter(|(_, n)| *n > 0)
            .collect();
        if said != shown.0 {
            found.push(format!(
                "run {}: README says {said:?}, it logs {:?}",
                run + 1,
                shown.0
            ));
        }
        if shown.1 != response {
            found.push(format!(
                "run {}: README shows {response}, it prints {}",
                run + 1,
                shown.1
            ));
        }
    }
    let records = event_records("events/sqs-batch.json");
    let first: u32 = counts.iter().map(|(_, n, _)| n).sum();
    if usize::try_from(first).unwrap() != records {
        found.push(format!(
            "README counts {first} records, the event has {records}"
        ));
    }
    found
}

fn event_records(event: &str) -> usize {
    let text = std::fs::read_to_string(root().join(event)).unwrap();
    let event: Value = serde_json::from_str(&text).unwrap();
    event["Records"].as_array().unwrap().len()
}

#[test]
fn make_run_prints_and_logs_what_the_readme_says_and_a_readme_that_drifted_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("readme.sqlite3");
    let first = run_shows(&db);
    let second = run_shows(&db);
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let found = disagreements(&readme, [&first, &second]);
    assert!(
        found.is_empty(),
        "README's Try it drifted:\n{}",
        found.join("\n")
    );
    // A README that still told of one failure and three charges on the second run.
    let drifted = readme
        .replace("| `charged` | 3 | 0 |", "| `charged` | 3 | 3 |")
        .replace(
            r#",{"itemIdentifier":"00000010-1100-0000-0000-000000001011"}"#,
            "",
        );
    let found = disagreements(&drifted, [&first, &second]);
    assert_eq!(found.len(), 3, "{found:#?}");
}
