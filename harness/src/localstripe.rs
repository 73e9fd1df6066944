//! Helpers for localstripe behind its layer (`servers::localstripe_url`): customers,
//! PaymentMethods made from Stripe's test card numbers, a customer's PaymentIntents,
//! the customer's on-session authentication, what the layer saw (the `Stripe-Version`
//! per key, every request), PaymentIntents seeded in its store, the faults it can
//! answer with, its rate limit and customer lock ([`set_limits`],
//! [`limit_counters`]), the EventBridge destination it puts Stripe's events on
//! ([`arm_eventbridge`]), and restricted keys ([`restricted_key`]).

use serde_json::Value;

/// Any `sk_` key is accepted; the layer keeps idempotency keys per API key.
pub use crate::stripe::TEST_KEY;

/// Stripe's test card numbers that localstripe knows. It knows no test PaymentMethod id
/// but `pm_card_visa`, so a card is made from its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Card {
    /// `4242424242424242`: charges succeed.
    Visa,
    /// `4000000000000341`: attaches to a customer, every charge is declined.
    DeclinesOnCharge,
    /// `4000002760003184`: every payment needs authentication; an off-session confirm
    /// leaves the PaymentIntent `requires_action`.
    RequiresAuthentication,
}

impl Card {
    pub fn number(self) -> &'static str {
        match self {
            Self::Visa => "4242424242424242",
            Self::DeclinesOnCharge => "4000000000000341",
            Self::RequiresAuthentication => "4000002760003184",
        }
    }
}

/// At most this many pages of 100 are read from one list.
const MAX_PAGES: usize = 100;

async fn send(request: reqwest::RequestBuilder, what: &str) -> Value {
    let response = request
        .bearer_auth(TEST_KEY)
        .send()
        .await
        .expect("localstripe reachable");
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    assert!(status.is_success(), "{what}: {status} {body}");
    body
}

fn url(path: &str) -> String {
    format!("{}{path}", crate::servers::localstripe_url())
}

async fn post(path: &str, form: &[(&str, &str)]) -> Value {
    let request = crate::http_client().post(url(path)).form(form);
    send(request, &format!("POST {path}")).await
}

async fn get(path: &str, query: &[(&str, &str)]) -> Value {
    let request = crate::http_client().get(url(path)).query(query);
    send(request, &format!("GET {path}")).await
}

fn id(object: &Value) -> String {
    object["id"].as_str().expect("an id").to_owned()
}

/// A new customer without a payment method.
pub async fn customer() -> String {
    id(&post("/v1/customers", &[]).await)
}

/// A PaymentMethod made from `card`'s number and attached to `customer`.
pub async fn card(customer: &str, card: Card) -> String {
    let method = post(
        "/v1/payment_methods",
        &[
            ("type", "card"),
            ("card[number]", card.number()),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ],
    )
    .await;
    let method = id(&method);
    post(
        &format!("/v1/payment_methods/{method}/attach"),
        &[("customer", customer)],
    )
    .await;
    method
}

/// A customer whose default payment method is `card`, so that a charge naming only the
/// customer uses it (as stripe-stateful-mock's customers made from a token).
pub async fn customer_with_default_card(card: Card) -> String {
    let customer = customer().await;
    let method = self::card(&customer, card).await;
    post(
        &format!("/v1/customers/{customer}"),
        &[("invoice_settings[default_payment_method]", &method)],
    )
    .await;
    customer
}

/// Every PaymentIntent of `customer`, page after page, in the order localstripe lists
/// them (oldest first).
pub async fn payment_intents_of(customer: &str) -> Vec<Value> {
    let mut all: Vec<Value> = Vec::new();
    for _ in 0..MAX_PAGES {
        let mut query = vec![("customer", customer.to_owned()), ("limit", "100".into())];
        if let Some(last) = all.last() {
            query.push(("starting_after", id(last)));
        }
        let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let page = get("/v1/payment_intents", &query).await;
        all.extend(page["data"].as_array().expect("a list").iter().cloned());
        if page["has_more"] != true {
            return all;
        }
    }
    panic!("{customer} has more than {MAX_PAGES} pages of PaymentIntents")
}

/// Every refund of `payment_intent` (one page of up to 100: a test makes a few).
pub async fn refunds_of(payment_intent: &str) -> Vec<Value> {
    let page = get(
        "/v1/refunds",
        &[("payment_intent", payment_intent), ("limit", "100")],
    )
    .await;
    assert_ne!(page["has_more"], true, "more refunds than a page");
    page["data"].as_array().expect("a list").clone()
}

