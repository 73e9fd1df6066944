//! The HTTP provider against stripe-stateful-mock (and moto's Secrets Manager), alone
//! and end to end through the handler: idempotent replays, declines, timeouts, TLS
//! that refuses an untrusted certificate (the payment client's and the SDK's), a wrong
//! key that never reaches the logs, a crash between charge and complete, and
//! reconciliation of keys the provider may have forgotten.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use charge_once::adapters::api_key;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::{Config, Secret};
use charge_once::contracts::payment::{ChargeListing, ChargePath, FailureKind, PaymentError};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, State};
use harness::lease::Lease;
use harness::logs::Captured;
use harness::rig::{Harness, Options, PAYMENT_TIMEOUT, PROVIDER_KEY_TTL, single_event_with_body};
use harness::stripe::{self, TEST_KEY};

fn http_provider(url: &str, key: &str, timeout: Duration) -> HttpProvider {
    HttpProvider::new(url, &Secret::new(key.to_owned()), timeout, &harness::tls()).unwrap()
}

fn provider_with_key(key: &str, timeout: Duration) -> HttpProvider {
    http_provider(harness::servers::stripe_mock_url(), key, timeout)
}

/// The HTTP provider with the test key, at `url` (a listener of the test's own).
fn provider_at(url: &str, timeout: Duration) -> HttpProvider {
    http_provider(url, TEST_KEY, timeout)
}

fn provider() -> HttpProvider {
    provider_with_key(TEST_KEY, PAYMENT_TIMEOUT)
}

fn unique_id() -> String {
    format!("ord-{}", uuid::Uuid::new_v4().simple())
}

fn order(id: &str, amount: u64, customer: &str) -> Order {
    Order::new(id, amount, "eur", customer).unwrap()
}

fn body(order: &Order) -> String {
    serde_json::json!({
        "id": order.id(), "amount": order.amount(), "currency": order.currency(), "customer": order.customer()
    })
    .to_string()
}

#[tokio::test]
async fn a_charge_returns_its_id_and_the_same_key_twice_returns_the_same_id() {
    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 5000, &customer);
    let key = Key::for_order(&order).provider_key(1);
    let first = provider().charge(&order, &key).await.unwrap();
    assert!(first.id.starts_with("ch_"), "{first:?}");
    let again = provider().charge(&order, &key).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(
        stripe::charges_of(&customer).await.len(),
        1,
        "the mock holds one charge"
    );
    let charge = &stripe::charges_of(&customer).await[0];
    assert_eq!(charge["amount"], 5000);
    assert_eq!(charge["currency"], "eur");
    assert_eq!(charge["metadata"]["order_id"], order.id());
}

#[tokio::test]
async fn the_declining_customer_is_declined_with_its_code() {
    let customer = stripe::customer("tok_chargeCustomerFail").await;
    let order = order(&unique_id(), 700, &customer);
    match provider()
        .charge(&order, &Key::for_order(&order).provider_key(1))
        .await
    {
        Err(PaymentError::Declined { code, decline_code }) => {
            assert_eq!(code, "card_declined");
            assert_eq!(decline_code.as_deref(), Some("generic_decline"));
        }
        other => panic!("expected Declined, got {other:?}"),
    }
    assert!(stripe::succeeded_charges_of(&customer).await.is_empty());
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_needs_reconciliation() {
    let customer = stripe::customer("tok_visa").await;
    let id = unique_id();
    let key = Key::for_order_id(&id).provider_key(1);
    provider()
        .charge(&order(&id, 100, &customer), &key)
        .await
        .unwrap();
    let other = provider().charge(&order(&id, 200, &customer), &key).await;
    assert!(matches!(other, Err(PaymentError::KeyReused)), "{other:?}");
}

#[tokio::test]
async fn a_closed_port_fails_within_the_timeout_and_keeps_the_key() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let provider = provider_at(&url, Duration::from_secs(2));
    let started = Instant::now();
    let result = provider
        .charge(&order("ord-closed", 100, "cus_x"), "cobro#ord-closed#1")
        .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Connection,
                ..
            })
        ),
        "{result:?}"
    );
}

