//! The store contract: the conditional writes the machines need, each one value
//! ([`Write`]) and one request, a read, and the awaiting index's listing. What each
//! write requires and leaves is specified in [`crate::table`]; [`crate::dynamodb`]
//! implements it.

use async_trait::async_trait;

use crate::BoxError;
use crate::clock::Time;
use crate::record::{Fingerprint, Key, Owner, Record};

/// Why a store call failed: the backend, or an item that is not a record.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed or could not be reached. The write may or may not have been
    /// applied: callers treat the record as failed, never as done.
    #[error("{operation} on {target} failed")]
    Backend {
        /// The operation, by its name (`reserve`, `get`, ...).
        operation: &'static str,
        /// The key, or the table for table-level operations.
        target: String,
        /// The backend's error, kept whole.
        #[source]
        source: BoxError,
    },
    /// An item exists but cannot be read as a record (wrong type, unknown shape).
    #[error("item {pk} is malformed: attribute `{attribute}` {problem}")]
    Malformed {
        /// The item's key (empty when it has none).
        pk: String,
        /// The attribute's stored name.
        attribute: &'static str,
        /// What is wrong with it.
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

/// Reserve `pk` for this fingerprint.
#[derive(Clone, Debug)]
pub struct ReserveRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The fact's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// Fresh random owner token of this attempt.
    pub owner: &'a Owner,
    /// The time of the reservation: leases and retention are judged by it.
    pub now: Time,
    /// End of the lease: the invocation deadline.
    pub lease_until: Time,
    /// Retention: the TTL attribute written with the reservation.
    pub expires: Time,
    /// A record with this many refusals (`refusals`) is not reserved again: the lost
    /// condition returns it, and the fact fails as refused without a provider call.
    pub max_refusals: u32,
}

/// Mark `pk` `Done` with `receipt`.
#[derive(Clone, Debug)]
pub struct CompleteRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The lease's owner token: the fence.
    pub owner: &'a Owner,
    /// The attempt whose provider key produced `receipt`.
    pub attempt: u32,
    /// The provider's reference of the effect.
    pub receipt: &'a str,
    /// Retention: the TTL attribute written with the completion.
    pub expires: Time,
}

/// Give a lease back (`Free`).
#[derive(Clone, Debug)]
pub struct ReleaseRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The lease's owner token: the fence.
    pub owner: &'a Owner,
    /// What becomes of the key and the refusal count.
    pub kind: ReleaseKind,
}

/// What a release does to the provider key and the refusal count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseKind {
    /// Keep `attempt`: the next attempt replays the same key. Every failure whose
    /// outcome at the provider is unknown or transient.
    KeepKey,
    /// After a refusal the provider stored under this key (a refusal a new attempt may overcome), so
    /// nothing was done under it: `attempt` + 1, `sent` removed, `refusals` + 1.
    Refused,
    /// `resolve` found nothing done: `attempt` + 1, `sent` removed; `refusals`
    /// removed too when a person says the cause is fixed.
    NextKey {
        /// `refusals` removed too.
        reset_refusals: bool,
    },
    /// The effect's outcome is unknown and it must happen at most once (its provider
    /// offers no key or no lookup): `Uncertain`, never reserved again, whatever
    /// `expires` says; the key and the count kept for the person who settles it.
    Uncertain,
}

/// Take a record for `resolve` (a human settling it): any non-`Done` record with the
/// same (or no) fingerprint and no live lease.
#[derive(Clone, Debug)]
pub struct ResolveLeaseRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The fact's fingerprint, which a record without one takes.
    pub fingerprint: &'a Fingerprint,
    /// `resolve`'s fresh random owner token.
    pub owner: &'a Owner,
    /// The time of the lease: a live lease is one that ends later.
    pub now: Time,
    /// When the lease ends.
    pub lease_until: Time,
}

/// Hand the fact to someone else (`Awaiting`): the reference it awaits and when the
/// wait ends, the lease removed, the key kept; same fence as `Complete`.
#[derive(Clone, Debug)]
pub struct AwaitRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The lease's owner token: the fence.
    pub owner: &'a Owner,
    /// The provider's reference of what the record awaits.
    pub awaited: &'a str,
    /// When the wait ends.
    pub wait_until: Time,
    /// Retention counted from the wait's end, so that TTL never sweeps a record whose
    /// awaited effect may still happen.
    pub expires: Time,
}

