//! The layer in front of localstripe (`harness/servers/localstripe_server.py`), held
//! against stripe-stateful-mock, which honours idempotency keys and was not written
//! here: the same request sequences on `/v1/charges` get the same answers from both.
//! Then what only the layer does (the in-flight 409, keys per API key and per endpoint,
//! the PaymentIntent list's `customer` filter), the PaymentIntent behaviours of
//! localstripe that the HTTP provider's tests stand on, Stripe's refusals of a confirm
//! that could redirect and of `payment_method_types` on endive (nothing kept under the
//! key), and the stored 500 a test arms, with and without a payment that rolls forward.
//!
//! By theme: `keys.rs` (idempotency keys on both servers), `payment_intents.rs`
//! (PaymentIntents, versions, stored errors, events), `refunds.rs` (what a refund may
//! take); the helpers they share are here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use charge_once::adapters::payment_http::{STRIPE_VERSION, charge_form};
use charge_once::domain::order::Order;
use harness::localstripe::{self, Card, Fault, Payer};
use harness::servers::{localstripe_url, stripe_mock_url};
use harness::stripe::{self, TEST_KEY};
use serde_json::Value;

/// An answer as it came: status, `Idempotent-Replayed`, body.
#[derive(Debug)]
struct Reply {
    status: u16,
    replayed: bool,
    body: Value,
}

impl Reply {
    fn error(&self, field: &str) -> Option<String> {
        self.body["error"][field].as_str().map(str::to_owned)
    }

    /// The charge an answer names: the object made, or the declined charge.
    fn charge(&self) -> Option<String> {
        let charge = if self.status < 300 {
            &self.body["id"]
        } else {
            &self.body["error"]["charge"]
        };
        charge.as_str().map(str::to_owned)
    }
}

/// What two servers' answers must share. The charge is its rank among the charges the
/// sequence met (0 for the first), so that two servers' ids compare.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    error_type: Option<String>,
    error_code: Option<String>,
    replayed: bool,
    charge: Option<usize>,
}

fn answers(replies: &[Reply]) -> Vec<Answer> {
    let mut seen: Vec<String> = Vec::new();
    replies
        .iter()
        .map(|reply| Answer {
            status: reply.status,
            error_type: reply.error("type"),
            error_code: reply.error("code"),
            replayed: reply.replayed,
            charge: reply.charge().map(|id| {
                seen.iter().position(|s| *s == id).unwrap_or_else(|| {
                    seen.push(id);
                    seen.len() - 1
                })
            }),
        })
        .collect()
}

fn answer(status: u16, replayed: bool, charge: Option<usize>) -> Answer {
    Answer {
        status,
        error_type: None,
        error_code: None,
        replayed,
        charge,
    }
}

fn refused(status: u16, error_type: &str, error_code: Option<&str>) -> Answer {
    Answer {
        error_type: Some(error_type.to_owned()),
        error_code: error_code.map(str::to_owned),
        ..answer(status, false, None)
    }
}

/// A request to `url`; a POST when `form` is given.
#[derive(Clone, Default)]
struct Call {
    api_key: Option<String>,
    idempotency_key: Option<String>,
    hold: Option<String>,
    stripe_version: Option<String>,
}

impl Call {
    fn key(idempotency_key: &str) -> Self {
        Self {
            idempotency_key: Some(idempotency_key.to_owned()),
            ..Self::default()
        }
    }

    async fn post(&self, url: &str, path: &str, form: &[(&str, &str)]) -> Reply {
        self.send(
            harness::http_client()
                .post(format!("{url}{path}"))
                .form(form),
        )
        .await
    }

    async fn send(&self, mut request: reqwest::RequestBuilder) -> Reply {
        request = request.bearer_auth(self.api_key.as_deref().unwrap_or(TEST_KEY));
        if let Some(key) = &self.idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(hold) = &self.hold {
            request = request.header("Layer-Hold", hold);
        }
        if let Some(version) = &self.stripe_version {
            request = request.header("Stripe-Version", version);
        }
        let response = request.send().await.expect("server reachable");
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body = response.json().await.expect("a JSON body");
        Reply {
            status,
            replayed,
            body,
        }
    }
}

