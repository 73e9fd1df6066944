//! What an outcome's log line says: its reason (a fixed text, or the cause's whole
//! chain) and its own fields.

use std::borrow::Cow;

use super::Outcome;
use crate::policy::retry::breaker::Dependency;

impl Outcome {
    /// What the log line says about a failure, with the cause's whole chain.
    /// Fixed texts are not copied: this runs once per record.
    pub fn reason(&self) -> Option<Cow<'static, str>> {
        let fixed = match self {
            Self::Charged { .. } | Self::Reconciled { .. } | Self::Duplicate { .. } => {
                return None;
            }
            Self::FailedRetryable { cause, .. } => {
                return Some(Cow::Owned(crate::error_chain(cause)));
            }
            Self::NeedsReconciliation { cause } => {
                return Some(Cow::Owned(crate::error_chain(cause)));
            }
            Self::Declined { .. } => {
                "payment declined; the next delivery uses the next attempt's key"
            }
            Self::DeclineLimit { .. } => {
                "decline limit reached (MAX_DECLINES): not sent to the provider; after the \
                 customer fixed the card, `resolve --retry-declined` lets it try again"
            }
            Self::Rejected { .. } => {
                "the provider rejected the charge for good; fix the order or the provider's \
                 data, then redrive (the key is kept)"
            }
            Self::Deadline { .. } => {
                "too little time left before the invocation deadline to start the next call; \
                 the lease ends at the deadline and the retry goes on"
            }
            Self::InProgress { .. } => "another delivery holds a live lease on this order",
            Self::Deferred {
                dependency: Dependency::Store,
                ..
            } => {
                "the store's breaker is open (transient failures in a row): not reserved, \
                 retried with the backoff"
            }
            Self::Deferred {
                dependency: Dependency::Provider,
                ..
            } => {
                "the provider's breaker is open (transient failures in a row): not \
                 reserved, retried with the backoff"
            }
            Self::Conflict => {
                "same order id with a different payload while a payment of the recorded order \
                 may still succeed; not charged"
            }
            Self::AuthenticationRequired { .. } => {
                "the customer's bank asks for authentication: the order awaits the customer's \
                 confirmation of this payment on the shop's page; its event or the settler \
                 completes it, and no other payment is made while it is open"
            }
            Self::PaymentProcessing { .. } => {
                "the provider is processing the payment (a bank debit settles in days): the \
                 order awaits it, and its event or the settler completes or ends it"
            }
            Self::AwaitingCustomer { .. } => {
                "the order awaits its customer's confirmation of its payment; no call made"
            }
            Self::Settled { paid: true, .. } => return None,
            Self::Settled { paid: false, .. } => {
                "the customer did not confirm the payment: it is cancelled and the order \
                 ended without a payment; the shop asks for another card, and a new message \
                 for the order is a new attempt"
            }
            Self::EventIgnored { why, .. } => why,
            Self::PaymentUnrecorded { .. } => {
                "the provider says this payment succeeded for an order the table does not \
                 know (its record swept, or never made by this consumer): check it at the \
                 provider"
            }
        };
        Some(Cow::Borrowed(fixed))
    }

    /// The outcome's own fields for its log line.
    pub fn details(&self) -> Details<'_> {
        match self {
            Self::Charged {
                receipt,
                charge,
                attempt,
            }
            | Self::Reconciled {
                receipt,
                charge,
                attempt,
            } => Details {
                receipt: Some(receipt),
                charge: charge.as_deref(),
                attempt: Some(*attempt),
                ..Details::default()
            },
            Self::Duplicate { receipt } => Details {
                receipt: Some(receipt.as_deref().unwrap_or("")),
                ..Details::default()
            },
            Self::Declined {
                code,
                decline_code,
                attempt,
            } => Details {
                code: Some(code),
                decline_code: Some(decline_code.as_deref().unwrap_or("")),
                attempt: Some(*attempt),
                ..Details::default()
            },
            Self::DeclineLimit { declines } => Details {
                declines: Some(*declines),
                ..Details::default()
            },
            Self::Rejected {
                status,
                code,
                attempt,
            } => Details {
                status: Some(*status),
                code: Some(code.as_deref().unwrap_or("")),
                attempt: Some(*attempt),
                ..Details::default()
            },
            _ => self.waiting_details(),
        }
    }

    /// The log line's fields of the outcomes that fail, wait or settle.
    fn waiting_details(&self) -> Details<'_> {
        match self {
            Self::FailedRetryable { attempt, .. } => Details {
                attempt: *attempt,
                ..Details::default()
            },
            Self::Deadline { before, attempt } => Details {
                before: Some(before.as_str()),
                attempt: *attempt,
                ..Details::default()
            },
            Self::AuthenticationRequired {
                payment_id,
                attempt,
                ..
            }
            | Self::PaymentProcessing {
                payment_id,
                attempt,
                ..
            } => Details {
                payment: Some(payment_id),
                attempt: Some(*attempt),
                ..Details::default()
            },
            Self::AwaitingCustomer { payment_id } => Details {
                payment: payment_id.as_deref(),
                ..Details::default()
            },
            Self::Settled {
                payment_id,
                paid: true,
            } => Details {
                receipt: Some(payment_id),
                ..Details::default()
            },
            Self::Settled { payment_id, .. }
            | Self::EventIgnored { payment_id, .. }
            | Self::PaymentUnrecorded { payment_id } => Details {
                payment: Some(payment_id),
                ..Details::default()
            },
            Self::Conflict
            | Self::InProgress { .. }
            | Self::NeedsReconciliation { .. }
            | Self::Deferred { .. } => Details::default(),
            Self::Charged { .. }
            | Self::Reconciled { .. }
            | Self::Duplicate { .. }
            | Self::Declined { .. }
            | Self::DeclineLimit { .. }
            | Self::Rejected { .. } => Details::default(),
        }
    }
}

/// The fields an outcome adds to its log line; `None` is left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Details<'a> {
    pub receipt: Option<&'a str>,
    /// The charge a payment made (`latest_charge`), beside its receipt.
    pub charge: Option<&'a str>,
    /// The payment a person or the customer must act on.
    pub payment: Option<&'a str>,
    pub attempt: Option<u32>,
    pub code: Option<&'a str>,
    pub decline_code: Option<&'a str>,
    pub status: Option<u16>,
    pub declines: Option<u32>,
    pub before: Option<&'static str>,
}