/// How an awaited effect settled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Settled {
    /// It happened: `Done`, the awaited reference its receipt, retention until
    /// `expires`; with `done_fingerprint` when what was done differs from the fact
    /// (other details the person chose), kept so an audit holds the effect to it.
    Done {
        /// Retention: the TTL attribute written with `Done`.
        expires: Time,
        /// The fingerprint of what was done, when it differs from the fact's.
        done_fingerprint: Option<Fingerprint>,
    },
    /// It was cancelled (or the wait expired and it was cancelled): `Failed`, the
    /// attempt + 1, so a later message for the fact starts a new key.
    Ended,
    /// It can no longer happen but its end is not written yet: the wait's end moved to
    /// `at` (still `Awaiting`), so that a copy of the fact sent meanwhile is retried,
    /// not acknowledged, while its producer hears of the end and the record says it.
    Ending {
        /// The wait's new end.
        at: Time,
    },
}

/// Settle an awaiting record by the reference it names: on `state = Awaiting AND
/// awaited = awaited`, which makes a repeated event or a second settler a refused
/// no-op.
#[derive(Clone, Debug)]
pub struct SettleRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The reference the record must await.
    pub awaited: &'a str,
    /// How the awaited effect settled.
    pub settled: Settled,
}

/// Record an effect the provider says happened for this fact, which the record does
/// not await (released after a lost answer, an ended wait, a lease that ended): `Done`
/// with it, on `state IN (Free, Failed) OR (InProgress AND lease ended)` and the same
/// `fingerprint`, so an effect that happened is never left unrecorded and a live
/// lease, a done fact or another payload refuses it.
#[derive(Clone, Debug)]
pub struct AdoptRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The provider's reference of the effect: the record's receipt.
    pub receipt: &'a str,
    /// The fingerprint of the fact the provider's object describes.
    pub fingerprint: &'a Fingerprint,
    /// The time of the write: whether a lease has ended is judged by it.
    pub now: Time,
    /// Retention: the TTL attribute written with `Done`.
    pub expires: Time,
}

/// The fact's payload corrected: the record takes `fingerprint`, the next attempt's key
/// and no refusals, on `state IN (Free, Failed) AND sent absent AND fingerprint <>
/// mine`: only a fact that ended without any effect that can still happen (every
/// earlier key's attempt cancelled, the current key never sent) takes another payload.
/// A reserve follows.
#[derive(Clone, Debug)]
pub struct CorrectRequest<'a> {
    /// The record's key.
    pub pk: &'a Key,
    /// The corrected payload's fingerprint.
    pub fingerprint: &'a Fingerprint,
}

/// A place in the awaiting index, which is read by the wait's end, then
/// the key: a read after it starts with the next record. Where a settler run stopped,
/// so the next run goes on from there (every wait is reached, however many there are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitingCursor {
    /// The end of the wait of the record reached.
    pub wait_until: Time,
    /// The key of the record reached.
    pub pk: Key,
}

