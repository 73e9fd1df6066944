//! The HTTP provider against localstripe behind its layer (and moto's Secrets
//! Manager), alone and end to end through the handler: PaymentIntents and their
//! idempotent replays under the pinned `Stripe-Version`, declines, authentication
//! required, cancels of open payments, lookups and the audit's listing page by page,
//! timeouts, TLS that refuses an untrusted certificate (the payment client's and the
//! SDK's), a wrong key that never reaches the logs, a crash between charge and
//! complete, reconciliation of keys the provider may have forgotten, and the
//! provider's advice not to retry; lookups bounded by `created[gte]` past thousands of
//! earlier payments, and the classification of 402 and 429 answers from a loopback
//! listener.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use charge_once::adapters::api_key;
use charge_once::adapters::payment_http::{HttpProvider, STRIPE_VERSION};
use charge_once::config::{Config, Secret};
use charge_once::contracts::payment::{
    Cancel, ChargePath, FailureKind, Limiter, Lookup, PaymentError, PaymentListing,
};
use charge_once::domain::clock::Time;
use charge_once::domain::order::Order;
use charge_once::domain::{Key, State};
use harness::lease::Lease;
use harness::localstripe::{self, Card, Payer, TEST_KEY};
use harness::logs::Captured;
use harness::rig::{Harness, Options, PAYMENT_TIMEOUT, PROVIDER_KEY_TTL, single_event_with_body};
use serde_json::Value;

fn http_provider(url: &str, key: &str, timeout: Duration) -> HttpProvider {
    HttpProvider::new(url, &Secret::new(key.to_owned()), timeout, &harness::tls()).unwrap()
}

fn provider_with_key(key: &str, timeout: Duration) -> HttpProvider {
    http_provider(harness::servers::localstripe_url(), key, timeout)
}

/// The HTTP provider with the test key, at `url` (a listener of the test's own).
fn provider_at(url: &str, timeout: Duration) -> HttpProvider {
    http_provider(url, TEST_KEY, timeout)
}

/// The provider for calls made outside any invocation that are not about time: a
/// generous timeout, so a loaded machine's slow page of a hundred payments is not read
/// as a lost answer (the tests about timeouts set their own).
fn provider() -> HttpProvider {
    provider_with_key(TEST_KEY, DIRECT_CALL_TIMEOUT)
}

const DIRECT_CALL_TIMEOUT: Duration = Duration::from_secs(15);

fn unique_id() -> String {
    format!("ord-{}", uuid::Uuid::new_v4().simple())
}

/// An order for a listener of the test's own (no provider holds its customer).
fn order(id: &str, amount: u64, customer: &str) -> Order {
    Order::new(id, amount, "eur", customer, "pm_card_visa").unwrap()
}

/// An order of `payer`, paid with their card.
fn order_of(id: &str, amount: u64, payer: &Payer) -> Order {
    Order::new(id, amount, "eur", &payer.customer, &payer.card).unwrap()
}

/// One delivery of `order`, with a whole invocation's time: the ids that failed.
async fn invoke_order<P: ChargePath + 'static>(h: &Harness<P>, order: &Order) -> Vec<String> {
    h.invoke_event_with(
        single_event_with_body(&body(order)),
        harness::rig::INVOCATION,
    )
    .await
}

fn body(order: &Order) -> String {
    serde_json::json!({
        "id": order.id(), "amount": order.amount(), "currency": order.currency(),
        "customer": order.customer(), "payment_method": order.payment_method()
    })
    .to_string()
}

fn key(order: &Order, attempt: u32) -> String {
    Key::for_order(order).provider_key(attempt)
}

fn status(intent: &Value) -> &str {
    intent["status"].as_str().unwrap_or_default()
}

fn statuses(intents: &[Value]) -> Vec<&str> {
    intents.iter().map(status).collect()
}

#[tokio::test]
async fn a_payment_and_its_replay_are_one_payment_intent_made_under_the_pinned_version() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 5000, &payer);
    let key = key(&order, 1);
    let first = provider().charge(&order, &key).await.unwrap();
    assert!(first.id.starts_with("pi_"), "{first:?}");
    assert!(
        first
            .charge
            .as_deref()
            .is_some_and(|c| c.starts_with("ch_")),
        "{first:?}"
    );
    let again = provider().charge(&order, &key).await.unwrap();
    assert_eq!(again, first);

    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(intents.len(), 1, "one PaymentIntent: {intents:?}");
    let intent = &intents[0];
    assert_eq!(intent["id"], first.id.as_str());
    assert_eq!(status(intent), "succeeded");
    assert_eq!(intent["amount"], 5000);
    assert_eq!(intent["currency"], "eur");
    assert_eq!(intent["payment_method"], payer.card.as_str());
    assert_eq!(intent["metadata"]["order_id"], order.id());
    assert_eq!(
        intent["automatic_payment_methods"],
        serde_json::json!({"enabled": true, "allow_redirects": "never"}),
        "no redirect-based method can be chosen off-session"
    );
    assert_eq!(
        intent["payment_method_options"]["card"]["stored_credential_usage"], "unscheduled",
        "a merchant-initiated charge on a saved card says so"
    );
    assert_eq!(
        localstripe::versions_sent_under(&key).await,
        [STRIPE_VERSION, STRIPE_VERSION],
        "both requests carried the pinned version"
    );
}

