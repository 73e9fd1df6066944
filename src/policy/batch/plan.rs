//! The batch's plan, pure (ARCHITECTURE.md, "The batch" and "Retries"): the library's
//! (`idempotent_consumer::batch`: one [`Entry`] per record, grouping, the skip rule,
//! dispositions, queue calls and the partial batch response), with what a record of the
//! orders queue is: an order with what the table knows it by, or a provider's payment
//! event ([`Valid`]). A standard queue's groups are chained by the order's customer, as
//! the provider locks a customer during a payment; the batch's I/O layer
//! (`drivers/batch/`) converts the event source's types, runs the records, makes the
//! queue calls, and hands the time and the jitter in.

use idempotent_consumer::batch::{self as library, Unit};

use crate::domain::event::PaymentEvent;
use crate::domain::message::Incoming;
use crate::domain::order::{Order, OrderError};
use crate::domain::{ForOrder, Identity, Key, OrderKey};
use crate::policy::outcome::Outcome;

pub use idempotent_consumer::batch::{
    BatchError, FifoScope, InOrder, Message, Response, Retries, Schedule, Skip, dead_lettered,
    dead_letters, dispose, response, schedule, visibility_changes,
};

/// One record of the batch, from its parse to its place in the response.
pub type Entry<'a> = library::Entry<'a, Valid, Outcome, OrderError>;

/// A valid record: an order with what the table knows it by (derived once per
/// record), or a provider's payment event with the key of the order it names (none:
/// a thin event, whose order the provider's answer names).
#[derive(Debug)]
pub enum Valid {
    Order {
        order: Order,
        identity: Identity,
    },
    Event {
        event: PaymentEvent,
        key: Option<Key>,
    },
}

impl Unit for Valid {
    const NAME: &'static str = "order";

    /// The key of the order the record is about.
    fn key(&self) -> Option<&Key> {
        match self {
            Self::Order { identity, .. } => Some(&identity.key),
            Self::Event { key, .. } => key.as_ref(),
        }
    }

    /// Its order's key, or, for an event that names no order (a thin event: the
    /// payment's order is read from the provider), its payment, so that copies of one
    /// event run one after another.
    fn group_key(&self) -> Option<&str> {
        match self {
            Self::Event { event, key: None } => Some(event.payment_id.as_str()),
            _ => self.key().map(Key::as_str),
        }
    }

    /// The customer of an order (the provider locks a customer during a payment), the
    /// order's key for an event (it calls no provider to charge). The two never meet: a
    /// key starts with `cobro#`, a customer never does.
    fn chain_key(&self) -> Option<&str> {
        match self {
            Self::Order { order, .. } => Some(order.customer()),
            Self::Event { key, .. } => key.as_ref().map(Key::as_str),
        }
    }

    /// A group is chained by its first order's customer, or, for a group of events
    /// alone, by their order's key.
    fn leads_chain(&self) -> bool {
        matches!(self, Self::Order { .. })
    }
}

/// Parses every record: an order, or a provider's payment event; an invalid one has
/// its outcome at once.
pub fn parse<'a>(messages: &[Message<'a>]) -> Result<Vec<Entry<'a>>, BatchError> {
    library::parse(messages, |body| {
        Incoming::parse(body).map(|incoming| match incoming {
            Incoming::Order(order) => Valid::Order {
                identity: Identity::for_order(&order),
                order,
            },
            Incoming::PaymentEvent(event) => Valid::Event {
                key: event.order_id.as_deref().map(Key::for_order_id),
                event,
            },
        })
    })
}

#[cfg(test)]
mod tests;
