//! The store contract suite (ARCHITECTURE.md, "The table" and "The state machine"),
//! one suite run against every store: DynamoDB on moto (behind its lock) and on
//! dynalite, and the SQLite store of local runs (`local/`, a dev-dependency here, never
//! shipped). Each test gets a fresh table (or file); times are explicit so expiry is
//! tested without waiting.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::OrderKey;
use std::time::Duration;

use charge_once::contracts::schema::{Value, attr};
use charge_once::contracts::store::{
    AdoptRequest, AwaitRequest, AwaitingCursor, CompleteRequest, CorrectRequest, IdempotencyStore,
    ReleaseKind, ReleaseRequest, ReserveRequest, ResolveLeaseRequest, SettleRequest, Settled,
    StoreError, Write, WriteOutcome,
};
use charge_once::domain::clock::Time;
use charge_once::domain::{Fingerprint, Key, Owner, Record, State};
use charge_once::policy::table::{Reservation, judge};
use charge_once_local::sqlite::SqliteStore;
use harness::servers::{Backend, Table, legacy_item};
use std::sync::Arc;

/// A fresh, empty store, and a way to write items as the legacy consumer did.
struct Fixture {
    store: Arc<dyn IdempotencyStore>,
    legacy: LegacyWriter,
}

enum LegacyWriter {
    Dynamo(Table),
    Sqlite(std::path::PathBuf, #[allow(dead_code)] tempfile::TempDir),
}

impl Fixture {
    async fn dynamo(backend: Backend) -> Self {
        let table = backend.fresh_table().await;
        Self {
            store: table.dyn_store(),
            legacy: LegacyWriter::Dynamo(table),
        }
    }

    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("contract.sqlite3");
        Self {
            store: Arc::new(SqliteStore::open(&path).unwrap()),
            legacy: LegacyWriter::Sqlite(path, dir),
        }
    }

    /// An item as the legacy consumer (the pattern card's TypeScript consumer) writes it: no fingerprint,
    /// no lease, no attempt.
    async fn put_legacy_item(&self, pk: &Key, state: State, receipt: Option<&str>, expires: Time) {
        self.put_item(legacy_item(pk, state, receipt, expires))
            .await;
    }

    /// Writes an item as another program would, attribute by attribute.
    async fn put_item(&self, item: Vec<(&'static str, Value)>) {
        match &self.legacy {
            LegacyWriter::Dynamo(table) => table.put_item(item).await,
            LegacyWriter::Sqlite(path, _) => {
                let names: Vec<&str> = item.iter().map(|(name, _)| *name).collect();
                let marks: Vec<String> = (1..=item.len()).map(|i| format!("?{i}")).collect();
                let values: Vec<rusqlite::types::Value> = item
                    .into_iter()
                    .map(|(_, value)| match value {
                        Value::S(s) => rusqlite::types::Value::Text(s),
                        Value::N(n) => rusqlite::types::Value::Integer(n),
                    })
                    .collect();
                let insert = format!(
                    "INSERT INTO idempotency ({}) VALUES ({})",
                    names.join(", "),
                    marks.join(", ")
                );
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.execute(&insert, rusqlite::params_from_iter(values))
                    .unwrap();
            }
        }
    }
}

const T: Time = harness::clock::TestClock::START;
const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
const H1: &str = "a29fade9ee1924fb759ed6201b67e1d73624e2c1014aec86f4d90bdace3691bc";
const H2: &str = "0000000000000000000000000000000000000000000000000000000000000002";

/// A test's owner token, kept for the life of the test binary (requests borrow it).
fn tok(name: &str) -> &'static Owner {
    Box::leak(Box::new(Owner::new(name)))
}

/// A test's fingerprint, kept likewise.
fn fp(value: &str) -> &'static Fingerprint {
    Box::leak(Box::new(Fingerprint::new(value)))
}

/// A reservation by `owner` at `now`, lease of one minute, retention 400 days.
fn req<'a>(pk: &'a Key, fingerprint: &str, owner: &str, now: Time) -> ReserveRequest<'a> {
    ReserveRequest {
        pk,
        fingerprint: fp(fingerprint),
        owner: tok(owner),
        now,
        lease_until: now + MINUTE,
        expires: now + Duration::from_secs(400 * 24 * 3600),
        max_refusals: MAX_DECLINES,
    }
}

const MAX_DECLINES: u32 = 3;

fn complete<'a>(pk: &'a Key, owner: &str, attempt: u32, receipt: &'a str) -> CompleteRequest<'a> {
    CompleteRequest {
        pk,
        owner: tok(owner),
        attempt,
        receipt,
        expires: Time::from_secs(T.as_secs() + 400 * 24 * 3600),
    }
}

