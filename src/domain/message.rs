//! What an SQS body of the orders queue is (ARCHITECTURE.md, "The message"): an order,
//! raw or in an SNS or EventBridge envelope, or a provider's payment event. The one
//! module that knows both, so that the order (`order.rs`) and the event (`event.rs`)
//! never import each other.

use serde_json::Value;

use crate::domain::event::{PaymentEvent, is_stripe_source};
use crate::domain::order::{
    Order, OrderError, StrictError, is_eventbridge_event, is_sns_envelope, strict_json,
};

/// What an SQS body of the orders queue is: an order, or a provider's payment event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    Order(Order),
    PaymentEvent(PaymentEvent),
}

impl Incoming {
    /// Parses an SQS body: a raw order, an SNS notification envelope around one, an
    /// EventBridge event whose `detail` is one, or a Stripe event from a partner event
    /// bus (its `source` names it).
    pub fn parse(body: &str) -> Result<Self, OrderError> {
        let value = strict_json(body).map_err(|e| match e {
            StrictError::Invalid(e) => OrderError::NotJson(e),
            StrictError::DuplicateField(e) => OrderError::DuplicateField(e),
        })?;
        let object = value.as_object().ok_or(OrderError::NotObject)?;
        if is_sns_envelope(object) {
            let message = match object.get("Message") {
                None => return Err(OrderError::SnsEnvelope("Message is missing")),
                Some(Value::String(s)) => s,
                Some(_) => return Err(OrderError::SnsEnvelope("Message is not a string")),
            };
            let inner = strict_json(message).map_err(|e| match e {
                StrictError::Invalid(e) => OrderError::SnsMessageNotJson(e),
                StrictError::DuplicateField(e) => OrderError::DuplicateField(e),
            })?;
            let inner = inner
                .as_object()
                .ok_or(OrderError::SnsEnvelope("Message is not a JSON object"))?;
            return Order::from_object(inner).map(Self::Order);
        }
        if is_eventbridge_event(object) {
            return match object.get("detail") {
                Some(Value::Object(detail)) if is_stripe_source(object) => {
                    PaymentEvent::from_detail(detail).map(Self::PaymentEvent)
                }
                Some(Value::Object(detail)) => Order::from_object(detail).map(Self::Order),
                Some(_) => Err(OrderError::EventBridgeEnvelope(
                    "detail is not a JSON object",
                )),
                None => Err(OrderError::EventBridgeEnvelope("detail is missing")),
            };
        }
        Order::from_object(object).map(Self::Order)
    }
}

impl Order {
    /// Parses an SQS body: a raw order, an SNS notification envelope around one (SNS
    /// to SQS without raw delivery), or an EventBridge event whose `detail` is one.
    pub fn parse(body: &str) -> Result<Self, OrderError> {
        match Incoming::parse(body)? {
            Incoming::Order(order) => Ok(order),
            Incoming::PaymentEvent(_) => Err(OrderError::EventBridgeEnvelope(
                "a payment event, not an order",
            )),
        }
    }
}
