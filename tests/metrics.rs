//! The EMF document of a mixed batch: every outcome counted, takeovers, latencies.
//! Its own test binary, with one test: the metrics recorder is process-global.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::OrderKey;
use std::time::Duration;

use charge_once::adapters::emf::{Emf, Recorded};
use charge_once::contracts::payment::ChargePath;
use charge_once::domain::clock::{self, Time};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, State};
use harness::lease::Lease;
use harness::provider::{Fault, TestProvider};
use harness::rig::{DEADLINE_MARGIN, Harness, INVOCATION, PROVIDER_KEY_TTL, batch_of};
use serde_json::Value;

fn body(id: &str, amount: u64) -> String {
    format!(
        r#"{{"id":"{id}","amount":{amount},"currency":"EUR","customer":"cus_m","payment_method":"pm_card_visa"}}"#
    )
}

/// The invocation's EMF document, as the Lambda entry point writes it.
fn document(emf: &Emf, recorded: &Recorded) -> Value {
    let mut out = Vec::new();
    emf.write(
        recorded,
        &[("RequestId", "req-m")],
        clock::wall_ms(),
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let docs: Vec<&str> = text.lines().collect();
    assert_eq!(docs.len(), 1, "one EMF document per invocation:\n{text}");
    serde_json::from_str(docs[0]).unwrap()
}

fn count(doc: &Value, name: &str) -> u64 {
    doc[name].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn the_emf_document_of_a_mixed_batch_counts_every_outcome() {
    let emf = charge_once::telemetry::init_metrics("charge-once-test").unwrap();
    let h = Harness::new(TestProvider::new()).await;
    let store = h.table.store.as_ref();
    let now = h.clock.now();
    let order = |id: &str, amount| Order::new(id, amount, "EUR", "cus_m", "pm_card_visa").unwrap();
    let reserve_as = |id: &'static str, at: Time, until: Time| async move {
        let o = Order::new(id, 100, "EUR", "cus_m", "pm_card_visa").unwrap();
        Lease::of(&o, "someone-else", at)
            .until(until)
            .make(store)
            .await;
    };
    // Before the batch: a charged order (for the conflict), a live lease, an expired
    // lease, an old key the provider charged, a legacy-format item.
    h.invoke_event_with(batch_of(&[body("m-conflict", 100)]), INVOCATION)
        .await;
    reserve_as("m-busy", now, now + Duration::from_millis(600_000)).await;
    reserve_as(
        "m-expired",
        now - Duration::from_millis(120_000),
        now - Duration::from_millis(60_000),
    )
    .await;
    let old = now - PROVIDER_KEY_TTL - Duration::from_secs(3600);
    reserve_as("m-old", old, old + Duration::from_millis(60_000)).await;
    h.provider
        .charge(
            &order("m-old", 100),
            &Key::for_order_id("m-old").provider_key(1),
        )
        .await
        .unwrap();
    h.table
        .put_legacy_item(
            &Key::for_order_id("m-legacy"),
            State::InProgress,
            None,
            now + Duration::from_secs(3600),
        )
        .await;
    h.provider.script("m-declined", &[Fault::Decline]);
    // A 5xx is retried once within the invocation: two fail the record.
    h.provider
        .script("m-broken", &[Fault::ServerError, Fault::ServerError]);

    let (failed, recorded) = emf
        .measure(h.invoke_event_with(
            batch_of(&[
                body("m-fresh", 100),
                body("m-fresh", 100),
                body("m-conflict", 999),
                body("m-busy", 100),
                body("m-declined", 100),
                body("m-broken", 100),
                body("m-broken", 100),
                body("m-legacy", 100),
                "{not json".to_owned(),
                body("m-expired", 100),
                body("m-old", 100),
            ]),
            INVOCATION,
        ))
        .await;
    assert_eq!(failed.len(), 7);
    let doc = document(emf, &recorded);
    assert_eq!(
        doc["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "charge-once-test"
    );
    for (name, expected) in [
        ("charged", 2), // m-fresh, m-expired
        ("duplicate", 1),
        ("conflict", 1),
        ("in_progress", 1),
        ("declined", 1),
        ("failed_retryable", 1),
        ("skipped", 1),
        ("needs_reconciliation", 1),
        ("invalid", 1),
        ("reconciled", 1),     // m-old
        ("takeover", 2),       // m-expired, m-old
        ("charge_retried", 1), // m-broken's 5xx, once
    ] {
        assert_eq!(count(&doc, name), expected, "{name} in {doc}");
    }
    let declared: Vec<&str> = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap())
        .collect();
    assert!(declared.contains(&"store_latency_ms") && declared.contains(&"payment_latency_ms"));
    // 5 charges (m-fresh, m-declined, m-broken and its retry, m-expired) + 1 lookup
    // (m-old) + the decline's lookup, cancel of its open payment, and look again.
    assert_eq!(
        doc["payment_latency_ms"].as_array().unwrap().len(),
        9,
        "{doc}"
    );
    assert!(doc["store_latency_ms"].as_array().unwrap().len() >= 10);

    // A batch with too little time left: unstarted.
    let (failed, recorded) = emf
        .measure(h.invoke_event_with(
            batch_of(&[body("m-late", 100)]),
            DEADLINE_MARGIN - Duration::from_millis(1),
        ))
        .await;
    assert_eq!(failed.len(), 1);
    let doc = document(emf, &recorded);
    assert_eq!(count(&doc, "unstarted"), 1, "{doc}");
    h.provider.assert_no_order_charged_twice();
}