/// Leaves the refund created under `idempotency_key` `pending`, as a bank holds some
/// (`POST /_layer/refunds/pending`).
pub async fn pend_refund(idempotency_key: &str) {
    layer_post(
        "/_layer/refunds/pending",
        &serde_json::json!({"key": idempotency_key}),
    )
    .await;
}

/// `POST <path>` of the layer's own with `body`, which must answer 204.
async fn layer_post(path: &str, body: &Value) {
    let response = crate::http_client()
        .post(url(path))
        .json(body)
        .send()
        .await
        .expect("localstripe reachable");
    assert_eq!(response.status(), 204, "POST {path}: {response:?}");
}

/// The bank's later answer for the pending refund `id`: `Ok(())` succeeds it,
/// `Err(reason)` fails it with Stripe's `failure_reason`.
pub async fn settle_refund(id: &str, answer: Result<(), &str>) {
    let body = match answer {
        Ok(()) => serde_json::json!({"status": "succeeded"}),
        Err(reason) => serde_json::json!({"status": "failed", "failure_reason": reason}),
    };
    layer_post(&format!("/_layer/refunds/{id}/settle"), &body).await;
}

/// `POST /v1/refunds` with `form`, sent straight to the layer: its status and body,
/// whatever they are.
pub async fn refund_directly(form: &[(&str, &str)]) -> (u16, Value) {
    let response = crate::http_client()
        .post(url("/v1/refunds"))
        .form(form)
        .bearer_auth(TEST_KEY)
        .send()
        .await
        .expect("localstripe reachable");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

/// The customer back on the shop's page completes the authentication the PaymentIntent
/// asks for (localstripe's `_authenticate`, with its client secret): a PaymentIntent in
/// `requires_action` is charged and comes back `succeeded`.
pub async fn authenticate(payment_intent: &str) -> Value {
    let intent = get(&format!("/v1/payment_intents/{payment_intent}"), &[]).await;
    let secret = intent["client_secret"].as_str().expect("a client secret");
    post(
        &format!("/v1/payment_intents/{payment_intent}/_authenticate"),
        &[("client_secret", secret), ("success", "true")],
    )
    .await
}

/// A customer and the PaymentMethod an order of theirs is paid with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payer {
    pub customer: String,
    pub card: String,
}

/// A new customer with `card` attached: what an order names as `customer` and
/// `payment_method`.
pub async fn payer(card: Card) -> Payer {
    let customer = customer().await;
    let card = self::card(&customer, card).await;
    Payer { customer, card }
}

/// A PaymentIntent created and confirmed off-session for `payer`, with the body an
/// order's charge has (`charge_form`), sent straight to the layer: the provider's own
/// answer, without a consumer in front of it (the bench's quiet day times it).
pub async fn charge_directly(payer: &Payer, amount: u64, order_id: &str) -> Value {
    let order = charge_once::domain::order::Order::new(
        order_id,
        amount,
        "EUR",
        &payer.customer,
        &payer.card,
    )
    .expect("a valid order");
    let form = charge_once::adapters::payment_http::charge_form(&order, Default::default());
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post("/v1/payment_intents", &form).await
}

/// A new restricted key (`rk_test_…`) with exactly `permissions` (`rak_…`), as the
/// layer answers Stripe's restricted keys (`POST /_layer/restricted_keys`).
pub async fn restricted_key(permissions: &[&str]) -> String {
    let key = format!("rk_test_{}", uuid::Uuid::new_v4().simple());
    let response = crate::http_client()
        .post(url("/_layer/restricted_keys"))
        .json(&serde_json::json!({"key": key, "permissions": permissions}))
        .send()
        .await
        .expect("localstripe reachable");
    assert!(response.status().is_success(), "{}", response.status());
    key
}

/// One PaymentIntent, as localstripe holds it now.
pub async fn payment_intent(id: &str) -> Value {
    get(&format!("/v1/payment_intents/{id}"), &[]).await
}

/// The ids of `customer`'s PaymentIntents that took money.
pub async fn succeeded_of(customer: &str) -> Vec<String> {
    payment_intents_of(customer)
        .await
        .iter()
        .filter(|pi| pi["status"] == "succeeded")
        .map(id)
        .collect()
}

/// The `Stripe-Version` header of every keyed POST that reached the layer under
/// `idempotency_key`, in order (`""`: none sent).
pub async fn versions_sent_under(idempotency_key: &str) -> Vec<String> {
    // A key holds `#`: it is one escaped path segment.
    let mut address = reqwest::Url::parse(&url("/_layer/versions")).unwrap();
    address.path_segments_mut().unwrap().push(idempotency_key);
    let request = crate::http_client().get(address);
    let versions = send(request, "GET /_layer/versions").await;
    versions
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_str().expect("a version").to_owned())
        .collect()
}

