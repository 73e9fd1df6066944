//! The queue side of a batch on moto's SQS, through the binary outside Lambda
//! (`invoke --sqs`, on moto's table and localstripe): a message no retry can fix goes to
//! the DLQ with its reason and attributes and is acknowledged; a failed record's retry
//! delay is set on its receipt handle; without `--sqs` nothing is sent and the log
//! says what would have been; in Lambda, no DLQ stops the cold start.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use harness::event_source::{Queues, event_of};
use harness::localstripe::{self, Card, Payer};
use harness::servers::{Backend, Table, cli_on_moto_and_localstripe};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");

/// An order of `payer`, paid with their card (localstripe's test cards choose the answer).
fn order(id: &str, payer: &Payer) -> String {
    json!({"id": id, "amount": 1200, "currency": "EUR", "customer": payer.customer,
           "payment_method": payer.card})
    .to_string()
}

/// `charge-once invoke <event> [--sqs]` with JSON log lines, on `table` and localstripe.
fn invoke(event: &Path, table: &Table, dlq: &str, sqs: bool) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("invoke")
        .arg(event)
        .args(sqs.then_some("--sqs"));
    cli_on_moto_and_localstripe(&mut command, &table.name, "sk_test_queue")
        .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
        .env("AWS_ENDPOINT_URL_SQS", Backend::Moto.url())
        .env("DEAD_LETTER_QUEUE_URL", dlq)
        .output()
        .unwrap()
}

/// The outcome lines of a run's stderr, by message id.
fn outcome_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["outcome"].is_string())
        .collect()
}

fn line_of<'a>(lines: &'a [Value], message_id: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["span"]["message_id"] == message_id)
        .unwrap_or_else(|| panic!("no outcome line for {message_id}: {lines:?}"))
}

