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
//!
//! By theme: `requests.rs` (the requests and their answers), `transport.rs` (ports,
//! certificates, silent listeners, redirects, statuses, the key), `records.rs` (records
//! charged through the real client); the helpers they share are here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::ForOrder;
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

/// Reserve, charge through the HTTP client, die before `complete` is written.
async fn charge_then_die(h: &Harness<HttpProvider>, order: &Order) {
    h.store
        .hang_completes
        .store(1, std::sync::atomic::Ordering::SeqCst);
    h.invoke_and_die(single_event_with_body(&body(order)), Duration::from_secs(3))
        .await;
}

mod records;
mod requests;
mod transport;
