//! Every AWS call the function makes, checked by a server that verifies SigV4: moto
//! with IAM authentication switched on after the setup (`POST /moto-api/reset-auth`,
//! body `0`), then the real binary in Lambda mode with an IAM user's key whose policy
//! holds exactly the template's actions. One batch makes every kind of call: the key
//! from Secrets Manager at cold start, DynamoDB's conditional writes, SQS's
//! `GetQueueUrl`, `ChangeMessageVisibilityBatch` and `SendMessageBatch`. A wrong secret
//! is refused. Stripe's events too: the layer in front of localstripe puts them on the
//! partner event bus signed with a key allowed only `PutEvents`, the function settles
//! them (the report of an ended wait sent to its queue), and the scheduled settler
//! reads the awaiting index, cancels and reports with its own key. Its own test
//! binary: its moto server is the only one with authentication on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::OrderKey;
use std::process::Command;
use std::time::Duration;

#[allow(dead_code)] // its `main` is the function's, not the test's
#[path = "../idempotent-consumer/examples/loyalty_points.rs"]
mod loyalty_points;

use charge_once::contracts::store::IdempotencyStore;
use harness::event_source::{Queues, event_of};
use harness::localstripe::{self, Card, Payer};
use harness::log_dir;
use harness::runtime_api::{ConsumerProcess, Launch, Reply, RuntimeApi, lambda_environment};
use harness::servers::{Backend, localstripe_url, moto_sdk_config};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");

/// Authentication is one switch of the whole server: one test at a time holds it.
static AUTHENTICATION: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An IAM call to moto while authentication is off (moto routes by the credential
/// scope of the Authorization header, which it does not check yet).
async fn iam(params: &[(&str, &str)]) -> String {
    let mut form = vec![("Version", "2010-05-08")];
    form.extend_from_slice(params);
    let response = harness::http_client()
        .post(Backend::Moto.url())
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/iam/aws4_request, \
             SignedHeaders=host, Signature=0",
        )
        .form(&form)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "IAM {params:?}");
    response.text().await.unwrap()
}

fn xml_field<'a>(xml: &'a str, name: &str) -> &'a str {
    let open = format!("<{name}>");
    let start = xml.find(&open).unwrap() + open.len();
    let end = start + xml[start..].find(&format!("</{name}>")).unwrap();
    &xml[start..end]
}

/// Switches moto's authentication on after `0` more requests, or off (`inf`).
async fn authentication_after(requests: &str) {
    let response = harness::http_client()
        .post(format!("{}/moto-api/reset-auth", Backend::Moto.url()))
        .header("content-type", "text/plain")
        .body(requests.to_owned())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
}

/// The template's actions for the function (tests/template/ holds the template to
/// them), on every resource (moto's IAM checks actions, not resource ARNs), for an IAM
/// user; its access key. Moto asks for the batch calls' own names
/// (`sqs:SendMessageBatch`), which AWS does not have: AWS authorizes a batch call by
/// its single-message action, the template's.
async fn function_user() -> (String, String) {
    user_with(&[
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "sqs:GetQueueUrl",
        "sqs:ChangeMessageVisibility",
        "sqs:SendMessage",
        "secretsmanager:GetSecretValue",
        "sqs:ChangeMessageVisibilityBatch",
        "sqs:SendMessageBatch",
    ])
    .await
}

/// An IAM user allowed `actions` on every resource; its access key.
async fn user_with(actions: &[&str]) -> (String, String) {
    let name = format!(
        "charge-once-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    iam(&[("Action", "CreateUser"), ("UserName", &name)]).await;
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
        "Action": actions, "Resource": "*"}]});
    iam(&[
        ("Action", "PutUserPolicy"),
        ("UserName", &name),
        ("PolicyName", "charge-once"),
        ("PolicyDocument", &policy.to_string()),
    ])
    .await;
    let key = iam(&[("Action", "CreateAccessKey"), ("UserName", &name)]).await;
    (
        xml_field(&key, "AccessKeyId").to_owned(),
        xml_field(&key, "SecretAccessKey").to_owned(),
    )
}

async fn api_key_secret() -> String {
    let client = aws_sdk_secretsmanager::Client::new(&moto_sdk_config());
    client
        .create_secret()
        .name(format!("payment-{}", uuid::Uuid::new_v4().simple()))
        .secret_string(localstripe::TEST_KEY)
        .send()
        .await
        .unwrap()
        .arn
        .unwrap()
}