async fn get(url: &str, path: &str, query: &[(&str, &str)]) -> Reply {
    Call::default()
        .send(
            harness::http_client()
                .get(format!("{url}{path}"))
                .query(query),
        )
        .await
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The two servers whose answers are compared.
#[derive(Clone, Copy, Debug)]
enum Server {
    StripeMock,
    Layer,
}

impl Server {
    fn url(self) -> &'static str {
        match self {
            Self::StripeMock => stripe_mock_url(),
            Self::Layer => localstripe_url(),
        }
    }

    /// A customer whose default card is charged (`declines`: declined) by a charge
    /// that names only the customer.
    async fn customer(self, declines: bool) -> String {
        match (self, declines) {
            (Self::StripeMock, false) => stripe::customer("tok_visa").await,
            (Self::StripeMock, true) => stripe::customer("tok_chargeCustomerFail").await,
            (Self::Layer, false) => localstripe::customer_with_default_card(Card::Visa).await,
            (Self::Layer, true) => {
                localstripe::customer_with_default_card(Card::DeclinesOnCharge).await
            }
        }
    }

    async fn charge(self, call: &Call, customer: &str, amount: &str) -> Reply {
        let form = [
            ("amount", amount),
            ("currency", "eur"),
            ("customer", customer),
        ];
        call.post(self.url(), "/v1/charges", &form).await
    }

    /// How many charges, succeeded or failed, the server holds for `customer`.
    async fn charges_of(self, customer: &str) -> usize {
        let list = get(self.url(), "/v1/charges", &[("customer", customer)]).await;
        assert_eq!(list.status, 200, "{list:?}");
        list.body["data"].as_array().expect("a list").len()
    }
}

// ---- the layer and stripe-stateful-mock answer alike --------------------------------

async fn replayed_once(server: Server) -> (Vec<Answer>, usize) {
    let customer = server.customer(false).await;
    let call = Call::key(&unique("replay"));
    let first = server.charge(&call, &customer, "1000").await;
    let again = server.charge(&call, &customer, "1000").await;
    (answers(&[first, again]), server.charges_of(&customer).await)
}

async fn reused_with_another_amount(server: Server) -> (Vec<Answer>, usize) {
    let customer = server.customer(false).await;
    let call = Call::key(&unique("amount"));
    let first = server.charge(&call, &customer, "1000").await;
    let other = server.charge(&call, &customer, "2000").await;
    let again = server.charge(&call, &customer, "1000").await;
    (
        answers(&[first, other, again]),
        server.charges_of(&customer).await,
    )
}

async fn two_at_once(server: Server) -> (Vec<Answer>, usize) {
    let customer = server.customer(false).await;
    let call = Call::key(&unique("concurrent"));
    let (a, b) = tokio::join!(
        server.charge(&call, &customer, "1000"),
        server.charge(&call, &customer, "1000")
    );
    // Which of the two is answered first is the servers' choice: the original first.
    let mut replies = [a, b];
    replies.sort_by_key(|r| r.replayed);
    (answers(&replies), server.charges_of(&customer).await)
}

async fn declined_twice(server: Server) -> (Vec<Answer>, usize) {
    let customer = server.customer(true).await;
    let call = Call::key(&unique("decline"));
    let first = server.charge(&call, &customer, "1000").await;
    let again = server.charge(&call, &customer, "1000").await;
    (answers(&[first, again]), server.charges_of(&customer).await)
}

/// A 500 under a key, and the same request again: stripe-stateful-mock's `tok_500`
/// charge, and localstripe's confirm with a payment method (which it has not
/// implemented).
async fn server_error_twice(server: Server) -> Vec<Answer> {
    let call = Call::key(&unique("server-error"));
    let (path, form) = match server {
        Server::StripeMock => (
            "/v1/charges".to_owned(),
            vec![
                ("amount", "1000"),
                ("currency", "eur"),
                ("source", "tok_500"),
            ],
        ),
        Server::Layer => {
            let customer = localstripe::customer().await;
            let card = localstripe::card(&customer, Card::RequiresAuthentication).await;
            let intent = payment_intent(&customer, &card, "server-error").await;
            let id = intent.body["id"].as_str().unwrap().to_owned();
            (
                format!("/v1/payment_intents/{id}/confirm"),
                vec![("payment_method", "pm_card_visa")],
            )
        }
    };
    let first = call.post(server.url(), &path, &form).await;
    let again = call.post(server.url(), &path, &form).await;
    let mut answers = answers(&[first, again]);
    for answer in &mut answers {
        // Each server's own words for it: `api_error` and `invalid_request_error`.
        answer.error_type = None;
    }
    answers
}

