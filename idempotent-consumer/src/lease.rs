//! The lease core that the record's machine and `resolve`'s share: whose record it is
//! (key, fingerprint, owner), which attempt's key it is on, until when the lease holds,
//! and the receipt to record. Both end a lease with the same two fenced writes, built
//! here once.

use crate::clock::Time;
use crate::record::{Fingerprint, Identity, Key, Owner, Record};
use crate::store::{CompleteRequest, ReleaseKind, ReleaseRequest};

/// One holder's lease on one fact's record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The record's key.
    pub key: Key,
    /// The fingerprint of the fact the lease is for.
    pub fingerprint: Fingerprint,
    /// The holder's random token: complete and release are fenced on it.
    pub owner: Owner,
    /// When the lease ends (the records' deadline, or `resolve`'s own).
    pub until: Time,
    /// `expires` written with the completion.
    pub expires: Time,
    /// The attempt whose provider key the holder is on (1 until the record says).
    pub attempt: u32,
    /// The record's creation, once leased: where lookups of its effects start.
    pub created: Option<Time>,
    /// The receipt to record, once there is one.
    pub receipt: Option<String>,
}

impl Lease {
    /// The lease `owner` asks for on `identity`'s record, until `until`.
    pub fn new(identity: Identity, owner: Owner, until: Time, expires: Time) -> Self {
        let Identity { key, fingerprint } = identity;
        Self {
            key,
            fingerprint,
            owner,
            until,
            expires,
            attempt: 1,
            created: None,
            receipt: None,
        }
    }

    /// The lease was granted: the record it left says the attempt and the creation.
    pub fn granted(&mut self, record: &Record) {
        self.attempt = record.attempt();
        self.created = record.created;
    }

    /// The provider key of the current attempt (`<pk>#<attempt>`).
    pub fn provider_key(&self) -> String {
        self.key.provider_key(self.attempt)
    }

    /// `complete` with the receipt to record, fenced on the owner (or, by attempt, on
    /// the attempt: the same request serves both writes).
    pub fn complete_request(&self) -> CompleteRequest<'_> {
        CompleteRequest {
            pk: &self.key,
            owner: &self.owner,
            attempt: self.attempt,
            receipt: self.receipt.as_deref().unwrap_or(""),
            expires: self.expires,
        }
    }

    /// `release`, fenced on the owner; `kind` says whether the key moves on.
    pub fn release_request(&self, kind: ReleaseKind) -> ReleaseRequest<'_> {
        ReleaseRequest {
            pk: &self.key,
            owner: &self.owner,
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::State;

    fn lease() -> Lease {
        let identity = Identity {
            key: Key::new("hecho#", "o-l"),
            fingerprint: Fingerprint::new("f"),
        };
        Lease::new(
            identity,
            Owner::new("me"),
            Time::from_ms(60_000),
            Time::from_secs(9_000),
        )
    }

    #[test]
    fn a_lease_starts_at_the_first_attempt_and_takes_the_records_once_granted() {
        let mut lease = lease();
        assert_eq!(lease.provider_key(), "hecho#o-l#1");
        let record = Record {
            attempt: Some(3),
            created: Some(Time::from_ms(5)),
            ..Record::new(lease.key.clone(), State::InProgress)
        };
        lease.granted(&record);
        assert_eq!(lease.provider_key(), "hecho#o-l#3");
        assert_eq!(lease.created, Some(Time::from_ms(5)));
    }

    #[test]
    fn complete_and_release_are_fenced_on_the_owner_and_carry_the_attempt_and_receipt() {
        let mut lease = lease();
        lease.attempt = 2;
        lease.receipt = Some("tr_1".into());
        let complete = lease.complete_request();
        assert_eq!(
            (
                complete.pk,
                complete.owner,
                complete.attempt,
                complete.receipt
            ),
            (&lease.key, &lease.owner, 2, "tr_1")
        );
        assert_eq!(complete.expires, Time::from_secs(9_000));
        let release = lease.release_request(ReleaseKind::KeepKey);
        assert_eq!((release.pk, release.owner), (&lease.key, &lease.owner));
        assert_eq!(release.kind, ReleaseKind::KeepKey);
    }
}