/// The function's settings with the IAM user's key `(id, secret)`.
fn signed_by((id, secret): (&str, &str), secret_arn: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", id.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_owned()),
        ("PAYMENT_API_KEY_SECRET_ARN", secret_arn.to_owned()),
        (
            "AWS_ENDPOINT_URL_SECRETS_MANAGER",
            Backend::Moto.url().to_owned(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_the_function_is_signed_as_moto_with_iam_authentication_accepts() {
    let _one_at_a_time = AUTHENTICATION.lock().await;
    // Setup, with authentication off.
    let table = Backend::Moto.fresh_table().await;
    let queues = Queues::create(Duration::from_secs(30), 10).await;
    let secret_arn = api_key_secret().await;
    let (id, secret) = function_user().await;
    let paying = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = |id: &str, payer: &Payer| {
        json!({"id": id, "amount": 900, "currency": "EUR", "customer": payer.customer,
            "payment_method": payer.card})
        .to_string()
    };
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    queues
        .send(&[
            order(&format!("sig-{run}-ok"), &paying),
            r#"{"id":"sig-bad","amount":"nine"}"#.to_owned(),
            order(&format!("sig-{run}-declined"), &declining),
        ])
        .await;
    let mut messages = Vec::new();
    for _ in 0..20 {
        messages.extend(queues.receive(Duration::from_secs(60)).await);
        if messages.len() >= 3 {
            break;
        }
    }
    assert_eq!(messages.len(), 3);
    let declined_id = messages
        .iter()
        .find(|m| m.body().unwrap().contains("declined"))
        .and_then(|m| m.message_id())
        .unwrap()
        .to_owned();

    authentication_after("0").await;
    let runtime = RuntimeApi::start().await;
    let endpoints = queues.endpoints(
        Backend::Moto.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );
    let log = log_dir().join(format!("sigv4-{run}.log"));
    let mut process = ConsumerProcess::launch(
        BIN.as_ref(),
        &runtime,
        &endpoints,
        Launch {
            env: [
                signed_by((&id, &secret), &secret_arn),
                vec![
                    ("MAX_DECLINES", "1".to_owned()),
                    ("RUST_LOG", "info".to_owned()),
                ],
            ]
            .concat(),
            ..Launch::logging_to(log.clone())
        },
    );
    let event = event_of(&messages, &queues.arn).to_string();
    let reply = runtime.invoke(event, Duration::from_secs(20)).await;
    process.stop();
    authentication_after("inf").await;

    let logs = std::fs::read_to_string(&log).unwrap();
    let Reply::Response(body) = reply else {
        panic!("{reply:?}\n{logs}");
    };
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        response["batchItemFailures"],
        json!([{"itemIdentifier": declined_id}]),
        "{logs}"
    );
    // Every queue call was accepted: no line says one failed.
    assert!(!logs.contains("queue_error"), "{logs}");
    let lines: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &Value| l["fields"]["outcome"].is_string())
        .collect();
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["fields"]["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes.len(), 3, "{logs}");
    for expected in ["charged", "invalid", "declined"] {
        assert!(outcomes.contains(&expected), "{outcomes:?}");
    }
    let dlq = queues.drain_dlq().await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].note_str("outcome"), Some("invalid"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_and_the_cold_start_stops_with_one_line() {
    let _one_at_a_time = AUTHENTICATION.lock().await;
    let secret_arn = api_key_secret().await;
    let (id, _) = function_user().await;
    let table = Backend::Moto.fresh_table().await;
    let queues = Queues::create(Duration::from_secs(30), 10).await;
    let endpoints = queues.endpoints(
        Backend::Moto.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );
    let runtime = RuntimeApi::start().await;
    authentication_after("0").await;
    let mut command = Command::new(BIN);
    lambda_environment(&mut command, &runtime.addr, &endpoints)
        .envs(signed_by((&id, "not-the-secret"), &secret_arn))
        .env("RUST_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    authentication_after("inf").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("PAYMENT_API_KEY_SECRET_ARN")
            && lines[0].contains("reading the secret failed"),
        "{stderr}"
    );
    assert!(
        !lines[0].contains("not-the-secret"),
        "the secret is never logged: {stderr}"
    );

    // What moto answered that call: a refused signature (as XML, which the JSON
    // client cannot read, hence the line's "unexpected token").
    authentication_after("0").await;
    let wrong = aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::config::Builder::from(&moto_sdk_config())
            .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new(
                id,
                "not-the-secret",
                None,
                None,
                "tests",
            ))
            .build(),
    );
    let refused = wrong.get_secret_value().secret_id(&secret_arn).send().await;
    authentication_after("inf").await;
    let raw = refused.expect_err("refused").raw_response().map(|r| {
        (
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().bytes().unwrap_or_default()).into_owned(),
        )
    });
    let (status, body) = raw.expect("an HTTP answer");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("SignatureDoesNotMatch"), "{body}");
}