/// A release by `titular`; `declined`: after a 402 (next key, one more decline).
fn release<'a>(pk: &'a Key, owner: &str, declined: bool) -> ReleaseRequest<'a> {
    let kind = if declined {
        ReleaseKind::Refused
    } else {
        ReleaseKind::KeepKey
    };
    ReleaseRequest {
        pk,
        owner: tok(owner),
        kind,
    }
}

/// The reserve write, judged as the state machine judges it.
async fn reserve(
    store: &dyn IdempotencyStore,
    r: &ReserveRequest<'_>,
) -> Result<Reservation, StoreError> {
    Ok(judge(store.write(&Write::Reserve(r.clone())).await?, r))
}

async fn won(store: &dyn IdempotencyStore, r: &ReserveRequest<'_>) -> Record {
    match reserve(store, r).await.expect("reserve") {
        Reservation::Won(record) => record,
        other => panic!("expected Won, got {other:?}"),
    }
}

async fn judged(store: &dyn IdempotencyStore, r: &ReserveRequest<'_>) -> Reservation {
    reserve(store, r).await.expect("reserve")
}

fn applied(outcome: WriteOutcome) -> Record {
    match outcome {
        WriteOutcome::Applied(record) => record,
        WriteOutcome::Refused(old) => panic!("expected Applied, refused by {old:?}"),
    }
}

fn key() -> Key {
    Key::for_order_id(&format!("ord-{}", uuid::Uuid::new_v4().simple()))
}

async fn fresh_reserve_wins_with_a_new_lease(t: Fixture) {
    let pk = key();
    let record = won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.owner.as_deref(), Some("a"));
    assert_eq!(record.fingerprint.as_deref(), Some(H1));
    assert_eq!(record.attempt, Some(1));
    assert_eq!(record.created, Some(T));
    assert_eq!(record.sent, Some(T));
    assert_eq!(record.lease_until, Some(T + MINUTE));
    assert_eq!(t.store.get(&pk).await.unwrap(), Some(record));
}

async fn duplicate_returns_the_stored_receipt(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    let done = applied(
        t.store
            .write(&Write::Complete(complete(&pk, "a", 1, "ch_1")))
            .await
            .unwrap(),
    );
    assert_eq!(done.state, State::Done);
    assert_eq!(done.owner, None, "the lease is removed on complete");
    assert_eq!(done.lease_until, None);
    assert_eq!(
        judged(t.store.as_ref(), &req(&pk, H1, "b", T + ms(1))).await,
        Reservation::Duplicate {
            receipt: Some("ch_1".into())
        }
    );
}

async fn a_done_item_past_its_expiry_is_still_a_duplicate(t: Fixture) {
    let pk = key();
    let mut first = req(&pk, H1, "a", T);
    first.expires = Time::from_secs(T.as_secs() + 1);
    won(t.store.as_ref(), &first).await;
    let mut done = complete(&pk, "a", 1, "ch_1");
    done.expires = Time::from_secs(T.as_secs() + 1);
    applied(t.store.write(&Write::Complete(done.clone())).await.unwrap());
    // Ten days later TTL has not swept it yet: it is still final.
    assert_eq!(
        judged(t.store.as_ref(), &req(&pk, H1, "b", T + 10 * DAY)).await,
        Reservation::Duplicate {
            receipt: Some("ch_1".into())
        }
    );
}

async fn an_unfinished_item_past_its_expiry_counts_as_absent(t: Fixture) {
    let pk = key();
    let mut first = req(&pk, H1, "a", T);
    first.expires = Time::from_secs(T.as_secs() + 1);
    first.lease_until = T + 30 * DAY;
    won(t.store.as_ref(), &first).await;
    // Past `expira`, even a live lease and another payload do not stop a reservation.
    let record = won(t.store.as_ref(), &req(&pk, H2, "b", T + 10 * DAY)).await;
    assert_eq!(record.owner.as_deref(), Some("b"));
    assert_eq!(record.fingerprint.as_deref(), Some(H2));
}

async fn other_fingerprint_is_a_conflict(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    assert!(matches!(
        judged(t.store.as_ref(), &req(&pk, H2, "b", T + ms(1))).await,
        Reservation::Conflict { stored_fingerprint: Some(h), .. } if &*h == H1
    ));
    // Also when the first one is done, released, or its lease expired.
    applied(
        t.store
            .write(&Write::Release(release(&pk, "a", false)))
            .await
            .unwrap(),
    );
    assert!(matches!(
        judged(t.store.as_ref(), &req(&pk, H2, "b", T + 2 * MINUTE)).await,
        Reservation::Conflict { .. }
    ));
    won(t.store.as_ref(), &req(&pk, H1, "c", T + 2 * MINUTE)).await;
    applied(
        t.store
            .write(&Write::Complete(complete(&pk, "c", 1, "ch_1")))
            .await
            .unwrap(),
    );
    assert!(matches!(
        judged(t.store.as_ref(), &req(&pk, H2, "d", T + 3 * MINUTE)).await,
        Reservation::Conflict { .. }
    ));
}

