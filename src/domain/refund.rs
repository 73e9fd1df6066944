//! A refund request as one message of the refunds queue carries it (its envelope
//! already taken off: `idempotent_consumer::envelope`): the refund's id, the order it
//! returns money of, how much (the rest of the order when absent) and why; validated
//! as an order is, each field with its reason. Its key in the shared table is
//! `reembolso#<refund id>`, beside the orders' `cobro#`.

use idempotent_consumer::record::{Fingerprint, Identity, Key};
use serde_json::Value;

use crate::domain::order::{
    MAX_AMOUNT, OrderError, StrictError, fingerprint_of, strict_json, string_field, validate_id,
};

/// The prefix of a refund's key in the table: `reembolso#<refund id>`.
pub const REFUND_PREFIX: &str = "reembolso#";

/// Why a refund is made, as Stripe names it (`reason` on `POST /v1/refunds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    /// Stripe's name of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [Self::Duplicate, Self::Fraudulent, Self::RequestedByCustomer]
            .into_iter()
            .find(|reason| reason.as_str() == name)
    }
}

/// A refund request, valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundRequest {
    id: String,
    order_id: String,
    amount: Option<u64>,
    reason: Option<RefundReason>,
}

/// Why a body is no refund request.
#[derive(Debug, thiserror::Error)]
pub enum RefundError {
    #[error("body is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("ambiguous JSON (I-JSON, RFC 7493): {0}")]
    DuplicateField(#[source] serde_json::Error),
    #[error("body is not a JSON object")]
    NotObject,
    /// A field missing or of the wrong type, as an order's would be.
    #[error(transparent)]
    Field(OrderError),
    #[error("field `{field}` is invalid: {source}")]
    InvalidId {
        field: &'static str,
        #[source]
        source: OrderError,
    },
    #[error("field `amount` must be an integer of minor units in 1..={MAX_AMOUNT}, got {0}")]
    AmountOutOfRange(String),
    #[error(
        "field `reason` must be one of duplicate, fraudulent or requested_by_customer, got {0:?}"
    )]
    UnknownReason(String),
}

impl RefundRequest {
    /// Builds a request from typed fields, under the rules parsing applies.
    pub fn new(
        id: &str,
        order_id: &str,
        amount: Option<u64>,
        reason: Option<RefundReason>,
    ) -> Result<Self, RefundError> {
        for (field, value) in [("id", id), ("order_id", order_id)] {
            validate_id(value).map_err(|source| RefundError::InvalidId { field, source })?;
        }
        if let Some(amount) = amount
            && (amount == 0 || amount > MAX_AMOUNT)
        {
            return Err(RefundError::AmountOutOfRange(amount.to_string()));
        }
        Ok(Self {
            id: id.to_owned(),
            order_id: order_id.to_owned(),
            amount,
            reason,
        })
    }

