//! `charge-once audit` on both pairs of real parts: SQLite + the simulator, and moto +
//! localstripe. A clean run audits clean (exit 0); then one side is tampered with, one
//! way at a time, and each audit exits 1 naming exactly the orders tampered with so
//! far: more than one succeeded PaymentIntent for an order, a record deleted, a receipt
//! no PaymentIntent has, a fingerprint changed, a lease left behind. A declined order
//! left `libre`, its PaymentIntent cancelled, is never a finding.
//! Its own test binary: the audit reads every PaymentIntent of the provider, so no
//! other test may charge at this binary's localstripe.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::adapters::simulated::SimulatedProvider;
use charge_once::adapters::sqlite::SqliteStore;
use charge_once::config::Secret;
use charge_once::contracts::payment::PaymentProvider;
use charge_once::contracts::schema::attr;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::clock::{self, Time};
use charge_once::domain::order::Order;
use charge_once::domain::{Fingerprint, Key};
use harness::lease::Lease;
use harness::localstripe::{self, Card};
use harness::rig::{PAYMENT_TIMEOUT, batch_of};
use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};
use harness::servers::{Backend, Table, cli_on_moto_and_localstripe, localstripe_url};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
const API_KEY: &str = "sk_test_audit";

/// One pair of real parts: where the records and the charges are.
enum Pair {
    Local { db: PathBuf },
    Aws { table: Table },
}

impl Pair {
    fn command(&self, args: &[&str]) -> Output {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("AWS_LAMBDA_RUNTIME_API");
        match self {
            Pair::Local { db } => command
                .arg("--db")
                .arg(db)
                .args(["--provider", "simulator"])
                .env_remove("PAYMENT_API_URL"),
            Pair::Aws { table } => cli_on_moto_and_localstripe(&mut command, &table.name, API_KEY),
        };
        command.output().expect("run charge-once")
    }

    fn store(&self) -> Arc<dyn IdempotencyStore> {
        match self {
            Pair::Local { db } => Arc::new(SqliteStore::open(db).unwrap()),
            Pair::Aws { table } => table.dyn_store(),
        }
    }

    fn provider(&self) -> Box<dyn PaymentProvider> {
        match self {
            Pair::Local { db } => Box::new(SimulatedProvider::open(db).unwrap()),
            Pair::Aws { .. } => Box::new(
                HttpProvider::new(
                    localstripe_url(),
                    &Secret::new(API_KEY.into()),
                    PAYMENT_TIMEOUT,
                    &harness::tls(),
                )
                .unwrap(),
            ),
        }
    }

