//! What on-call people use: the log line of every record, and the `inspect` and
//! `resolve` commands of the real binary against moto and localstripe; and
//! the runbook's own sequence after a charge whose answer was lost, pasted as printed,
//! which must end with one charge.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::{ForOrder, OrderKey};
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
use harness::localstripe::{self, Card, Payer};
use harness::logs::Captured;
use harness::rig::{Harness, INVOCATION, PAYMENT_TIMEOUT, batch_of};
use harness::servers::{Backend, Table};
use serde_json::Value;

/// A secret-looking key localstripe accepts; its random part must never be logged.
const KEY_SECRET_PART: &str = "QzXwVbNmKjHgFdSa";

fn api_key() -> String {
    format!("sk_test_{KEY_SECRET_PART}")
}

fn http_provider() -> HttpProvider {
    HttpProvider::new(
        harness::servers::localstripe_url(),
        &Secret::new(api_key()),
        PAYMENT_TIMEOUT,
        &harness::tls(),
    )
    .unwrap()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn body(id: &str, amount: u64, payer: &Payer) -> String {
    let Payer { customer, card } = payer;
    format!(
        r#"{{"id":"{id}","amount":{amount},"currency":"EUR","customer":"{customer}","payment_method":"{card}"}}"#
    )
}

/// An order of `payer`, paid with their card.
fn order_of(id: &str, amount: u64, payer: &Payer) -> Order {
    Order::new(id, amount, "EUR", &payer.customer, &payer.card).unwrap()
}

#[tokio::test]
async fn every_record_gets_one_log_line_with_its_fields_and_no_secret_or_body() {
    let logs = Captured::default();
    let _guard = logs.install();

    let good = localstripe::payer(Card::Visa).await;
    let bad = localstripe::payer(Card::DeclinesOnCharge).await;
    let (a, b, c) = (unique("log-a"), unique("log-b"), unique("log-c"));
    let bodies = [
        body(&a, 1000, &good),
        serde_json::json!({"Type": "Notification", "Message": body(&a, 1000, &good)}).to_string(),
        body(&b, 2000, &bad),
        format!(
            r#"{{"id":"{c}","amount":3.5,"currency":"EUR","customer":"{}","payment_method":"{}"}}"#,
            good.customer, good.card
        ),
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
    // localstripe names no decline code (Stripe does): none is made up.
    assert_eq!(
        declined["fields"]["decline_code"]
            .as_str()
            .unwrap_or_default(),
        "",
        "{declined}"
    );
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
    for reference in [&good.customer, &bad.customer, &good.card, &bad.card] {
        assert!(
            !text.contains(reference.as_str()),
            "customer and payment method references are not logged"
        );
    }
}

/// Runs the real binary on moto's `table`, provider = localstripe.
fn charge_once(table: &Table, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_charge-once"));
    command.args(args);
    harness::servers::cli_on_moto_and_localstripe(&mut command, &table.name, &api_key())
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
    args.extend(["--payment-method", order.payment_method()]);
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
    let order = Order::new(&unique("res-live"), 500, "EUR", "cus_x", "pm_card_visa").unwrap();
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
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique("res-found"), 1500, &payer);
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
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1
    );
}

#[tokio::test]
async fn resolve_releases_with_the_next_attempt_when_the_provider_has_no_charge() {
    let table = Backend::Moto.fresh_table().await;
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique("res-none"), 700, &payer);
    abandoned(&table, &order, now() - Duration::from_secs(1)).await;

    let done = json_out(&resolve(&table, &order, &[]));
    assert_eq!(done["resolution"], "released");
    assert_eq!(done["next_attempt"], 2);
    let shown = json_out(&charge_once(&table, &["inspect", order.id()]));
    assert_eq!(shown["record"]["estado"], "libre");
    assert_eq!(shown["record"]["intento"], 2);
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn resolve_refuses_a_legacy_format_record_until_a_human_checked_the_provider() {
    let table = Backend::Moto.fresh_table().await;
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique("res-legacy"), 900, &payer);
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
        Some(Fingerprint::for_order(&order)),
        "the record now has a fingerprint"
    );
}

