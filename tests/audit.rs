//! `charge-once audit` on moto and localstripe (the same scenario on SQLite and the
//! simulator: `local/tests/audit.rs`). A clean run audits clean (exit 0); then one side is tampered with, one
//! way at a time, and each audit exits 1 naming exactly the orders tampered with so
//! far: more than one succeeded PaymentIntent for an order, a record deleted, a receipt
//! no PaymentIntent has, a fingerprint changed, a lease left behind. A declined order
//! left `libre`, its PaymentIntent cancelled, is never a finding.
//! The audit's reads are counted on a table of N records over a window of W orders:
//! the same for two N, proportional to W, a late confirmation of an old open
//! PaymentIntent of a paid order found as a `double_charge`.
//! Its own test binary: the audit reads every PaymentIntent of its window, so no
//! other test may charge at this binary's localstripe; its tests take turns.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::{ForOrder, OrderKey};
use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use charge_once::adapters::dynamodb::DynamoStore;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::contracts::payment::{PaymentError, PaymentProvider};
use charge_once::contracts::schema::{self, attr};
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::clock::{self, Time};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, State};
use charge_once::drivers::audit;
use charge_once::policy::audit::Kind;
use harness::audit::{AuditPair, clean_then_tampered_one_way_at_a_time, invoke};
use harness::localstripe::{self, Card};
use harness::proxy::{Faults, Target, start_proxy};
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

/// The tests of this binary that charge, one at a time: each audit reads every
/// PaymentIntent of its window.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Ends a test's turn once its last payment is older than the scenario's window can
/// reach (whole seconds, one more than it ran, the start rounded down).
async fn end_turn(turn: tokio::sync::MutexGuard<'_, ()>) {
    tokio::time::sleep(Duration::from_millis(2500)).await;
    drop(turn);
}

