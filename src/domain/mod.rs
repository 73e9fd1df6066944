//! The words every layer shares, pure: the time, the order as a message carries it,
//! the provider's payment events, what a message of the orders queue is (either), a
//! refund request as the refunds queue carries it, and what the table knows an order
//! by (its key, fingerprint and stored record).

/// Time, from the library (`idempotent_consumer::clock`).
pub use idempotent_consumer::clock;
pub mod event;
mod key;
pub mod message;
pub mod order;
pub mod refund;

pub use idempotent_consumer::record::{Fingerprint, Identity, Key, Owner, Record, State};
pub use key::{ForOrder, ORDER_PREFIX, OrderKey};
