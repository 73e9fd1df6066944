//! The unit tests of `sqlite.rs`.

use charge_once::domain::OrderKey;
use std::time::Duration;

use super::*;
use charge_once::contracts::store::{
    AwaitRequest, ReserveRequest, ResolveLeaseRequest, SettleRequest,
};
use charge_once::domain::{Fingerprint, Owner, State};
use charge_once::policy::rules::Rules;
use charge_once::policy::table;

const NOW_MS: i64 = 1_000_000;

fn record(state: State, owner: Option<&str>, payment: Option<&str>) -> Record {
    Record {
        pk: Key::for_order_id("ord-1"),
        state,
        created: Some(Time::from_ms(1)),
        expires: Some(Time::from_secs(9_000)),
        receipt: None,
        fingerprint: Some(Fingerprint::new("h")),
        owner: owner.map(Owner::new),
        lease_until: owner.map(|_| Time::from_ms(NOW_MS + 30_000)),
        attempt: Some(1),
        sent: Some(Time::from_ms(1)),
        refusals: None,
        awaited: payment.map(str::to_owned),
        wait_until: payment.map(|_| Time::from_secs(5_000)),
        done_fingerprint: None,
    }
}

/// Writes `record` as it is stored, attribute by attribute.
fn seed(path: &Path, record: Option<&Record>) {
    let conn = Connection::open(path).unwrap();
    conn.execute("DELETE FROM idempotency", []).unwrap();
    let Some(record) = record else { return };
    let item = schema::attributes(record);
    let names: Vec<&str> = item.iter().map(|(name, _)| *name).collect();
    let marks: Vec<String> = (1..=item.len()).map(|i| format!("?{i}")).collect();
    let values = item.into_iter().map(|(_, value)| match value {
        Value::S(s) => rusqlite::types::Value::Text(s),
        Value::N(n) => rusqlite::types::Value::Integer(n),
    });
    let insert = format!(
        "INSERT INTO idempotency ({}) VALUES ({})",
        names.join(", "),
        marks.join(", ")
    );
    conn.execute(&insert, rusqlite::params_from_iter(values))
        .unwrap();
}

#[tokio::test]
async fn the_await_and_settle_writes_and_the_writes_beside_them_leave_what_the_table_specification_says()
 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    let (pk, me, fingerprint) = (
        Key::for_order_id("ord-1"),
        Owner::new("me"),
        Fingerprint::new("h"),
    );
    let now = Time::from_ms(NOW_MS);
    let lease_until = now + Duration::from_secs(30);
    let settle = |settled| {
        Write::Settle(SettleRequest {
            pk: &pk,
            awaited: "pi_1",
            settled,
        })
    };
    let writes = [
        Write::Await(AwaitRequest {
            pk: &pk,
            owner: &me,
            awaited: "pi_1",
            wait_until: Time::from_secs(5_000),
            expires: Time::from_secs(9_000),
        }),
        settle(Settled::Done {
            expires: Time::from_secs(8_000),
            done_fingerprint: None,
        }),
        settle(Settled::Done {
            expires: Time::from_secs(8_000),
            done_fingerprint: Some(Fingerprint::new("another card")),
        }),
        settle(Settled::Ended),
        settle(Settled::Ending {
            at: Time::from_secs(4_000),
        }),
        Write::Reserve(ReserveRequest {
            pk: &pk,
            fingerprint: &fingerprint,
            owner: &me,
            now,
            lease_until,
            expires: Time::from_secs(8_000),
            max_refusals: 3,
        }),
        Write::LeaseForResolve(ResolveLeaseRequest {
            pk: &pk,
            fingerprint: &fingerprint,
            owner: &me,
            now,
            lease_until,
        }),
    ];
    // An awaiting record past its retention is still held: it never counts as absent.
    let mut expired_wait = record(State::Awaiting, None, Some("pi_1"));
    expired_wait.expires = Some(Time::from_secs(1));
    let stored = [
        None,
        Some(record(State::InProgress, Some("me"), None)),
        Some(record(State::InProgress, Some("other"), None)),
        Some(record(State::Awaiting, None, Some("pi_1"))),
        Some(record(State::Awaiting, None, Some("pi_2"))),
        Some(expired_wait),
        Some(record(State::Failed, None, None)),
        Some(record(State::Done, None, None)),
        Some(record(State::Free, None, None)),
    ];
    for write in &writes {
        for before in &stored {
            seed(&path, before.as_ref());
            let expected = if table::holds(write, before.as_ref(), Rules::ALL) {
                WriteOutcome::Applied(table::apply(write, before.as_ref()))
            } else {
                WriteOutcome::Refused(before.clone())
            };
            assert_eq!(
                store.write(write).await.unwrap(),
                expected,
                "{write:?} on {before:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_awaiting_read_is_the_waits_ending_before_the_bound_soonest_first_at_most_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    for (order, state, wait) in [
        ("ord-a", "espera", Some(300)),
        ("ord-b", "espera", Some(100)),
        ("ord-c", "espera", Some(200)),
        ("ord-d", "hecho", None),
        ("ord-e", "fallido", None),
    ] {
        conn.execute(
            "INSERT INTO idempotency (pk, estado, espera_hasta, pago) VALUES (?1, ?2, ?3, 'pi_1')",
            rusqlite::params![format!("cobro#{order}"), state, wait],
        )
        .unwrap();
    }
    let pks = |records: Vec<Record>| -> Vec<String> {
        records.iter().map(|r| r.pk.as_str().to_owned()).collect()
    };
    let far = Time::from_secs(i64::MAX / 1000);
    assert_eq!(
        pks(store.awaiting(None, far, 10).await.unwrap()),
        ["cobro#ord-b", "cobro#ord-c", "cobro#ord-a"]
    );
    assert_eq!(
        pks(store.awaiting(None, far, 2).await.unwrap()),
        ["cobro#ord-b", "cobro#ord-c"]
    );
    assert_eq!(
        pks(store
            .awaiting(None, Time::from_secs(300), 10)
            .await
            .unwrap()),
        ["cobro#ord-b", "cobro#ord-c"],
        "before the bound, not at it"
    );
}
