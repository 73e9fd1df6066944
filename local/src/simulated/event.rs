//! The events the simulator's payments make, as the orders queue would carry them:
//! Stripe's Event about a PaymentIntent (`detail`, its `data.object` the payment with
//! `metadata.order_id`), in the envelope Stripe's EventBridge event destination puts on
//! a partner bus (`source` `aws.partner/stripe.com/…`, `detail-type` the event's type),
//! in one SQS record of the orders queue (the template's rule routes it there). What
//! the consumer reads of them is `src/domain/event.rs`'s; the rest is what Stripe and
//! EventBridge send beside it, so that a local run reads what a deployed one gets.

use charge_once::contracts::payment::ListedPayment;
use charge_once::domain::clock::Time;
use serde_json::{Value, json};

/// The simulator's event destination: a partner event source is named
/// `aws.partner/stripe.com/<destination id>`.
pub const EVENT_SOURCE: &str = "aws.partner/stripe.com/ed_test_simulator";
/// The Stripe API version the events are rendered in: the one every request pins.
const API_VERSION: &str = charge_once::adapters::payment_http::STRIPE_VERSION;
/// The local run's account and region: those of the `events/` files.
const ACCOUNT: &str = "123456789012";
const REGION: &str = "eu-west-1";

/// The PaymentIntent as Stripe renders it in an event's `data.object`.
pub fn payment_intent(payment: &ListedPayment) -> Value {
    let succeeded = payment.succeeded();
    json!({
        "id": payment.id,
        "object": "payment_intent",
        "amount": payment.amount,
        "amount_received": if succeeded { payment.amount } else { 0 },
        "currency": payment.currency.to_ascii_lowercase(),
        "customer": payment.customer,
        "payment_method": payment.payment_method,
        "status": payment.status,
        "created": payment.created.as_secs(),
        // The simulator's charge of a payment is named after it (`simulated::receipt`).
        "latest_charge": succeeded.then(|| payment.id.replacen("pi_", "ch_", 1)),
        "livemode": false,
        "metadata": { "order_id": payment.order_id },
        "off_session": true,
    })
}

/// Stripe's Event of type `kind` (`payment_intent.succeeded`…) about `payment`, made
/// at `now`.
pub fn stripe_event(kind: &str, payment: &ListedPayment, now: Time) -> Value {
    json!({
        "id": format!("evt_sim_{}", uuid::Uuid::new_v4().simple()),
        "object": "event",
        "api_version": API_VERSION,
        "created": now.as_secs(),
        "data": { "object": payment_intent(payment) },
        "livemode": false,
        "pending_webhooks": 0,
        "request": { "id": null, "idempotency_key": null },
        "type": kind,
    })
}

/// The EventBridge event the partner bus delivers for `event` (a Stripe Event).
pub fn envelope(event: &Value, now: Time) -> Value {
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": event["type"],
        "source": EVENT_SOURCE,
        "account": ACCOUNT,
        "time": rfc3339(now),
        "region": REGION,
        "resources": [],
        "detail": event,
    })
}

/// An SQS event of one record of the orders queue whose body is `body`, received once
/// at `now`.
pub fn sqs_event(body: &Value, now: Time) -> Value {
    let sent = now.as_ms().to_string();
    json!({
        "Records": [{
            "messageId": uuid::Uuid::new_v4().to_string(),
            "receiptHandle": format!("AQEB{}", uuid::Uuid::new_v4().simple()),
            "body": body.to_string(),
            "attributes": {
                "ApproximateReceiveCount": "1",
                "SentTimestamp": sent,
                "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                "ApproximateFirstReceiveTimestamp": sent,
            },
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": format!("arn:aws:sqs:{REGION}:{ACCOUNT}:orders"),
            "awsRegion": REGION,
        }]
    })
}

/// EventBridge's `time`: UTC, to the second.
fn rfc3339(now: Time) -> String {
    let secs = u64::try_from(now.as_secs()).unwrap_or(0);
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use charge_once::domain::message::Incoming;

    fn payment(status: &str) -> ListedPayment {
        ListedPayment {
            id: "pi_sim_1".into(),
            order_id: Some("ord-3006".into()),
            amount: 3300,
            currency: "EUR".into(),
            customer: Some("cus_123".into()),
            payment_method: Some("pm_card_authenticationRequired".into()),
            status: status.into(),
            created: Time::from_ms(1_764_460_800_000),
        }
    }

    #[test]
    fn the_consumer_reads_the_event_of_a_record_as_the_payment_and_its_order() {
        let now = Time::from_ms(1_764_460_900_000);
        let event = stripe_event("payment_intent.succeeded", &payment("succeeded"), now);
        let sqs = sqs_event(&envelope(&event, now), now);
        let body = sqs["Records"][0]["body"].as_str().unwrap();
        let Incoming::PaymentEvent(read) = Incoming::parse(body).unwrap() else {
            panic!("a payment event: {body}");
        };
        assert_eq!(read.kind, "payment_intent.succeeded");
        assert_eq!(read.payment_id, "pi_sim_1");
        assert_eq!(read.status, "succeeded");
        assert_eq!(read.order_id.as_deref(), Some("ord-3006"));
        assert_eq!(Some(read.id.as_str()), event["id"].as_str());
        let sent: Value = serde_json::from_str(body).unwrap();
        assert_eq!(sent["time"], "2025-11-30T00:01:40Z");
        assert_eq!(sent["detail"]["data"]["object"]["currency"], "eur");
        assert_eq!(
            sent["detail"]["data"]["object"]["latest_charge"],
            "ch_sim_1"
        );
    }
}
