//! A payment provider's event as the orders queue carries it: Stripe's Event put on an
//! EventBridge partner bus (`source` `aws.partner/stripe.com/…`, `detail` the Event,
//! `detail.data.object` the PaymentIntent) and routed to the queue by the template's
//! rule (ARCHITECTURE.md, "An order that awaits its customer"). Only what settling a
//! payment needs is read: the event's id and type, the PaymentIntent's id, and, from a
//! snapshot event, its status and `metadata[order_id]`; nothing of the customer or the
//! card. A thin event (`related_object`) names only the PaymentIntent. Either way the
//! event is a hint: settling fetches the PaymentIntent and believes Stripe's answer
//! (`policy/settle.rs`), so what the body says of the payment moves nothing.

use serde_json::{Map, Value};

use crate::domain::order::{OrderError, validate_id};

/// The prefix of a Stripe partner event source's name.
pub const STRIPE_SOURCE_PREFIX: &str = "aws.partner/stripe.com";

/// One PaymentIntent event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentEvent {
    /// The provider's event id (`evt_…`), for the log line.
    pub id: String,
    /// The event's type (`payment_intent.succeeded`, `.payment_failed`, `.canceled`…).
    pub kind: String,
    pub payment_id: String,
    /// The PaymentIntent's `status` when the event was made, as the body claims it
    /// (empty for a thin event).
    pub status: String,
    /// `metadata[order_id]`: the order the payment is for, when the body names a valid
    /// one (a thin event names none: the provider's answer does).
    pub order_id: Option<String>,
}

/// Whether an EventBridge event comes from a Stripe event destination.
pub fn is_stripe_source(envelope: &Map<String, Value>) -> bool {
    envelope
        .get("source")
        .and_then(Value::as_str)
        .is_some_and(|source| source.starts_with(STRIPE_SOURCE_PREFIX))
}

impl PaymentEvent {
    /// Reads a Stripe Event (an EventBridge event's `detail`). Events about anything
    /// but a PaymentIntent are refused with the reason, as an invalid order is.
    pub fn from_detail(detail: &Map<String, Value>) -> Result<Self, OrderError> {
        let text = |object: &Map<String, Value>, field: &'static str| {
            object
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(OrderError::PaymentEvent(field))
        };
        // A thin event of a v1 resource names its type with the `v1.` prefix.
        let kind = text(detail, "type")?;
        let kind = kind.strip_prefix("v1.").unwrap_or(&kind).to_owned();
        if !kind.starts_with("payment_intent.") {
            return Err(OrderError::PaymentEvent(
                "type (not a payment_intent event)",
            ));
        }
        let snapshot = detail
            .get("data")
            .and_then(|data| data.get("object"))
            .and_then(Value::as_object);
        let thin = detail.get("related_object").and_then(Value::as_object);
        let payment_id = match (snapshot, thin) {
            (Some(object), _) => text(object, "id")?,
            (None, Some(related)) => text(related, "id")?,
            (None, None) => return Err(OrderError::PaymentEvent("data.object")),
        };
        if !payment_id.starts_with("pi_") {
            return Err(OrderError::PaymentEvent(
                "data.object.id (not a PaymentIntent)",
            ));
        }
        // An order id that is not one of ours names no record: the event changes
        // nothing, and says so.
        let order_id = snapshot
            .and_then(|object| object.get("metadata"))
            .and_then(|metadata| metadata.get("order_id"))
            .and_then(Value::as_str)
            .filter(|id| validate_id(id).is_ok())
            .map(str::to_owned);
        let status = snapshot
            .and_then(|object| object.get("status"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(Self {
            id: text(detail, "id")?,
            kind,
            payment_id,
            status,
            order_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(kind: &str, object: Value) -> Map<String, Value> {
        let event = serde_json::json!({
            "id": "evt_1", "object": "event", "type": kind,
            "data": { "object": object },
        });
        event.as_object().cloned().unwrap()
    }

    #[test]
    fn a_payment_intent_event_reads_its_payment_status_and_order() {
        let object = serde_json::json!({
            "id": "pi_1", "object": "payment_intent", "status": "succeeded",
            "amount": 5000, "customer": "cus_1", "metadata": { "order_id": "ord-1" },
        });
        let event = PaymentEvent::from_detail(&detail("payment_intent.succeeded", object)).unwrap();
        assert_eq!(
            event,
            PaymentEvent {
                id: "evt_1".into(),
                kind: "payment_intent.succeeded".into(),
                payment_id: "pi_1".into(),
                status: "succeeded".into(),
                order_id: Some("ord-1".into()),
            }
        );
    }

    #[test]
    fn an_event_about_something_else_or_without_its_payment_is_refused_with_the_field() {
        let charge = serde_json::json!({ "id": "ch_1", "status": "succeeded" });
        let err = PaymentEvent::from_detail(&detail("charge.succeeded", charge)).unwrap_err();
        assert!(err.to_string().contains("type"), "{err}");
        let no_id = serde_json::json!({ "status": "canceled" });
        let err = PaymentEvent::from_detail(&detail("payment_intent.canceled", no_id));
        assert!(err.unwrap_err().to_string().contains("id"));
    }

    #[test]
    fn a_thin_event_names_only_its_payment() {
        let event = serde_json::json!({
            "id": "evt_2", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
            "related_object": { "id": "pi_9", "type": "payment_intent",
                                "url": "/v1/payment_intents/pi_9" },
        });
        let event = PaymentEvent::from_detail(event.as_object().unwrap()).unwrap();
        assert_eq!(
            (
                event.kind.as_str(),
                event.payment_id.as_str(),
                event.order_id,
                event.status.as_str()
            ),
            ("payment_intent.succeeded", "pi_9", None, "")
        );
    }

    #[test]
    fn an_order_id_that_is_not_one_names_no_order() {
        let object = serde_json::json!({
            "id": "pi_1", "status": "succeeded", "metadata": { "order_id": "a#b" },
        });
        let event = PaymentEvent::from_detail(&detail("payment_intent.succeeded", object)).unwrap();
        assert_eq!(event.order_id, None);
    }
}