async fn live_lease_is_in_progress(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    assert_eq!(
        judged(t.store.as_ref(), &req(&pk, H1, "b", T + MINUTE - ms(1))).await,
        Reservation::InProgress {
            until: Some(T + MINUTE)
        }
    );
}

async fn our_own_retried_reserve_is_won(t: Fixture) {
    let pk = key();
    let first = req(&pk, H1, "a", T);
    let record = won(t.store.as_ref(), &first).await;
    // The SDK resends the same request after a lost response: the condition fails on
    // our own write, and the lease is recognised as ours.
    assert_eq!(won(t.store.as_ref(), &first).await, record);
}

async fn an_expired_lease_is_taken_over_keeping_the_attempt(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    applied(
        t.store
            .write(&Write::Release(release(&pk, "a", true)))
            .await
            .unwrap(),
    );
    won(t.store.as_ref(), &req(&pk, H1, "b", T + ms(1))).await;
    let taken = won(
        t.store.as_ref(),
        &req(&pk, H1, "c", T + ms(1) + MINUTE + ms(1)),
    )
    .await;
    assert_eq!(taken.owner.as_deref(), Some("c"));
    assert_eq!(
        taken.attempt,
        Some(2),
        "takeover keeps the attempt (and its provider key)"
    );
    assert_eq!(taken.created, Some(T), "creado is the first reservation");
    assert_eq!(
        taken.sent,
        Some(T + ms(1)),
        "enviado is when attempt 2 was first sent"
    );
}

async fn a_free_item_is_reserved_again(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    let released = applied(
        t.store
            .write(&Write::Release(release(&pk, "a", false)))
            .await
            .unwrap(),
    );
    assert_eq!(released.state, State::Free);
    assert_eq!(released.owner, None);
    let again = won(t.store.as_ref(), &req(&pk, H1, "b", T + ms(1))).await;
    assert_eq!(again.owner.as_deref(), Some("b"));
    assert_eq!(again.attempt, Some(1));
}

async fn complete_and_release_with_a_stale_owner_are_refused(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    won(t.store.as_ref(), &req(&pk, H1, "b", T + 2 * MINUTE)).await;
    let refused = t
        .store
        .write(&Write::Complete(complete(&pk, "a", 1, "ch_zombie")))
        .await
        .unwrap();
    assert!(matches!(&refused, WriteOutcome::Refused(Some(r)) if r.owner.as_deref() == Some("b")));
    let refused = t
        .store
        .write(&Write::Release(release(&pk, "a", true)))
        .await
        .unwrap();
    assert!(matches!(refused, WriteOutcome::Refused(Some(_))));
    let refused = t
        .store
        .write(&Write::NextAttempt {
            pk: &pk,
            owner: tok("a"),
            now: T + 3 * MINUTE,
        })
        .await
        .unwrap();
    assert!(matches!(refused, WriteOutcome::Refused(Some(_))));
    let record = t.store.get(&pk).await.unwrap().unwrap();
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.owner.as_deref(), Some("b"));
    assert_eq!(record.attempt, Some(1));
    assert_eq!(record.receipt, None);
    // Fences on a key that does not exist are refused too, and create nothing.
    let ghost = key();
    let refused = t
        .store
        .write(&Write::Complete(complete(&ghost, "a", 1, "ch_x")))
        .await
        .unwrap();
    assert_eq!(refused, WriteOutcome::Refused(None));
    assert_eq!(t.store.get(&ghost).await.unwrap(), None);
}

async fn complete_falls_back_on_the_attempt_when_the_fence_is_lost(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    // "a" charged under attempt 1 but its lease expired; "b" took over (same attempt).
    won(t.store.as_ref(), &req(&pk, H1, "b", T + 2 * MINUTE)).await;
    let late = complete(&pk, "a", 1, "ch_1");
    assert!(matches!(
        t.store.write(&Write::Complete(late.clone())).await.unwrap(),
        WriteOutcome::Refused(_)
    ));
    let wrong_attempt = complete(&pk, "a", 2, "ch_1");
    assert!(matches!(
        t.store
            .write(&Write::CompleteAttempt(wrong_attempt.clone()))
            .await
            .unwrap(),
        WriteOutcome::Refused(_)
    ));
    let done = applied(
        t.store
            .write(&Write::CompleteAttempt(late.clone()))
            .await
            .unwrap(),
    );
    assert_eq!(done.state, State::Done);
    assert_eq!(done.receipt.as_deref(), Some("ch_1"));
    // "b" replays the same key, gets the same receipt, and finds the record done.
    let b = t
        .store
        .write(&Write::Complete(complete(&pk, "b", 1, "ch_1")))
        .await
        .unwrap();
    assert!(
        matches!(b, WriteOutcome::Refused(Some(r)) if r.state == State::Done && r.receipt.as_deref() == Some("ch_1"))
    );
    // `hecho` is final: the fallback never overwrites it.
    let other = complete(&pk, "z", 1, "ch_other");
    assert!(matches!(
        t.store
            .write(&Write::CompleteAttempt(other.clone()))
            .await
            .unwrap(),
        WriteOutcome::Refused(_)
    ));
    assert_eq!(
        t.store.get(&pk).await.unwrap().unwrap().receipt.as_deref(),
        Some("ch_1")
    );
}