/// One request that reached the layer (`GET /_layer/requests`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    /// The query's pairs, decoded, in the order sent.
    pub query: Vec<(String, String)>,
    /// `""`: none sent.
    pub stripe_version: String,
    pub idempotency_key: Option<String>,
}

impl SeenRequest {
    /// The first value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every request that reached the layer to `path` (any path: `None`), oldest first.
/// The log is shared by every test of the binary: pick yours by what only it used (a
/// customer, a PaymentIntent, a key).
pub async fn requests_seen(path: Option<&str>) -> Vec<SeenRequest> {
    let mut request = crate::http_client().get(url("/_layer/requests"));
    if let Some(path) = path {
        request = request.query(&[("path", path)]);
    }
    let seen = send(request, "GET /_layer/requests").await;
    let text = |v: &Value| v.as_str().expect("a string").to_owned();
    seen.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            let query = reqwest::Url::parse(&format!("http://layer/?{}", text(&r["query"])))
                .expect("a query")
                .query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            SeenRequest {
                method: text(&r["method"]),
                path: text(&r["path"]),
                query,
                stripe_version: text(&r["stripe_version"]),
                idempotency_key: r["idempotency_key"].as_str().map(str::to_owned),
            }
        })
        .collect()
}

/// `count` PaymentIntents of `customer` made in localstripe's store directly, created
/// at `created` (seconds since the epoch), `requires_payment_method`, for orders named
/// `seed-<customer>-<n>`: a customer's earlier payments, cheaply.
pub async fn seed_payment_intents(customer: &str, count: usize, created: i64) {
    let request = crate::http_client()
        .post(url("/_layer/seed"))
        .json(&serde_json::json!({"customer": customer, "count": count, "created": created}));
    let seeded = send(request, "POST /_layer/seed").await;
    assert_eq!(seeded["count"], count, "{seeded}");
}

/// What the next create under an idempotency key meets (`arm_fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A 500 (`api_error`) stored under the key and replayed; no payment is made.
    ServerError,
    /// The same stored 500, but localstripe makes the payment, which lists and GETs
    /// show only once `after` has passed: Stripe rolling an indeterminate request
    /// forward.
    ServerErrorRollsForward { after: std::time::Duration },
}

/// Arms `fault` for the next `POST /v1/payment_intents` that is the first under
/// `idempotency_key` (one that already holds an answer replays it).
pub async fn arm_fault(idempotency_key: &str, fault: Fault) {
    let (name, after) = match fault {
        Fault::ServerError => ("server_error", 0.0),
        Fault::ServerErrorRollsForward { after } => {
            ("server_error_rolls_forward", after.as_secs_f64())
        }
    };
    let response = crate::http_client()
        .post(url("/_layer/faults"))
        .json(&serde_json::json!({"key": idempotency_key, "fault": name, "after_s": after}))
        .send()
        .await
        .expect("localstripe reachable");
    assert_eq!(response.status(), 204, "POST /_layer/faults: {response:?}");
}

/// The layer's rate limit and customer lock (`POST /_layer/limits`): `None` leaves one
/// off. Setting them zeroes the counters; [`Limits::OFF`] turns both off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    /// Requests a second per endpoint (a token bucket holding one second's worth).
    pub per_endpoint_per_s: Option<f64>,
    /// How long a create holds its customer, ms.
    pub lock_ms: Option<u64>,
    /// How long another request on that customer waits for it before `lock_timeout`, ms.
    pub lock_wait_ms: Option<u64>,
}

impl Limits {
    pub const OFF: Self = Self {
        per_endpoint_per_s: None,
        lock_ms: None,
        lock_wait_ms: None,
    };
}

/// Turns the layer's rate limit and customer lock on (or off) for what follows.
pub async fn set_limits(limits: Limits) {
    let mut body = serde_json::Map::new();
    if let Some(rate) = limits.per_endpoint_per_s {
        body.insert("per_endpoint_per_s".into(), rate.into());
    }
    if let Some(ms) = limits.lock_ms {
        body.insert("lock_ms".into(), ms.into());
    }
    if let Some(ms) = limits.lock_wait_ms {
        body.insert("lock_wait_ms".into(), ms.into());
    }
    let response = crate::http_client()
        .post(url("/_layer/limits"))
        .json(&Value::Object(body))
        .send()
        .await
        .expect("localstripe reachable");
    assert!(
        response.status().is_success(),
        "POST /_layer/limits: {}",
        response.status()
    );
}