#[tokio::test]
async fn a_decline_and_its_replay_are_declined_with_their_code_and_leave_one_open_payment() {
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 700, &payer);
    let key = key(&order, 1);
    let mut named = Vec::new();
    for _ in 0..2 {
        match provider().charge(&order, &key).await {
            Err(PaymentError::Declined {
                code,
                decline_code,
                payment_id,
            }) => {
                assert_eq!(code, "card_declined");
                // localstripe names no decline_code (Stripe does).
                assert_eq!(decline_code, None);
                named.push(payment_id);
            }
            other => panic!("expected Declined, got {other:?}"),
        }
    }
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(
        statuses(&intents),
        ["requires_payment_method"],
        "{intents:?}"
    );
    let left = intents[0]["id"].as_str().unwrap().to_owned();
    assert!(left.starts_with("pi_"), "{left}");
    assert_eq!(
        named,
        [Some(left.clone()), Some(left)],
        "the decline and its replay name the PaymentIntent localstripe made"
    );
    assert_eq!(intents[0]["metadata"]["order_id"], order.id());
    match provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    {
        Lookup::Open {
            payment_id, status, ..
        } => {
            assert_eq!(payment_id, intents[0]["id"].as_str().unwrap());
            assert_eq!(status, "requires_payment_method");
        }
        other => panic!("expected the declined payment open, got {other:?}"),
    }
}

#[tokio::test]
async fn a_payment_that_needs_the_customer_names_its_payment_intent_which_stays_open() {
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let order = order_of(&unique_id(), 2500, &payer);
    let payment_id = match provider().charge(&order, &key(&order, 1)).await {
        Err(PaymentError::AuthenticationRequired {
            payment_id: Some(id),
        }) => id,
        other => panic!("expected AuthenticationRequired with its id, got {other:?}"),
    };
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["requires_action"]);
    assert_eq!(intents[0]["id"], payment_id.as_str());
    assert_eq!(
        provider()
            .find_payment(&order, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::Open {
            payment_id: payment_id.clone(),
            status: "requires_action".into(),
            awaits_customer: true,
        }
    );
    // The customer confirms it on the shop's page: the lookup finds it paid.
    localstripe::authenticate(&payment_id).await;
    match provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    {
        Lookup::Succeeded(receipt) => assert_eq!(receipt.id, payment_id),
        other => panic!("expected the authenticated payment, got {other:?}"),
    }
}

#[tokio::test]
async fn an_open_payment_is_cancelled_once_and_a_succeeded_one_cannot_be() {
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 1100, &declining);
    let declined = provider().charge(&order, &key(&order, 1)).await;
    assert!(
        matches!(declined, Err(PaymentError::Declined { .. })),
        "{declined:?}"
    );
    let Lookup::Open { payment_id, .. } = provider()
        .find_payment(&order, Time::from_ms(0))
        .await
        .unwrap()
    else {
        panic!("the declined payment is open")
    };
    assert_eq!(
        provider().cancel(&payment_id).await.unwrap(),
        Cancel::Cancelled
    );
    assert_eq!(
        statuses(&localstripe::payment_intents_of(&declining.customer).await),
        ["canceled"]
    );
    assert_eq!(
        provider()
            .find_payment(&order, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::NotFound,
        "a cancelled payment does not count"
    );
    assert_eq!(
        provider().cancel(&payment_id).await.unwrap(),
        Cancel::NotCancellable,
        "cancelled already"
    );

    let paying = localstripe::payer(Card::Visa).await;
    let paid = order_of(&unique_id(), 1100, &paying);
    let receipt = provider().charge(&paid, &key(&paid, 1)).await.unwrap();
    assert_eq!(
        provider().cancel(&receipt.id).await.unwrap(),
        Cancel::NotCancellable
    );
    assert_eq!(
        localstripe::succeeded_of(&paying.customer).await,
        [receipt.id]
    );
    // No such payment: the provider names the missing object.
    let unknown = provider().cancel("pi_never_issued").await;
    assert!(
        matches!(
            unknown,
            Err(PaymentError::Rejected {
                status: 404,
                code: Some(ref code)
            }) if code == "resource_missing"
        ),
        "{unknown:?}"
    );
}