async fn a_declined_release_bumps_the_attempt_and_any_other_keeps_it(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    let kept = applied(
        t.store
            .write(&Write::Release(release(&pk, "a", false)))
            .await
            .unwrap(),
    );
    assert_eq!(kept.attempt, Some(1));
    assert_eq!(
        kept.sent,
        Some(T),
        "the same key is still the one sent at T"
    );
    won(t.store.as_ref(), &req(&pk, H1, "b", T + ms(1))).await;
    assert_eq!(kept.refusals, None, "only a decline is counted");
    let bumped = applied(
        t.store
            .write(&Write::Release(release(&pk, "b", true)))
            .await
            .unwrap(),
    );
    assert_eq!(bumped.attempt, Some(2));
    assert_eq!(bumped.refusals, Some(1));
    assert_eq!(bumped.sent, None, "attempt 2's key has not been sent yet");
    let next = won(t.store.as_ref(), &req(&pk, H1, "c", T + ms(2))).await;
    assert_eq!(next.attempt, Some(2));
    assert_eq!(next.sent, Some(T + ms(2)));
}

async fn declines_up_to_the_limit_stop_the_reserve_until_resolve_resets_them(t: Fixture) {
    let pk = key();
    for (i, owner) in ["a", "b", "c"].into_iter().enumerate() {
        let now = T + ms(u64::try_from(i).unwrap());
        won(t.store.as_ref(), &req(&pk, H1, owner, now)).await;
        applied(
            t.store
                .write(&Write::Release(release(&pk, owner, true)))
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        judged(t.store.as_ref(), &req(&pk, H1, "d", T + ms(10))).await,
        Reservation::RefusalLimit { refusals: 3 }
    );
    let stored = t.store.get(&pk).await.unwrap().unwrap();
    assert_eq!((stored.state, stored.attempt), (State::Free, Some(4)));

    // `resolve` may lease it; without --retry-declined the count stays.
    let lease = |owner| ResolveLeaseRequest {
        pk: &pk,
        fingerprint: fp(H1),
        owner: tok(owner),
        now: T + ms(20),
        lease_until: T + ms(20) + MINUTE,
    };
    applied(
        t.store
            .write(&Write::LeaseForResolve(lease("r1")))
            .await
            .unwrap(),
    );
    let kept = ReleaseRequest {
        pk: &pk,
        owner: tok("r1"),
        kind: ReleaseKind::NextKey {
            reset_refusals: false,
        },
    };
    assert_eq!(
        applied(t.store.write(&Write::Release(kept.clone())).await.unwrap()).refusals,
        Some(3)
    );
    applied(
        t.store
            .write(&Write::LeaseForResolve(lease("r2")))
            .await
            .unwrap(),
    );
    let reset = ReleaseRequest {
        pk: &pk,
        owner: tok("r2"),
        kind: ReleaseKind::NextKey {
            reset_refusals: true,
        },
    };
    let after = applied(t.store.write(&Write::Release(reset.clone())).await.unwrap());
    assert_eq!((after.refusals, after.attempt), (None, Some(6)));
    won(t.store.as_ref(), &req(&pk, H1, "e", T + ms(30))).await;
}

/// Every adapter implements the table's pure conditions and effects exactly: a seeded
/// random run of every kind of write (two owners, two payloads, two payments, moving
/// time, short retention, waits that end at different times) is applied to the store
/// and to `holds`/`apply` in lockstep; and every so often the awaiting listing (the
/// index's query, the SQLite SELECT) returns exactly the model's records that await
/// their customer with a wait ending before the bound, soonest first.
async fn every_write_agrees_with_the_pure_condition_and_effect(t: Fixture) {
    const STEPS: i64 = 400;
    use charge_once::policy::rules::Rules;
    use charge_once::policy::table::{apply, holds};
    use rand::{Rng, SeedableRng};

    let keys: Vec<Key> = (0..STEPS).map(|_| key()).collect();
    let mut current = 0;
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut model: Option<Record> = None;
    // Every key's record as the model has it, for the awaiting listing.
    let mut all: std::collections::BTreeMap<String, Record> = Default::default();
    let (mut applied_count, mut refused_count, mut uncertain) = (0, 0, 0usize);
    let mut by_kind: std::collections::BTreeMap<&str, (u32, u32)> = Default::default();
    let mut listed = 0;
    for step in 0..STEPS {
        if step % 20 == 0 {
            listed += awaiting_agrees(t.store.as_ref(), &all, &mut rng, step).await;
        }
        // `hecho` is final: every later write on it is refused. Go on with a new key.
        if model.as_ref().is_some_and(|r| r.state == State::Done) && rng.random_bool(0.5) {
            current += 1;
            model = None;
        }
        // Now and then leave a record that awaits its customer behind, so the awaiting
        // listing holds several, whose waits end at different times.
        if model.as_ref().is_some_and(|r| r.state == State::Awaiting) && rng.random_bool(0.3) {
            current += 1;
            model = None;
        }
        let pk = &keys[current];
        let now = T + MINUTE * rng.random_range(0..6u32) + ms(u64::try_from(step).unwrap());
        // Mostly one owner, so leases are taken, released and declined in turn.
        let owner = tok(["a", "a", "a", "b", "resolve-c"][rng.random_range(0..5)]);
        let fingerprint = fp(if rng.random_bool(0.85) { H1 } else { H2 });
        // Short retention now and then, so "past expira" is exercised.
        let expires = Time::from_secs(
            now.as_secs()
                + if rng.random_bool(0.3) {
                    90
                } else {
                    400 * 86_400
                },
        );
        let receipt = ["ch_1", "ch_2"][rng.random_range(0..2)];
        let attempt = rng.random_range(1..4);
        let complete = CompleteRequest {
            pk,
            owner,
            attempt,
            receipt,
            expires,
        };
        // Seldom `Uncertain`: only resolve's lease and a completion by attempt leave it,
        // so the walk would otherwise spend itself there.
        let kind = [
            ReleaseKind::KeepKey,
            ReleaseKind::Refused,
            ReleaseKind::NextKey {
                reset_refusals: false,
            },
            ReleaseKind::NextKey {
                reset_refusals: true,
            },
        ][rng.random_range(0..4)];
        let kind = if rng.random_ratio(1, 16) {
            ReleaseKind::Uncertain
        } else {
            kind
        };
        // A settle mostly names the payment the record awaits, so that it also wins.
        let awaited = model
            .as_ref()
            .filter(|r| r.state == State::Awaiting)
            .and_then(|r| r.awaited.clone());
        let payment_id = match &awaited {
            Some(named) if rng.random_bool(0.75) => {
                if named == "pi_1" {
                    "pi_1"
                } else {
                    "pi_2"
                }
            }
            _ => ["pi_1", "pi_2"][rng.random_range(0..2)],
        };
        let settled = match rng.random_range(0..3) {
            // Paid by `pi_2` stands for paid with another card: what was paid is kept
            // beside the order's fingerprint (no draw of its own, so the walk is the
            // same).
            0 => Settled::Done {
                expires,
                done_fingerprint: (payment_id == "pi_2")
                    .then(|| Fingerprint::new("paid-with-another-card")),
            },
            1 => Settled::Ended,
            _ => Settled::Ending { at: now },
        };
        let ended = model
            .as_ref()
            .is_some_and(|r| matches!(r.state, State::Free | State::Failed));
        let pick = if awaited.is_some() && rng.random_bool(0.4) {
            9
        } else if ended && rng.random_bool(0.3) {
            rng.random_range(10..12)
        } else {
            rng.random_range(0..12)
        };
        let write = match pick {
            7 | 8 => Write::Await(AwaitRequest {
                pk,
                owner,
                awaited: payment_id,
                wait_until: Time::from_secs(now.as_secs() + 60 * rng.random_range(0..5i64)),
                expires: Time::from_secs(now.as_secs() + 3600),
            }),
            9 => Write::Settle(SettleRequest {
                pk,
                awaited: payment_id,
                settled,
            }),
            // A corrected payload: mostly the one the record does not hold.
            11 => Write::Correct(CorrectRequest {
                pk,
                fingerprint: if model
                    .as_ref()
                    .and_then(|r| r.fingerprint.as_ref())
                    .is_some_and(|f| f == fp(H1))
                    && rng.random_bool(0.8)
                {
                    fp(H2)
                } else {
                    fingerprint
                },
            }),
            10 => Write::Adopt(AdoptRequest {
                pk,
                receipt,
                fingerprint,
                now,
                expires,
            }),
            0 | 1 => Write::Reserve(ReserveRequest {
                pk,
                fingerprint,
                owner,
                now,
                lease_until: now + MINUTE,
                expires,
                max_refusals: 2,
            }),
            2 => Write::Complete(complete),
            3 => Write::CompleteAttempt(complete),
            4 => Write::Release(ReleaseRequest { pk, owner, kind }),
            5 => Write::NextAttempt { pk, owner, now },
            _ => Write::LeaseForResolve(ResolveLeaseRequest {
                pk,
                fingerprint,
                owner,
                now,
                lease_until: now + MINUTE,
            }),
        };
        let expected = holds(&write, model.as_ref(), Rules::ALL);
        let name = match &write {
            Write::Await(_) => "await",
            Write::Settle(_) => "settle",
            Write::Adopt(_) => "adopt",
            Write::Correct(_) => "correct",
            _ => "other",
        };
        let counts = by_kind.entry(name).or_default();
        match t.store.write(&write).await.unwrap() {
            WriteOutcome::Applied(record) => {
                assert!(expected, "step {step}: {write:?} applied on {model:?}");
                assert_eq!(
                    record,
                    apply(&write, model.as_ref()),
                    "step {step}: {write:?}"
                );
                all.insert(pk.as_str().to_owned(), record.clone());
                uncertain += usize::from(record.state == State::Uncertain);
                model = Some(record);
                applied_count += 1;
                counts.0 += 1;
            }
            WriteOutcome::Refused(old) => {
                assert!(!expected, "step {step}: {write:?} refused on {model:?}");
                assert_eq!(old, model, "step {step}: the old item comes back");
                refused_count += 1;
                counts.1 += 1;
            }
        }
    }
    listed += awaiting_agrees(t.store.as_ref(), &all, &mut rng, STEPS).await;
    assert!(uncertain > 0, "no write left a record `Uncertain`");
    assert!(
        applied_count > 20 && refused_count > 20,
        "{applied_count} / {refused_count}"
    );
    // Each new write both won and lost, and the listing found records to list.
    for kind in ["await", "settle", "adopt", "correct"] {
        let (won, lost) = by_kind.get(kind).copied().unwrap_or_default();
        assert!(
            won > 3 && lost > 3,
            "{kind}: {won} applied / {lost} refused"
        );
    }
    assert!(listed > 5, "the listings held {listed} records in all");
}

/// The store's awaiting listing below a random bound, against the model's records:
/// the same records, soonest wait end first; a short limit keeps the soonest. Returns
/// how many it listed.
async fn awaiting_agrees(
    store: &dyn IdempotencyStore,
    all: &std::collections::BTreeMap<String, Record>,
    rng: &mut rand::rngs::StdRng,
    step: i64,
) -> usize {
    use rand::Rng;
    let until = Time::from_secs(T.as_secs() + 60 * rng.random_range(0..8i64));
    let mut expected: Vec<&Record> = all
        .values()
        .filter(|r| r.state == State::Awaiting && r.wait_until.is_some_and(|w| w < until))
        .collect();
    expected.sort_by_key(|r| (r.wait_until, r.pk.as_str().to_owned()));
    let mut listed = store.awaiting(None, until, 1000).await.unwrap();
    let ends: Vec<Option<Time>> = listed.iter().map(|r| r.wait_until).collect();
    assert!(
        ends.windows(2).all(|w| w[0] <= w[1]),
        "step {step}: not soonest first: {ends:?}"
    );
    listed.sort_by_key(|r| (r.wait_until, r.pk.as_str().to_owned()));
    let listed_refs: Vec<&Record> = listed.iter().collect();
    assert_eq!(
        listed_refs, expected,
        "step {step}: awaiting before {until:?}"
    );
    if expected.len() > 1 {
        let short = store.awaiting(None, until, 1).await.unwrap();
        assert_eq!(short.len(), 1, "step {step}");
        assert_eq!(short[0].wait_until, expected[0].wait_until, "step {step}");
    }
    // Page by page, each read going on after the last record of the one before: every
    // record once, in the order of the wait's end.
    let mut paged: Vec<Record> = Vec::new();
    let mut after: Option<AwaitingCursor> = None;
    for _ in 0..=expected.len() {
        let page = store.awaiting(after.as_ref(), until, 2).await.unwrap();
        let Some(last) = page.last() else { break };
        after = AwaitingCursor::of(last);
        paged.extend(page);
    }
    let ends: Vec<Option<Time>> = paged.iter().map(|r| r.wait_until).collect();
    assert!(
        ends.windows(2).all(|w| w[0] <= w[1]),
        "step {step}: {ends:?}"
    );
    paged.sort_by_key(|r| (r.wait_until, r.pk.as_str().to_owned()));
    assert_eq!(
        paged.iter().collect::<Vec<_>>(),
        expected,
        "step {step}: paged awaiting before {until:?}"
    );
    expected.len()
}

async fn next_attempt_moves_the_key_under_the_lease(t: Fixture) {
    let pk = key();
    won(t.store.as_ref(), &req(&pk, H1, "a", T)).await;
    let moved = applied(
        t.store
            .write(&Write::NextAttempt {
                pk: &pk,
                owner: tok("a"),
                now: T + ms(5),
            })
            .await
            .unwrap(),
    );
    assert_eq!(moved.attempt, Some(2));
    assert_eq!(moved.sent, Some(T + ms(5)));
    assert_eq!(moved.owner.as_deref(), Some("a"), "the lease is kept");
}

async fn an_attempt_out_of_range_is_malformed_in_every_store(t: Fixture) {
    let pk = key();
    let mut item = legacy_item(&pk, State::Free, None, Time::from_secs(T.as_secs() + 3600));
    item.push((attr::ATTEMPT, Value::N(-1)));
    t.put_item(item).await;
    let malformed = |result: Result<_, StoreError>| match result {
        Err(StoreError::Malformed {
            attribute, problem, ..
        }) => (attribute, problem),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        malformed(t.store.get(&pk).await.map(|_| ())),
        ("intento", "is out of range")
    );
    let lost = t
        .store
        .write(&Write::Reserve(req(&pk, H1, "a", T)))
        .await
        .map(|_| ());
    assert_eq!(malformed(lost), ("intento", "is out of range"));
}

async fn a_legacy_done_item_is_a_duplicate(t: Fixture) {
    let pk = key();
    t.put_legacy_item(
        &pk,
        State::Done,
        Some("ch_legacy"),
        Time::from_secs(T.as_secs() + 3600),
    )
    .await;
    assert_eq!(
        judged(t.store.as_ref(), &req(&pk, H1, "a", T)).await,
        Reservation::Duplicate {
            receipt: Some("ch_legacy".into())
        }
    );
}

async fn a_legacy_in_progress_item_needs_reconciliation(t: Fixture) {
    let pk = key();
    t.put_legacy_item(
        &pk,
        State::InProgress,
        None,
        Time::from_secs(T.as_secs() + 3600),
    )
    .await;
    assert!(matches!(
        judged(t.store.as_ref(), &req(&pk, H1, "a", T)).await,
        Reservation::NeedsReconciliation { .. }
    ));
    // Never taken over, even past its `expira`.
    assert!(matches!(
        judged(t.store.as_ref(), &req(&pk, H1, "a", T + 30 * DAY)).await,
        Reservation::NeedsReconciliation { .. }
    ));
    assert_eq!(
        t.store.get(&pk).await.unwrap().unwrap().owner,
        None,
        "nothing was written"
    );
}

async fn missing_key_reads_as_none(t: Fixture) {
    assert_eq!(t.store.get(&key()).await.unwrap(), None);
}

/// The settler's cursor: none at first, kept as written, back to none when cleared.
async fn the_settle_cursor_is_kept_until_cleared(t: Fixture) {
    let store = t.store.as_ref();
    assert_eq!(store.settle_cursor().await.unwrap(), None);
    let at = AwaitingCursor {
        wait_until: Time::from_secs(T.as_secs() + 60),
        pk: key(),
    };
    store.save_settle_cursor(Some(&at)).await.unwrap();
    assert_eq!(store.settle_cursor().await.unwrap(), Some(at.clone()));
    let later = AwaitingCursor {
        wait_until: Time::from_secs(T.as_secs() + 120),
        ..at
    };
    store.save_settle_cursor(Some(&later)).await.unwrap();
    assert_eq!(store.settle_cursor().await.unwrap(), Some(later));
    store.save_settle_cursor(None).await.unwrap();
    assert_eq!(store.settle_cursor().await.unwrap(), None);
}

/// 20 concurrent reservations of one key, 50 rounds: exactly one winner each round.
async fn twenty_concurrent_reservations_have_exactly_one_winner(t: Fixture) {
    for round in 0..50 {
        let pk = key();
        let owners: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
        let attempts = owners.iter().map(|owner| {
            let store = t.store.clone();
            let pk = pk.clone();
            let owner = owner.clone();
            tokio::spawn(async move {
                let r = req(&pk, H1, &owner, T);
                reserve(store.as_ref(), &r).await
            })
        });
        let results = futures::future::join_all(attempts).await;
        let mut winners = 0;
        for result in results {
            match result.expect("task").expect("reserve") {
                Reservation::Won(_) => winners += 1,
                Reservation::InProgress { .. } => {}
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: {winners} winners");
    }
}

macro_rules! contract_suite {
    ($($test:ident),* $(,)?) => {
        mod moto {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Fixture::dynamo(super::Backend::Moto).await).await;
                }
            )*
        }
        mod dynalite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Fixture::dynamo(super::Backend::Dynalite).await).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Fixture::sqlite().await).await;
                }
            )*
        }
    };
}

