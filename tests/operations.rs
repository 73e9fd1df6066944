//! What on-call people use: the log line of every record, and the `inspect` and
//! `resolve` commands of the real binary against moto and stripe-stateful-mock.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::process::{Command, Output};

use std::time::Duration;

use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::contracts::payment::ChargePath;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::clock::Time;
use charge_once::domain::order::Order;
use charge_once::domain::{Fingerprint, Key, State};
use harness::lease::Lease;
use harness::logs::Captured;
use harness::rig::{Harness, INVOCATION, PAYMENT_TIMEOUT, batch_of};
use harness::servers::{Backend, Table};
use harness::stripe;
use serde_json::Value;

/// A secret-looking key the mock accepts; its random part must never be logged.
const KEY_SECRET_PART: &str = "QzXwVbNmKjHgFdSa";

fn api_key() -> String {
    format!("sk_test_{KEY_SECRET_PART}")
}

fn http_provider() -> HttpProvider {
    HttpProvider::new(
        harness::servers::stripe_mock_url(),
        &Secret::new(api_key()),
        PAYMENT_TIMEOUT,
        &harness::tls(),
    )
    .unwrap()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn body(id: &str, amount: u64, customer: &str) -> String {
    format!(r#"{{"id":"{id}","amount":{amount},"currency":"EUR","customer":"{customer}"}}"#)
}

#[tokio::test]
async fn every_record_gets_one_log_line_with_its_fields_and_no_secret_or_body() {
    let logs = Captured::default();
    let _guard = logs.install();

    let good = stripe::customer("tok_visa").await;
    let bad = stripe::customer("tok_chargeCustomerFail").await;
    let (a, b, c) = (unique("log-a"), unique("log-b"), unique("log-c"));
    let bodies = [
        body(&a, 1000, &good),
        serde_json::json!({"Type": "Notification", "Message": body(&a, 1000, &good)}).to_string(),
        body(&b, 2000, &bad),
        format!(r#"{{"id":"{c}","amount":3.5,"currency":"EUR","customer":"{good}"}}"#),
        body(&c, 3000, &good),
    ];
    let event = batch_of(&bodies);
    let ids: Vec<String> = event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();
    let h = Harness::new(http_provider()).await;
    let failed = h.invoke_event_with(event, INVOCATION).await;
    assert_eq!(failed, [ids[2].clone(), ids[3].clone()]);

    let text = logs.text();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outcome_lines: Vec<&Value> = lines
        .iter()
        .filter(|l| !l["fields"]["outcome"].is_null())
        .collect();
    assert_eq!(
        outcome_lines.len(),
        ids.len(),
        "one outcome line per record:\n{text}"
    );
    for (id, expected) in ids
        .iter()
        .zip(["charged", "duplicate", "declined", "invalid", "charged"])
    {
        let mine: Vec<&&Value> = outcome_lines
            .iter()
            .filter(|l| l["span"]["message_id"] == id.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "{id}:\n{text}");
        let fields = &mine[0]["fields"];
        assert_eq!(fields["outcome"], expected, "{id}");
        if expected != "invalid" {
            assert!(
                mine[0]["span"]["key"]
                    .as_str()
                    .unwrap()
                    .starts_with("cobro#log-")
            );
            assert!(fields["latency_ms"].is_u64(), "{fields}");
        }
        if expected == "charged" || expected == "declined" {
            assert_eq!(fields["attempt"], 1);
        }
        if expected == "declined" || expected == "invalid" {
            assert!(
                fields["reason"].is_string() || fields["code"].is_string(),
                "{fields}"
            );
        }
    }
    let declined = outcome_lines
        .iter()
        .find(|l| l["fields"]["outcome"] == "declined")
        .unwrap();
    assert_eq!(declined["fields"]["code"], "card_declined");
    assert_eq!(declined["fields"]["decline_code"], "generic_decline");
    // Never the API key (nor a 4-character piece of its secret part), never a body.
    for window in KEY_SECRET_PART.as_bytes().windows(4) {
        let piece = std::str::from_utf8(window).unwrap();
        assert!(
            !text.contains(piece),
            "key fragment {piece:?} logged:\n{text}"
        );
    }
    for body in &bodies {
        assert!(
            !text.contains(body.as_str()),
            "a raw body was logged:\n{text}"
        );
    }
    assert!(
        !text.contains(&good) && !text.contains(&bad),
        "customer references are not logged"
    );
}

/// Runs the real binary with `--store dynamodb` on `table`, provider = the mock.
fn charge_once(table: &Table, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_charge-once"));
    command.args(args);
    harness::servers::cli_on_moto_and_mock(&mut command, &table.name, &api_key())
        .output()
        .unwrap()
}

fn json_out(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn resolve(table: &Table, order: &Order, extra: &[&str]) -> Output {
    let amount = order.amount().to_string();
    let mut args = vec![
        "resolve",
        order.id(),
        "--amount",
        &amount,
        "--currency",
        order.currency(),
        "--customer",
        order.customer(),
    ];
    args.extend_from_slice(extra);
    charge_once(table, &args)
}

fn now() -> Time {
    Time::from_ms(charge_once::domain::clock::wall_ms())
}

/// A reservation by an invocation that died, with its lease ending at `until`.
async fn abandoned(table: &Table, order: &Order, until: Time) {
    Lease::of(order, "died", until - Duration::from_secs(60))
        .until(until)
        .make(table.store.as_ref())
        .await;
}

#[tokio::test]
async fn resolve_refuses_while_a_live_lease_is_held() {
    let table = Backend::Moto.fresh_table().await;
    let order = Order::new(&unique("res-live"), 500, "EUR", "cus_x").unwrap();
    abandoned(&table, &order, now() + Duration::from_secs(600)).await;
    let out = resolve(&table, &order, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("live lease"), "{stderr}");
    let shown = json_out(&charge_once(&table, &["inspect", order.id()]));
    assert_eq!(shown["record"]["estado"], "en-curso", "nothing was written");
    assert_eq!(shown["record"]["titular"], "died");
}

#[tokio::test]
async fn resolve_completes_a_stuck_record_with_the_charge_the_provider_holds() {
    let table = Backend::Moto.fresh_table().await;
    let customer = stripe::customer("tok_visa").await;
    let order = Order::new(&unique("res-found"), 1500, "EUR", &customer).unwrap();
    abandoned(&table, &order, now() - Duration::from_secs(1)).await;
    // The dead invocation had charged under its key before dying.
    let charged = http_provider()
        .charge(&order, &Key::for_order(&order).provider_key(1))
        .await
        .unwrap();

    let done = json_out(&resolve(&table, &order, &[]));
    assert_eq!(done["resolution"], "completed");
    assert_eq!(done["receipt"], charged.id.as_str());
    let shown = json_out(&charge_once(&table, &["inspect", order.id()]));
    assert_eq!(shown["record"]["estado"], "hecho");
    assert_eq!(shown["record"]["recibo"], charged.id.as_str());
    assert!(
        shown.get("ledger").is_none(),
        "no simulator ledger with a real provider"
    );
    // Again: nothing to do.
    assert_eq!(
        json_out(&resolve(&table, &order, &[]))["resolution"],
        "already_done"
    );
    assert_eq!(stripe::charges_of(&customer).await.len(), 1);
}

#[tokio::test]
async fn resolve_releases_with_the_next_attempt_when_the_provider_has_no_charge() {
    let table = Backend::Moto.fresh_table().await;
    let customer = stripe::customer("tok_visa").await;
    let order = Order::new(&unique("res-none"), 700, "EUR", &customer).unwrap();
    abandoned(&table, &order, now() - Duration::from_secs(1)).await;

    let done = json_out(&resolve(&table, &order, &[]));
    assert_eq!(done["resolution"], "released");
    assert_eq!(done["next_attempt"], 2);
    let shown = json_out(&charge_once(&table, &["inspect", order.id()]));
    assert_eq!(shown["record"]["estado"], "libre");
    assert_eq!(shown["record"]["intento"], 2);
    assert!(stripe::charges_of(&customer).await.is_empty());
}

#[tokio::test]
async fn resolve_refuses_a_legacy_format_record_until_a_human_checked_the_provider() {
    let table = Backend::Moto.fresh_table().await;
    let customer = stripe::customer("tok_visa").await;
    let order = Order::new(&unique("res-legacy"), 900, "EUR", &customer).unwrap();
    table
        .put_legacy_item(
            &Key::for_order(&order),
            State::InProgress,
            None,
            now() + Duration::from_secs(3600),
        )
        .await;
    let out = resolve(&table, &order, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--legacy-format-checked"));

    let done = json_out(&resolve(&table, &order, &["--legacy-format-checked"]));
    assert_eq!(done["resolution"], "released");
    let record = table
        .store
        .get(&Key::for_order_id(order.id()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.fingerprint,
        Some(Fingerprint::of(&order)),
        "the record now has a fingerprint"
    );
}

#[tokio::test]
async fn resolve_refuses_an_order_that_does_not_match_the_record() {
    let table = Backend::Moto.fresh_table().await;
    let order = Order::new(&unique("res-mismatch"), 900, "EUR", "cus_x").unwrap();
    abandoned(&table, &order, now() - Duration::from_secs(1)).await;
    let other = Order::new(order.id(), 901, "EUR", "cus_x").unwrap();
    let out = resolve(&table, &other, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fingerprint"));
}
