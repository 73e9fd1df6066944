//! The state machine's branches, fast: `Charger::process` on the local member's SQLite
//! store (a fresh file per test) and the in-process provider, on a clock the test moves. No server
//! starts, so these run in well under a second each; the same branches against
//! DynamoDB-compatible servers are in `handler.rs` and `store_contract.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::ForOrder;
use std::time::Duration;

use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::order::Order;
use charge_once::domain::{Identity, Key, Record, State};
use charge_once::drivers::charge::{Charger, Settings};
use charge_once::policy::outcome::{Call, Outcome, RetryCause};
use charge_once_local::sqlite::SqliteStore;
use harness::clock::TestClock;
use harness::lease::Lease;
use harness::provider::{Fault, TestProvider};

const PAYMENT_TIMEOUT: Duration = Duration::from_millis(300);
const KEY_TTL: Duration = Duration::from_secs(23 * 3600);
const MAX_DECLINES: u32 = 2;
const AUTHENTICATION_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

struct Bench {
    store: SqliteStore,
    provider: TestProvider,
    settings: Settings,
    clock: TestClock,
    _dir: tempfile::TempDir,
}

fn bench() -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::new();
    Bench {
        store: SqliteStore::open(&dir.path().join("process.sqlite3")).unwrap(),
        provider: TestProvider::new(),
        settings: Settings {
            retention: Duration::from_secs(400 * 24 * 3600),
            provider_key_ttl: KEY_TTL,
            budget: charge_once::policy::deadline::Budget::new(
                PAYMENT_TIMEOUT + charge_once::policy::deadline::SAFETY,
                PAYMENT_TIMEOUT,
            ),
            max_declines: MAX_DECLINES,
            authentication_wait: AUTHENTICATION_WAIT,
            clock: clock.clock(),
            breakers: std::sync::Arc::new(charge_once::policy::retry::breaker::Breakers::new(
                u32::MAX,
                Duration::from_secs(30),
                Duration::from_secs(900),
            )),
        },
        clock,
        _dir: dir,
    }
}

fn order(id: &str, amount: u64) -> Order {
    Order::new(id, amount, "EUR", "cus_1", "pm_card_visa").unwrap()
}

impl Bench {
    /// One delivery of `order` with a minute left before its invocation deadline.
    async fn deliver(&self, order: &Order) -> Outcome {
        self.deliver_with(order, Duration::from_secs(60)).await
    }

    async fn deliver_with(&self, order: &Order, time_left: Duration) -> Outcome {
        let deadline = self.clock.now() + time_left;
        let charger = Charger {
            store: &self.store,
            provider: &self.provider,
            settings: &self.settings,
        };
        charger
            .process(order, &Identity::for_order(order), deadline)
            .await
    }

    async fn record(&self, order: &Order) -> Record {
        self.store
            .get(&Key::for_order(order))
            .await
            .unwrap()
            .expect("a record")
    }

    /// The next delivery comes after this one's lease ended.
    fn later(&self) {
        self.clock.advance(Duration::from_secs(120));
    }
}

fn charged(outcome: &Outcome) -> (&str, u32) {
    match outcome {
        Outcome::Charged {
            receipt, attempt, ..
        } => (receipt, *attempt),
        other => panic!("expected charged, got {other:?}"),
    }
}

#[tokio::test]
async fn a_fresh_order_is_charged_once_and_recorded_done() {
    let b = bench();
    let o = order("p-1", 500);
    let outcome = b.deliver(&o).await;
    let (receipt, attempt) = charged(&outcome);
    let record = b.record(&o).await;
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), Some(receipt));
    assert_eq!((attempt, record.owner), (1, None));
    assert_eq!(b.provider.keys_for("p-1"), ["cobro#p-1#1"]);
}