contract_suite!(
    the_settle_cursor_is_kept_until_cleared,
    an_attempt_out_of_range_is_malformed_in_every_store,
    fresh_reserve_wins_with_a_new_lease,
    duplicate_returns_the_stored_receipt,
    a_done_item_past_its_expiry_is_still_a_duplicate,
    an_unfinished_item_past_its_expiry_counts_as_absent,
    other_fingerprint_is_a_conflict,
    live_lease_is_in_progress,
    our_own_retried_reserve_is_won,
    an_expired_lease_is_taken_over_keeping_the_attempt,
    a_free_item_is_reserved_again,
    complete_and_release_with_a_stale_owner_are_refused,
    complete_falls_back_on_the_attempt_when_the_fence_is_lost,
    a_declined_release_bumps_the_attempt_and_any_other_keeps_it,
    declines_up_to_the_limit_stop_the_reserve_until_resolve_resets_them,
    every_write_agrees_with_the_pure_condition_and_effect,
    next_attempt_moves_the_key_under_the_lease,
    a_legacy_done_item_is_a_duplicate,
    a_legacy_in_progress_item_needs_reconciliation,
    missing_key_reads_as_none,
    twenty_concurrent_reservations_have_exactly_one_winner,
);

// --- Consumed capacity: the item-size rules `make bench` prices by -----------------