/// The whole chain of an error, as one line: where the TLS alert is.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

#[tokio::test]
async fn a_payment_api_whose_certificate_no_trusted_root_signed_is_refused_and_keeps_the_key() {
    let server = harness::servers::SelfSignedTls::start();
    let provider = provider_at(&server.url, Duration::from_secs(5));
    let result = provider
        .charge(
            &order("ord-untrusted", 100, "cus_x"),
            "cobro#ord-untrusted#1",
        )
        .await;
    match &result {
        Err(
            error @ PaymentError::Retryable {
                kind: FailureKind::Connection,
                ..
            },
        ) => {
            assert!(
                chain(error).contains("invalid peer certificate"),
                "{}",
                chain(error)
            );
        }
        other => panic!("expected a refused certificate, got {other:?}"),
    }
}

#[tokio::test]
async fn the_store_refuses_an_endpoint_whose_certificate_no_trusted_root_signed() {
    let server = harness::servers::SelfSignedTls::start();
    let store = charge_once::adapters::dynamodb::DynamoStore::new(
        harness::servers::Backend::client_at(&server.url),
        "orders".to_owned(),
    );
    let order = order("ord-untrusted", 100, "cus_x");
    let error =
        charge_once::contracts::store::IdempotencyStore::get(&store, &Key::for_order(&order))
            .await
            .unwrap_err();
    assert!(
        chain(&error).contains("invalid peer certificate"),
        "{}",
        chain(&error)
    );
}

#[tokio::test]
async fn a_certificate_in_aws_ca_bundle_is_trusted_by_both_clients() {
    let server = harness::servers::SelfSignedTls::start();
    let tls = charge_once::adapters::tls::Tls::new(Some(&server.cert)).unwrap();
    // The handshake succeeds and the server answers a GET with an HTML page: no
    // charge. (openssl s_server answers GET only: a POST waits, so the store's read
    // below ends in its timeout, after the handshake.)
    let provider = HttpProvider::new(
        &server.url,
        &Secret::new(TEST_KEY.into()),
        Duration::from_secs(5),
        &tls,
    )
    .unwrap();
    let looked_up = provider.charge_by_id("ch_bundle").await;
    match &looked_up {
        Err(error) => assert!(
            chain(error).contains("unexpected provider response"),
            "{}",
            chain(error)
        ),
        Ok(found) => panic!("an HTML page is no charge: {found:?}"),
    }
    let store = charge_once::adapters::dynamodb::DynamoStore::new(
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::Config::builder()
                .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
                .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
                .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                    "test", "test", None, None, "tests",
                ))
                .endpoint_url(&server.url)
                .http_client(charge_once::adapters::sdk_http::client(&tls))
                .timeout_config(
                    aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                        .operation_timeout(Duration::from_secs(2))
                        .build(),
                )
                .build(),
        ),
        "orders".to_owned(),
    );
    let order = order("ord-bundle", 100, "cus_x");
    let read =
        charge_once::contracts::store::IdempotencyStore::get(&store, &Key::for_order(&order)).await;
    let error = chain(&read.unwrap_err());
    assert!(error.contains("timeout"), "{error}");
    assert!(!error.contains("certificate"), "{error}");
}

#[tokio::test]
async fn a_listener_that_never_answers_fails_within_the_timeout_and_keeps_the_key() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Accepts, reads nothing, answers nothing; bounded by the test.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..4 {
            if let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let timeout = Duration::from_millis(800);
    let provider = provider_at(&url, timeout);
    let started = Instant::now();
    let result = provider
        .charge(&order("ord-silent", 100, "cus_x"), "cobro#ord-silent#1")
        .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Timeout,
                ..
            })
        ),
        "{result:?}"
    );
    silent.abort();
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_fails_retryably_keeping_the_key() {
    // Answers every request with a 307 to the mock's own charge endpoint: a client that
    // followed it would POST the charge there again, and the mock would charge.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let location = format!("{}/v1/charges", harness::servers::stripe_mock_url());
    let redirecting = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for _ in 0..4 {
            let Ok((mut socket, _)) = listener.accept().await else {
                break;
            };
            let mut request = [0u8; 8192];
            let _ = socket.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 4200, &customer);
    let redirected = provider_at(&url, PAYMENT_TIMEOUT);
    let result = redirected
        .charge(&order, &Key::for_order(&order).provider_key(1))
        .await;
    assert!(
        matches!(
            result,
            Err(PaymentError::Retryable {
                kind: FailureKind::Redirect(307),
                ..
            })
        ),
        "{result:?}"
    );
    assert!(
        stripe::charges_of(&customer).await.is_empty(),
        "the redirect was followed: the mock charged"
    );
    redirecting.abort();
}

