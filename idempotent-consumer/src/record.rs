//! The stored idempotency record, as the machines see it: the key (the business fact,
//! never the message id), the fingerprint of the payload, the owner token of a lease,
//! the record's states and fields. Their storage names are in [`crate::schema`].

use std::fmt;
use std::ops::Deref;

use crate::clock::Time;

/// The partition key of the idempotency table: `<kind>#<id>`, the kind of fact (its
/// prefix, `<kind>#`) and the fact's id, which holds no `#`.
///
/// Built from the business fact (a purchase id, a request id), never from the queue's
/// message id: an SNS fan-out or a producer retry gives the same fact a new message
/// id (the pattern card's trap 3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// The key of fact `id` under `prefix`, its kind and `#` (`"transfer#"`).
    /// Validating the id (no `#`, not empty) is the fact's parser's job.
    pub fn new(prefix: &str, id: &str) -> Self {
        Self(format!("{prefix}{id}"))
    }

    /// A key read back from the table: `<kind>#<id>`, both parts not empty; `None`
    /// otherwise.
    pub fn from_stored(pk: &str) -> Option<Self> {
        let at = pk.find('#')?;
        (at > 0 && at + 1 < pk.len()).then(|| Self(pk.to_owned()))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The fact's id: the key after its prefix's `#`.
    pub fn id(&self) -> &str {
        self.0.split_once('#').map_or("", |(_, id)| id)
    }

    /// The prefix, its `#` included.
    pub fn prefix(&self) -> &str {
        &self.0[..self.0.len() - self.id().len()]
    }

    /// The idempotency key the provider gets for an attempt: `<pk>#<attempt>`.
    ///
    /// A replay with the same attempt gets the provider's stored outcome, so a crash
    /// between the effect and `complete` cannot apply it twice.
    pub fn provider_key(&self, attempt: u32) -> String {
        format!("{}#{attempt}", self.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A payload's fingerprint, never confused with an owner token: the same key with
/// another fingerprint is another payload under the same fact's id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// A fingerprint as computed by the fact's parser, or as stored.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

/// What the table knows a fact by, derived together: its key and its fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The fact's key.
    pub key: Key,
    /// The fact's fingerprint.
    pub fingerprint: Fingerprint,
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

/// The state of a record (its stored values are in [`crate::schema`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// `InProgress`: a lease is (or was) held by `owner` until `lease_until`.
    InProgress,
    /// `Done`: the effect is applied and recorded; final, whatever `expires` says.
    Done,
    /// `Free`: released after a failed attempt; the next delivery may reserve it.
    Free,
    /// `Awaiting`: the effect waits for someone else (a person to confirm it, a
    /// provider to process it); the record names what it awaits and when the wait
    /// ends. Only that reference's settling (an event, the scheduled settler) moves it
    /// on.
    Awaiting,
    /// `Failed`: the wait ended without the effect (cancelled, or expired and
    /// cancelled); a later message for the fact starts a new attempt.
    Failed,
    /// `Uncertain`: the effect's outcome is unknown and its provider offers no key or
    /// no lookup; an at-most-once effect is never performed again, so the record is
    /// final for every delivery, and a person settles it.
    Uncertain,
    /// Anything else: written by something we do not know. Never taken over.
    Other(String),
}

/// One item of the idempotency table. Optional fields are absent on items written by
/// the legacy consumer (the pattern card's TypeScript consumer: no `fingerprint`, no
/// lease, no attempt).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// The record's key.
    pub pk: Key,
    /// The record's state.
    pub state: State,
    /// ms epoch of the first reservation.
    pub created: Option<Time>,
    /// s epoch; TTL attribute, retention only.
    pub expires: Option<Time>,
    /// Once `Done`: the provider's reference of the effect.
    pub receipt: Option<String>,
    /// The fingerprint of the fact's payload.
    pub fingerprint: Option<Fingerprint>,
    /// The random token of the current lease.
    pub owner: Option<Owner>,
    /// ms epoch when the current lease ends.
    pub lease_until: Option<Time>,
    /// The attempt whose provider key is current.
    pub attempt: Option<u32>,
    /// ms epoch when the current attempt's key was first sent.
    pub sent: Option<Time>,
    /// How many times the provider refused an attempt of this fact in a way a new
    /// attempt may overcome (counted refusals; a refusal for good is not counted).
    pub refusals: Option<u32>,
    /// While `Awaiting`: the provider's reference of what the record awaits.
    pub awaited: Option<String>,
    /// While `Awaiting`: s epoch when the wait ends.
    pub wait_until: Option<Time>,
    /// `Done` by what it awaited, completed with other fields than the fact's (a
    /// person who confirmed with other details): the fingerprint of what was done,
    /// which an audit holds the provider's object to.
    pub done_fingerprint: Option<Fingerprint>,
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
            refusals: None,
            awaited: None,
            wait_until: None,
            done_fingerprint: None,
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

    /// Refusals so far, 0 when absent.
    pub fn refusals(&self) -> u32 {
        self.refusals.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_its_prefix_and_id_and_the_provider_key_appends_the_attempt() {
        let key = Key::new("hecho#", "p-1");
        assert_eq!(
            (key.as_str(), key.prefix(), key.id()),
            ("hecho#p-1", "hecho#", "p-1")
        );
        assert_eq!(key.provider_key(1), "hecho#p-1#1");
        assert_eq!(key.provider_key(12), "hecho#p-1#12");
    }

    #[test]
    fn a_stored_key_reads_back_only_with_a_prefix_and_an_id() {
        assert_eq!(
            Key::from_stored("hecho#p-1"),
            Some(Key::new("hecho#", "p-1"))
        );
        for bad in ["hecho#", "#p-1", "p-1", ""] {
            assert_eq!(Key::from_stored(bad), None, "{bad}");
        }
    }
}
