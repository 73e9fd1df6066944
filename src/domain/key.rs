//! What the table knows an order by: its key (`cobro#<order id>`), its fingerprint and
//! both together, as the library's record types ([`idempotent_consumer::record`])
//! built from an order. The key's prefix is the orders' in the shared table.

use idempotent_consumer::record::{Fingerprint, Identity, Key};

use crate::domain::order::Order;

/// The prefix of an order's key in the table: `cobro#<order id>`.
pub const ORDER_PREFIX: &str = "cobro#";

/// The library's types, made from an order in this one place.
pub trait ForOrder {
    fn for_order(order: &Order) -> Self;
}

impl ForOrder for Key {
    /// Built from the business fact (the order id), never from the SQS message id: an
    /// SNS fan-out or a producer retry gives the same order a new message id (trap 3).
    fn for_order(order: &Order) -> Self {
        Key::for_order_id(order.id())
    }
}

impl ForOrder for Fingerprint {
    fn for_order(order: &Order) -> Self {
        Fingerprint::new(order.fingerprint())
    }
}

impl ForOrder for Identity {
    fn for_order(order: &Order) -> Self {
        Identity {
            key: Key::for_order(order),
            fingerprint: Fingerprint::for_order(order),
        }
    }
}

/// An order's key by its id, and its id back.
pub trait OrderKey {
    /// The key of an order id. Validation of the id (no `#`) is `Order`'s job.
    fn for_order_id(order_id: &str) -> Self;
    /// The order id part of the key.
    fn order_id(&self) -> &str;
}

impl OrderKey for Key {
    fn for_order_id(order_id: &str) -> Self {
        Key::new(ORDER_PREFIX, order_id)
    }

    fn order_id(&self) -> &str {
        self.id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_key_appends_the_attempt_to_the_partition_key() {
        let key = Key::for_order_id("ord-1");
        assert_eq!(key.as_str(), "cobro#ord-1");
        assert_eq!(key.order_id(), "ord-1");
        assert_eq!(key.provider_key(1), "cobro#ord-1#1");
        assert_eq!(key.provider_key(12), "cobro#ord-1#12");
    }

    #[test]
    fn the_key_is_the_order_id_whatever_shape_or_copy_carried_it() {
        let raw = r#"{"id":"A-1","amount":5000,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#;
        let sns = serde_json::json!({"Type": "Notification", "MessageId": "m-2", "Message": raw})
            .to_string();
        let keys: Vec<Key> = [raw.to_owned(), sns]
            .iter()
            .map(|body| Key::for_order(&Order::parse(body).unwrap()))
            .collect();
        assert_eq!(keys[0].as_str(), "cobro#A-1");
        assert_eq!(
            keys[0], keys[1],
            "an SNS copy has another message id, the same key"
        );
    }
}