/// More than one page of the customer's PaymentIntents (100 a page): the order's
/// payment is found on the last one, and "not found" is said only after every page.
#[tokio::test]
async fn a_lookup_reads_every_page_of_the_customers_payments() {
    let p = provider();
    let payer = localstripe::payer(Card::Visa).await;
    for n in 0..100 {
        let other = order_of(&unique_id(), 200 + n, &payer);
        p.charge(&other, &key(&other, 1)).await.unwrap();
    }
    let order = order_of(&unique_id(), 4321, &payer);
    assert_eq!(
        p.find_payment(&order, Time::from_ms(0)).await.unwrap(),
        Lookup::NotFound
    );
    let receipt = p.charge(&order, &key(&order, 1)).await.unwrap();
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        101
    );
    match p.find_payment(&order, Time::from_ms(0)).await.unwrap() {
        Lookup::Succeeded(found) => assert_eq!(found.id, receipt.id),
        other => panic!("expected the order's payment on page two, got {other:?}"),
    }
    // The same order id with another amount is not this order's payment.
    let other_amount = order_of(order.id(), 4322, &payer);
    assert_eq!(
        p.find_payment(&other_amount, Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::NotFound
    );
}

fn now() -> Time {
    Time::from_ms(charge_once::domain::clock::wall_ms())
}

/// The customer's listings that reached the layer (the log is shared by the binary's
/// tests: the customer is this test's own).
async fn listings_of(customer: &str) -> Vec<localstripe::SeenRequest> {
    localstripe::requests_seen(Some("/v1/payment_intents"))
        .await
        .into_iter()
        .filter(|r| r.method == "GET" && r.param("customer") == Some(customer))
        .collect()
}

/// 5,000 earlier PaymentIntents of the customer, made two days ago: a lookup bounded by
/// the record's creation reads one page and finds the order; one from the epoch reads
/// every page it may and refuses to say "not found".
#[tokio::test]
async fn a_lookup_bounded_by_the_records_creation_reads_one_page_past_thousands_of_earlier_payments()
 {
    let payer = localstripe::payer(Card::Visa).await;
    let two_days_ago = now() - Duration::from_secs(2 * 86_400);
    localstripe::seed_payment_intents(&payer.customer, 5_000, two_days_ago.as_secs()).await;
    let order = order_of(&unique_id(), 3300, &payer);
    let since = now() - Duration::from_secs(60);
    let receipt = provider().charge(&order, &key(&order, 1)).await.unwrap();

    assert_eq!(
        provider().find_payment(&order, since).await.unwrap(),
        Lookup::Succeeded(receipt.clone())
    );
    let bounded = listings_of(&payer.customer).await;
    assert_eq!(bounded.len(), 1, "one page: {bounded:?}");
    assert_eq!(
        bounded[0].param("created[gte]"),
        Some(since.as_secs().to_string().as_str())
    );
    assert_eq!(bounded[0].param("starting_after"), None);

    // From the epoch the order's payment is past the pages a lookup reads: an error,
    // never a false "not found" that would send a new key.
    let unbounded = provider().find_payment(&order, Time::from_ms(0)).await;
    assert!(
        matches!(
            unbounded,
            Err(PaymentError::Retryable {
                kind: FailureKind::BadResponse,
                ..
            })
        ),
        "{unbounded:?}"
    );
    let all = listings_of(&payer.customer).await;
    assert!(all.len() > 2, "it read page after page: {}", all.len());
    assert!(all.len() <= 1 + 5_001 / 100, "bounded: {}", all.len());
    assert!(
        all.iter().all(|r| r.param("created[gte]").is_some()),
        "created[gte] on every lookup: {all:?}"
    );
}

