//! The idempotency key (`cobro#<id>`) and the provider key derived from it.

use std::fmt;

use crate::domain::order::Order;

/// Partition key of the idempotency table: `cobro#<order id>`.
///
/// Built from the business fact (the order id), never from the SQS message id: an
/// SNS fan-out or a producer retry gives the same order a new message id (trap 3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    pub const PREFIX: &'static str = "cobro#";

    /// The key of an order: built once per record and carried from there.
    pub fn for_order(order: &Order) -> Self {
        Self::for_order_id(order.id())
    }

    /// The key of an order id. Validation of the id (no `#`) is `Order`'s job.
    pub fn for_order_id(order_id: &str) -> Self {
        Self(format!("{}{order_id}", Self::PREFIX))
    }

    /// A key read back from the table; `None` unless it is `cobro#<something>`.
    pub fn from_stored(pk: &str) -> Option<Self> {
        pk.strip_prefix(Self::PREFIX)
            .filter(|id| !id.is_empty())
            .map(|_| Self(pk.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The order id part of the key.
    pub fn order_id(&self) -> &str {
        &self.0[Self::PREFIX.len()..]
    }

    /// The key the provider gets for an attempt: `<pk>#<attempt>`.
    ///
    /// A replay with the same attempt gets the provider's stored outcome, so a crash
    /// between charging and `complete` cannot charge twice.
    pub fn provider_key(&self, attempt: u32) -> String {
        format!("{}#{attempt}", self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