/// What the layer's limits did since they were set: requests let through and refused
/// by the rate limit, per endpoint (method and route, ids replaced), and requests
/// refused with `lock_timeout`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitCounters {
    pub accepted: std::collections::BTreeMap<String, u64>,
    pub refused: std::collections::BTreeMap<String, u64>,
    pub locks: u64,
}

impl LimitCounters {
    /// Let through and refused on `endpoint` (`POST /v1/payment_intents`, ...).
    pub fn of(&self, endpoint: &str) -> (u64, u64) {
        let get = |m: &std::collections::BTreeMap<String, u64>| m.get(endpoint).copied();
        (
            get(&self.accepted).unwrap_or(0),
            get(&self.refused).unwrap_or(0),
        )
    }
}

/// The layer's counters (`GET /_layer/limits`).
pub async fn limit_counters() -> LimitCounters {
    let request = crate::http_client().get(url("/_layer/limits"));
    let body = send(request, "GET /_layer/limits").await;
    let counts = |name: &str| {
        body[name]
            .as_object()
            .expect("counts per endpoint")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("a count")))
            .collect()
    };
    LimitCounters {
        accepted: counts("accepted"),
        refused: counts("refused"),
        locks: body["locks"].as_u64().expect("a count"),
    }
}

/// A Stripe event destination of type `amazon_eventbridge` for the layer to put
/// PaymentIntent events on (`POST /_layer/eventbridge`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventDestination {
    /// EventBridge's endpoint (moto).
    pub endpoint: String,
    pub region: String,
    /// The key `PutEvents` is signed with.
    pub access_key: String,
    pub secret_key: String,
    /// The partner event bus (named after its source).
    pub bus: String,
    /// `aws.partner/stripe.com/ed_test_…`.
    pub source: String,
    /// Only events of orders whose `metadata[order_id]` starts with this: one test's
    /// orders, when several share the layer.
    pub order_id_prefix: Option<String>,
    /// Only events of this customer's PaymentIntents.
    pub customer: Option<String>,
}

/// Arms `destination`: from now on every PaymentIntent event (of its orders) is put on
/// its bus, shortly after the change. Returns the destination's id.
pub async fn arm_eventbridge(destination: &EventDestination) -> String {
    let request = crate::http_client()
        .post(url("/_layer/eventbridge"))
        .json(&serde_json::json!({
            "endpoint": destination.endpoint,
            "region": destination.region,
            "access_key": destination.access_key,
            "secret_key": destination.secret_key,
            "bus": destination.bus,
            "source": destination.source,
            "order_id_prefix": destination.order_id_prefix,
            "customer": destination.customer,
        }));
    let armed = send(request, "POST /_layer/eventbridge").await;
    armed["destination"]
        .as_str()
        .expect("a destination id")
        .to_owned()
}

/// What one destination put on its bus so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub published: u64,
    /// Puts that failed every try.
    pub failed: u64,
    /// Events made and not yet put.
    pub pending: u64,
    /// Published per event type.
    pub types: std::collections::BTreeMap<String, u64>,
}

impl Published {
    pub fn of(&self, kind: &str) -> u64 {
        self.types.get(kind).copied().unwrap_or(0)
    }
}

/// The counters of a destination armed with [`arm_eventbridge`].
pub async fn events_published(destination: &str) -> Published {
    let request = crate::http_client().get(url(&format!("/_layer/eventbridge/{destination}")));
    let body = send(request, "GET /_layer/eventbridge/<id>").await;
    let count = |name: &str| body[name].as_u64().expect("a count");
    Published {
        published: count("published"),
        failed: count("failed"),
        pending: count("pending"),
        types: body["types"]
            .as_object()
            .expect("counts per type")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("a count")))
            .collect(),
    }
}

/// Waits until the destination has nothing left to put (at most `limit`); its counters.
pub async fn events_settled(destination: &str, limit: std::time::Duration) -> Published {
    let started = std::time::Instant::now();
    loop {
        let published = events_published(destination).await;
        if published.pending == 0 || started.elapsed() >= limit {
            return published;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Removes a destination: no more events go to its bus.
pub async fn disarm_eventbridge(destination: &str) {
    let response = crate::http_client()
        .delete(url(&format!("/_layer/eventbridge/{destination}")))
        .send()
        .await
        .expect("localstripe reachable");
    assert_eq!(
        response.status(),
        204,
        "DELETE /_layer/eventbridge/{destination}"
    );
}
