//! Traces on a real receiver: the real binary in Lambda mode (under the Runtime API
//! emulator, on moto and localstripe behind a fault proxy) exporting over OTLP/HTTP to
//! the harness's receiver on 127.0.0.1 (`harness/src/otlp.rs`). One batch holds a
//! charged order, its duplicate, a declined card and a charge whose answer is lost
//! (the provider answers after the client's timeout): the receiver must get the
//! invocation's span, one span per record under it linked to its producer, one span
//! per store and provider call under each record, no payload and no secret in any
//! attribute, and each record's log line must name its span. A bad setting stops the
//! cold start with one line naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessageAttribute;
use harness::localstripe::{self, Card};
use harness::otlp::{ReceivedSpan, Receiver};
use harness::proxy::{Faults, Target, start_proxy};
use harness::rig::batch_of;
use harness::runtime_api::{
    ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi, lambda_environment,
};
use harness::servers::{Backend, localstripe_url};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");
/// The producer's X-Ray header on the charged order.
const PRODUCER_XRAY: &str =
    "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
/// The W3C context on its duplicate.
const PRODUCER_W3C: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// The amount of every order: distinctive, so that its absence from the spans means
/// something.
const AMOUNT: u32 = 4_273_918;

fn order(id: &str, payer: &localstripe::Payer) -> String {
    serde_json::json!({
        "id": id, "amount": AMOUNT, "currency": "EUR",
        "customer": payer.customer, "payment_method": payer.card
    })
    .to_string()
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

/// The operations of a record's call spans, in the order they started (the receiver
/// keeps the order of arrival, which the batch processor keeps by end time; sorted
/// by name where the order is not the point).
fn operations(calls: &[&ReceivedSpan]) -> Vec<(String, String)> {
    calls
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                s.attribute("charge_once.outcome").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_exports_its_span_tree_linked_to_the_producers_and_joined_to_its_log_lines() {
    let receiver = Receiver::start().await;
    let table = Backend::Moto.fresh_table().await;
    let visa = localstripe::payer(Card::Visa).await;
    let declines = localstripe::payer(Card::DeclinesOnCharge).await;
    let lost = localstripe::payer(Card::Visa).await;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (charged_id, declined_id, lost_id) = (
        format!("tr-ok-{suffix}"),
        format!("tr-no-{suffix}"),
        format!("tr-lost-{suffix}"),
    );
    // The lost answer: the charge is made, its answer held past PAYMENT_TIMEOUT (1 s).
    let faults = Arc::new(Faults {
        payment_delay: Duration::from_millis(2500),
        late_answers: std::sync::Mutex::new(vec![format!("cobro#{lost_id}#1")]),
        ..Faults::default()
    });
    let payment = start_proxy(localstripe_url(), Target::Payment, faults).await;
    let endpoints =
        Endpoints::without_queue(Backend::Moto.url().to_owned(), payment, table.name.clone());

    let mut event = batch_of(&[
        order(&charged_id, &visa),
        order(&charged_id, &visa),
        order(&declined_id, &declines),
        order(&lost_id, &lost),
    ]);
    event.records[0]
        .attributes
        .insert("AWSTraceHeader".into(), PRODUCER_XRAY.into());
    let mut traceparent = SqsMessageAttribute::default();
    traceparent.string_value = Some(PRODUCER_W3C.into());
    traceparent.data_type = Some("String".into());
    event.records[1]
        .message_attributes
        .insert("traceparent".into(), traceparent);
    // A header that is not X-Ray's: no link, and the record is judged as any other.
    event.records[3]
        .attributes
        .insert("AWSTraceHeader".into(), "Root=not-a-trace".into());
    let ids: Vec<String> = event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();

    let log = harness::log_dir().join(format!("traces-{suffix}.log"));
    let runtime = RuntimeApi::start().await;
    let mut launch = Launch::logging_to(log.clone());
    launch.env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.clone()),
        ("RUST_LOG", "info".to_owned()),
    ];
    let mut function = ConsumerProcess::launch(BIN.as_ref(), &runtime, &endpoints, launch);
    let reply = runtime
        .invoke(
            serde_json::to_string(&event).unwrap(),
            Duration::from_secs(20),
        )
        .await;
    let Reply::Response(bytes) = reply else {
        function.stop();
        panic!("no response: {reply:?}");
    };
    let failed = harness::failed_ids(&bytes);
    assert_eq!(
        failed,
        [ids[2].clone(), ids[3].clone()],
        "the decline and the lost answer fail"
    );

    // The invocation's span ends once the response is posted, and is flushed then.
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| s.attribute("faas.trigger").is_some())
        })
        .await;
    function.stop();

    let invocations: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attribute("faas.trigger").is_some())
        .collect();
    assert_eq!(invocations.len(), 1, "{spans:#?}");
    let invocation = invocations[0];
    assert_eq!(invocation.attribute("faas.trigger"), Some("pubsub"));
    assert_eq!(invocation.attribute("faas.coldstart"), Some("true"));
    assert!(
        invocation.parent_span_id.is_empty(),
        "the invocation is the root"
    );
    assert_eq!(
        invocation.resource.get("service.name").map(String::as_str),
        Some("charge-once")
    );

    // One span per record under the invocation, in the same trace, a consumer's.
    let records: BTreeMap<String, &ReceivedSpan> = children(&spans, invocation)
        .into_iter()
        .map(|s| (s.attribute("messaging.message.id").unwrap().to_owned(), s))
        .collect();
    assert_eq!(records.len(), 4, "{spans:#?}");
    for (id, key) in ids
        .iter()
        .zip([&charged_id, &charged_id, &declined_id, &lost_id])
    {
        let span = records[id];
        assert_eq!(span.name, "process orders");
        assert_eq!(span.kind, 5, "a consumer span");
        assert_eq!(span.attribute("messaging.system"), Some("aws_sqs"));
        assert_eq!(span.attribute("messaging.destination.name"), Some("orders"));
        assert_eq!(span.attribute("messaging.aws_sqs.receive_count"), Some("1"));
        assert_eq!(span.attribute("key"), Some(format!("cobro#{key}").as_str()));
    }

    // The links to the producers: X-Ray's header, W3C's traceparent, none for a header
    // that does not parse.
    assert_eq!(
        records[&ids[0]].links,
        [(
            "5759e988bd862e3fe1be46a994272793".to_owned(),
            "53995c3f42cd8ad8".to_owned()
        )]
    );
    assert_eq!(
        records[&ids[1]].links,
        [(
            "0af7651916cd43dd8448eb211c80319c".to_owned(),
            "b7ad6b7169203331".to_owned()
        )]
    );
    assert!(records[&ids[2]].links.is_empty());
    assert!(records[&ids[3]].links.is_empty());

    // How each record ended, and its calls.
    let ended = |id: &String| {
        let span = records[id];
        (
            span.attribute("charge_once.outcome").unwrap().to_owned(),
            span.status.0,
        )
    };
    assert_eq!(ended(&ids[0]), ("charged".into(), 0));
    assert_eq!(ended(&ids[1]), ("duplicate".into(), 0));
    assert_eq!(ended(&ids[2]), ("declined".into(), 2));
    assert_eq!(ended(&ids[3]).1, 2, "the lost answer is an error");

    // Nothing was refused for its rate, so no call waited for the pacer.
    assert!(
        spans.iter().all(|s| s.name != "wait pacing"),
        "a call waited for the pacer though nothing was refused: {spans:#?}"
    );

    let calls = |id: &String| children(&spans, records[id]);
    let charged = calls(&ids[0]);
    assert_eq!(
        operations(&charged),
        [
            ("store reserve".into(), "applied".into()),
            ("provider charge".into(), "ok".into()),
            ("store complete".into(), "applied".into()),
        ]
    );
    let reserve = charged[0];
    assert_eq!(reserve.kind, 3, "a client span");
    assert_eq!(reserve.attribute("db.system.name"), Some("aws.dynamodb"));
    assert_eq!(
        reserve.attribute("db.collection.name"),
        Some(table.name.as_str())
    );
    let charge = charged[1];
    assert_eq!(charge.attribute("http.request.method"), Some("POST"));
    assert_eq!(
        charge.attribute("url.template"),
        Some("/v1/payment_intents")
    );
    assert_eq!(charge.attribute("server.address"), Some("127.0.0.1"));
    assert_eq!(charge.attribute("charge_once.retry"), Some("false"));
    assert_eq!(charge.attribute("charge_once.replay"), Some("false"));

    assert_eq!(
        operations(&calls(&ids[1])),
        [("store reserve".into(), "refused".into())],
        "the duplicate: one refused reserve, no provider call"
    );

    let declined = calls(&ids[2]);
    let decline = declined
        .iter()
        .find(|s| s.name == "provider charge")
        .expect("the declined charge");
    assert_eq!(decline.attribute("charge_once.outcome"), Some("declined"));
    assert_eq!(decline.attribute("http.response.status_code"), Some("402"));
    assert_eq!(decline.status.0, 2, "a decline is an error of its call");
    assert!(
        declined.iter().any(|s| s.name == "provider cancel"),
        "the declined PaymentIntent is cancelled: {declined:#?}"
    );
    assert!(declined.iter().any(|s| s.name == "store release"));

    let lost_calls = calls(&ids[3]);
    let timed_out: Vec<&&ReceivedSpan> = lost_calls
        .iter()
        .filter(|s| s.name == "provider charge")
        .collect();
    assert_eq!(
        timed_out.len(),
        1,
        "a timeout is not retried: {lost_calls:#?}"
    );
    assert_eq!(
        timed_out[0].attribute("charge_once.outcome"),
        Some("timed_out")
    );
    assert_eq!(timed_out[0].status.0, 2);

    // No payload and no secret anywhere in what was exported.
    let forbidden = [
        localstripe::TEST_KEY.to_owned(),
        AMOUNT.to_string(),
        visa.customer.clone(),
        visa.card.clone(),
        declines.customer.clone(),
        declines.card.clone(),
        lost.customer.clone(),
        lost.card.clone(),
        "payment_method".to_owned(),
    ];
    for span in &spans {
        for (key, value) in span.attributes.iter().chain(&span.resource) {
            for secret in &forbidden {
                assert!(
                    !key.contains(secret.as_str()) && !value.contains(secret.as_str()),
                    "{} carries {secret:?} in {key}={value}",
                    span.name
                );
            }
        }
    }

    // Each record's log line names its span: the same trace id and span id.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["outcome"].is_string())
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    for line in lines {
        let id = line["span"]["message_id"].as_str().unwrap();
        let span = records[id];
        assert_eq!(
            line["fields"]["otel_trace_id"],
            span.trace_id.as_str(),
            "{line}"
        );
        assert_eq!(
            line["fields"]["otel_span_id"],
            span.span_id.as_str(),
            "{line}"
        );
    }
}

#[test]
fn a_bad_traces_setting_stops_the_cold_start_with_one_line_naming_it() {
    let endpoints = Endpoints::without_queue(
        "http://127.0.0.1:9".to_owned(),
        "http://127.0.0.1:9".to_owned(),
        "no-table".to_owned(),
    );
    let mut command = Command::new(BIN);
    lambda_environment(&mut command, "127.0.0.1:9", &endpoints)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let output = command.output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("OTEL_EXPORTER_OTLP_PROTOCOL=\\\"grpc\\\" is invalid"),
        "{stderr}"
    );
}

#[test]
fn without_an_endpoint_the_binary_exports_nothing_and_starts_as_before() {
    // The cold start of a function without traces reaches its Runtime API (here a port
    // nothing listens on) rather than stopping on a setting: traces are off.
    let endpoints = Endpoints::without_queue(
        "http://127.0.0.1:9".to_owned(),
        "http://127.0.0.1:9".to_owned(),
        "no-table".to_owned(),
    );
    let mut command = Command::new(BIN);
    lambda_environment(&mut command, "127.0.0.1:9", &endpoints)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("OTEL_"),
        "no endpoint: no OTEL setting is read: {stderr}"
    );
}
