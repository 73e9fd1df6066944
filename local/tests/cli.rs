//! The local binary as a newcomer runs it: `invoke` on the SQLite file and the
//! simulator, twice (`make run`); `refund` before and after it (`make refund`);
//! `inspect`; the crash-after-charge customer; the
//! decline limit and `resolve --retry-declined`; the order that awaits its customer,
//! `confirm` (the customer, then Stripe's event) and `settle` (the settler, on a moved
//! clock); the audit of what `make run` left; and the refusals that keep the simulator
//! away from real parts (never inside Lambda, never beside the production settings)
//! and the read-only commands from creating files.

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
    // The invalid body and the declined card; the card that needs authentication is
    // acknowledged (its order awaits the customer).
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

/// Runs `refund` on `event` and returns the failed message ids and the log.
fn refund(db: &Path, event: &str) -> (Vec<String>, String) {
    let out = charge_once(db, &["refund", event]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (harness::failed_ids(&out.stdout), stderr)
}

/// The simulator's refunds of `order`: (refund request id, amount).
fn refunds_of(db: &Path, order: &str) -> Vec<(String, i64)> {
    let shown: Value =
        serde_json::from_slice(&charge_once(db, &["inspect", order]).stdout).unwrap();
    shown["refunds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[1].as_str().unwrap().to_owned(), r[2].as_i64().unwrap()))
        .collect()
}

#[test]
fn make_refund_waits_for_the_charges_then_refunds_each_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.sqlite3");
    let event = "events/sqs-refunds.json";
    // Before any order: every refund waits, nothing is refunded.
    let (failed, log) = refund(&db, event);
    assert_eq!(failed, message_ids(event, &[0, 1, 2, 3, 4]), "{log}");
    assert!(log.contains("is not charged yet"), "{log}");
    assert!(refunds_of(&db, "ord-3001").is_empty());

    invoke(&db, "events/sqs-batch.json");
    // ref-3001 (and its SNS copy) refunds 500 of ord-3001; ref-3002 the whole of
    // ord-3002, so ref-3003 asks for more than remains and is refused; ref-3006 waits
    // for its customer's authentication.
    let (failed, log) = refund(&db, event);
    assert_eq!(failed, message_ids(event, &[3, 4]), "{log}");
    assert!(log.contains("charge_already_refunded"), "{log}");
    let refunded = (refunds_of(&db, "ord-3001"), refunds_of(&db, "ord-3002"));
    assert_eq!(
        refunded,
        (
            vec![("ref-3001".to_owned(), 500)],
            vec![("ref-3002".to_owned(), 4500)]
        )
    );

    let (failed_again, log) = refund(&db, event);
    assert_eq!(failed_again, failed, "the same failures: {log}");
    assert_eq!(
        (refunds_of(&db, "ord-3001"), refunds_of(&db, "ord-3002")),
        refunded,
        "nothing refunded twice"
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
fn inspect_of_an_unknown_order_prints_a_null_record_says_so_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.sqlite3");
    invoke(&db, "events/sqs-single.json");
    let out = charge_once(&db, &["inspect", "ord-none"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "no record of order ord-none in the table"
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(shown["record"].is_null());
    assert_eq!(shown["ledger"], Value::Array(vec![]));
}

/// The commands that never create the `--db` file.
const READ_ONLY: [&[&str]; 5] = [
    &["audit"],
    &["inspect", "ord-1001"],
    &RESOLVE,
    &["confirm", "ord-1001"],
    &["settle"],
];

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
        &["confirm", "ord-1001"][..],
        &["settle"][..],
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
        for args in READ_ONLY {
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
    for args in READ_ONLY {
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
    // A README that still told of three charges on the second run, and of the order
    // that awaits its customer as a failure.
    let drifted = readme
        .replace("| `charged` | 3 | 0 |", "| `charged` | 3 | 3 |")
        .replace(
            r#"{"itemIdentifier":"00000010-1000-0000-0000-000000001010"}]}"#,
            r#"{"itemIdentifier":"00000010-1000-0000-0000-000000001010"},{"itemIdentifier":"00000010-1100-0000-0000-000000001011"}]}"#,
        );
    let found = disagreements(&drifted, [&first, &second]);
    assert_eq!(found.len(), 3, "{found:#?}");
}

/// A command that must exit 0: its stdout, one JSON value.
fn printed(db: &Path, args: &[&str]) -> Value {
    let out = charge_once(db, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `inspect`'s record of `order`.
fn record_of(db: &Path, order: &str) -> Value {
    printed(db, &["inspect", order])["record"].clone()
}

/// `inspect`'s ledger statuses of `order`, oldest first.
fn ledger_of(db: &Path, order: &str) -> Vec<String> {
    printed(db, &["inspect", order])["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["status"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn an_order_that_awaits_its_customer_is_acknowledged_then_done_once_they_confirm_and_stripes_event_arrives()
 {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("awaiting.sqlite3");
    invoke(&db, "events/sqs-batch.json");
    let waiting = record_of(&db, "ord-3006");
    assert_eq!(waiting["estado"], "espera", "{waiting}");
    let payment = waiting["pago"].as_str().unwrap().to_owned();
    assert!(payment.starts_with("pi_sim_"), "{waiting}");
    // The wait ends AUTHENTICATION_WAIT (7 days by default) after the attempt began.
    let wait =
        waiting["espera_hasta"].as_i64().unwrap() - waiting["creado"].as_i64().unwrap() / 1000;
    assert!((wait - 7 * 24 * 3600).abs() <= 1, "{waiting}");

    // Its second delivery is acknowledged and calls nothing.
    invoke(&db, "events/sqs-batch.json");
    assert_eq!(ledger_of(&db, "ord-3006"), ["authentication_required"]);
    assert_eq!(record_of(&db, "ord-3006"), waiting);

    let out = charge_once(&db, &["confirm", "ord-3006"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let confirmed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(confirmed["outcome"], "reconciled", "{confirmed}");
    assert_eq!(confirmed["event"], "payment_intent.succeeded");
    assert_eq!(confirmed["payment_id"], payment.as_str());
    // The handler's own line: the event went through the batch, as a queue's record.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("key=\"cobro#ord-3006\"") && l.contains("outcome=\"reconciled\"")),
        "{stderr}"
    );

    let done = record_of(&db, "ord-3006");
    assert_eq!(done["estado"], "hecho", "{done}");
    assert_eq!(done["recibo"], payment.as_str());
    assert!(
        done["pago"].is_null() && done["espera_hasta"].is_null(),
        "{done}"
    );
    assert_eq!(
        ledger_of(&db, "ord-3006"),
        ["authentication_required", "authenticated"]
    );
    assert!(charges(&db).contains(&("ord-3006".to_owned(), 1)));
    let audit = charge_once(&db, &["audit"]);
    assert_eq!(audit.status.code(), Some(0), "the paid order audits clean");

    // Nothing awaits any more: a second confirm does nothing and says why.
    let again = charge_once(&db, &["confirm", "ord-3006"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(again.stdout.is_empty());
    assert!(
        stderr.contains("does not await its customer: its record is estado hecho"),
        "{stderr}"
    );
    assert_eq!(ledger_of(&db, "ord-3006").len(), 2, "no other call");
}

#[test]
fn a_wait_that_ends_unconfirmed_is_cancelled_by_the_settler_and_the_next_message_is_a_new_attempt()
{
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("settle.sqlite3");
    let event = "events/sqs-authentication-required.json";
    assert_eq!(invoke(&db, event), Vec::<String>::new(), "acknowledged");
    let first = record_of(&db, "ord-6001");
    assert_eq!(first["estado"], "espera");

    // Within the wait the settler leaves it; eight days on it cancels the payment.
    let run = printed(&db, &["settle"]);
    assert_eq!(
        (run["read"].as_u64(), run["waiting"].as_u64()),
        (Some(1), Some(1))
    );
    let out = charge_once(&db, &["settle", "--later", "8d"]);
    assert!(out.status.success());
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["ended"], 1, "{run}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("outcome=\"authentication_expired\""));
    let ended = record_of(&db, "ord-6001");
    assert_eq!(
        (ended["estado"].as_str(), ended["intento"].as_u64()),
        (Some("fallido"), Some(2))
    );
    assert_eq!(
        ledger_of(&db, "ord-6001"),
        ["authentication_required", "canceled"]
    );

    // The next message is the next attempt: a new payment, awaiting the customer again.
    assert_eq!(invoke(&db, event), Vec::<String>::new());
    let second = record_of(&db, "ord-6001");
    assert_eq!(
        (second["estado"].as_str(), second["intento"].as_u64()),
        (Some("espera"), Some(2))
    );
    assert_ne!(second["pago"], first["pago"]);

    // The customer confirms, and no event arrives: the settler finds the payment.
    let confirmed = printed(&db, &["confirm", "ord-6001", "--no-event"]);
    assert_eq!(confirmed["payment"], "succeeded");
    assert_eq!(record_of(&db, "ord-6001")["estado"], "espera");
    let run = printed(&db, &["settle"]);
    assert_eq!(run["completed"], 1, "{run}");
    let done = record_of(&db, "ord-6001");
    assert_eq!(
        (done["estado"].clone(), done["recibo"].clone()),
        ("hecho".into(), second["pago"].clone())
    );
    assert_eq!(charges(&db), [("ord-6001".to_owned(), 1)]);
}

/// What README's "An order that awaits its customer" shows: the order `make confirm`
/// is given, and the JSON lines it shows `confirm` and `settle` printing.
fn readme_awaiting(readme: &str) -> (String, Vec<Value>) {
    let section = readme
        .split("\n## An order that awaits its customer\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has the section");
    let order = section
        .split("make confirm ORDER=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the section runs make confirm ORDER=…")
        .to_owned();
    let printed = section
        .split("```json\n")
        .skip(1)
        .map(|s| serde_json::from_str(s.split("```").next().unwrap()).unwrap())
        .collect();
    (order, printed)
}

/// Whether a line README shows is what the binary printed: the same fields, each the
/// same value, or (a value ending in `…`) one that starts so.
fn shows(said: &Value, printed: &Value) -> bool {
    match (said, printed) {
        (Value::Object(said), Value::Object(printed)) => {
            said.len() == printed.len()
                && said
                    .iter()
                    .all(|(k, v)| printed.get(k).is_some_and(|p| shows(v, p)))
        }
        (Value::String(said), Value::String(printed)) => {
            said.strip_suffix('…').map_or(said == printed, |start| {
                printed.starts_with(start) && printed.len() > start.len()
            })
        }
        _ => said == printed,
    }
}

/// What the section's commands did: the record before, `confirm`'s line, the record
/// after; on another file, `settle --later 8d`'s line and the record after it.
struct AwaitingRun {
    order: String,
    waiting: Value,
    confirmed: Value,
    done: Value,
    settled: Value,
    ended: Value,
}

fn awaiting_run(order: &str, dir: &Path) -> AwaitingRun {
    let db = dir.join("confirm.sqlite3");
    invoke(&db, "events/sqs-batch.json");
    invoke(&db, "events/sqs-batch.json");
    let waiting = record_of(&db, order);
    let confirmed = printed(&db, &["confirm", order]);
    let done = record_of(&db, order);
    let db = dir.join("settle.sqlite3");
    invoke(&db, "events/sqs-batch.json");
    let settled = printed(&db, &["settle", "--later", "8d"]);
    AwaitingRun {
        order: order.to_owned(),
        waiting,
        confirmed,
        done,
        settled,
        ended: record_of(&db, order),
    }
}

/// Where the section and the run disagree, one line each (empty: they agree).
fn awaiting_disagreements(readme: &str, makefile: &str, run: &AwaitingRun) -> Vec<String> {
    let (order, said) = readme_awaiting(readme);
    let mut found = Vec::new();
    if order != run.order {
        found.push(format!("README confirms {order}, the run {}", run.order));
    }
    if !makefile.contains("-- confirm $(ORDER) --db $(DB)") {
        found.push("make confirm does not run charge-once-local confirm $(ORDER)".to_owned());
    }
    let lines = [("confirm", &run.confirmed), ("settle", &run.settled)];
    if said.len() != lines.len() {
        found.push(format!(
            "README shows {} lines, not {}",
            said.len(),
            lines.len()
        ));
    }
    for ((command, printed), said) in lines.iter().zip(&said) {
        if !shows(said, printed) {
            found.push(format!(
                "README shows {command} printing {said}, it prints {printed}"
            ));
        }
    }
    let states = [
        ("espera", &run.waiting),
        ("hecho", &run.done),
        ("fallido", &run.ended),
    ];
    for (state, record) in states {
        let claim = format!("`\"estado\": \"{state}\"`");
        if !readme.contains(&claim) || record["estado"] != state {
            found.push(format!("README says {claim}, inspect shows {record}"));
        }
    }
    if run.done["recibo"] != run.waiting["pago"]
        || run.confirmed["payment_id"] != run.waiting["pago"]
    {
        found.push(format!(
            "the receipt is not the payment that awaited: {} then {}",
            run.waiting, run.done
        ));
    }
    found
}

#[test]
fn the_readmes_order_that_awaits_its_customer_is_what_confirm_settle_and_inspect_print_and_a_drift_is_caught()
 {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (order, _) = readme_awaiting(&readme);
    let run = awaiting_run(&order, dir.path());
    let found = awaiting_disagreements(&readme, &makefile, &run);
    assert!(
        found.is_empty(),
        "README's order that awaits its customer drifted:\n{}",
        found.join("\n")
    );
    // A README that still sent the order to the DLQ, and whose settler ended nothing.
    let drifted = readme
        .replace(
            r#""outcome":"reconciled""#,
            r#""outcome":"authentication_required""#,
        )
        .replace(r#""ended":1"#, r#""ended":0"#);
    let found = awaiting_disagreements(&drifted, &makefile, &run);
    assert_eq!(found.len(), 2, "{found:#?}");
}

#[test]
fn a_customer_who_confirms_after_the_dlqs_fourteen_day_retention_would_have_passed_still_ends_with_the_order_recorded()
 {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("late.sqlite3");
    let event = "events/sqs-authentication-required.json";
    // A shop that gives its customers three weeks; an SQS queue keeps a message 14 days
    // at most, so a redrive from the DLQ could no longer complete this order.
    let out = bare(&db, &["invoke", event])
        .env("AUTHENTICATION_WAIT", "21d")
        .output()
        .unwrap();
    assert_eq!(harness::failed_ids(&out.stdout), Vec::<String>::new());
    let waiting = record_of(&db, "ord-6001");
    let wait =
        waiting["espera_hasta"].as_i64().unwrap() - waiting["creado"].as_i64().unwrap() / 1000;
    assert!((wait - 21 * 24 * 3600).abs() <= 1, "{waiting}");

    let run = printed(&db, &["settle", "--later", "15d"]);
    assert_eq!(
        run["waiting"], 1,
        "fifteen days on, the order still waits: {run}"
    );
    printed(&db, &["confirm", "ord-6001", "--no-event"]);
    let run = printed(&db, &["settle", "--later", "15d"]);
    assert_eq!(run["completed"], 1, "{run}");
    let done = record_of(&db, "ord-6001");
    assert_eq!(done["estado"], "hecho", "{done}");
    assert_eq!(done["recibo"], waiting["pago"]);
    assert_eq!(charges(&db), [("ord-6001".to_owned(), 1)]);
}

#[test]
fn resolve_of_an_order_that_awaits_its_customer_says_so_in_one_line_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("awaiting.sqlite3");
    invoke(&db, "events/sqs-batch.json");
    let waiting = record_of(&db, "ord-3006");
    let payment = waiting["pago"].as_str().unwrap().to_owned();
    let out = charge_once(
        &db,
        &[
            "resolve",
            "ord-3006",
            "--amount",
            "3300",
            "--currency",
            "EUR",
            "--customer",
            "cus_123",
            "--payment-method",
            "pm_card_authenticationRequired",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("awaits payment") && lines[0].contains(&payment),
        "{stderr}"
    );
    assert!(!stderr.contains("run resolve again"), "{stderr}");
    assert_eq!(record_of(&db, "ord-3006"), waiting, "untouched");
}