/// Charge (a decline), lookup, fetch by id and cancel, and the audit's two listings:
/// every request the provider makes carries the pinned version, whatever the account's
/// default, and names only what Stripe declares for that version (the layer refuses
/// anything else with Stripe's `parameter_unknown`, so each call below succeeding holds
/// its request to that).
#[tokio::test]
async fn every_request_the_provider_makes_carries_the_pinned_version_and_only_declared_names() {
    let p = provider();
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 1900, &payer);
    let key = key(&order, 1);
    let Err(PaymentError::Declined {
        payment_id: Some(payment_id),
        ..
    }) = p.charge(&order, &key).await
    else {
        panic!("expected a decline naming its PaymentIntent")
    };
    assert!(matches!(
        p.find_payment(&order, now() - Duration::from_secs(60))
            .await
            .unwrap(),
        Lookup::Open { .. }
    ));
    assert!(p.payment_by_id(&payment_id).await.unwrap().is_some());
    assert_eq!(p.cancel(&payment_id).await.unwrap(), Cancel::Cancelled);
    let since = now() - Duration::from_secs(60);
    assert!(
        p.payments_since(since)
            .await
            .unwrap()
            .iter()
            .any(|l| l.id == payment_id)
    );
    p.confirmed_since(since).await.unwrap();

    let seen = localstripe::requests_seen(None).await;
    let intent_path = format!("/v1/payment_intents/{payment_id}");
    let cancel_path = format!("{intent_path}/cancel");
    let mine: Vec<(&str, &str, &str)> = seen
        .iter()
        .filter(|r| {
            r.idempotency_key.as_deref() == Some(key.as_str())
                || r.param("customer") == Some(payer.customer.as_str())
                || r.path == intent_path
                || r.path == cancel_path
        })
        .map(|r| {
            (
                r.method.as_str(),
                r.path.as_str(),
                r.stripe_version.as_str(),
            )
        })
        .collect();
    assert_eq!(
        mine,
        [
            ("POST", "/v1/payment_intents", STRIPE_VERSION),
            ("GET", "/v1/payment_intents", STRIPE_VERSION),
            ("GET", intent_path.as_str(), STRIPE_VERSION),
            ("POST", cancel_path.as_str(), STRIPE_VERSION),
        ]
    );
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_needs_reconciliation() {
    let payer = localstripe::payer(Card::Visa).await;
    let id = unique_id();
    let key = Key::for_order_id(&id).provider_key(1);
    provider()
        .charge(&order_of(&id, 100, &payer), &key)
        .await
        .unwrap();
    let other = provider().charge(&order_of(&id, 200, &payer), &key).await;
    assert!(matches!(other, Err(PaymentError::KeyReused)), "{other:?}");
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1
    );
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
    let looked_up = provider.payment_by_id("ch_bundle").await;
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
    // Answers every request with a 307 to localstripe's own PaymentIntents: a client
    // that followed it would POST the payment there again, and it would be charged.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let location = format!("{}/v1/payment_intents", harness::servers::localstripe_url());
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
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4200, &payer);
    let redirected = provider_at(&url, PAYMENT_TIMEOUT);
    let result = redirected.charge(&order, &key(&order, 1)).await;
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
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty(),
        "the redirect was followed: localstripe charged"
    );
    redirecting.abort();
}

/// A loopback listener that answers every request with `answer` (a whole HTTP
/// response) and counts the requests; bounded in connections.
async fn answering(answer: String) -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    let task = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for _ in 0..8 {
            let Ok((mut socket, _)) = listener.accept().await else {
                break;
            };
            let mut request = [0u8; 8192];
            let _ = socket.read(&mut request).await;
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    (url, seen, task)
}

fn json_answer(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// What the provider makes of `answer` to a charge.
async fn charged_against(
    answer: String,
) -> Result<charge_once::contracts::payment::Receipt, PaymentError> {
    let (url, seen, task) = answering(answer).await;
    let order = order(&unique_id(), 4200, "cus_any");
    let result = provider_at(&url, Duration::from_secs(5))
        .charge(&order, &key(&order, 1))
        .await;
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "one request, no retry inside"
    );
    task.abort();
    result
}

