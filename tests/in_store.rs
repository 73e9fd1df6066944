//! The library's effect inside the store, on moto: the loyalty points of its example
//! (`idempotent-consumer/examples/loyalty_points.rs`: ten per purchase, `saldo = saldo +
//! 10`), credited once per order however the order comes: copies in one batch (raw, SNS, EventBridge),
//! deliveries in parallel, and redeliveries after a crash at any point. The same credit
//! made outside the record's transaction (read the record, add, write the record) is
//! shown crediting twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

#[allow(dead_code)] // its `main` is the function's, not the test's
#[path = "../idempotent-consumer/examples/loyalty_points.rs"]
mod loyalty_points;

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use harness::rig::batch_of;
use harness::servers::{Backend, Table};
use idempotent_consumer::clock::{self, Time};
use idempotent_consumer::in_store::Consumer;
use idempotent_consumer::sqs::SqsQueue;
use loyalty_points::{LoyaltyPoints, POINTS, consumer};

fn order(id: &str, customer: &str) -> String {
    format!(r#"{{"id":"{id}","customer":"{customer}","amount":900}}"#)
}

fn deadline() -> Time {
    Time::from_ms(clock::wall_ms()) + Duration::from_secs(60)
}

async fn setup() -> (Table, Consumer<LoyaltyPoints>) {
    let table = Backend::Moto.fresh_table().await;
    let consumer = consumer(table.client.clone(), &table.name);
    (table, consumer)
}

/// The customer's balance, 0 before any credit.
async fn balance(table: &Table, customer: &str) -> u64 {
    let item = table
        .client
        .get_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S(format!("saldo#{customer}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    item.item()
        .and_then(|item| item.get("saldo"))
        .map_or(0, |n| n.as_n().unwrap().parse().unwrap())
}

#[tokio::test]
async fn copies_of_one_order_in_one_batch_raw_sns_and_eventbridge_credit_it_once() {
    let (table, consumer) = setup().await;
    let raw = order("ord-1", "cus-a");
    let sns = serde_json::json!({"Type": "Notification", "MessageId": "m-9", "Message": raw});
    let bridge = serde_json::json!({"detail-type": "order", "source": "shop",
        "detail": serde_json::from_str::<serde_json::Value>(&raw).unwrap()});
    let batch = batch_of(&[
        raw.clone(),
        raw.clone(),
        sns.to_string(),
        bridge.to_string(),
        order("ord-2", "cus-a"),
    ]);
    let response = consumer.run(&batch, deadline()).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        balance(&table, "cus-a").await,
        2 * POINTS,
        "two orders, once each"
    );
    // Delivered again later: still once.
    let response = consumer.run(&batch_of(&[raw]), deadline()).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(balance(&table, "cus-a").await, 2 * POINTS);
}

#[tokio::test]
async fn deliveries_of_one_order_in_parallel_credit_it_once() {
    let (table, consumer) = setup().await;
    let deliveries = 16;
    let batch = batch_of(&[order("ord-p", "cus-p")]);
    let runs = (0..deliveries).map(|_| consumer.run(&batch, deadline()));
    let responses = futures::future::join_all(runs).await;
    // Each delivery is acknowledged: one made the credit, the others found it done.
    assert!(responses.iter().all(|r| r.batch_item_failures.is_empty()));
    assert_eq!(balance(&table, "cus-p").await, POINTS);
}

#[tokio::test]
async fn a_crash_at_any_point_then_a_redelivery_credits_each_order_once() {
    let (table, consumer) = setup().await;
    let orders = 40;
    let (mut credited_before_the_crash, mut not_yet) = (0, 0);
    for n in 0..orders {
        let batch = batch_of(&[order(&format!("ord-c{n}"), "cus-c")]);
        let before = balance(&table, "cus-c").await;
        // The process dies after `n` × 0.5 ms: before the transaction, while it is in
        // flight, or after it committed and before the response.
        let killed = Duration::from_micros(500 * n);
        let died = tokio::time::timeout(killed, consumer.run(&batch, deadline())).await;
        let after_crash = balance(&table, "cus-c").await;
        match (died.is_err(), after_crash - before) {
            (true, 0) => not_yet += 1,
            (true, _) => credited_before_the_crash += 1,
            (false, _) => {}
        }
        // SQS delivers it again.
        let response = consumer.run(&batch, deadline()).await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(balance(&table, "cus-c").await, before + POINTS, "order {n}");
    }
    println!(
        "in_store crash orders={orders} credited_once={orders} died_before_commit={not_yet} died_after_commit={credited_before_the_crash}"
    );
    assert_eq!(balance(&table, "cus-c").await, orders * POINTS);
}

#[tokio::test]
async fn an_order_id_reused_for_another_customer_is_refused_and_credits_nothing() {
    let (table, consumer) = setup().await;
    let first = consumer
        .run(&batch_of(&[order("ord-r", "cus-r")]), deadline())
        .await;
    assert!(first.batch_item_failures.is_empty());
    let other = batch_of(&[order("ord-r", "cus-other")]);
    let refused = consumer.run(&other, deadline()).await;
    assert_eq!(refused.batch_item_failures.len(), 1);
    assert_eq!(balance(&table, "cus-other").await, 0);
    assert_eq!(balance(&table, "cus-r").await, POINTS);
    // An invalid body fails alone, with nothing written.
    let invalid = consumer
        .run(
            &batch_of(&[r#"{"id":"ord-x"}"#.to_owned(), order("ord-y", "cus-r")]),
            deadline(),
        )
        .await;
    assert_eq!(invalid.batch_item_failures.len(), 1);
    assert_eq!(balance(&table, "cus-r").await, 2 * POINTS);
}

#[tokio::test]
async fn a_record_no_retry_fixes_goes_to_the_dead_letter_queue_at_once_with_its_reason() {
    let (table, consumer) = setup().await;
    let queues = harness::event_source::Queues::create(Duration::from_secs(30), 5).await;
    let dlq = SqsQueue::new(queues.client.clone(), &queues.dlq_url, "loyalty-points");
    let consumer = consumer.with_dead_letters(std::sync::Arc::new(dlq));
    let first = consumer
        .run(&batch_of(&[order("ord-d", "cus-d")]), deadline())
        .await;
    assert!(first.batch_item_failures.is_empty());
    let batch = batch_of(&[
        r#"{"id":"ord-e"}"#.to_owned(),
        order("ord-d", "cus-other"),
        order("ord-f", "cus-d"),
    ]);
    let response = consumer.run(&batch, deadline()).await;
    // Each dead letter was sent, so each record is acknowledged: nothing comes back.
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(balance(&table, "cus-d").await, 2 * POINTS);
    assert_eq!(balance(&table, "cus-other").await, 0);
    let received = queues
        .client
        .receive_message()
        .queue_url(&queues.dlq_url)
        .message_attribute_names("All")
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    let mut notes: Vec<(String, serde_json::Value)> = received
        .messages()
        .iter()
        .map(|m| {
            let note = m.message_attributes().unwrap()["loyalty-points"]
                .string_value()
                .unwrap();
            (
                m.body().unwrap().to_owned(),
                serde_json::from_str(note).unwrap(),
            )
        })
        .collect();
    notes.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert_eq!(
        notes[0].0,
        order("ord-d", "cus-other"),
        "the body as it came"
    );
    assert_eq!(notes[0].1["outcome"], "mismatch");
    assert_eq!(notes[1].0, r#"{"id":"ord-e"}"#);
    assert_eq!(notes[1].1["outcome"], "invalid");
    assert!(notes[1].1["reason"].as_str().unwrap().contains("customer"));
}

/// The same credit made outside the record's transaction, as a consumer without the
/// library writes it: read the record, add the points, then write the record. `crash`:
/// the process dies between the credit and the record.
async fn credit_outside_the_transaction(table: &Table, id: &str, customer: &str, crash: bool) {
    let key = AttributeValue::S(format!("puntos#{id}"));
    let done = table
        .client
        .get_item()
        .table_name(&table.name)
        .key("pk", key.clone())
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    if done.item().is_some() {
        return;
    }
    table
        .client
        .update_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S(format!("saldo#{customer}")))
        .update_expression("ADD saldo :points")
        .expression_attribute_values(":points", AttributeValue::N(POINTS.to_string()))
        .send()
        .await
        .unwrap();
    if crash {
        return;
    }
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item("pk", key)
        .item("estado", AttributeValue::S("hecho".to_owned()))
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn the_same_credit_outside_the_transaction_is_made_twice() {
    let table = Backend::Moto.fresh_table().await;
    // A crash between the credit and the record, then the redelivery.
    credit_outside_the_transaction(&table, "ord-n1", "cus-n1", true).await;
    credit_outside_the_transaction(&table, "ord-n1", "cus-n1", false).await;
    assert_eq!(
        balance(&table, "cus-n1").await,
        2 * POINTS,
        "credited twice"
    );
    // Deliveries in parallel: each reads no record before any writes one.
    let runs = (0..16).map(|_| credit_outside_the_transaction(&table, "ord-n2", "cus-n2", false));
    futures::future::join_all(runs).await;
    let credited = balance(&table, "cus-n2").await;
    assert!(credited > POINTS, "credited {credited}, more than once");
}

#[test]
fn the_librarys_page_shows_the_example_these_tests_run_as_it_is() {
    let root = env!("CARGO_MANIFEST_DIR");
    let page = std::fs::read_to_string(format!("{root}/idempotent-consumer/README.md")).unwrap();
    let example = std::fs::read_to_string(format!(
        "{root}/idempotent-consumer/examples/loyalty_points.rs"
    ))
    .unwrap();
    assert!(
        page.contains(&format!("```rust,no_run\n{example}```\n")),
        "idempotent-consumer/README.md's code block is the example, whole"
    );
    let code = example
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count();
    assert!(
        code <= 70,
        "a consumer in about fifty lines of code: {code}"
    );
}
