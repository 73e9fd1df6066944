//! Store adapters: implementations of [`crate::idempotency::IdempotencyStore`]. They
//! translate the contract into one conditional request each and do nothing else.

pub mod dynamodb;
pub mod sqlite;