#[tokio::test]
async fn a_2xx_charge_without_a_status_is_not_a_receipt() {
    // A provider (or a proxy) that answers 200 with a charge id and no status: the
    // outcome is unknown, as the lookup and the audit read such a charge.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answering = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0u8; 8192];
            let _ = socket.read(&mut request).await;
            let body = r#"{"id":"ch_without_status","object":"charge"}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    let order = order(&unique_id(), 4200, "cus_any");
    let result = provider_at(&url, PAYMENT_TIMEOUT)
        .charge(&order, &Key::for_order(&order).provider_key(1))
        .await;
    assert!(
        matches!(
            &result,
            Err(PaymentError::Pending { charge_id, status })
                if charge_id == "ch_without_status" && status == "unknown"
        ),
        "{result:?}"
    );
    answering.abort();
}

#[tokio::test]
async fn a_wrong_key_fails_the_record_and_no_fragment_of_it_reaches_the_logs() {
    let wrong_key = "qZxJvWpKmQbTrYgHfNdLsXcV";
    let logs = Captured::default();
    let _guard = logs.install();

    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 1500, &customer);
    let h = Harness::new(provider_with_key(wrong_key, PAYMENT_TIMEOUT)).await;
    let event = single_event_with_body(&body(&order));
    let failed = h.invoke_event_with(event, harness::rig::INVOCATION).await;
    assert_eq!(failed.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(1), "a 401 keeps the key");
    assert!(stripe::charges_of(&customer).await.is_empty());

    let text = logs.text();
    assert!(text.contains("provider refused the API key"), "{text}");
    for window in wrong_key.as_bytes().windows(4) {
        let fragment = std::str::from_utf8(window).unwrap();
        assert!(
            !text.contains(fragment),
            "key fragment {fragment:?} in logs:\n{text}"
        );
    }
}

#[tokio::test]
async fn the_api_key_is_read_from_a_secrets_manager_secret_in_moto() {
    let sdk = harness::servers::moto_sdk_config();
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let name = format!("charge-once/{}", uuid::Uuid::new_v4().simple());
    let created = secrets
        .create_secret()
        .name(&name)
        .secret_string(r#"{"api_key":"sk_test_fromsecret"}"#)
        .send()
        .await
        .unwrap();
    let arn = created.arn().unwrap().to_owned();
    let config = Config::from_lookup(|var| match var {
        "PAYMENT_API_KEY_SECRET_ARN" => Some(arn.clone()),
        "PAYMENT_API_KEY" => Some("sk_test_loses".to_owned()),
        _ => None,
    })
    .unwrap();
    let key = api_key::load(&config, &sdk).await.unwrap();
    assert_eq!(
        key.expose(),
        "sk_test_fromsecret",
        "the ARN wins over the plain variable"
    );

    let missing = Config::from_lookup(|var| {
        (var == "PAYMENT_API_KEY_SECRET_ARN").then(|| format!("{arn}-missing"))
    })
    .unwrap();
    let err = api_key::load(&missing, &sdk).await.unwrap_err();
    assert!(
        err.to_string().starts_with("PAYMENT_API_KEY_SECRET_ARN="),
        "{err}"
    );
}

/// Reserve, charge through the HTTP client, die before `complete` is written.
async fn charge_then_die(h: &Harness<HttpProvider>, order: &Order) {
    h.store
        .hang_completes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    h.invoke_and_die(single_event_with_body(&body(order)), Duration::from_secs(3))
        .await;
}

#[tokio::test]
async fn a_crash_between_charge_and_complete_is_replayed_by_the_next_owner_and_charges_once() {
    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 4200, &customer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let first = stripe::succeeded_charges_of(&customer).await;
    assert_eq!(first.len(), 1, "charged before the crash");
    assert_eq!(h.record(order.id()).await.unwrap().state, State::InProgress);

    // After the lease expires, a second invocation takes over and replays the key.
    h.redeliver_later();
    let failed = h
        .invoke_event_with(
            single_event_with_body(&body(&order)),
            harness::rig::INVOCATION,
        )
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt.as_deref(),
        Some(first[0].as_str()),
        "the same charge id"
    );
    assert_eq!(
        stripe::charges_of(&customer).await.len(),
        1,
        "the mock holds one charge"
    );
}