// ---- what only the layer does -------------------------------------------------------

async fn holds(method: reqwest::Method, hold: &str) -> u16 {
    let url = format!("{}/_layer/holds/{hold}", localstripe_url());
    let response = harness::http_client()
        .request(method, url)
        .send()
        .await
        .expect("localstripe reachable");
    response.status().as_u16()
}

async fn payment_intent(customer: &str, method: &str, order: &str) -> Reply {
    let form = [
        ("amount", "1000"),
        ("currency", "eur"),
        ("customer", customer),
        ("payment_method", method),
        ("confirm", "true"),
        ("off_session", "true"),
        ("automatic_payment_methods[enabled]", "true"),
        ("automatic_payment_methods[allow_redirects]", "never"),
        ("metadata[order_id]", order),
    ];
    Call::default()
        .post(localstripe_url(), "/v1/payment_intents", &form)
        .await
}

fn ids(list: &Reply) -> Vec<String> {
    assert_eq!(list.status, 200, "{list:?}");
    assert_eq!(list.body["object"], "list");
    let data = list.body["data"].as_array().expect("data");
    data.iter()
        .map(|pi| pi["id"].as_str().unwrap().to_owned())
        .collect()
}

// ---- localstripe's PaymentIntents, as the HTTP provider meets them -----------------

async fn cancel(id: &str) -> Reply {
    let path = format!("/v1/payment_intents/{id}/cancel");
    Call::default().post(localstripe_url(), &path, &[]).await
}

// ---- Stripe's refusals, always on -------------------------------------------------

/// An order of `payer`'s, as the HTTP provider's form sends it.
fn order_of(payer: &Payer, amount: u64) -> Order {
    Order::new(
        &unique("order"),
        amount,
        "eur",
        &payer.customer,
        &payer.card,
    )
    .unwrap()
}

/// The form as `charge_form` made it before it excluded redirects (and before it said
/// what a charge on a saved card is): what Stripe refuses on an account whose
/// Dashboard enables redirect-based methods.
fn old_form(order: &Order) -> Vec<(&'static str, String)> {
    charge_form(order, Default::default())
        .into_iter()
        .filter(|(name, _)| {
            !name.starts_with("automatic_payment_methods")
                && !name.starts_with("payment_method_options")
        })
        .collect()
}

fn pairs<'a>(form: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    form.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn endive(idempotency_key: &str) -> Call {
    Call {
        stripe_version: Some(STRIPE_VERSION.to_owned()),
        ..Call::key(idempotency_key)
    }
}

const RETURN_URL_REQUIRED: &str = "you must provide a `return_url`";

/// A refusal case: its name, the `Stripe-Version` sent, the form, the status and error
/// code expected.
type Case = (
    &'static str,
    Option<&'static str>,
    Vec<(&'static str, String)>,
    u16,
    Option<&'static str>,
);

// ---- the stored 500, for the state machine's tests --------------------------------

/// A charge under `key`: status, `Idempotent-Replayed`, error type.
async fn charged_under(key: &str, order: &Order) -> (u16, bool, Option<String>) {
    let reply = endive(key)
        .post(
            localstripe_url(),
            "/v1/payment_intents",
            &pairs(&charge_form(order, Default::default())),
        )
        .await;
    (reply.status, reply.replayed, reply.error("type"))
}

/// The PaymentIntent of the customer's only charge (charges are never hidden).
async fn payment_intent_charged(customer: &str) -> String {
    let charges = get(localstripe_url(), "/v1/charges", &[("customer", customer)]).await;
    let data = charges.body["data"].as_array().expect("a list");
    assert_eq!(data.len(), 1, "{charges:?}");
    data[0]["payment_intent"].as_str().unwrap().to_owned()
}

/// Every message on `queues`' source queue, until `count` came or 10 s passed.
async fn received(queues: &harness::event_source::Queues, count: usize) -> Vec<Value> {
    let mut bodies = Vec::new();
    let started = Instant::now();
    while bodies.len() < count && started.elapsed() < Duration::from_secs(10) {
        for m in queues.receive(Duration::from_secs(60)).await {
            bodies.push(serde_json::from_str(m.body().unwrap()).unwrap());
        }
        if bodies.len() < count {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    bodies
}

mod keys;
mod payment_intents;
mod refunds;