#[tokio::test]
async fn a_402_whose_decline_code_asks_for_authentication_awaits_the_customer() {
    // Stripe's card error for an issuer that wants authentication: `code` is the
    // generic `card_declined`, the reason is in `decline_code`.
    let body = r#"{"error":{"type":"card_error","code":"card_declined","decline_code":"authentication_required","charge":"ch_1","payment_intent":{"id":"pi_awaits","object":"payment_intent","status":"requires_payment_method"}}}"#;
    let result = charged_against(json_answer("402 Payment Required", "", body)).await;
    assert!(
        matches!(
            &result,
            Err(PaymentError::AuthenticationRequired { payment_id: Some(id) }) if id == "pi_awaits"
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_3ds_partners_error_is_the_providers_trouble_retried_with_the_key_never_a_decline() {
    // 2026-10-28.endive's code for a 3-D Secure partner that failed Stripe.
    let body = r#"{"error":{"type":"card_error","code":"three_d_secure_authentication_upstream_error","message":"An error with the authentication partner prevented the request."}}"#;
    for status in ["402 Payment Required", "400 Bad Request"] {
        let result = charged_against(json_answer(status, "", body)).await;
        assert!(
            matches!(
                &result,
                Err(PaymentError::Retryable {
                    kind: FailureKind::AuthenticationUpstream,
                    ..
                })
            ),
            "{status}: {result:?}"
        );
    }
}

#[tokio::test]
async fn a_429_is_a_rate_limit_named_by_its_header_or_a_lock_by_its_code() {
    let cases = [
        (
            "stripe-rate-limited-reason: endpoint-rate\r\n",
            "rate_limit",
            FailureKind::RateLimited(Limiter::EndpointRate),
        ),
        ("", "rate_limit", FailureKind::RateLimited(Limiter::Unnamed)),
        ("", "lock_timeout", FailureKind::Lock),
        // A limiter that names itself is a rate limit, whatever the code says.
        (
            "stripe-rate-limited-reason: endpoint-rate\r\n",
            "lock_timeout",
            FailureKind::RateLimited(Limiter::EndpointRate),
        ),
    ];
    let mut seen = Vec::new();
    for (headers, code, _) in &cases {
        let body = format!(r#"{{"error":{{"type":"invalid_request_error","code":"{code}"}}}}"#);
        match charged_against(json_answer("429 Too Many Requests", headers, &body)).await {
            Err(PaymentError::Retryable { kind, .. }) => seen.push(kind),
            other => panic!("{headers:?} {code}: expected a retryable failure, got {other:?}"),
        }
    }
    let expected: Vec<FailureKind> = cases.iter().map(|(_, _, kind)| *kind).collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_2xx_payment_without_a_status_is_not_a_receipt() {
    // A provider (or a proxy) that answers 200 with a payment id and no status: the
    // outcome is unknown, as the lookup and the audit read such a payment.
    let (url, _, task) = answering(json_answer(
        "200 OK",
        "",
        r#"{"id":"pi_without_status","object":"payment_intent"}"#,
    ))
    .await;
    let order = order(&unique_id(), 4200, "cus_any");
    let result = provider_at(&url, PAYMENT_TIMEOUT)
        .charge(&order, &key(&order, 1))
        .await;
    assert!(
        matches!(
            &result,
            Err(PaymentError::Pending { payment_id, status })
                if payment_id == "pi_without_status" && status == "unknown"
        ),
        "{result:?}"
    );
    task.abort();
}

/// Stripe's `Stripe-Should-Retry: false` comes before the status: a 503 that carries
/// it is not retried within the invocation; the same 503 without it is, once.
#[tokio::test]
async fn a_failure_the_provider_advises_not_to_retry_is_not_retried_within_the_invocation() {
    let error = r#"{"error":{"type":"api_error","message":"try later"}}"#;
    let mut requests = Vec::new();
    for advice in ["stripe-should-retry: false\r\n", ""] {
        let (url, seen, task) =
            answering(json_answer("503 Service Unavailable", advice, error)).await;
        let order = order(&unique_id(), 1300, "cus_any");
        let h = Harness::new(provider_at(&url, PAYMENT_TIMEOUT)).await;
        let failed = invoke_order(&h, &order).await;
        assert_eq!(failed.len(), 1);
        let record = h.record(order.id()).await.unwrap();
        assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
        requests.push(seen.load(Ordering::SeqCst));
        task.abort();
    }
    assert_eq!(
        requests,
        [1, 2],
        "advised not to retry: one request; not advised: one retry under the same key"
    );
}

#[tokio::test]
async fn a_wrong_key_fails_the_record_and_no_fragment_of_it_reaches_the_logs() {
    let wrong_key = "qZxJvWpKmQbTrYgHfNdLsXcV";
    let logs = Captured::default();
    let _guard = logs.install();

    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 1500, &payer);
    let h = Harness::new(provider_with_key(wrong_key, PAYMENT_TIMEOUT)).await;
    let failed = invoke_order(&h, &order).await;
    assert_eq!(failed.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Free);
    assert_eq!(record.attempt, Some(1), "a 401 keeps the key");
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );

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
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4200, &payer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let first = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(first.len(), 1, "charged before the crash");
    assert_eq!(h.record(order.id()).await.unwrap().state, State::InProgress);

    // After the lease expires, a second invocation takes over and replays the key.
    h.redeliver_later();
    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt.as_deref(),
        Some(first[0].as_str()),
        "the same PaymentIntent"
    );
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1,
        "localstripe holds one PaymentIntent"
    );
}

#[tokio::test]
async fn an_old_key_is_reconciled_and_the_payment_found_is_completed() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 990, &payer);
    let h = Harness::new(provider()).await;
    charge_then_die(&h, &order).await;
    let charged = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charged.len(), 1);

    // A day later the key is older than PROVIDER_KEY_TTL: look up, do not re-send.
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));
    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    done_with_its_first_keys_payment(&h, &order, &payer, &charged[0]).await;
}
/// The order is done with the one PaymentIntent its customer has, `charged`, made under
/// its first key: nothing was ever sent under the next attempt's.
async fn done_with_its_first_keys_payment(
    h: &Harness<HttpProvider>,
    order: &Order,
    payer: &Payer,
    charged: &str,
) {
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(charged));
    assert!(
        localstripe::versions_sent_under(&key(order, 2))
            .await
            .is_empty(),
        "nothing sent under the next attempt's key"
    );
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1
    );
}

