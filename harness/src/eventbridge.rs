//! Stripe's EventBridge event destination on moto, as the shop's account holds it: the
//! partner event source Stripe makes for the account, the partner event bus named after
//! it, and the rule with the template's pattern (a Stripe source, the three
//! PaymentIntent events) whose target is the orders queue; then the layer in front of
//! localstripe armed to put every PaymentIntent event on that bus
//! (`harness/servers/localstripe_server.py`, `POST /_layer/eventbridge`). moto delivers
//! a rule's SQS target itself, so the event reaches the queue as EventBridge sends it.
//! The setup calls are the harness's own, made while moto checks no signature; the
//! layer's `PutEvents` is signed with the key it is given.

use serde_json::{Value, json};

use crate::localstripe::{self, EventDestination};
use crate::servers::Backend;

/// moto's account, the one every test resource lives in.
pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "us-east-1";

/// The PaymentIntent events the rule routes.
pub const EVENT_TYPES: [&str; 3] = [
    "payment_intent.succeeded",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
];

/// The rule's event pattern, as the template writes it.
pub fn pattern() -> Value {
    json!({
        "source": [{"prefix": charge_once::domain::event::STRIPE_SOURCE_PREFIX}],
        "detail-type": EVENT_TYPES,
    })
}

/// An EventBridge call to moto (JSON 1.1), unsigned: moto routes it by the credential
/// scope and checks nothing while authentication is off.
async fn call(action: &str, body: Value) -> Value {
    let response = crate::http_client()
        .post(Backend::Moto.url())
        .header("X-Amz-Target", format!("AWSEvents.{action}"))
        .header("Content-Type", "application/x-amz-json-1.1")
        .header(
            "Authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/events/aws4_request, \
             SignedHeaders=host, Signature=0",
        )
        .body(body.to_string())
        .send()
        .await
        .expect("moto reachable");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert!(status.is_success(), "EventBridge {action}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// A fresh Stripe event source (`aws.partner/stripe.com/ed_test_…`), its partner event
/// bus, and the rule sending its PaymentIntent events to the queue `queue_arn`.
/// Returns the source's name (the bus's too).
pub async fn route_to_queue(queue_arn: &str) -> String {
    let source = format!(
        "{}/ed_test_{}",
        charge_once::domain::event::STRIPE_SOURCE_PREFIX,
        uuid::Uuid::new_v4().simple()
    );
    // Stripe's side: the destination makes the source in the shop's account.
    call(
        "CreatePartnerEventSource",
        json!({"Name": source, "Account": ACCOUNT}),
    )
    .await;
    // The shop's side: the bus that accepts it, and the template's rule.
    call(
        "CreateEventBus",
        json!({"Name": source, "EventSourceName": source}),
    )
    .await;
    call(
        "PutRule",
        json!({"Name": "stripe-payment-events", "EventBusName": source,
            "EventPattern": pattern().to_string(), "State": "ENABLED"}),
    )
    .await;
    let targets = call(
        "PutTargets",
        json!({"Rule": "stripe-payment-events", "EventBusName": source,
            "Targets": [{"Id": "orders", "Arn": queue_arn}]}),
    )
    .await;
    assert_eq!(targets["FailedEntryCount"], 0, "{targets}");
    source
}

/// Routes a fresh Stripe source to `queue_arn` and arms the layer to put the events of
/// orders starting with `order_id_prefix` there, signed with `(access_key, secret_key)`.
/// Returns the layer's destination id.
pub async fn stripe_events_to(
    queue_arn: &str,
    order_id_prefix: Option<&str>,
    key: (&str, &str),
) -> String {
    stripe_events_of(queue_arn, order_id_prefix, None, key).await
}

/// The same, for the PaymentIntents of one `customer` only.
pub async fn stripe_events_of(
    queue_arn: &str,
    order_id_prefix: Option<&str>,
    customer: Option<&str>,
    (access_key, secret_key): (&str, &str),
) -> String {
    let source = route_to_queue(queue_arn).await;
    localstripe::arm_eventbridge(&EventDestination {
        endpoint: Backend::Moto.url().to_owned(),
        region: REGION.to_owned(),
        access_key: access_key.to_owned(),
        secret_key: secret_key.to_owned(),
        bus: source.clone(),
        source,
        order_id_prefix: order_id_prefix.map(str::to_owned),
        customer: customer.map(str::to_owned),
    })
    .await
}

/// The body of a Stripe event about `payment` as the template's rule delivers it from
/// the partner event bus to the orders queue: the EventBridge envelope of a partner
/// source, the Event in `detail`, the PaymentIntent (its id, status and order) in
/// `data.object`. What Stripe sends, or what anyone allowed to send to the queue can
/// forge: the consumer believes none of the payment's fields.
pub fn stripe_event(kind: &str, payment: &str, status: &str, order_id: &str) -> String {
    serde_json::json!({
        "version": "0", "id": uuid::Uuid::new_v4().to_string(), "detail-type": kind,
        "source": "aws.partner/stripe.com/ed_test_1", "account": "123456789012",
        "time": "2026-12-01T00:00:00Z", "region": "us-east-1", "resources": [],
        "detail": {"id": "evt_1", "object": "event", "type": kind, "data": {"object": {
            "id": payment, "object": "payment_intent", "status": status,
            "metadata": {"order_id": order_id}}}},
    })
    .to_string()
}
