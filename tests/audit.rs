//! `charge-once audit` on moto and localstripe (the same scenario on SQLite and the
//! simulator: `local/tests/audit.rs`). A clean run audits clean (exit 0); then one side is tampered with, one
//! way at a time, and each audit exits 1 naming exactly the orders tampered with so
//! far: more than one succeeded PaymentIntent for an order, a record deleted, a receipt
//! no PaymentIntent has, a fingerprint changed, a lease left behind. A declined order
//! left `libre`, its PaymentIntent cancelled, is never a finding.
//! Its own test binary: the audit reads every PaymentIntent of the provider, so no
//! other test may charge at this binary's localstripe.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::contracts::payment::PaymentProvider;
use charge_once::contracts::schema::attr;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::Key;
use harness::audit::{AuditPair, clean_then_tampered_one_way_at_a_time};
use harness::localstripe::{self, Card};
use harness::rig::PAYMENT_TIMEOUT;
use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};
use harness::servers::{Backend, Table, cli_on_moto_and_localstripe, localstripe_url};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
const API_KEY: &str = "sk_test_audit";

/// moto's table and localstripe, through the product's binary.
struct Aws {
    table: Table,
}

#[async_trait]
impl AuditPair for Aws {
    fn command(&self, args: &[&str]) -> Output {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("AWS_LAMBDA_RUNTIME_API");
        cli_on_moto_and_localstripe(&mut command, &self.table.name, API_KEY);
        command.output().expect("run charge-once")
    }

    fn store(&self) -> Arc<dyn IdempotencyStore> {
        self.table.dyn_store()
    }

    fn provider(&self) -> Box<dyn PaymentProvider> {
        Box::new(
            HttpProvider::new(
                localstripe_url(),
                &Secret::new(API_KEY.into()),
                PAYMENT_TIMEOUT,
                &harness::tls(),
            )
            .unwrap(),
        )
    }

    async fn delete(&self, key: &Key) {
        self.table
            .client
            .delete_item()
            .table_name(&self.table.name)
            .key(attr::PK, AttributeValue::S(key.to_string()))
            .send()
            .await
            .unwrap();
    }

    async fn overwrite(&self, key: &Key, attribute: &str, value: &str) {
        self.table
            .client
            .update_item()
            .table_name(&self.table.name)
            .key(attr::PK, AttributeValue::S(key.to_string()))
            .update_expression("SET #a = :v")
            .expression_attribute_names("#a", attribute)
            .expression_attribute_values(":v", AttributeValue::S(value.to_owned()))
            .send()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn moto_and_localstripe_audit_clean_then_name_each_tampered_order() {
    let pair = Aws {
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
    let table = &pair.table;
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
        .arg("audit")
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