impl AwaitingCursor {
    /// The place of `record` (`None` unless it awaits, with an end of its wait).
    pub fn of(record: &Record) -> Option<Self> {
        Some(Self {
            wait_until: record.wait_until?,
            pk: record.pk.clone(),
        })
    }
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

/// One conditional write to the idempotency table: the unit of the store contract.
/// What each one requires and leaves is specified in [`crate::table`] (`holds`,
/// `apply`); the adapters implement exactly that.
#[derive(Clone, Debug)]
pub enum Write<'a> {
    /// Wins when the key is absent, or an item of ours past `expires` that is neither
    /// `Done`, `Awaiting` nor `Uncertain`, or the item has the same `fingerprint` (any
    /// fingerprint once `Failed`), fewer than `max_refusals` refusals, and is `Free`,
    /// `Failed` or `InProgress` with an expired lease. On winning: `InProgress`, our
    /// `owner`, lease until `lease_until`, `created`/`attempt`/`sent`/`refusals` kept
    /// if present.
    Reserve(ReserveRequest<'a>),
    /// `Done` + `receipt`, lease removed, on `state = InProgress AND owner = mine`.
    Complete(CompleteRequest<'a>),
    /// The fallback when the fence is lost: the success is still a fact about its
    /// attempt, so `Done` + `receipt` on `attempt = mine AND state <> Done` (an
    /// `Uncertain` record included: what it did not know is now known).
    CompleteAttempt(CompleteRequest<'a>),
    /// `Free` (`Uncertain` for [`ReleaseKind::Uncertain`]), lease removed, the key and
    /// refusal count as `kind` says; same fence as `Complete`.
    Release(ReleaseRequest<'a>),
    /// While holding the lease: `attempt` + 1 and `sent = now`, for a key the provider
    /// may have forgotten and reconciliation did not find.
    NextAttempt {
        /// The record's key.
        pk: &'a Key,
        /// The lease's owner token: the fence.
        owner: &'a Owner,
        /// The time written as `sent`.
        now: Time,
    },
    /// For `resolve`: leases a record that exists, is neither `Done` nor `Awaiting`
    /// (resolve refuses an `Uncertain` one before it asks), has no live lease
    /// (legacy-format `InProgress` items have none) and has the same or no
    /// `fingerprint` (which it then gets). `attempt`, `sent`, `created` are kept or
    /// started.
    LeaseForResolve(ResolveLeaseRequest<'a>),
    /// While holding the lease: `Awaiting` someone else's step on the effect.
    Await(AwaitRequest<'a>),
    /// By whoever learns how the awaited effect ended (an event, the settler).
    Settle(SettleRequest<'a>),
    /// By whoever learns of an effect that happened, which the record does not await.
    Adopt(AdoptRequest<'a>),
    /// A corrected copy of a fact that ended without its effect.
    Correct(CorrectRequest<'a>),
}

impl<'a> Write<'a> {
    /// The key the write is on.
    pub fn pk(&self) -> &'a Key {
        match self {
            Self::Reserve(r) => r.pk,
            Self::Complete(r) | Self::CompleteAttempt(r) => r.pk,
            Self::Release(r) => r.pk,
            Self::NextAttempt { pk, .. } => pk,
            Self::LeaseForResolve(r) => r.pk,
            Self::Await(r) => r.pk,
            Self::Settle(r) => r.pk,
            Self::Adopt(r) => r.pk,
            Self::Correct(r) => r.pk,
        }
    }

    /// The write's name, as errors report it.
    pub fn operation(&self) -> &'static str {
        match self {
            Self::Reserve(_) => "reserve",
            Self::Complete(_) => "complete",
            Self::CompleteAttempt(_) => "complete_attempt",
            Self::Release(_) => "release",
            Self::NextAttempt { .. } => "next_attempt",
            Self::LeaseForResolve(_) => "lease_for_resolve",
            Self::Await(_) => "await",
            Self::Settle(_) => "settle",
            Self::Adopt(_) => "adopt",
            Self::Correct(_) => "correct",
        }
    }
}

/// The idempotency table, one item per key: the few primitives every backend offers.
/// Implementations do only I/O; deciding what a refused write means is the state
/// machines' job, so every refused write returns the old record.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Performs one conditional write as one request.
    async fn write(&self, write: &Write<'_>) -> Result<WriteOutcome, StoreError>;

    /// Strongly consistent read.
    async fn get(&self, pk: &Key) -> Result<Option<Record>, StoreError>;

    /// Every record that awaits someone else whose wait ends before `until` (all of
    /// them with a far `until`), soonest first (then by key), starting after `after`
    /// when given, at most `limit`: the settler's and the audit's reads, from the
    /// awaiting index (never a scan of the table).
    async fn awaiting(
        &self,
        after: Option<&AwaitingCursor>,
        until: Time,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// Where the settler's last run stopped in the awaiting index (`None`: at its
    /// start). One item of its own, outside the index.
    async fn settle_cursor(&self) -> Result<Option<AwaitingCursor>, StoreError>;

    /// Keeps where this settler run stopped (`None`: back to the start).
    async fn save_settle_cursor(&self, cursor: Option<&AwaitingCursor>) -> Result<(), StoreError>;
}