#[tokio::test]
async fn moto_and_localstripe_audit_clean_then_name_each_tampered_order() {
    let turn = ONE_AT_A_TIME.lock().await;
    let pair = Aws {
        table: Backend::Moto.fresh_table().await,
    };
    let good = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let started = clean_then_tampered_one_way_at_a_time(
        &pair,
        (&good.customer, &good.card),
        (&declining.customer, &declining.card),
    )
    .await;
    // The declined order's PaymentIntent was cancelled, and is no finding; the stuck
    // order's declined payment is left open.
    let declined = localstripe::payment_intents_of(&declining.customer).await;
    assert_eq!(declined.len(), 2, "{declined:?}");
    assert_eq!(declined[0]["status"], "canceled", "{declined:?}");
    assert_eq!(
        declined[1]["status"], "requires_payment_method",
        "{declined:?}"
    );

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
            env: vec![
                ("CHARGE_ONCE_FUNCTION", "audit".to_owned()),
                // Back to the scenario's start, and no further.
                (
                    "AUDIT_SINCE",
                    format!("{}s", started.elapsed().as_secs() + 1),
                ),
            ],
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
    // A test after this one reads a window that starts after it began: nothing to wait.
    drop(turn);
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

/// What one audit read: DynamoDB requests (by operation) and provider requests.
struct Reads {
    dynamodb: BTreeMap<String, u64>,
    provider: u64,
}

impl Reads {
    fn dynamodb_requests(&self) -> u64 {
        self.dynamodb.values().sum()
    }
}

/// `n` records of orders done 30 days ago, written straight into the table (25 an
/// item batch): the table the audit must not read.
async fn seed_old_records(table: &Table, n: usize) {
    let old = Time::from_ms(clock::wall_ms()) - Duration::from_secs(30 * 24 * 3600);
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let items: Vec<WriteRequest> = (0..n)
        .map(|i| {
            let item = [
                (attr::PK, s(Key::for_order_id(&format!("old-{i}")).as_str())),
                (attr::STATE, s(schema::state::DONE)),
                (attr::RECEIPT, s(&format!("pi_old_{i}"))),
                (attr::CREATED, AttributeValue::N(old.as_ms().to_string())),
                (
                    attr::EXPIRES,
                    AttributeValue::N((old.as_secs() + 400 * 24 * 3600).to_string()),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            let put = PutRequest::builder().set_item(Some(item)).build().unwrap();
            WriteRequest::builder().put_request(put).build()
        })
        .collect();
    for chunk in items.chunks(25) {
        let out = table
            .client
            .batch_write_item()
            .request_items(&table.name, chunk.to_vec())
            .send()
            .await
            .unwrap();
        assert!(
            out.unprocessed_items().is_none_or(HashMap::is_empty),
            "moto took every item"
        );
    }
}

/// One run of the count: a table of `records` old records, one order paid before the
/// window whose old open PaymentIntent (made with a card that asks for
/// authentication) the customer confirms in it, and `fresh` orders of the window
/// through the consumer, the last of them awaiting its customer. The audit reads both
/// through counting proxies.
async fn audit_reads(records: usize, fresh: usize) -> Reads {
    let pair = Aws {
        table: Backend::Moto.fresh_table().await,
    };
    seed_old_records(&pair.table, records).await;
    let payer = localstripe::payer(Card::Visa).await;
    let asks = localstripe::card(&payer.customer, Card::RequiresAuthentication).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let order = |n: usize, method: &str| {
        Order::new(
            &format!("reads-{run}-{n}"),
            2000,
            "EUR",
            &payer.customer,
            method,
        )
        .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();

    // Before the window: an open PaymentIntent of the late order, left to its
    // customer, and the same order paid with another.
    let late = order(0, &payer.card);
    let left_open = pair
        .provider()
        .charge(&order(0, &asks), &format!("left-open-{run}"))
        .await;
    let Err(PaymentError::AuthenticationRequired {
        payment_id: Some(left_open),
    }) = left_open
    else {
        panic!("expected a PaymentIntent awaiting its customer: {left_open:?}")
    };
    assert_eq!(invoke(&pair, dir.path(), &[&late]), 0);

    // The window starts at the next whole second (`created[gte]` is in seconds).
    let since = Time::from_secs(Time::from_ms(clock::wall_ms()).as_secs() + 1);
    let until_then = since.as_ms() - clock::wall_ms();
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(until_then).unwrap_or(0),
    ))
    .await;
    let mut window: Vec<Order> = (1..fresh).map(|n| order(n, &payer.card)).collect();
    window.push(order(fresh, &asks));
    let window: Vec<&Order> = window.iter().collect();
    assert_eq!(invoke(&pair, dir.path(), &window), 0, "paid, or awaiting");
    let awaiting = pair.store().get(&Key::for_order(window[fresh - 1])).await;
    assert_eq!(awaiting.unwrap().unwrap().state, State::Awaiting);
    // The customer confirms the old PaymentIntent, late.
    localstripe::authenticate(&left_open).await;

    let dynamodb = Arc::new(Faults::default());
    let provider = Arc::new(Faults::default());
    let store = DynamoStore::new(
        Backend::client_at(
            &start_proxy(Backend::Moto.url(), Target::DynamoDb, dynamodb.clone()).await,
        ),
        pair.table.name.clone(),
    );
    let listing = HttpProvider::new(
        &start_proxy(localstripe_url(), Target::Payment, provider.clone()).await,
        &Secret::new(API_KEY.into()),
        PAYMENT_TIMEOUT,
        &harness::tls(),
    )
    .unwrap();
    let report = audit::audit(
        &store,
        &listing,
        Some(&listing),
        audit::Window {
            now: Time::from_ms(clock::wall_ms()),
            since,
            stuck_after: Duration::from_secs(3600),
        },
    )
    .await
    .unwrap();
    let found: Vec<(Kind, &str)> = report
        .findings
        .iter()
        .map(|f| (f.kind, f.order_id.as_str()))
        .collect();
    // Two succeeded PaymentIntents for the late order; the old one was made with the
    // card that asked for authentication, not the order's: a mismatch too.
    assert_eq!(
        found,
        [(Kind::DoubleCharge, late.id()), (Kind::Mismatch, late.id())],
        "{:#?}",
        report.findings
    );
    let twice = &report.findings[0].evidence["payments"];
    assert_eq!(twice.as_array().map(Vec::len), Some(2), "{twice}");
    Reads {
        dynamodb: dynamodb.calls(),
        provider: provider.calls().values().sum(),
    }
}

/// The audit's reads on a table of N records over a window of W orders are the same
/// for N = 200 and N = 2,000, and at most 2 W: one `GetItem` per order of the window,
/// one query of the awaiting index, a page of each listing, the receipts created
/// before the window by id; never a scan. At ten million records they are the same
/// (no term in N); the scan they replace read every item, 100 a page.
#[tokio::test]
async fn the_audits_reads_grow_with_the_window_not_the_table_and_find_a_late_confirmation() {
    let turn = ONE_AT_A_TIME.lock().await;
    // 20 orders in the window, and the late order whose PaymentIntent succeeded in it.
    let fresh = 20;
    let w = u64::try_from(fresh + 1).unwrap();
    let mut counted = Vec::new();
    for records in [200, 2_000] {
        let reads = audit_reads(records, fresh).await;
        println!(
            "audit reads: records={records} window={w} dynamodb_requests={} provider_requests={} ({:?})",
            reads.dynamodb_requests(),
            reads.provider,
            reads.dynamodb
        );
        assert!(!reads.dynamodb.contains_key("Scan"), "{:?}", reads.dynamodb);
        counted.push(reads);
    }
    let (small, large) = (&counted[0], &counted[1]);
    assert_eq!(
        small.dynamodb, large.dynamodb,
        "the table's size reads nothing more"
    );
    assert_eq!(small.provider, large.provider);
    assert!(large.dynamodb_requests() <= 2 * w, "{:?}", large.dynamodb);
    assert!(large.provider <= 2 * w, "{}", large.provider);
    println!(
        "audit reads: records=10000000 window={w} dynamodb_requests={} provider_requests={} (no term in N; the scan read {} pages)",
        large.dynamodb_requests(),
        large.provider,
        10_000_000 / 100
    );
    end_turn(turn).await;
}
