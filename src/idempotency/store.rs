//! The store contract: the conditional writes the state machine needs, each one
//! request (DESIGN §5). Implementations do only I/O; deciding what a lost condition
//! means is the state machine's job, so every losing write returns the old record.

use async_trait::async_trait;

use super::{Fingerprint, Key, Owner, Record};
use crate::BoxError;
use crate::clock::Time;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed or could not be reached. The write may or may not have been
    /// applied: callers treat the record as failed, never as done.
    #[error("{operation} on {target} failed")]
    Backend {
        operation: &'static str,
        /// The key, or the table for table-level operations.
        target: String,
        #[source]
        source: BoxError,
    },
    /// An item exists but cannot be read as a record (wrong type, unknown shape).
    #[error("item {pk} is malformed: attribute `{attribute}` {problem}")]
    Malformed {
        pk: String,
        attribute: &'static str,
        problem: &'static str,
    },
}

impl StoreError {
    /// A backend failure of `operation` on `target` (a key or a table), source kept.
    pub fn backend<E>(operation: &'static str, target: &str, source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::Backend {
            operation,
            target: target.to_owned(),
            source: Box::new(source),
        }
    }
}

/// Reserve `pk` for this fingerprint (DESIGN §5 "reserve").
#[derive(Clone, Debug)]
pub struct ReserveRequest<'a> {
    pub pk: &'a Key,
    pub fingerprint: &'a Fingerprint,
    /// Fresh random owner token of this attempt.
    pub owner: &'a Owner,
    pub now: Time,
    /// End of the lease: the invocation deadline.
    pub lease_until: Time,
    /// Retention: the TTL attribute written with the reservation.
    pub expires: Time,
    /// A record with this many declines (`rechazos`) is not reserved again: the lost
    /// condition returns it, and the order fails as declined without a provider call.
    pub max_declines: u32,
}

/// Mark `pk` `hecho` with `recibo`.
#[derive(Clone, Debug)]
pub struct CompleteRequest<'a> {
    pub pk: &'a Key,
    pub owner: &'a Owner,
    /// The attempt whose provider key produced `recibo`.
    pub attempt: u32,
    pub receipt: &'a str,
    pub expires: Time,
}

/// Give a lease back (`libre`).
#[derive(Clone, Debug)]
pub struct ReleaseRequest<'a> {
    pub pk: &'a Key,
    pub owner: &'a Owner,
    pub kind: ReleaseKind,
}

/// What a release does to the provider key and the decline count (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseKind {
    /// Keep `intento`: the next attempt replays the same key. Every failure whose
    /// outcome at the provider is unknown or transient.
    KeepKey,
    /// After a 402: the provider stored a decline under this key, so nothing was
    /// charged under it. `intento` + 1, `enviado` removed, `rechazos` + 1.
    Declined,
    /// `resolve` found no charge: `intento` + 1, `enviado` removed; `rechazos`
    /// removed too when a human says the customer fixed the card.
    NextKey { reset_declines: bool },
}

/// Take a record for `resolve` (a human settling it): any non-`hecho` record with the
/// same (or no) fingerprint and no live lease.
#[derive(Clone, Debug)]
pub struct ResolveLeaseRequest<'a> {
    pub pk: &'a Key,
    pub fingerprint: &'a Fingerprint,
    pub owner: &'a Owner,
    pub now: Time,
    pub lease_until: Time,
}

/// The answer to every conditional write (a reservation included).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WriteOutcome {
    /// The condition held; the record as written.
    Applied(Record),
    /// The condition failed; the record that made it fail (`None` if it vanished
    /// between the write and the fallback read).
    Refused(Option<Record>),
}

/// The idempotency table. One item per key; every write is one conditional request.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Wins when the key is absent, or a non-`hecho` item of ours is past `expira`,
    /// or the item has the same `huella`, fewer than `max_declines` declines, and is
    /// `libre` or `en-curso` with an expired lease. On winning: `en-curso`, our
    /// `titular`, lease until `lease_until`, `creado`/`intento`/`enviado`/`rechazos`
    /// kept if present. On losing, the old item.
    async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<WriteOutcome, StoreError>;

    /// `hecho` + `recibo`, lease removed, on `estado = en-curso AND titular = mine`.
    async fn complete(&self, req: &CompleteRequest<'_>) -> Result<WriteOutcome, StoreError>;

    /// The fallback when the fence is lost: the success is still a fact about
    /// attempt `intento`, so write `hecho` + `recibo` on `intento = :mine AND estado <>
    /// hecho`.
    async fn complete_attempt(&self, req: &CompleteRequest<'_>)
    -> Result<WriteOutcome, StoreError>;

    /// `libre`, lease removed, the key and decline count as `kind` says; same fence
    /// as `complete`.
    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<WriteOutcome, StoreError>;

    /// While holding the lease: `intento` + 1 and `enviado = now`, for a key the
    /// provider may have forgotten and reconciliation did not find (DESIGN §5).
    async fn next_attempt(
        &self,
        pk: &Key,
        owner: &Owner,
        now: Time,
    ) -> Result<WriteOutcome, StoreError>;

    /// For `resolve`: leases a record that exists, is not `hecho`, has no live lease
    /// (card-format `en-curso` items have none) and has the same or no `huella`
    /// (which it then gets). `intento`, `enviado`, `creado` are kept or started.
    async fn lease_for_resolve(
        &self,
        req: &ResolveLeaseRequest<'_>,
    ) -> Result<WriteOutcome, StoreError>;

    /// Strongly consistent read.
    async fn get(&self, pk: &Key) -> Result<Option<Record>, StoreError>;

    /// For the audit: every record first reserved at or after `since` (`creado`;
    /// card-format items have none). Every page is read, or an error: never a
    /// shorter list.
    async fn created_since(&self, since: Time) -> Result<Vec<Record>, StoreError>;
}
