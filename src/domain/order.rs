//! The order message: parsing an SQS body (a raw order, an SNS notification or an
//! EventBridge event around one), validating it against ARCHITECTURE.md, "The message", and computing its
//! fingerprint (ARCHITECTURE.md, "The key and the fingerprint").
//!
//! Parsing never panics and never guesses: every rejection names the field and the
//! rule it broke, so the log line of a failed record says exactly what to fix. A
//! field named twice anywhere in the body is refused (I-JSON, RFC 7493): parsers
//! disagree on which value wins, and a charge must not depend on that.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Largest accepted amount, in minor units.
pub const MAX_AMOUNT: u64 = 99_999_999;
/// Longest accepted order id.
pub const MAX_ID_LEN: usize = 128;
/// Longest accepted customer reference (Stripe ids are far shorter).
pub const MAX_CUSTOMER_LEN: usize = 255;

/// A validated order: the only input the state machine and the provider ever see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    id: String,
    amount: u64,
    currency: String,
    customer: String,
    /// The saved payment method (`pm_…`) the customer agreed to for this order.
    payment_method: String,
}

/// Why a body is not a valid order. Each variant names the problem.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("body is not a JSON object")]
    NotObject,
    #[error("SNS envelope: {0}")]
    SnsEnvelope(&'static str),
    #[error("SNS envelope: Message is not JSON: {0}")]
    SnsMessageNotJson(#[source] serde_json::Error),
    #[error("EventBridge event: {0}")]
    EventBridgeEnvelope(&'static str),
    /// A Stripe event that is not a PaymentIntent's, or lacks this field.
    #[error("payment event: `{0}` is missing or not what a PaymentIntent event carries")]
    PaymentEvent(&'static str),
    /// The body (or the SNS message inside it) names a field twice.
    #[error("ambiguous JSON (I-JSON, RFC 7493): {0}")]
    DuplicateField(#[source] serde_json::Error),
    #[error("field `{0}` is missing")]
    Missing(&'static str),
    #[error("field `{field}` must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("field `id` is invalid: {0}")]
    InvalidId(&'static str),
    #[error("field `amount` must be an integer of minor units in 1..={MAX_AMOUNT}, got {0}")]
    AmountOutOfRange(String),
    #[error("field `currency` must be 3 ASCII letters (ISO 4217)")]
    InvalidCurrency,
    #[error("field `customer` is invalid: {0}")]
    InvalidCustomer(&'static str),
    #[error("field `payment_method` is invalid: {0}")]
    InvalidPaymentMethod(&'static str),
}

impl Order {
    /// Builds an order from already-typed fields, applying the same rules as parsing.
    pub fn new(
        id: &str,
        amount: u64,
        currency: &str,
        customer: &str,
        payment_method: &str,
    ) -> Result<Self, OrderError> {
        validate_id(id)?;
        if amount == 0 || amount > MAX_AMOUNT {
            return Err(OrderError::AmountOutOfRange(amount.to_string()));
        }
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(OrderError::InvalidCurrency);
        }
        validate_customer(customer)?;
        validate_payment_method(payment_method)?;
        Ok(Self {
            id: id.to_owned(),
            amount,
            currency: currency.to_ascii_uppercase(),
            customer: customer.to_owned(),
            payment_method: payment_method.to_owned(),
        })
    }
}

impl Order {
    pub(crate) fn from_object(object: &Map<String, Value>) -> Result<Self, OrderError> {
        let id = string_field(object, "id")?;
        let amount = match object.get("amount") {
            None | Some(Value::Null) => return Err(OrderError::Missing("amount")),
            // A float (even 50.0) is refused: money is never a float here.
            Some(Value::Number(n)) => match n.as_u64() {
                Some(a) => a,
                None => return Err(OrderError::AmountOutOfRange(n.to_string())),
            },
            Some(_) => {
                return Err(OrderError::WrongType {
                    field: "amount",
                    expected: "a JSON integer (minor units)",
                });
            }
        };
        let currency = string_field(object, "currency")?;
        let customer = string_field(object, "customer")?;
        let payment_method = string_field(object, "payment_method")?;
        Self::new(id, amount, currency, customer, payment_method)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Amount in minor units (cents).
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// ISO 4217 code, upper case.
    pub fn currency(&self) -> &str {
        &self.currency
    }

    pub fn customer(&self) -> &str {
        &self.customer
    }

    /// The saved payment method to charge (`pm_…`).
    pub fn payment_method(&self) -> &str {
        &self.payment_method
    }

    /// Lower-case hex SHA-256 of `id\namount\nCURRENCY\ncustomer\npayment_method`
    /// (ARCHITECTURE.md, "The key and the fingerprint").
    pub fn fingerprint(&self) -> String {
        let amount = self.amount.to_string();
        fingerprint_of(&[
            self.id.as_str(),
            &amount,
            &self.currency,
            &self.customer,
            &self.payment_method,
        ])
    }
}

/// Lower-case hex SHA-256 of `fields` joined by `\n`: the fingerprint of a message's
/// fields (an order's, a refund request's).
pub(crate) fn fingerprint_of(fields: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            hasher.update(b"\n");
        }
        hasher.update(field.as_bytes());
    }
    hex(hasher)
}

fn hex(hasher: Sha256) -> String {
    let mut hex = String::with_capacity(64);
    for byte in hasher.finalize() {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

pub(crate) fn is_sns_envelope(object: &Map<String, Value>) -> bool {
    matches!(object.get("Type"), Some(Value::String(t)) if t == "Notification")
}

/// An EventBridge event delivered to SQS by a rule: `detail-type` and `source` beside
/// `detail`. A raw order never has `detail-type` (a producer's own field would be
/// ignored, so its presence is unambiguous).
pub(crate) fn is_eventbridge_event(object: &Map<String, Value>) -> bool {
    object.contains_key("detail-type") && object.contains_key("source")
}

pub(crate) enum StrictError {
    Invalid(serde_json::Error),
    DuplicateField(serde_json::Error),
}

/// Parses JSON, refusing an object that names a key twice at any depth.
pub(crate) fn strict_json(text: &str) -> Result<Value, StrictError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = StrictValue::deserialize(&mut deserializer).and_then(|v| {
        deserializer.end()?;
        Ok(v.0)
    });
    parsed.map_err(|e| match e.classify() {
        // Every JSON document is data the visitor accepts, except a repeated key.
        serde_json::error::Category::Data => StrictError::DuplicateField(e),
        _ => StrictError::Invalid(e),
    })
}

/// A JSON value built by a visitor that refuses repeated object keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let StrictValue(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "field `{key}` appears twice"
                )));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

pub(crate) fn string_field<'a>(
    object: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, OrderError> {
    match object.get(field) {
        None | Some(Value::Null) => Err(OrderError::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(OrderError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// Checks an order id against ARCHITECTURE.md, "The message" (also used by the CLI for `inspect`).
pub fn validate_id(id: &str) -> Result<(), OrderError> {
    if id.is_empty() {
        return Err(OrderError::InvalidId("empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(OrderError::InvalidId("longer than 128 characters"));
    }
    if id.contains('#') {
        return Err(OrderError::InvalidId(
            "contains `#`, which separates key parts",
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(OrderError::InvalidId(
            "only A-Z, a-z, 0-9 and . _ : - are allowed",
        ));
    }
    Ok(())
}

/// A provider id of a saved payment method: 1-255 of A-Z a-z 0-9 `_` (Stripe's
/// `pm_…`; which kind of id it must be is the provider's rule).
fn validate_payment_method(payment_method: &str) -> Result<(), OrderError> {
    if payment_method.is_empty() {
        return Err(OrderError::InvalidPaymentMethod("empty"));
    }
    if payment_method.len() > MAX_CUSTOMER_LEN {
        return Err(OrderError::InvalidPaymentMethod("longer than 255 bytes"));
    }
    if !payment_method
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(OrderError::InvalidPaymentMethod(
            "only A-Z, a-z, 0-9 and _ are allowed",
        ));
    }
    Ok(())
}

fn validate_customer(customer: &str) -> Result<(), OrderError> {
    if customer.trim().is_empty() {
        return Err(OrderError::InvalidCustomer("empty"));
    }
    if customer.len() > MAX_CUSTOMER_LEN {
        return Err(OrderError::InvalidCustomer("longer than 255 bytes"));
    }
    if customer.chars().any(char::is_control) {
        return Err(OrderError::InvalidCustomer("contains control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