#[tokio::test]
async fn an_old_key_not_found_moves_to_the_next_attempt_and_charges_once() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 1234, &payer);
    let h = Harness::new(provider()).await;
    // A reservation made a day ago whose invocation died before sending anything.
    Lease::of(&order, "died-before-sending", h.clock.now())
        .max_declines(harness::rig::MAX_DECLINES)
        .make(h.table.store.as_ref())
        .await;
    h.clock
        .advance(PROVIDER_KEY_TTL + Duration::from_secs(3600));

    let failed = invoke_order(&h, &order).await;
    assert!(failed.is_empty(), "{failed:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(
        localstripe::versions_sent_under(&key(&order, 2)).await,
        [STRIPE_VERSION],
        "not found: the payment went under the next attempt's key"
    );
    assert!(
        localstripe::versions_sent_under(&key(&order, 1))
            .await
            .is_empty()
    );
    let charges = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(record.receipt.as_deref(), Some(charges[0].as_str()));
}

/// After a decline, the declined PaymentIntent is cancelled before the order moves to
/// its next key: nobody can confirm it later, so at most one payment can succeed.
/// (localstripe cannot confirm a declined PaymentIntent again, and the payment method
/// is part of the order, so the same order is never paid with another card.)
#[tokio::test]
async fn a_declined_order_has_its_open_payment_cancelled_before_it_moves_to_attempt_two() {
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&unique_id(), 3100, &payer);
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
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(
        statuses(&intents),
        ["canceled"],
        "the declined payment is cancelled: {intents:?}"
    );

    // SQS redelivers: attempt two is declined too, and cancelled in turn.
    h.redeliver_later();
    assert_eq!(
        h.invoke_event_with(event, harness::rig::INVOCATION)
            .await
            .len(),
        1
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(3)));
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["canceled", "canceled"], "{intents:?}");
    assert!(localstripe::succeeded_of(&payer.customer).await.is_empty());
}

/// An order that needs the customer's authentication is acknowledged and awaits its
/// customer with its one PaymentIntent; a redelivery makes no other; once the customer
/// has confirmed it, the scheduled settler finds it paid and completes the order with it.
#[tokio::test]
async fn an_order_that_needs_authentication_awaits_its_customer_and_the_settler_completes_it_once_confirmed()
 {
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let order = order_of(&unique_id(), 2700, &payer);
    let h = Harness::new(provider()).await;
    let event = single_event_with_body(&body(&order));
    assert!(
        h.invoke_event_with(event.clone(), harness::rig::INVOCATION)
            .await
            .is_empty(),
        "acknowledged: the table holds the order"
    );
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Awaiting, Some(1)));
    let intents = localstripe::payment_intents_of(&payer.customer).await;
    assert_eq!(statuses(&intents), ["requires_action"]);
    let payment_id = intents[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(record.payment.as_deref(), Some(payment_id.as_str()));

    // Delivered again while it waits: no call, no other payment.
    h.redeliver_later();
    assert!(
        h.invoke_event_with(event, harness::rig::INVOCATION)
            .await
            .is_empty()
    );
    localstripe::authenticate(&payment_id).await;
    let run = charge_once::drivers::settle::Settler {
        store: h.table.store.as_ref(),
        provider: h.provider.as_ref(),
        reports: &charge_once::contracts::queue::Unreported,
        settings: &h.settings,
        time: Duration::from_secs(120),
        limit: 10,
        per_run: usize::MAX,
    }
    .run()
    .await
    .unwrap();
    assert_eq!((run.read, run.completed), (1, 1), "{run:?}");
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(payment_id.as_str()));
    assert_eq!(
        localstripe::payment_intents_of(&payer.customer).await.len(),
        1,
        "no second payment"
    );
}

#[tokio::test]
async fn a_charge_the_provider_rejects_for_good_fails_as_rejected_with_its_code_and_moves_to_the_next_key()
 {
    let logs = Captured::default();
    let _guard = logs.install();
    // The provider has no such customer: 404 `resource_missing`, on every retry alike.
    let order = Order::new(
        &unique_id(),
        800,
        "eur",
        "cus_nobodyknows",
        "pm_nobodyknows",
    )
    .unwrap();
    let h = Harness::new(provider()).await;
    let failed = invoke_order(&h, &order).await;
    assert_eq!(failed.len(), 1);
    // Nothing under its key can succeed: the redrive after the fix, or a corrected
    // copy, is a new attempt, whose key was never sent.
    let record = h.record(order.id()).await.unwrap();
    assert_eq!(
        (record.state, record.attempt, record.sent),
        (State::Free, Some(2), None)
    );

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
        !text.contains("Not Found"),
        "provider text is never logged:\n{text}"
    );
}