/// An item holding every kind of value the rules size differently, padded so that its
/// size (by `harness::capacity`) is exactly `size` bytes.
fn sized_item(
    pk: &str,
    size: u64,
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    use aws_sdk_dynamodb::primitives::Blob;
    use aws_sdk_dynamodb::types::AttributeValue as A;
    use harness::capacity::item_size;
    let mut item: std::collections::HashMap<String, A> = [
        ("pk", A::S(pk.to_owned())),
        ("expira", A::N("1764460800".to_owned())),
        ("round", A::N("1000".to_owned())),
        ("neg", A::N("-12.5".to_owned())),
        ("small", A::N("0.05".to_owned())),
        ("odd", A::N("123456789012345".to_owned())),
        ("huella", A::B(Blob::new(vec![7u8; 32]))),
        ("ok", A::Bool(true)),
        ("nada", A::Null(true)),
        (
            "m",
            A::M(
                [("a".to_owned(), A::S("xy".to_owned()))]
                    .into_iter()
                    .collect(),
            ),
        ),
        ("l", A::L(vec![A::N("5".to_owned()), A::S("z".to_owned())])),
        ("pad", A::S(String::new())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let unpadded = item_size(&item);
    assert!(unpadded < size, "{unpadded} bytes before padding");
    item.insert(
        "pad".to_owned(),
        A::S("p".repeat(usize::try_from(size - unpadded).unwrap())),
    );
    assert_eq!(item_size(&item), size);
    item
}

/// The units dynalite reports through the bench's counting proxy (the client asks for
/// none) equal the units computed from the item's size, on both sides of the 1 KB
/// write boundary and the 4 KB read boundary, for puts, updates (the larger of the
/// item before and after) and reads of both consistencies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_item_size_rules_agree_with_the_capacity_dynalite_reports() {
    use aws_sdk_dynamodb::types::AttributeValue as A;
    use harness::capacity::{read_units, write_units};
    use harness::proxy::{Faults, Target, start_proxy};
    use std::sync::atomic::Ordering;
    let table = Backend::Dynalite.fresh_table().await;
    let faults = Arc::new(Faults::default());
    faults.ask_capacity.store(true, Ordering::Relaxed);
    let url = start_proxy(Backend::Dynalite.url(), Target::DynamoDb, faults.clone()).await;
    let client = Backend::client_at(&url);
    let counted = |operation: &str| {
        let c = faults
            .capacity()
            .get(operation)
            .copied()
            .unwrap_or_default();
        assert_eq!(c.unreported, 0, "{operation}: a call without units");
        c.units
    };
    let mut expected_writes = 0.0;
    let mut expected_reads = 0.0;
    for (n, size) in [300u64, 1024, 1025, 4096, 4097, 9000]
        .into_iter()
        .enumerate()
    {
        let pk = format!("size-{n}");
        client
            .put_item()
            .table_name(&table.name)
            .set_item(Some(sized_item(&pk, size)))
            .send()
            .await
            .unwrap();
        expected_writes += write_units(size);
        assert_eq!(counted("PutItem"), expected_writes, "put of {size} bytes");
        for consistent in [true, false] {
            client
                .get_item()
                .table_name(&table.name)
                .key("pk", A::S(pk.clone()))
                .consistent_read(consistent)
                .send()
                .await
                .unwrap();
            expected_reads += read_units(size, consistent);
            assert_eq!(
                counted("GetItem"),
                expected_reads,
                "read of {size} bytes, consistent {consistent}"
            );
        }
    }
    // An update that shrinks a 1025-byte item to 9 bytes costs what the larger costs.
    let before = counted("UpdateItem");
    client
        .update_item()
        .table_name(&table.name)
        .key("pk", A::S("size-2".to_owned()))
        .update_expression("REMOVE #pad")
        .expression_attribute_names("#pad", "pad")
        .send()
        .await
        .unwrap();
    assert_eq!(counted("UpdateItem") - before, write_units(1025));
    // The client gets its item intact (and the units the proxy asked for, unused).
    let got = client
        .get_item()
        .table_name(&table.name)
        .key("pk", A::S("size-0".to_owned()))
        .send()
        .await
        .unwrap();
    assert!(got.consumed_capacity().is_some());
    assert_eq!(got.item().map(harness::capacity::item_size), Some(300));
}