#[tokio::test]
async fn resolve_refuses_an_order_that_does_not_match_the_record() {
    let table = Backend::Moto.fresh_table().await;
    let order = Order::new(&unique("res-mismatch"), 900, "EUR", "cus_x", "pm_card_visa").unwrap();
    abandoned(&table, &order, now() - Duration::from_secs(1)).await;
    let other = Order::new(order.id(), 901, "EUR", "cus_x", "pm_card_visa").unwrap();
    let out = resolve(&table, &other, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fingerprint"));
}

/// A provider that takes every request at once but answers `delay` later: a payment
/// lands at localstripe, and the caller times out first. Bounded: it serves `connections`
/// connections, then stops.
async fn slow_provider(
    delay: Duration,
    connections: usize,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upstream = harness::servers::localstripe_url()
        .trim_start_matches("http://")
        .to_owned();
    let serving = tokio::spawn(async move {
        for _ in 0..connections {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let forward = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                tokio::time::sleep(delay).await;
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                forward.abort();
            });
        }
    });
    (url, serving)
}

/// `charge-once` outside Lambda on moto's `table`, with only the settings given:
/// nothing inherited that names a provider.
fn on_table(table: &Table, args: &[&str], settings: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_charge-once"));
    harness::servers::test_account(&mut command)
        .args(args)
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .env_remove("AWS_PROFILE")
        .env_remove("PAYMENT_API_URL")
        .env_remove("PAYMENT_API_KEY")
        .env("AWS_ENDPOINT_URL", Backend::Moto.url())
        .env("IDEMPOTENCY_TABLE", &table.name)
        .envs(settings.iter().copied())
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_runbooks_resolve_pasted_as_printed_after_a_lost_answer_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let table = Backend::Moto.fresh_table().await;
    let payer = localstripe::payer(Card::Visa).await;
    let customer = payer.customer.clone();
    let id = unique("DC");
    let event = dir.path().join("event.json");
    let message = serde_json::json!({
        "Records": [{
            "messageId": "m-dc", "receiptHandle": "h", "body": body(&id, 4200, &payer),
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1"},
            "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:orders"
        }]
    });
    std::fs::write(&event, message.to_string()).unwrap();
    let event = event.to_str().unwrap();
    let key = api_key();

    // 1. The provider takes the charge but answers after PAYMENT_TIMEOUT.
    let (slow, serving) = slow_provider(Duration::from_secs(3), 4).await;
    let at_slow = [
        ("PAYMENT_API_URL", slow.as_str()),
        ("PAYMENT_API_KEY", key.as_str()),
        ("PAYMENT_TIMEOUT", "1s"),
    ];
    let out = on_table(&table, &["invoke", event], &at_slow);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(harness::failed_ids(&out.stdout), ["m-dc"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    serving.abort();
    assert_eq!(
        localstripe::succeeded_of(&customer).await.len(),
        1,
        "localstripe charged"
    );

    // 2. The runbook's resolve, pasted as printed: no provider is set. It stops before
    // touching the record, naming what to set; nothing stands in for the provider.
    let printed = [
        "resolve",
        &id,
        "--amount",
        "4200",
        "--currency",
        "EUR",
        "--customer",
        &customer,
        "--payment-method",
        &payer.card,
    ];
    let before = table.store.get(&Key::for_order_id(&id)).await.unwrap();
    let out = on_table(&table, &printed, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("PAYMENT_API_URL is required"));
    assert_eq!(
        table.store.get(&Key::for_order_id(&id)).await.unwrap(),
        before,
        "the record is untouched"
    );
    let at_provider = [
        ("PAYMENT_API_URL", harness::servers::localstripe_url()),
        ("PAYMENT_API_KEY", key.as_str()),
    ];

    // 3. With the provider the function uses, resolve finds the charge.
    let out = on_table(&table, &printed, &at_provider);
    let done: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(done["resolution"], "completed", "{done}");
    let charges = localstripe::succeeded_of(&customer).await;
    assert_eq!(done["receipt"], charges[0].as_str());

    // 4. The next delivery is a duplicate: one charge in all.
    let out = on_table(&table, &["invoke", event], &at_provider);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(harness::failed_ids(&out.stdout).is_empty());
    assert_eq!(
        localstripe::payment_intents_of(&customer).await.len(),
        1,
        "one payment in all"
    );
}

/// A stack as CloudFormation on moto creates it, with what the runbook's DLQ commands
/// read of the real one: the DLQ's output and the consumer function (never invoked).
const DLQ_STACK: &str = r#"
Resources:
  OrdersDeadLetterQueue:
    Type: AWS::SQS::Queue
  ChargeFunctionRole:
    Type: AWS::IAM::Role
    Properties:
      AssumeRolePolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Effect: Allow
            Principal: {Service: lambda.amazonaws.com}
            Action: sts:AssumeRole
  ChargeFunction:
    Type: AWS::Lambda::Function
    Properties:
      Runtime: provided.al2023
      Handler: bootstrap
      Role: !GetAtt ChargeFunctionRole.Arn
      Code:
        ZipFile: "never run"
Outputs:
  OrdersDeadLetterQueueUrl:
    Value: !Ref OrdersDeadLetterQueue
"#;

/// The runbook's blocks under "The DLQ's commands", in order.
fn dlq_blocks() -> Vec<String> {
    let page = harness::root().join("docs/operate.md");
    harness::docs::shown(&page, &[])
        .into_iter()
        .filter(|s| !s.inline && s.section == "The DLQ's commands")
        .map(|s| s.script)
        .collect()
}

/// `script` with the value of its `NAME=` line replaced by `value`: what the reader
/// fills in.
fn filled(script: &str, name: &str, value: &str) -> String {
    let prefix = format!("{name}=");
    assert!(
        script.lines().any(|l| l.starts_with(&prefix)),
        "no {name}= in {script}"
    );
    script
        .lines()
        .map(|l| {
            if l.starts_with(&prefix) {
                format!("{name}='{value}'")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_runbooks_dlq_commands_read_find_and_delete_a_dead_letter_as_written_on_moto() {
    let blocks = dlq_blocks();
    assert_eq!(
        blocks.len(),
        5,
        "the stack's names, read, find, delete, redrive"
    );
    let [names, read, find, delete, redrive] = &blocks[..] else {
        unreachable!()
    };
    let shell = harness::docs::Shell::new();
    // The stack's names, once the stack exists (below): what each later step starts
    // from, as the reader's shell keeps them.
    let known = std::cell::RefCell::new(String::new());
    let run = |script: &str| {
        let out = shell.run(&format!("{}\n{script}", known.borrow()));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{script}\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let stack = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(stack.path(), DLQ_STACK).unwrap();
    run(&format!(
        "STACK=charge-once\n\
         aws cloudformation create-stack --stack-name \"$STACK\" --template-body file://{}",
        stack.path().display()
    ));
    // The first block, as written, then what it set.
    let set = run(&format!(
        "{names}\nprintf 'STACK=%q\\nDLQ=%q\\nDLQ_ARN=%q\\nLOG_GROUP=%q\\n' \
         \"$STACK\" \"$DLQ\" \"$DLQ_ARN\" \"$LOG_GROUP\""
    ));
    assert!(
        set.contains("DLQ=") && set.contains("LOG_GROUP=/aws/lambda/charge-once-ChargeFunction"),
        "{set}"
    );
    *known.borrow_mut() = set;

    // A dead letter as the function sends it, and the lines the function logged for
    // its message and for another one.
    let original = uuid::Uuid::new_v4().to_string();
    let other = uuid::Uuid::new_v4().to_string();
    let note = serde_json::json!({"outcome": "invalid", "reason": "field `amount` is missing",
                                  "message_id": original, "receive_count": 1});
    let attributes = serde_json::json!({"charge-once": {"DataType": "String",
                                                        "StringValue": note.to_string()}});
    let line = |id: &str| {
        serde_json::json!({"level": "ERROR", "message": "record", "outcome": "invalid",
                           "message_id": id})
        .to_string()
    };
    let now_ms = Time::from_ms(charge_once::domain::clock::wall_ms()).as_ms();
    let events = serde_json::json!([{"timestamp": now_ms, "message": line(&original)},
                                    {"timestamp": now_ms + 1, "message": line(&other)}]);
    let setup = tempfile::tempdir().unwrap();
    std::fs::write(setup.path().join("attributes.json"), attributes.to_string()).unwrap();
    std::fs::write(setup.path().join("events.json"), events.to_string()).unwrap();
    let dir = setup.path().display();
    run(&format!(
        "aws sqs send-message --queue-url \"$DLQ\" --message-body '{{\"id\":\"ord-1\"}}' \
           --message-attributes file://{dir}/attributes.json\n\
         aws logs create-log-group --log-group-name \"$LOG_GROUP\"\n\
         aws logs create-log-stream --log-group-name \"$LOG_GROUP\" --log-stream-name s\n\
         aws logs put-log-events --log-group-name \"$LOG_GROUP\" --log-stream-name s \
           --log-events file://{dir}/events.json"
    ));

    // Read: the message's id, its note, and the receipt handle to delete it with.
    let printed = run(read);
    let fields: Vec<&str> = printed.trim_end().split('\t').collect();
    assert_eq!(fields.len(), 3, "id, note, receipt handle: {printed}");
    let read_note: serde_json::Value = serde_json::from_str(fields[1]).unwrap();
    assert_eq!(read_note, note);

    // Find: the lines of the note's message id, and only those.
    let printed = run(&filled(find, "MESSAGE_ID", &original));
    assert!(printed.contains(&original), "{printed}");
    assert!(!printed.contains(&other), "{printed}");

    // Delete, with the read's receipt handle: the DLQ is empty, hidden messages too.
    run(&filled(delete, "RECEIPT", fields[2]));
    let counts = run(
        "aws sqs get-queue-attributes --queue-url \"$DLQ\" --attribute-names \
         ApproximateNumberOfMessages ApproximateNumberOfMessagesNotVisible \
         --query 'Attributes.[ApproximateNumberOfMessages, ApproximateNumberOfMessagesNotVisible]' \
         --output text",
    );
    assert_eq!(counts.split_whitespace().collect::<Vec<_>>(), ["0", "0"]);

    // The redrive is SQS's move task, which moto does not have: its syntax is held by
    // tests/documented_commands.rs.
    assert!(redrive.contains("aws sqs start-message-move-task --source-arn \"$DLQ_ARN\""));
    assert!(shell.refused().is_empty(), "{:?}", shell.refused());
}

#[tokio::test]
async fn resolve_stops_within_its_lease_with_one_clear_line_when_a_call_outlasts_it() {
    use charge_once::drivers::charge::resolve;
    use charge_once::policy::resolve::{Confirmed, ResolveError};
    use harness::provider::{Fault, TestProvider};

    // An order whose charge timed out: resolve takes the lease and looks it up.
    let h = Harness::new(TestProvider::new()).await;
    h.provider.script("ord-1001", &[Fault::Timeout]);
    assert_eq!(h.invoke("sqs-single.json").await.len(), 1);
    h.redeliver_later();
    // The provider's lookups now hang far past the lease (5 calls' worth).
    let lease = PAYMENT_TIMEOUT * 5;
    h.provider.delay_lookups(lease * 4);
    let order = Order::new("ord-1001", 5000, "EUR", "cus_123", "pm_card_visa").unwrap();
    let started = std::time::Instant::now();
    let resolved = resolve(
        h.table.store.as_ref(),
        h.provider.as_ref(),
        &h.settings,
        &order,
        Confirmed::default(),
    )
    .await;
    let took = started.elapsed();
    // The lookup had the whole lease left, not one call's timeout, and no more.
    assert!(
        took >= PAYMENT_TIMEOUT * 2 && took < lease,
        "cut at the lease's end: {took:?}"
    );
    let Err(error @ ResolveError::LeaseEnded { step: "lookup" }) = resolved else {
        panic!("{resolved:?}")
    };
    let line = error.to_string();
    assert!(
        line.starts_with("resolve stopped during its lookup")
            && line.ends_with("run resolve again"),
        "{line}"
    );
    assert!(!line.contains("  "), "one line, single spaces: {line}");
    // Nothing moved: the key is the one sent, nothing charged since.
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.attempt, Some(1));
    h.provider.assert_no_order_charged_twice();
}