#[tokio::test]
async fn a_404_that_names_no_missing_object_is_a_setting_fault_retried_never_rejected() {
    // A base URL pasted with its `/v1`: every payment goes to /v1/v1/payment_intents,
    // which the provider answers 404 without `resource_missing`. Every order would fail
    // alike, so it is a setting to fix: retried with the key kept, at error level,
    // counted by the breaker; never `rejected`, which would dead-letter every order.
    let logs = Captured::default();
    let _guard = logs.install();
    let url = format!("{}/v1", harness::servers::localstripe_url());
    let options = Options {
        breaker_threshold: Some(2),
        ..Options::default()
    };
    let h = Harness::with(provider_at(&url, PAYMENT_TIMEOUT), options).await;
    let payer = localstripe::payer(Card::Visa).await;
    let orders: Vec<Order> = (0..3)
        .map(|_| order_of(&unique_id(), 900, &payer))
        .collect();
    for order in &orders {
        let failed = invoke_order(&h, order).await;
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
    assert!(
        localstripe::payment_intents_of(&payer.customer)
            .await
            .is_empty()
    );
}

/// The audit's reads: `created[gte]`, every page of the listing (more than one page of
/// 100 here), each PaymentIntent once with what the audit compares, whatever its
/// status; one by id; an unknown id is none.
#[tokio::test]
async fn the_audit_lists_every_page_of_payment_intents_since_a_time_and_finds_one_by_id() {
    let p = provider();
    let payer = localstripe::payer(Card::Visa).await;
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let since = charge_once::domain::clock::Time::from_ms(charge_once::domain::clock::wall_ms())
        - Duration::from_secs(5);
    let mut made = Vec::new();
    for n in 0..130 {
        let o = order_of(&unique_id(), 100 + n, &payer);
        let receipt = p.charge(&o, &key(&o, 1)).await.unwrap();
        made.push((receipt.id, o));
    }
    let declined = order_of(&unique_id(), 555, &declining);
    assert!(p.charge(&declined, &key(&declined, 1)).await.is_err());

    let listed = p.payments_since(since).await.unwrap();
    let mine: Vec<_> = listed
        .iter()
        .filter(|c| c.customer.as_deref() == Some(payer.customer.as_str()))
        .collect();
    assert_eq!(mine.len(), made.len(), "each PaymentIntent listed once");
    for (id, o) in &made {
        let c = mine.iter().find(|c| c.id == *id).expect("listed");
        assert_eq!(c.order_id.as_deref(), Some(o.id()));
        assert_eq!((c.amount, c.currency.as_str()), (o.amount(), "eur"));
        assert_eq!(c.payment_method.as_deref(), Some(payer.card.as_str()));
        assert!(c.succeeded() && c.created.as_secs() >= since.as_secs());
    }
    let theirs: Vec<_> = listed
        .iter()
        .filter(|c| c.customer.as_deref() == Some(declining.customer.as_str()))
        .collect();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(theirs[0].status, "requires_payment_method");
    assert!(!theirs[0].succeeded());
    // Nothing was made after a time to come.
    let later = since + Duration::from_secs(3600);
    assert!(p.payments_since(later).await.unwrap().is_empty());
    // The server filters on `created` itself, before the page is cut: a page of 100
    // says there is more, the next holds the rest, and a time to come lists nothing.
    let page = |created: i64, after: Option<&str>| {
        let mut query = vec![
            ("customer", payer.customer.clone()),
            ("created[gte]", created.to_string()),
            ("limit", "100".to_owned()),
        ];
        query.extend(after.map(|a| ("starting_after", a.to_owned())));
        async move {
            let answer = harness::http_client()
                .get(format!(
                    "{}/v1/payment_intents",
                    harness::servers::localstripe_url()
                ))
                .bearer_auth(TEST_KEY)
                .query(&query)
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success(), "{answer:?}");
            answer.json::<Value>().await.unwrap()
        }
    };
    let first = page(since.as_secs(), None).await;
    assert_eq!(first["data"].as_array().unwrap().len(), 100);
    assert_eq!(first["has_more"], true);
    let last = first["data"][99]["id"].as_str().unwrap();
    let rest = page(since.as_secs(), Some(last)).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 30);
    assert_eq!(rest["has_more"], false);
    let none = page(later.as_secs(), None).await;
    assert_eq!(
        (none["data"].as_array().unwrap().len(), &none["has_more"]),
        (0, &Value::Bool(false))
    );

    let (id, o) = &made[0];
    let one = p.payment_by_id(id).await.unwrap().expect("found by id");
    assert_eq!(one.order_id.as_deref(), Some(o.id()));
    assert!(one.succeeded());
    assert_eq!(p.payment_by_id("pi_never_issued").await.unwrap(), None);
    // A receipt is whatever the table holds: it stays one path segment.
    assert_eq!(p.payment_by_id("../customers").await.unwrap(), None);
}