#[tokio::test]
async fn a_second_delivery_is_a_duplicate_with_the_stored_receipt() {
    let b = bench();
    let o = order("p-2", 500);
    let first = b.deliver(&o).await;
    b.later();
    let second = b.deliver(&o).await;
    assert_eq!(
        second,
        Outcome::Duplicate {
            receipt: Some(charged(&first).0.to_owned())
        }
    );
    assert_eq!(b.provider.calls_for("p-2").len(), 1);
}

#[tokio::test]
async fn the_same_id_with_another_payload_is_a_conflict_and_never_charged() {
    let b = bench();
    b.deliver(&order("p-3", 500)).await;
    b.later();
    assert_eq!(b.deliver(&order("p-3", 999)).await, Outcome::Conflict);
    assert_eq!(b.provider.charges_for("p-3").len(), 1);
}

#[tokio::test]
async fn a_live_lease_of_another_delivery_is_in_progress_and_nothing_is_sent() {
    let b = bench();
    let o = order("p-4", 500);
    let now = b.clock.now();
    Lease::of(&o, "other", now)
        .expiring(now + Duration::from_secs(3600))
        .max_declines(MAX_DECLINES)
        .make(&b.store)
        .await;
    assert!(matches!(
        b.deliver(&o).await,
        Outcome::InProgress { until: Some(_) }
    ));
    assert!(b.provider.calls().is_empty());
}

#[tokio::test]
async fn a_decline_frees_the_record_under_the_next_key_and_the_limit_stops_the_card() {
    let b = bench();
    let o = order("p-5", 500);
    b.provider
        .script("p-5", &[Fault::Decline, Fault::Decline, Fault::Decline]);
    for attempt in 1..=MAX_DECLINES {
        assert!(
            matches!(b.deliver(&o).await, Outcome::Declined { attempt: a, .. } if a == attempt)
        );
        let record = b.record(&o).await;
        assert_eq!(record.state, State::Free);
        assert_eq!(record.attempt, Some(attempt + 1), "the next key");
        assert_eq!(record.refusals, Some(attempt));
        b.later();
    }
    assert_eq!(
        b.deliver(&o).await,
        Outcome::DeclineLimit {
            declines: MAX_DECLINES
        }
    );
    assert_eq!(
        b.provider.calls_for("p-5").len(),
        2,
        "no third try of the card"
    );
}

#[tokio::test]
async fn a_timeout_keeps_the_key_and_the_retry_replays_it_charging_once() {
    let b = bench();
    let o = order("p-6", 500);
    b.provider.script("p-6", &[Fault::ChargeThenTimeout]);
    let first = b.deliver(&o).await;
    assert!(
        matches!(
            first,
            Outcome::FailedRetryable {
                cause: RetryCause::ChargeTimedOut,
                attempt: Some(1)
            }
        ),
        "{first:?}"
    );
    let record = b.record(&o).await;
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    b.later();
    let (_, attempt) = charged(&b.deliver(&o).await);
    assert_eq!(attempt, 1);
    assert_eq!(b.provider.keys_for("p-6"), ["cobro#p-6#1", "cobro#p-6#1"]);
    b.provider.assert_no_order_charged_twice();
}

/// The record failed with a replayed 5xx whose payment is not found yet: the key is
/// kept.
fn is_unsettled_server_error(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::FailedRetryable {
            cause: RetryCause::ServerErrorUnsettled { status: 500 },
            attempt: Some(1),
        }
    )
}

