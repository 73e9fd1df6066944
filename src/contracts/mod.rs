//! The contracts (ports) the drivers call and the adapters implement, each named by
//! what its reader uses: the idempotency table ([`store`], its stored format in
//! [`schema`]), the payment provider ([`payment`]) and the queue ([`queue`]). Data and
//! traits only: no I/O, no decisions.

pub mod payment;
pub mod queue;
/// The table's storage format: the library's (`idempotent_consumer::schema`).
pub use idempotent_consumer::schema;
/// The store contract: the library's (`idempotent_consumer::store`).
pub use idempotent_consumer::store;
