//! The stored idempotency record (ARCHITECTURE.md, "The table"), as the policy sees it. Its storage
//! names are in [`super::schema`].

use std::fmt;
use std::ops::Deref;

use crate::domain::Key;
use crate::domain::clock::Time;
use crate::domain::order::Order;

/// An order's fingerprint (ARCHITECTURE.md, "The key and the fingerprint"), never confused with an owner token.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(order: &Order) -> Self {
        Self(order.fingerprint())
    }

    /// A fingerprint as stored (or made up by a test).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

/// What the table knows an order by, derived together in this one place: its key
/// (the business fact, never the message id) and its fingerprint (the payload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub key: Key,
    pub fingerprint: Fingerprint,
}

impl Identity {
    pub fn of(order: &Order) -> Self {
        Self {
            key: Key::for_order(order),
            fingerprint: Fingerprint(order.fingerprint()),
        }
    }
}

/// The random token of one attempt's lease, the fence of its writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner(String);

impl Owner {
    /// A fresh random token (UUID v4): one per attempt.
    pub fn fresh() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// A token as stored (or made up by a test).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

macro_rules! reads_as_str {
    ($($name:ident),*) => {$(
        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}

reads_as_str!(Fingerprint, Owner);

/// The state of a record (its stored values are in `contracts/schema.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// `InProgress`: a lease is (or was) held by `owner` until `lease_until`.
    InProgress,
    /// `Done`: charged; final, whatever `expires` says.
    Done,
    /// `Free`: released after a failed charge; the next delivery may reserve it.
    Free,
    /// `Awaiting`: the customer's bank asked for authentication; the record names the
    /// payment the customer is asked to confirm and when the wait ends. Only that
    /// payment's settling (an event, the scheduled settler) moves it on.
    Awaiting,
    /// `Failed`: the wait ended without a payment (cancelled, or expired and
    /// cancelled); a later message for the order starts a new attempt.
    Failed,
    /// Anything else: written by something we do not know. Never taken over.
    Other(String),
}

/// One item of the idempotency table. Optional fields are absent on items written by
/// the legacy consumer (the TypeScript consumer of "Idempotencia en consumidores": no `fingerprint`, no lease, no attempt).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub pk: Key,
    pub state: State,
    /// ms epoch of the first reservation.
    pub created: Option<Time>,
    /// s epoch; TTL attribute, retention only.
    pub expires: Option<Time>,
    pub receipt: Option<String>,
    pub fingerprint: Option<Fingerprint>,
    pub owner: Option<Owner>,
    /// ms epoch when the current lease ends.
    pub lease_until: Option<Time>,
    pub attempt: Option<u32>,
    /// ms epoch when the current attempt's key was first sent.
    pub sent: Option<Time>,
    /// How many times the provider declined this order (ARCHITECTURE.md, "The state machine").
    pub declines: Option<u32>,
    /// While `Awaiting`: the payment the customer is asked to confirm.
    pub payment: Option<String>,
    /// While `Awaiting`: s epoch when the wait ends.
    pub wait_until: Option<Time>,
    /// `Done` by the payment it awaited, paid with other fields than the order's (the
    /// customer confirmed it with another card): the fingerprint of what was paid, which
    /// the audit holds that payment to.
    pub paid_fingerprint: Option<Fingerprint>,
}

impl Record {
    /// A record with only its key and state: what a first write starts from.
    pub fn new(pk: Key, state: State) -> Self {
        Self {
            pk,
            state,
            created: None,
            expires: None,
            receipt: None,
            fingerprint: None,
            owner: None,
            lease_until: None,
            attempt: None,
            sent: None,
            declines: None,
            payment: None,
            wait_until: None,
            paid_fingerprint: None,
        }
    }

    /// Written by the legacy consumer: no fingerprint, so no lease and no provider key.
    pub fn is_legacy_format(&self) -> bool {
        self.fingerprint.is_none()
    }

    /// The attempt number, 1 when absent.
    pub fn attempt(&self) -> u32 {
        self.attempt.unwrap_or(1)
    }

    /// Declines so far, 0 when absent.
    pub fn declines(&self) -> u32 {
        self.declines.unwrap_or(0)
    }
}