#[tokio::test]
async fn an_old_key_is_reconciled_and_the_charge_found_is_completed() {
    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 990, &customer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let charged = stripe::succeeded_charges_of(&customer).await;
    assert_eq!(charged.len(), 1);

    // A day later the key is older than PROVIDER_KEY_TTL: look up, do not re-send.
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    let failed = h
        .invoke_event_with(
            single_event_with_body(&body(&order)),
            harness::rig::INVOCATION,
        )
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(charged[0].as_str()));
    assert_eq!(record.attempt, Some(1), "found: no new attempt");
    assert_eq!(stripe::charges_of(&customer).await.len(), 1);
}

#[tokio::test]
async fn an_old_key_not_found_moves_to_the_next_attempt_and_charges_once() {
    let customer = stripe::customer("tok_visa").await;
    let order = order(&unique_id(), 1234, &customer);
    let h = Harness::new(provider()).await;
    // A reservation made a day ago whose invocation died before sending anything.
    Lease::of(&order, "died-before-sending", h.clock.now())
        .max_declines(harness::rig::MAX_DECLINES)
        .make(h.table.store.as_ref())
        .await;
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));

    let failed = h
        .invoke_event_with(
            single_event_with_body(&body(&order)),
            harness::rig::INVOCATION,
        )
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.attempt, Some(2), "not found: the next attempt's key");
    let charges = stripe::succeeded_charges_of(&customer).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(record.receipt.as_deref(), Some(charges[0].as_str()));
}

#[tokio::test]
async fn a_declined_order_is_retried_with_attempt_two_and_can_succeed() {
    let customer = stripe::customer("tok_chargeCustomerFail").await;
    let order = order(&unique_id(), 3100, &customer);
    let h = Harness::new(provider()).await;
    let event = single_event_with_body(&body(&order));
    assert_eq!(
        h.invoke_event_with(event.clone(), harness::rig::INVOCATION)
            .await
            .len(),
        1
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(2)));

    // The customer fixes their card; SQS redelivers.
    stripe::replace_card(&customer, "tok_visa").await;
    h.redeliver_later();
    assert!(
        h.invoke_event_with(event, harness::rig::INVOCATION)
            .await
            .is_empty()
    );
    let charges = stripe::charges_of(&customer).await;
    assert_eq!(
        charges.len(),
        2,
        "one decline under #1, one charge under #2"
    );
    let succeeded = stripe::succeeded_charges_of(&customer).await;
    assert_eq!(succeeded.len(), 1);
    assert_eq!(
        h.record(order.id()).await.unwrap().receipt.as_deref(),
        Some(succeeded[0].as_str())
    );
}

#[tokio::test]
async fn a_charge_the_provider_rejects_for_good_fails_as_rejected_with_its_code_and_keeps_the_key()
{
    let logs = Captured::default();
    let _guard = logs.install();
    // The provider has no such customer: 404 `resource_missing`, on every retry alike.
    let order = order(&unique_id(), 800, "cus_nobodyknows");
    let h = Harness::new(provider()).await;
    let failed = h
        .invoke_event_with(
            single_event_with_body(&body(&order)),
            harness::rig::INVOCATION,
        )
        .await;
    assert_eq!(failed.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));

    let text = logs.text();
    let line: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["fields"]["outcome"].is_string())
        .unwrap_or_else(|| panic!("no outcome line:\n{text}"));
    assert_eq!(line["fields"]["outcome"], "rejected", "{line}");
    assert_eq!(line["level"], "ERROR", "{line}");
    assert_eq!(line["fields"]["code"], "resource_missing", "{line}");
    assert_eq!(line["fields"]["status"], 404, "{line}");
    assert!(
        !text.contains("No such customer"),
        "provider text is never logged"
    );
}