/// Stripe stores a 500 under its key and says its payment may still appear: the record
/// keeps the key through every delivery, and the payment that appears completes it. No
/// second PaymentIntent is ever made for the order.
/// The audit's read of late confirmations: the `payment_intent.succeeded` events
/// since a time (`type`, `created[gte]`, every page of 100, under the pinned version),
/// each one's PaymentIntent: one created before that time and confirmed after it by
/// the customer is there, succeeded, with its order; one that was only created before
/// is not.
#[tokio::test]
async fn the_audit_lists_the_payments_that_succeeded_since_a_time_whenever_they_were_created() {
    let p = provider();
    let waiting = localstripe::payer(Card::RequiresAuthentication).await;
    let late = order_of(&unique_id(), 2600, &waiting);
    let Err(PaymentError::AuthenticationRequired {
        payment_id: Some(late_id),
    }) = p.charge(&late, &key(&late, 1)).await
    else {
        panic!("expected AuthenticationRequired with its id")
    };
    let payer = localstripe::payer(Card::Visa).await;
    let before = order_of(&unique_id(), 2601, &payer);
    let before_id = p.charge(&before, &key(&before, 1)).await.unwrap().id;
    // The window starts at the next whole second (`created` is in seconds).
    let since = Time::from_secs(now().as_secs() + 1);
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(since.as_ms() - now().as_ms()).unwrap_or(0),
    ))
    .await;
    localstripe::authenticate(&late_id).await;
    let mut made = Vec::new();
    for n in 0..101 {
        let o = order_of(&unique_id(), 2700 + n, &payer);
        made.push(p.charge(&o, &key(&o, 1)).await.unwrap().id);
    }

    let confirmed = p.confirmed_since(since).await.unwrap();
    let once = |id: &str| confirmed.iter().filter(|c| c.payment.id == id).count();
    let found = confirmed
        .iter()
        .find(|c| c.payment.id == late_id)
        .expect("the late confirmation is listed");
    assert!(found.payment.succeeded(), "{found:?}");
    assert_eq!(found.payment.order_id.as_deref(), Some(late.id()));
    assert!(
        found.payment.created < since && found.at >= since,
        "{found:?}"
    );
    assert_eq!(once(&late_id), 1);
    assert!(
        made.iter().all(|id| once(id) == 1),
        "each payment of the window once"
    );
    assert_eq!(once(&before_id), 0, "succeeded before the window");
    // Every page was read, each under the pinned version and the filters.
    let pages: Vec<_> = localstripe::requests_seen(Some("/v1/events"))
        .await
        .into_iter()
        .filter(|r| r.param("created[gte]") == Some(since.as_secs().to_string().as_str()))
        .collect();
    assert!(pages.len() >= 2, "{pages:?}");
    assert!(
        pages.iter().all(|r| r.stripe_version == STRIPE_VERSION
            && r.param("type") == Some("payment_intent.succeeded")
            && r.param("limit") == Some("100")),
        "{pages:?}"
    );
    assert!(
        p.confirmed_since(since + Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_stored_server_error_whose_payment_appears_later_completes_the_order_with_one_payment() {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&unique_id(), 4321, &payer);
    let h = Harness::new(provider()).await;
    let after = Duration::from_secs(2);
    localstripe::arm_fault(
        &key(&order, 1),
        localstripe::Fault::ServerErrorRollsForward { after },
    )
    .await;

    // The 500 and its replay: looked up, nothing yet, the key kept.
    assert_eq!(invoke_order(&h, &order).await.len(), 1);
    let record = h.record(order.id()).await.unwrap();
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    h.redeliver_later();
    assert_eq!(
        invoke_order(&h, &order).await.len(),
        1,
        "still indeterminate"
    );

    // Stripe rolls the payment forward; the next delivery finds it.
    tokio::time::sleep(after).await;
    h.redeliver_later();
    assert!(invoke_order(&h, &order).await.is_empty());
    let charged = localstripe::succeeded_of(&payer.customer).await;
    assert_eq!(charged.len(), 1);
    done_with_its_first_keys_payment(&h, &order, &payer, &charged[0]).await;
}