    /// Parses a body: a JSON object with `id`, `order_id`, and optionally `amount` and
    /// `reason`.
    pub fn parse(body: &str) -> Result<Self, RefundError> {
        let value = strict_json(body).map_err(|e| match e {
            StrictError::Invalid(e) => RefundError::NotJson(e),
            StrictError::DuplicateField(e) => RefundError::DuplicateField(e),
        })?;
        let object = value.as_object().ok_or(RefundError::NotObject)?;
        let amount = match object.get("amount") {
            None | Some(Value::Null) => None,
            // A float (even 50.0) is refused: money is never a float here.
            Some(Value::Number(n)) => Some(
                n.as_u64()
                    .ok_or_else(|| RefundError::AmountOutOfRange(n.to_string()))?,
            ),
            Some(_) => {
                return Err(RefundError::Field(OrderError::WrongType {
                    field: "amount",
                    expected: "a JSON integer (minor units)",
                }));
            }
        };
        let reason = match object.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) => Some(
                RefundReason::parse(name)
                    .ok_or_else(|| RefundError::UnknownReason(name.clone()))?,
            ),
            Some(_) => {
                return Err(RefundError::Field(OrderError::WrongType {
                    field: "reason",
                    expected: "a string",
                }));
            }
        };
        Self::new(
            string_field(object, "id").map_err(RefundError::Field)?,
            string_field(object, "order_id").map_err(RefundError::Field)?,
            amount,
            reason,
        )
    }

    /// The refund's id (`ref-…`): its key in the table, its idempotency key at Stripe,
    /// `metadata[refund_id]`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The order whose charge it refunds.
    pub fn order_id(&self) -> &str {
        &self.order_id
    }

    /// How much, in minor units; `None`: what remains of the charge.
    pub fn amount(&self) -> Option<u64> {
        self.amount
    }

    pub fn reason(&self) -> Option<RefundReason> {
        self.reason
    }

    /// Its key (`reembolso#<id>`) and the fingerprint of its fields: the same id with
    /// another order, amount or reason is a conflict, never a second refund.
    pub fn identity(&self) -> Identity {
        let amount = self.amount.map(|a| a.to_string()).unwrap_or_default();
        let reason = self.reason.map(RefundReason::as_str).unwrap_or_default();
        let hex = fingerprint_of(&[self.id.as_str(), &self.order_id, &amount, reason]);
        Identity {
            key: Key::new(REFUND_PREFIX, &self.id),
            fingerprint: Fingerprint::new(hex),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_with_every_field_parses_and_is_keyed_by_its_own_id() {
        let request = RefundRequest::parse(
            r#"{"id": "ref-1", "order_id": "ord-1", "amount": 500, "reason": "requested_by_customer"}"#,
        )
        .unwrap();
        assert_eq!(request.id(), "ref-1");
        assert_eq!(request.order_id(), "ord-1");
        assert_eq!(request.amount(), Some(500));
        assert_eq!(request.reason(), Some(RefundReason::RequestedByCustomer));
        assert_eq!(request.identity().key.as_str(), "reembolso#ref-1");
    }

    #[test]
    fn a_request_without_amount_or_reason_refunds_the_rest_of_the_order() {
        let request = RefundRequest::parse(r#"{"id": "ref-2", "order_id": "ord-2"}"#).unwrap();
        assert_eq!((request.amount(), request.reason()), (None, None));
    }

    #[test]
    fn each_invalid_field_is_refused_with_its_own_reason() {
        for (body, reason) in [
            (r#"{"order_id": "ord-1"}"#, "field `id` is missing"),
            (r#"{"id": "ref-1"}"#, "field `order_id` is missing"),
            (
                r#"{"id": "ref#1", "order_id": "o"}"#,
                "field `id` is invalid",
            ),
            (
                r#"{"id": "ref-1", "order_id": "o", "amount": 0}"#,
                "field `amount`",
            ),
            (
                r#"{"id": "ref-1", "order_id": "o", "amount": 5.0}"#,
                "field `amount`",
            ),
            (
                r#"{"id": "ref-1", "order_id": "o", "amount": "5"}"#,
                "field `amount`",
            ),
            (
                r#"{"id": "ref-1", "order_id": "o", "reason": "bored"}"#,
                "field `reason`",
            ),
            (
                r#"{"id": "ref-1", "id": "ref-2", "order_id": "o"}"#,
                "ambiguous JSON",
            ),
            ("[1]", "not a JSON object"),
        ] {
            let error = RefundRequest::parse(body).unwrap_err().to_string();
            assert!(error.contains(reason), "{body}: {error}");
        }
    }

    #[test]
    fn the_same_id_with_another_amount_has_another_fingerprint() {
        let a = RefundRequest::new("ref-1", "ord-1", Some(500), None).unwrap();
        let b = RefundRequest::new("ref-1", "ord-1", Some(600), None).unwrap();
        let c = RefundRequest::new("ref-1", "ord-1", None, None).unwrap();
        assert_eq!(a.identity().key, b.identity().key);
        assert_ne!(a.identity().fingerprint, b.identity().fingerprint);
        assert_ne!(a.identity().fingerprint, c.identity().fingerprint);
    }
}
