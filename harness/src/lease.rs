//! Leases taken outside the consumer under test (another invocation, one that died):
//! a reservation of one order by one owner, made in a store and judged as the
//! consumer judges its own. (The store contract suite builds its raw requests itself:
//! it tests the writes, not the consumer.)

use charge_once::domain::ForOrder;
use std::time::Duration;

use charge_once::contracts::store::{
    IdempotencyStore, ReleaseKind, ReleaseRequest, ReserveRequest, Write,
};
use charge_once::domain::clock::Time;
use charge_once::domain::order::Order;
use charge_once::domain::{Fingerprint, Identity, Key, Owner};
use charge_once::policy::table::{Reservation, judge};

/// A reservation of one order by one owner.
#[derive(Clone, Debug)]
pub struct Lease {
    pk: Key,
    fingerprint: Fingerprint,
    owner: Owner,
    now: Time,
    lease_until: Time,
    expires: Time,
    max_declines: u32,
}

impl Lease {
    /// `order` reserved by `owner` at `now`: a lease of one minute, the default
    /// retention (400 days) and decline limit (3).
    pub fn of(order: &Order, owner: &str, now: Time) -> Self {
        let identity = Identity::for_order(order);
        Self {
            pk: identity.key,
            fingerprint: identity.fingerprint,
            owner: Owner::new(owner),
            now,
            lease_until: now + Duration::from_secs(60),
            expires: now + Duration::from_secs(400 * 24 * 3600),
            max_declines: 3,
        }
    }

    /// The lease ends at `until`.
    pub fn until(self, lease_until: Time) -> Self {
        Self {
            lease_until,
            ..self
        }
    }

    /// `expira` is `expires`.
    pub fn expiring(self, expires: Time) -> Self {
        Self { expires, ..self }
    }

    pub fn max_declines(self, max_declines: u32) -> Self {
        Self {
            max_declines,
            ..self
        }
    }

    pub fn request(&self) -> ReserveRequest<'_> {
        ReserveRequest {
            pk: &self.pk,
            fingerprint: &self.fingerprint,
            owner: &self.owner,
            now: self.now,
            lease_until: self.lease_until,
            expires: self.expires,
            max_refusals: self.max_declines,
        }
    }

    /// Makes it in `store`, judged as the consumer judges its own.
    pub async fn make(&self, store: &dyn IdempotencyStore) -> Reservation {
        let request = self.request();
        let answer = store.write(&Write::Reserve(request.clone())).await.unwrap();
        judge(answer, &request)
    }

    /// Releases it after a decline, as its holder would: the next attempt's key.
    pub async fn release_declined(&self, store: &dyn IdempotencyStore) {
        let release = Write::Release(ReleaseRequest {
            pk: &self.pk,
            owner: &self.owner,
            kind: ReleaseKind::Refused,
        });
        store.write(&release).await.unwrap();
    }
}
