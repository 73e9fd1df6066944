//! The provider's answer about one payment, as settling reads it (and, for the mutant
//! that trusts events, what an event's body claims).

use idempotent_consumer::settle::{Now, Seen};

use crate::contracts::payment::{ListedPayment, RefundSeen, Status};
use crate::domain::Fingerprint;
use crate::domain::ForOrder;
use crate::domain::order::Order;

/// What became of a payment, as the provider (or, for the mutant that trusts it, an
/// event's body) tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaymentNow {
    /// `succeeded`: final; the order is paid with it.
    Succeeded,
    /// `canceled`: final; it can never succeed.
    Canceled,
    /// A confirmation attempt failed (`requires_payment_method`): the customer may
    /// still confirm it, with this card or another, until it is cancelled.
    AttemptFailed,
    /// Still waiting for the customer (`requires_action`, `requires_confirmation`…).
    Open,
    /// `processing`: it settles by itself, either way; it cannot be cancelled.
    Processing,
}

impl PaymentNow {
    /// A PaymentIntent's `status` as the provider states it (read in
    /// `contracts/payment.rs`, [`Status`]), as settling sees it.
    pub fn of_status(status: &str) -> Self {
        match Status::read(Some(status)) {
            Status::Succeeded => Self::Succeeded,
            Status::Canceled => Self::Canceled,
            Status::Processing => Self::Processing,
            Status::RequiresPaymentMethod => Self::AttemptFailed,
            Status::RequiresConfirmation
            | Status::RequiresAction
            | Status::RequiresCapture
            | Status::Unknown => Self::Open,
        }
    }

    /// What became of the payment, in the settlement machine's words.
    pub fn now(self) -> Now {
        match self {
            Self::Succeeded => Now::Done,
            Self::Canceled => Now::Cancelled,
            Self::AttemptFailed => Now::AttemptFailed,
            Self::Open => Now::Open,
            Self::Processing => Now::InFlight,
        }
    }

    /// What an event's type claims of its payment (only the mutant that trusts events
    /// reads it), else the status its body carries.
    pub fn claimed(kind: &str, status: &str) -> Self {
        match kind {
            "payment_intent.succeeded" => Self::Succeeded,
            "payment_intent.canceled" => Self::Canceled,
            "payment_intent.payment_failed" => Self::AttemptFailed,
            _ => Self::of_status(status),
        }
    }
}

/// The provider's answer about one payment, fetched by id: what settling reads of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Found {
    pub status: PaymentNow,
    /// The fact this consumer made it for: a payment's `metadata[order_id]`, a
    /// refund's `metadata[refund_id]`.
    pub fact_id: Option<String>,
    /// The fingerprint of the order the payment describes (its order id, amount,
    /// currency, customer and payment method), when it names all of them.
    pub fingerprint: Option<Fingerprint>,
}

impl Found {
    /// A refund fetched by id, as settling reads it: `succeeded` is done, `failed` or
    /// `canceled` can never be (the bank refused it), anything else is still in flight
    /// at the bank. Its fact is the refund request (`metadata[refund_id]`); a refund
    /// names no order fields, so a refund its record does not await is for a person.
    pub fn of_refund(refund: &RefundSeen) -> Self {
        Self {
            status: match refund.status.as_str() {
                "succeeded" => PaymentNow::Succeeded,
                "failed" | "canceled" => PaymentNow::Canceled,
                _ => PaymentNow::Processing,
            },
            fact_id: refund.refund_id.clone(),
            fingerprint: None,
        }
    }

    /// The provider's answer, in the settlement machine's words.
    pub fn seen(self) -> Seen {
        Seen {
            now: self.status.now(),
            fact_id: self.fact_id,
            fingerprint: self.fingerprint,
        }
    }

    /// What settling reads of a payment the provider holds: its status, its order, and
    /// the fingerprint of the order its fields describe.
    pub fn of(payment: &ListedPayment) -> Self {
        let fingerprint = match (
            &payment.order_id,
            &payment.customer,
            &payment.payment_method,
        ) {
            (Some(order_id), Some(customer), Some(method)) => Order::new(
                order_id,
                payment.amount,
                &payment.currency,
                customer,
                method,
            )
            .ok()
            .map(|order| Fingerprint::for_order(&order)),
            _ => None,
        };
        Self {
            status: PaymentNow::of_status(&payment.status),
            fact_id: payment.order_id.clone(),
            fingerprint,
        }
    }
}