#[tokio::test]
async fn a_404_that_names_no_missing_object_is_a_setting_fault_retried_never_rejected() {
    // A base URL pasted with its `/v1`: every charge goes to /v1/v1/charges, which the
    // provider answers 404 without `resource_missing`. Every order would fail alike, so
    // it is a setting to fix: retried with the key kept, at error level, counted by the
    // breaker; never `rejected`, which would dead-letter every order.
    let logs = Captured::default();
    let _guard = logs.install();
    let url = format!("{}/v1", harness::servers::stripe_mock_url());
    let options = Options {
        breaker_threshold: Some(2),
        ..Options::default()
    };
    let h = Harness::with(provider_at(&url, PAYMENT_TIMEOUT), options).await;
    let customer = stripe::customer("tok_visa").await;
    let orders: Vec<Order> = (0..3)
        .map(|_| order(&unique_id(), 900, &customer))
        .collect();
    for order in &orders {
        let event = single_event_with_body(&body(order));
        let failed = h.invoke_event_with(event, harness::rig::INVOCATION).await;
        assert_eq!(failed.len(), 1);
    }
    let lines: Vec<serde_json::Value> = logs
        .text()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["fields"]["outcome"].is_string())
        .collect();
    let seen: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["fields"]["outcome"].as_str().unwrap(),
                l["level"].as_str().unwrap(),
            )
        })
        .collect();
    // Two failures in a row open the breaker: the third order is deferred.
    assert_eq!(
        seen,
        [
            ("failed_retryable", "ERROR"),
            ("failed_retryable", "ERROR"),
            ("deferred", "WARN")
        ]
    );
    assert!(
        lines[0]["fields"]["reason"]
            .as_str()
            .unwrap()
            .contains("check PAYMENT_API_URL"),
        "{}",
        lines[0]
    );
    let record = h.record(orders[0].id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    assert!(
        h.record(orders[2].id()).await.is_none(),
        "deferred: no write"
    );
    assert!(stripe::charges_of(&customer).await.is_empty());
}

/// The audit's reads: every page of the listing (more than one page of 100 here), each
/// charge once with what the audit compares; one charge by id; an unknown id is none.
#[tokio::test]
async fn the_audit_lists_every_page_of_charges_and_finds_one_by_id() {
    let p = provider();
    let customer = stripe::customer("tok_visa").await;
    let since = charge_once::domain::clock::Time::from_ms(charge_once::domain::clock::wall_ms())
        - Duration::from_secs(5);
    let mut made = Vec::new();
    for n in 0..130 {
        let o = order(&unique_id(), 100 + n, &customer);
        let receipt = p.charge(&o, &format!("{}#1", o.id())).await.unwrap();
        made.push((receipt.id, o));
    }
    let listed = p.charges_since(since).await.unwrap();
    let mine: Vec<_> = listed
        .iter()
        .filter(|c| c.customer.as_deref() == Some(customer.as_str()))
        .collect();
    assert_eq!(mine.len(), made.len(), "each charge listed once");
    for (id, o) in &made {
        let c = mine.iter().find(|c| c.id == *id).expect("listed");
        assert_eq!(c.order_id.as_deref(), Some(o.id()));
        assert_eq!((c.amount, c.currency.as_str()), (o.amount(), "eur"));
        assert!(c.succeeded() && c.created.as_secs() >= since.as_secs());
    }
    let (id, o) = &made[0];
    let one = p.charge_by_id(id).await.unwrap().expect("found by id");
    assert_eq!(one.order_id.as_deref(), Some(o.id()));
    assert_eq!(p.charge_by_id("ch_never_issued").await.unwrap(), None);
    // A receipt is whatever the table holds: it stays one path segment.
    assert_eq!(p.charge_by_id("../customers").await.unwrap(), None);
}