    async fn delete(&self, key: &Key) {
        match self {
            Pair::Local { db } => {
                let conn = rusqlite::Connection::open(db).unwrap();
                let deleted = conn
                    .execute("DELETE FROM idempotency WHERE pk = ?1", [key.as_str()])
                    .unwrap();
                assert_eq!(deleted, 1);
            }
            Pair::Aws { table } => {
                table
                    .client
                    .delete_item()
                    .table_name(&table.name)
                    .key(attr::PK, AttributeValue::S(key.to_string()))
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// Overwrites one text attribute of a record, as a bug or a hand would.
    async fn overwrite(&self, key: &Key, attribute: &str, value: &str) {
        match self {
            Pair::Local { db } => {
                let conn = rusqlite::Connection::open(db).unwrap();
                // The column is the attribute's name (schema.rs); not user input.
                let sql = format!("UPDATE idempotency SET {attribute} = ?1 WHERE pk = ?2");
                assert_eq!(conn.execute(&sql, [value, key.as_str()]).unwrap(), 1);
            }
            Pair::Aws { table } => {
                table
                    .client
                    .update_item()
                    .table_name(&table.name)
                    .key(attr::PK, AttributeValue::S(key.to_string()))
                    .update_expression("SET #a = :v")
                    .expression_attribute_names("#a", attribute)
                    .expression_attribute_values(":v", AttributeValue::S(value.to_owned()))
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// Runs the audit: its exit code and the (finding, order id) pairs it printed.
    fn audit(&self) -> (i32, BTreeSet<(String, String)>) {
        let out = self.command(&["audit"]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let summary: Value = serde_json::from_str(stderr.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the summary is the last stderr line ({e}):\n{stderr}"));
        let findings: BTreeSet<(String, String)> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let finding: Value = serde_json::from_str(line).unwrap();
                (
                    finding["finding"].as_str().unwrap().to_owned(),
                    finding["order_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let code = out.status.code().unwrap();
        assert_eq!(
            summary["audit"],
            if findings.is_empty() {
                "clean"
            } else {
                "findings"
            },
            "{stderr}"
        );
        (code, findings)
    }
}

fn body(order: &Order) -> String {
    serde_json::json!({"id": order.id(), "amount": order.amount(),
        "currency": order.currency(), "customer": order.customer(),
        "payment_method": order.payment_method()})
    .to_string()
}

/// A customer and the payment method their orders are paid with.
type Payer<'a> = (&'a str, &'a str);

fn invoke(pair: &Pair, dir: &Path, orders: &[&Order]) -> usize {
    let bodies: Vec<String> = orders.iter().map(|o| body(o)).collect();
    let event = dir.join("event.json");
    std::fs::write(&event, serde_json::to_string(&batch_of(&bodies)).unwrap()).unwrap();
    let out = pair.command(&["invoke", event.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let response: Value = serde_json::from_slice(&out.stdout).unwrap();
    response["batchItemFailures"].as_array().unwrap().len()
}

fn expect(found: &[(&str, &Order)]) -> BTreeSet<(String, String)> {
    found
        .iter()
        .map(|(kind, order)| ((*kind).to_owned(), order.id().to_owned()))
        .collect()
}

/// The scenario, the same on both pairs: `good` pays with a card the provider
/// charges, `declining` with one it declines.
async fn clean_then_tampered_one_way_at_a_time(pair: &Pair, good: Payer<'_>, declining: Payer<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let order = |n: u64, (customer, method): Payer<'_>| {
        Order::new(
            &format!("audit-{run}-{n}"),
            1000 + n,
            "EUR",
            customer,
            method,
        )
        .unwrap()
    };
    let (twice, unrecorded, ghost, changed, stuck) = (
        order(1, good),
        order(2, good),
        order(3, good),
        order(4, good),
        order(5, good),
    );
    let declined = order(6, declining);
    let failed = invoke(
        pair,
        dir.path(),
        &[&twice, &unrecorded, &ghost, &changed, &declined],
    );
    assert_eq!(failed, 1, "only the declined order fails");

    let (code, findings) = pair.audit();
    assert_eq!(
        (code, findings),
        (0, BTreeSet::new()),
        "a clean run audits clean"
    );

    // A second payment of the same order made at the provider directly, under
    // another key: two succeeded PaymentIntents for one order.
    pair.provider()
        .charge(&twice, &format!("not-ours-{run}"))
        .await
        .unwrap();
    let mut expected = vec![("double_charge", &twice)];
    assert_eq!(pair.audit(), (1, expect(&expected)));

    // A deleted record.
    pair.delete(&Key::for_order(&unrecorded)).await;
    expected.push(("charged_not_recorded", &unrecorded));
    assert_eq!(pair.audit(), (1, expect(&expected)));

    // A receipt the provider never issued.
    pair.overwrite(&Key::for_order(&ghost), attr::RECEIPT, "pi_never_issued")
        .await;
    expected.push(("recorded_without_charge", &ghost));
    assert_eq!(pair.audit(), (1, expect(&expected)));

    // A record whose fingerprint says another amount.
    let other = Order::new(changed.id(), changed.amount() + 1, "EUR", good.0, good.1).unwrap();
    pair.overwrite(
        &Key::for_order(&changed),
        attr::FINGERPRINT,
        &Fingerprint::of(&other),
    )
    .await;
    expected.push(("mismatch", &changed));
    assert_eq!(pair.audit(), (1, expect(&expected)));

    // A lease that ended two hours ago (the default --stuck-after is 1h).
    let now = Time::from_ms(clock::wall_ms());
    let hours = |h: u64| Duration::from_secs(3600 * h);
    let store = pair.store();
    Lease::of(&stuck, "died", now - hours(3))
        .until(now - hours(2))
        .make(store.as_ref())
        .await;
    expected.push(("stuck", &stuck));
    assert_eq!(pair.audit(), (1, expect(&expected)));
}

#[tokio::test]
async fn sqlite_and_the_simulator_audit_clean_then_name_each_tampered_order() {
    let dir = tempfile::tempdir().unwrap();
    let pair = Pair::Local {
        db: dir.path().join("audit.sqlite3"),
    };
    clean_then_tampered_one_way_at_a_time(
        &pair,
        ("cus_audit", "pm_card_visa"),
        ("cus_audit", "pm_card_chargeDeclined"),
    )
    .await;
}

#[tokio::test]
async fn moto_and_localstripe_audit_clean_then_name_each_tampered_order() {
    let pair = Pair::Aws {
        table: Backend::Moto.fresh_table().await,
    };
    let good = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    clean_then_tampered_one_way_at_a_time(
        &pair,
        (&good.customer, &good.card),
        (&declining.customer, &declining.card),
    )
    .await;
    // The declined order's PaymentIntent was cancelled, and is no finding.
    let declined = localstripe::payment_intents_of(&declining.customer).await;
    assert_eq!(declined.len(), 1, "{declined:?}");
    assert_eq!(declined[0]["status"], "canceled", "{declined:?}");

    // The same five findings from the scheduled audit: the binary in Lambda mode as
    // the template's AuditFunction, invoked by an EventBridge Scheduler event.
    let Pair::Aws { table } = &pair else {
        unreachable!()
    };
    let dir = tempfile::tempdir().unwrap();
    let (log, metrics) = (dir.path().join("audit.log"), dir.path().join("emf.jsonl"));
    let runtime = RuntimeApi::start().await;
    let endpoints = Endpoints::without_queue(
        Backend::Moto.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );
    let mut process = ConsumerProcess::launch(
        BIN.as_ref(),
        &runtime,
        &endpoints,
        Launch {
            metrics: Some(metrics.clone()),
            env: vec![("CHARGE_ONCE_FUNCTION", "audit".to_owned())],
            ..Launch::logging_to(log.clone())
        },
    );
    let scheduled =
        serde_json::json!({"source": "aws.scheduler", "detail-type": "Scheduled Event"});
    let reply = runtime
        .invoke(scheduled.to_string(), Duration::from_secs(30))
        .await;
    process.stop();
    let Reply::Response(body) = reply else {
        panic!(
            "{reply:?}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    };
    let summary: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(summary["audit"], "findings", "{summary}");
    let emf: Value = serde_json::from_str(
        std::fs::read_to_string(&metrics)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(emf["audit_findings"], 5, "{emf}");
    for kind in [
        "double_charge",
        "charged_not_recorded",
        "recorded_without_charge",
        "mismatch",
        "stuck",
    ] {
        assert_eq!(summary["findings"][kind], 1, "{summary}");
        assert_eq!(emf[format!("audit_{kind}")], 1, "{emf}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = logged
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &Value| l["fields"]["message"] == "audit finding")
        .collect();
    assert_eq!(lines.len(), 5, "one error line per finding:\n{logged}");
    assert!(lines.iter().all(|l| l["level"] == "ERROR"), "{logged}");
}

#[test]
fn an_audit_that_cannot_read_exits_2_and_never_says_clean() {
    // No table behind the endpoint: nothing can be read.
    let out = Command::new(BIN)
        .args(["audit", "--store", "dynamodb"])
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_PROFILE")
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("IDEMPOTENCY_TABLE", "no-such-table")
        .env("PAYMENT_API_URL", "http://127.0.0.1:9")
        .env("PAYMENT_API_KEY", API_KEY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains(r#""audit":"incomplete""#), "{stderr}");
    assert!(!stderr.contains(r#""audit":"clean""#), "{stderr}");
}