/// An IAM user allowed `actions` (on every resource); its access key.
async fn user_allowed(name: &str, actions: &[&str]) -> (String, String) {
    let name = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    iam(&[("Action", "CreateUser"), ("UserName", &name)]).await;
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
        "Action": actions, "Resource": "*"}]});
    iam(&[
        ("Action", "PutUserPolicy"),
        ("UserName", &name),
        ("PolicyName", "only-these"),
        ("PolicyDocument", &policy.to_string()),
    ])
    .await;
    let key = iam(&[("Action", "CreateAccessKey"), ("UserName", &name)]).await;
    (
        xml_field(&key, "AccessKeyId").to_owned(),
        xml_field(&key, "SecretAccessKey").to_owned(),
    )
}

/// Every message of `queue` (authentication off: the harness's own read).
async fn read_all(queues: &Queues, queue: &str, want: usize) -> Vec<aws_sdk_sqs::types::Message> {
    let mut all = Vec::new();
    let started = std::time::Instant::now();
    while all.len() < want && started.elapsed() < Duration::from_secs(10) {
        let out = queues
            .client
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap();
        all.extend(out.messages.unwrap_or_default());
    }
    all
}

/// An order paid with the card that always asks for authentication.
fn awaiting_order(id: &str, payer: &Payer) -> String {
    json!({"id": id, "amount": 700, "currency": "EUR", "customer": payer.customer,
        "payment_method": payer.card})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripes_events_the_consumer_settling_them_and_the_settler_are_signed_as_moto_with_iam_authentication_accepts()
 {
    let _one_at_a_time = AUTHENTICATION.lock().await;
    // Setup, with authentication off: the table, the queues, the partner bus and its
    // rule, and three users: the function (the template's actions), Stripe's event
    // destination (PutEvents only), the scheduled settler (the index's Query too).
    let table = Backend::Moto.fresh_table().await;
    let queues = Queues::create(Duration::from_secs(30), 10).await;
    let reports = queues.create_report_queue().await;
    let secret_arn = api_key_secret().await;
    let (id, secret) = function_user().await;
    let stripe = user_allowed("stripe", &["events:PutEvents"]).await;
    let settler_key = user_allowed(
        "settler",
        &[
            "dynamodb:Query",
            "dynamodb:GetItem",
            "dynamodb:UpdateItem",
            "sqs:SendMessage",
        ],
    )
    .await;
    let run = format!("sig{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let source = harness::eventbridge::route_to_queue(&queues.arn).await;
    let bus = localstripe::EventDestination {
        endpoint: Backend::Moto.url().to_owned(),
        region: harness::eventbridge::REGION.to_owned(),
        access_key: stripe.0.clone(),
        secret_key: stripe.1.clone(),
        bus: source.clone(),
        source,
        order_id_prefix: Some(run.clone()),
        customer: None,
    };
    let destination = localstripe::arm_eventbridge(&bus).await;
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let orders: Vec<String> = (1..=3).map(|n| format!("{run}-{n}")).collect();
    let bodies: Vec<String> = orders.iter().map(|o| awaiting_order(o, &payer)).collect();
    queues.send(&bodies).await;
    let messages = read_all(&queues, &queues.url, 3).await;
    assert_eq!(messages.len(), 3);

    authentication_after("0").await;
    let runtime = RuntimeApi::start().await;
    let endpoints = queues.endpoints(
        Backend::Moto.url().to_owned(),
        localstripe_url().to_owned(),
        table.name.clone(),
    );
    let log = log_dir().join(format!("sigv4-{run}.log"));
    let mut process = ConsumerProcess::launch(
        BIN.as_ref(),
        &runtime,
        &endpoints,
        Launch {
            env: [
                signed_by((&id, &secret), &secret_arn),
                vec![
                    ("AUTHENTICATION_ENDED_QUEUE_URL", reports.clone()),
                    ("RUST_LOG", "info".to_owned()),
                ],
            ]
            .concat(),
            ..Launch::logging_to(log.clone())
        },
    );
    // The three orders await their customers; Stripe's destination puts the
    // payment_failed of each on the bus, signed with its own key.
    let reply = runtime
        .invoke(
            event_of(&messages, &queues.arn).to_string(),
            Duration::from_secs(20),
        )
        .await;
    let logs = || std::fs::read_to_string(&log).unwrap();
    let Reply::Response(body) = reply else {
        panic!("{reply:?}\n{}", logs());
    };
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["batchItemFailures"], json!([]), "{}", logs());
    // The harness reads the table with moto's test key, which authentication refuses.
    authentication_after("inf").await;
    let mut payments = Vec::new();
    for order in &orders {
        let record = table
            .store
            .get(&charge_once::domain::Key::for_order_id(order))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            record.state,
            charge_once::domain::State::Awaiting,
            "{record:?}"
        );
        payments.push(record.awaited.unwrap());
    }
    authentication_after("0").await;
    // The first customer confirms; the second payment is cancelled (the Dashboard);
    // the third customer never comes back.
    localstripe::authenticate(&payments[0]).await;
    let cancelled = harness::http_client()
        .post(format!(
            "{}/v1/payment_intents/{}/cancel",
            localstripe_url(),
            payments[1]
        ))
        .bearer_auth(localstripe::TEST_KEY)
        .send()
        .await
        .unwrap();
    assert!(cancelled.status().is_success());
    let published = localstripe::events_settled(&destination, Duration::from_secs(10)).await;
    assert_eq!(
        (published.published, published.failed),
        (5, 0),
        "moto accepted every PutEvents signed with the destination's key: {published:?}"
    );
    assert_eq!(published.of("payment_intent.succeeded"), 1, "{published:?}");
    assert_eq!(published.of("payment_intent.canceled"), 1, "{published:?}");

    authentication_after("inf").await;
    let events = read_all(&queues, &queues.url, 5).await;
    assert_eq!(events.len(), 5, "{events:?}");
    authentication_after("0").await;
    // The consumer settles them: a completion, an ended wait reported, three
    // failed attempts that leave the waits.
    let reply = runtime
        .invoke(
            event_of(&events, &queues.arn).to_string(),
            Duration::from_secs(20),
        )
        .await;
    let Reply::Response(body) = reply else {
        panic!("{reply:?}\n{}", logs());
    };
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["batchItemFailures"], json!([]), "{}", logs());

    // The scheduled settler, on a clock past the end of the waits, with its own key.
    let credentials = aws_sdk_dynamodb::config::Credentials::new(
        &settler_key.0,
        &settler_key.1,
        None,
        None,
        "tests",
    );
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&moto_sdk_config())
            .credentials_provider(credentials.clone())
            .build(),
    );
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&moto_sdk_config())
            .credentials_provider(credentials)
            .build(),
    );
    let store = charge_once::adapters::dynamodb::DynamoStore::new(dynamodb, table.name.clone());
    let provider = charge_once::adapters::payment_http::HttpProvider::new(
        localstripe_url(),
        &charge_once::config::Secret::new(localstripe::TEST_KEY.to_owned()),
        Duration::from_secs(5),
        &harness::tls(),
    )
    .unwrap();
    let report_queue = charge_once::adapters::sqs::SqsReports::new(sqs, &reports);
    let clock = harness::clock::TestClock::new();
    clock.advance(Duration::from_secs(8 * 24 * 3600));
    let settings = harness::rig::settler_settings(
        clock.clock(),
        Duration::from_secs(30 * 24 * 3600),
        Duration::from_secs(10),
    );
    let settled = charge_once::drivers::settle::Settler {
        store: &store,
        provider: &provider,
        refunds: None,
        reports: &report_queue,
        settings: &settings,
        time: Duration::from_secs(120),
        limit: 100,
        per_run: usize::MAX,
    }
    .run()
    .await
    .unwrap();
    // A destination whose key may not put events is refused by moto: the check is real.
    let refused = localstripe::arm_eventbridge(&localstripe::EventDestination {
        access_key: settler_key.0.clone(),
        secret_key: settler_key.1.clone(),
        order_id_prefix: Some(format!("{run}-refused")),
        ..bus.clone()
    })
    .await;
    let asks = harness::http_client()
        .post(format!("{}/v1/payment_intents", localstripe_url()))
        .bearer_auth(localstripe::TEST_KEY)
        .form(&[
            ("amount", "700"),
            ("currency", "eur"),
            ("customer", payer.customer.as_str()),
            ("payment_method", payer.card.as_str()),
            ("confirm", "true"),
            ("off_session", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
            ("metadata[order_id]", &format!("{run}-refused-1")),
        ])
        .send()
        .await
        .unwrap();
    assert!(asks.status().is_success());
    let not_put = localstripe::events_settled(&refused, Duration::from_secs(10)).await;
    assert_eq!((not_put.published, not_put.failed), (0, 1), "{not_put:?}");
    localstripe::disarm_eventbridge(&refused).await;
    process.stop();
    authentication_after("inf").await;
    localstripe::disarm_eventbridge(&destination).await;

    let logs = logs();
    assert!(!logs.contains("queue_error"), "{logs}");
    let outcomes: Vec<String> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["fields"]["outcome"].as_str().map(str::to_owned))
        .collect();
    for expected in [
        "authentication_required",
        "reconciled",
        "authentication_expired",
    ] {
        assert!(
            outcomes.iter().any(|o| o == expected),
            "{outcomes:?}\n{logs}"
        );
    }
    assert_eq!(
        (settled.read, settled.ended, settled.failed),
        (1, 1, 0),
        "{settled:?}"
    );
    let states: Vec<charge_once::domain::State> = {
        let mut states = Vec::new();
        for order in &orders {
            let key = charge_once::domain::Key::for_order_id(order);
            states.push(table.store.get(&key).await.unwrap().unwrap().state);
        }
        states
    };
    use charge_once::domain::State::{Done, Failed};
    assert_eq!(states, [Done, Failed, Failed]);
    let ended = read_all(&queues, &reports, 2).await;
    let mut reported: Vec<String> = ended
        .iter()
        .map(|m| {
            serde_json::from_str::<Value>(m.body().unwrap()).unwrap()["order_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    reported.sort();
    assert_eq!(reported, [orders[1].clone(), orders[2].clone()]);
}

/// The library's effect inside the store (its example: loyalty points), with an IAM
/// user's key whose policy holds what the library's page says a role needs:
/// `dynamodb:PutItem`, `dynamodb:UpdateItem` and `dynamodb:GetItem`. Moto asks for the
/// transaction's own name (`dynamodb:TransactWriteItems`), which AWS does not have: AWS
/// authorizes a transaction by the actions of its items. A key without it is refused,
/// and the record fails with nothing credited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_librarys_effect_inside_the_store_is_signed_as_moto_with_iam_authentication_accepts() {
    let _one_at_a_time = AUTHENTICATION.lock().await;
    let table = Backend::Moto.fresh_table().await;
    let allowed = user_with(&[
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "dynamodb:TransactWriteItems",
    ])
    .await;
    let refused = user_with(&[
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
    ])
    .await;
    let client = |(id, secret): &(String, String)| {
        let credentials =
            aws_sdk_dynamodb::config::Credentials::new(id, secret, None, None, "tests");
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&moto_sdk_config())
                .credentials_provider(credentials)
                .build(),
        )
    };
    let purchase = r#"{"id":"buy-1","customer":"cus-iam"}"#.to_owned();
    let batch = harness::rig::batch_of(&[purchase.clone(), purchase]);
    let deadline = idempotent_consumer::clock::Time::from_ms(idempotent_consumer::clock::wall_ms())
        + Duration::from_secs(60);

    authentication_after("0").await;
    let denied = loyalty_points::consumer(client(&refused), &table.name)
        .run(&batch, deadline)
        .await;
    let accepted = loyalty_points::consumer(client(&allowed), &table.name)
        .run(&batch, deadline)
        .await;
    authentication_after("inf").await;

    assert_eq!(denied.batch_item_failures.len(), 2, "refused without it");
    assert!(accepted.batch_item_failures.is_empty(), "{accepted:?}");
    let balance = table
        .client
        .get_item()
        .table_name(&table.name)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S("saldo#cus-iam".to_owned()),
        )
        .send()
        .await
        .unwrap();
    let saldo = balance.item().unwrap()["saldo"].as_n().unwrap().to_owned();
    assert_eq!(saldo, loyalty_points::POINTS.to_string(), "credited once");
}