#[tokio::test]
async fn a_replayed_server_error_keeps_the_key_until_its_payment_appears() {
    let b = bench();
    let o = order("p-7", 500);
    b.provider
        .script("p-7", &[Fault::StoredServerErrorThenPayment]);
    // The in-invocation retry gets the stored 5xx replayed: looked up, nothing found
    // yet, and the key is kept.
    let first = b.deliver(&o).await;
    assert!(is_unsettled_server_error(&first), "{first:?}");
    assert_eq!(b.provider.lookups(), ["p-7"]);
    let record = b.record(&o).await;
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));
    // Each later delivery replays the key and looks again; no second key while the
    // first may still succeed.
    b.later();
    let second = b.deliver(&o).await;
    assert!(is_unsettled_server_error(&second), "{second:?}");
    // The provider rolls the payment forward: the next delivery completes with it.
    b.provider.roll_forward("p-7");
    b.later();
    let third = b.deliver(&o).await;
    assert!(
        matches!(third, Outcome::Reconciled { attempt: 1, .. }),
        "{third:?}"
    );
    assert!(
        b.provider
            .keys_for("p-7")
            .iter()
            .all(|k| k == "cobro#p-7#1")
    );
    assert_eq!(b.provider.charges_for("p-7").len(), 1);
    b.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_replayed_server_error_moves_to_a_new_key_only_once_the_key_is_forgotten() {
    let b = bench();
    let o = order("p-7b", 500);
    b.provider.script("p-7b", &[Fault::StoredServerError]);
    assert!(is_unsettled_server_error(&b.deliver(&o).await));
    // Within the key's TTL nothing moves it, however often it comes back.
    b.clock.advance(KEY_TTL - Duration::from_secs(3600));
    assert!(is_unsettled_server_error(&b.deliver(&o).await));
    // Past the TTL the forgotten-key rule reconciles first, finds nothing, and only
    // then charges under the next key.
    b.clock.advance(Duration::from_secs(2 * 3600));
    b.provider.forget_keys();
    let (_, attempt) = charged(&b.deliver(&o).await);
    assert_eq!(attempt, 2);
    assert_eq!(b.provider.lookups(), ["p-7b", "p-7b", "p-7b"]);
    assert_eq!(b.provider.charges_for("p-7b").len(), 1);
    b.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn an_old_key_is_reconciled_and_a_charge_found_completes_the_record() {
    let b = bench();
    let o = order("p-8", 500);
    b.provider.script("p-8", &[Fault::ChargeThenTimeout]);
    b.deliver(&o).await;
    // Past the provider's key TTL, and the provider forgot the key.
    b.clock.advance(KEY_TTL + Duration::from_secs(3600));
    b.provider.forget_keys();
    let outcome = b.deliver(&o).await;
    assert!(
        matches!(outcome, Outcome::Reconciled { attempt: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(b.record(&o).await.state, State::Done);
    assert_eq!(b.provider.calls_for("p-8").len(), 1, "nothing sent again");
    b.provider.assert_no_order_charged_twice();
}

#[tokio::test]
async fn a_pending_charge_found_by_reconciliation_is_awaited_under_its_key() {
    let b = bench();
    let o = order("p-9", 500);
    b.provider.script("p-9", &[Fault::Timeout]);
    b.deliver(&o).await;
    let pending = b.provider.add_pending_charge("p-9", 500);
    b.clock.advance(KEY_TTL + Duration::from_secs(3600));
    let outcome = b.deliver(&o).await;
    assert!(
        matches!(
            &outcome,
            Outcome::PaymentProcessing { payment_id, .. } if *payment_id == pending
        ),
        "{outcome:?}"
    );
    let record = b.record(&o).await;
    assert_eq!((record.state, record.attempt), (State::Awaiting, Some(1)));
    assert_eq!(record.awaited.as_deref(), Some(pending.as_str()));
    assert_eq!(b.provider.calls_for("p-9").len(), 1, "no new key was sent");
}

#[tokio::test]
async fn too_little_time_for_the_provider_call_sends_nothing_and_keeps_the_lease() {
    let b = bench();
    let o = order("p-10", 500);
    // 280 ms before the deadline less 500 ms: a store call may start (250 ms), the
    // provider call may not (it needs its whole 300 ms). The test clock stands still.
    let outcome = b.deliver_with(&o, Duration::from_millis(780)).await;
    assert_eq!(
        outcome,
        Outcome::Deadline {
            before: Call::Charge,
            attempt: Some(1)
        }
    );
    let record = b.record(&o).await;
    assert_eq!(
        record.state,
        State::InProgress,
        "the lease ends at the deadline"
    );
    assert!(b.provider.calls().is_empty());
}