/// Sends an order, an invalid body (with a message attribute) and a declining order,
/// and receives them as the event source would, hidden for 1 s.
async fn three_messages(queues: &Queues) -> (Vec<aws_sdk_sqs::types::Message>, [String; 3]) {
    let good = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    // Order ids of this run only: the provider's idempotency keys are the order's, and
    // every test of this binary charges at the same localstripe.
    let run = uuid::Uuid::new_v4().simple();
    queues.send(&[order(&format!("q-ok-{run}"), &good)]).await;
    queues
        .client
        .send_message()
        .queue_url(&queues.url)
        .message_body(r#"{"id":"q-bad","amount":12.5,"currency":"EUR","customer":"cus_123"}"#)
        .message_attributes(
            "trace",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("t-1")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    queues
        .send(&[order(&format!("q-declined-{run}"), &declining)])
        .await;
    let mut messages = Vec::new();
    for _ in 0..20 {
        messages.extend(queues.receive(Duration::from_secs(1)).await);
        if messages.len() >= 3 {
            break;
        }
    }
    assert_eq!(messages.len(), 3, "{messages:?}");
    let id_of = |needle: &str| {
        messages
            .iter()
            .find(|m| m.body().unwrap().contains(needle))
            .and_then(|m| m.message_id())
            .unwrap()
            .to_owned()
    };
    let ids = [id_of("q-ok"), id_of("q-bad"), id_of("q-declined")];
    (messages, ids)
}

/// One `invoke` of the three messages, with `--sqs` or not, sending dead letters to
/// `dlq` (the queues' own when `None`).
struct Invoked {
    queues: Queues,
    /// The order's, the invalid body's and the declined order's message ids.
    ids: [String; 3],
    /// The failed ids, sorted.
    failed: Vec<String>,
    lines: Vec<Value>,
}

impl Invoked {
    async fn run(sqs: bool, dlq: Option<String>) -> Self {
        let queues = Queues::create(Duration::from_secs(1), 10).await;
        let (messages, ids) = three_messages(&queues).await;
        let dir = tempfile::tempdir().unwrap();
        let event = dir.path().join("event.json");
        std::fs::write(&event, event_of(&messages, &queues.arn).to_string()).unwrap();
        let dlq = dlq.unwrap_or_else(|| queues.dlq_url.clone());
        let table = Backend::Moto.fresh_table().await;
        let out = invoke(&event, &table, &dlq, sqs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let mut failed = harness::failed_ids(&out.stdout);
        failed.sort();
        Self {
            queues,
            ids,
            failed,
            lines: outcome_lines(&out),
        }
    }

    /// The fields of the outcome line of the message `id`.
    fn line(&self, id: &str) -> &Value {
        &line_of(&self.lines, id)["fields"]
    }

    /// `ids`, sorted as `failed` is.
    fn sorted(ids: &[&String]) -> Vec<String> {
        let mut ids: Vec<String> = ids.iter().map(|id| (*id).clone()).collect();
        ids.sort();
        ids
    }
}

#[tokio::test]
async fn with_sqs_the_poison_is_dead_lettered_with_its_reason_and_a_decline_is_delayed() {
    let run = Invoked::run(true, None).await;
    let [ok, bad, declined] = &run.ids;
    // The invalid body is acknowledged: it is in the DLQ.
    assert_eq!(run.failed, Invoked::sorted(&[declined]));
    let bad_line = run.line(bad);
    assert_eq!(bad_line["outcome"], "invalid");
    assert_eq!(bad_line["dead_lettered"], true, "{bad_line}");
    let declined_line = run.line(declined);
    assert_eq!(declined_line["outcome"], "declined");
    // A decline waits at least RETRY_CAP (15 min by default).
    assert!(
        declined_line["retry_in_s"].as_u64().unwrap() >= 900,
        "{declined_line}"
    );
    assert!(declined_line["queue_error"].is_null(), "{declined_line}");
    assert!(run.line(ok)["retry_in_s"].is_null());

    let dlq = run.queues.drain_dlq().await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let letter = &dlq[0];
    assert!(letter.body.contains("q-bad"));
    assert_eq!(letter.attributes, ["charge-once", "trace"]);
    assert_eq!(letter.note_str("outcome"), Some("invalid"));
    assert_eq!(letter.note_str("message_id"), Some(bad.as_str()));
    assert_eq!(letter.note.as_ref().unwrap()["receive_count"], 1);
    // docs/operate.md shows this very note: its example is what the function writes.
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operate.md")).unwrap();
    let example: serde_json::Value = page
        .lines()
        .find(|l| l.starts_with(r#"{"outcome":"invalid""#))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("docs/operate.md shows a dead letter's note");
    assert_eq!(
        (letter.note_str("reason"), letter.note_str("outcome")),
        (example["reason"].as_str(), example["outcome"].as_str()),
        "the docs' example note is not what the function writes"
    );

    // The queue's visibility (1 s) has passed. The event source would delete the
    // acknowledged records; nobody does here, so they are back. The declined one is
    // still hidden, for its own delay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut back = Vec::new();
    for _ in 0..5 {
        back.extend(
            run.queues
                .receive(Duration::from_secs(30))
                .await
                .into_iter()
                .filter_map(|m| m.message_id().map(str::to_owned)),
        );
    }
    assert!(back.contains(ok) && back.contains(bad), "{back:?}");
    assert!(!back.contains(declined), "{back:?}");
}

#[tokio::test]
async fn without_sqs_nothing_is_sent_and_the_log_says_what_would_be() {
    let run = Invoked::run(false, None).await;
    let [_, bad, declined] = &run.ids;
    // Not sent, so not acknowledged: the invalid body fails as the queue would see it.
    assert_eq!(run.failed, Invoked::sorted(&[bad, declined]));
    let bad_line = run.line(bad);
    assert_eq!(bad_line["dead_lettered"], false, "{bad_line}");
    let error = bad_line["queue_error"].as_str().unwrap();
    assert!(error.contains("--sqs"), "{bad_line}");
    assert!(run.line(declined)["retry_in_s"].as_u64().unwrap() >= 900);
    assert!(run.queues.drain_dlq().await.is_empty());
}

#[tokio::test]
async fn a_dead_letter_that_cannot_be_sent_is_not_acknowledged_and_retries() {
    let nowhere = format!("{}/123456789012/no-such-dlq", Backend::Moto.url());
    let run = Invoked::run(true, Some(nowhere)).await;
    let [_, bad, declined] = &run.ids;
    assert_eq!(
        run.failed,
        Invoked::sorted(&[bad, declined]),
        "the poison stays in the queue"
    );
    let bad_line = run.line(bad);
    assert_eq!(bad_line["dead_lettered"], false, "{bad_line}");
    let error = bad_line["queue_error"].as_str().unwrap();
    assert!(error.contains("SendMessageBatch"), "{bad_line}");
    // It comes back with the backoff (first step 30 s, upper half), set on its handle.
    let retry = bad_line["retry_in_s"].as_u64().unwrap();
    assert!((15..=30).contains(&retry), "{bad_line}");
}

#[tokio::test]
async fn in_lambda_a_missing_dead_letter_queue_stops_the_cold_start_with_one_line() {
    let runtime = harness::runtime_api::RuntimeApi::start().await;
    let endpoints = harness::runtime_api::Endpoints::without_queue(
        "http://127.0.0.1:9".to_owned(),
        "http://127.0.0.1:9".to_owned(),
        "charge-once-idempotency".to_owned(),
    );
    let mut command = Command::new(BIN);
    harness::runtime_api::lambda_environment(&mut command, &runtime.addr, &endpoints)
        .env_remove("DEAD_LETTER_QUEUE_URL");
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("DEAD_LETTER_QUEUE_URL is required"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_dead_letter_too_big_with_its_note_reaches_the_dlq_at_once_note_trimmed_body_intact() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let queues = Queues::create(Duration::from_secs(1), 10).await;
    // The DLQ takes 1 KiB a message, body and attributes together (SQS counts both;
    // the harness teaches moto so).
    queues
        .client
        .set_queue_attributes()
        .queue_url(&queues.dlq_url)
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap();
    let reason = "field `amount` must be an integer of minor units in 1..=99999999, got 12.5";
    // The note the function writes (a message id is 36 characters).
    let whole = json!({"outcome": "invalid", "reason": reason,
                       "message_id": "059f36b4-87a3-44ab-83d2-661975830a7d", "receive_count": 1});
    // A poison body the queue took, 30 bytes too big to have that note beside it
    // (`charge-once` and `String` count too), with room for a short one.
    let body_of = |pad: usize| {
        json!({"id": "q-big", "amount": 12.5, "currency": "EUR", "customer": "cus_1",
                            "payment_method": "pm_1", "pad": "x".repeat(pad)})
        .to_string()
    };
    let target = 1024 - "charge-once".len() - "String".len() - whole.to_string().len() + 30;
    let body = body_of(target - body_of(0).len());
    assert_eq!(body.len(), target);
    // The whole note beside it is what SQS refuses: the dead letter used to fail, and
    // the record came back until the redrive policy moved it, without its reason.
    let note = MessageAttributeValue::builder()
        .data_type("String")
        .string_value(whole.to_string())
        .build()
        .unwrap();
    let refused = queues
        .client
        .send_message()
        .queue_url(&queues.dlq_url)
        .message_body(&body)
        .message_attributes("charge-once", note)
        .send()
        .await;
    assert!(refused.is_err(), "SQS's rule: {refused:?}");

    queues.send(std::slice::from_ref(&body)).await;
    let mut messages = Vec::new();
    for _ in 0..20 {
        messages.extend(queues.receive(Duration::from_secs(1)).await);
        if !messages.is_empty() {
            break;
        }
    }
    assert_eq!(messages.len(), 1);
    let dir = tempfile::tempdir().unwrap();
    let event = dir.path().join("event.json");
    std::fs::write(&event, event_of(&messages, &queues.arn).to_string()).unwrap();
    let table = Backend::Moto.fresh_table().await;
    let out = invoke(&event, &table, &queues.dlq_url, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        harness::failed_ids(&out.stdout).is_empty(),
        "acknowledged: it is in the DLQ"
    );
    let id = messages[0].message_id().unwrap();
    let lines = outcome_lines(&out);
    assert_eq!(line_of(&lines, id)["fields"]["dead_lettered"], true);

    let dlq = queues.drain_dlq().await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].body, body, "the body as it came");
    assert_eq!(dlq[0].note_str("outcome"), Some("invalid"));
    assert_eq!(dlq[0].note_str("message_id"), Some(id));
    assert_eq!(dlq[0].note.as_ref().unwrap()["note_trimmed"], true);
    let kept = dlq[0].note_str("reason").unwrap();
    assert!(reason.starts_with(kept), "a prefix of the reason: {kept:?}");
}
