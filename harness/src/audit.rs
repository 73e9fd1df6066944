//! The audit's scenario, the same on every pair of real parts (SQLite and the
//! simulator in `local/tests/audit.rs`; moto and localstripe in `tests/audit.rs`): a
//! clean run audits clean (exit 0); then one side is tampered with, one way at a time,
//! and each audit exits 1 naming exactly the orders tampered with so far. The audit
//! reads the records of its window's payments: each tampered order has one.

use charge_once::domain::ForOrder;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use charge_once::contracts::payment::PaymentProvider;
use charge_once::contracts::schema::attr;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::clock::{self, Time};
use charge_once::domain::order::Order;
use charge_once::domain::{Fingerprint, Key};
use serde_json::Value;

use crate::lease::Lease;
use crate::rig::batch_of;

/// One pair of real parts: where the records and the charges are, the binary that
/// runs on them, and how a bug or a hand would tamper with each side.
#[async_trait]
pub trait AuditPair: Sync {
    /// Runs one command of the pair's binary on its parts.
    fn command(&self, args: &[&str]) -> Output;

    fn store(&self) -> Arc<dyn IdempotencyStore>;

    fn provider(&self) -> Box<dyn PaymentProvider>;

    /// Deletes the record of `key`.
    async fn delete(&self, key: &Key);

    /// Overwrites one text attribute of a record.
    async fn overwrite(&self, key: &Key, attribute: &str, value: &str);

    /// Runs the audit over the window that reaches `since` back: its exit code and
    /// the (finding, order id) pairs it printed.
    fn audit(&self, since: Duration) -> (i32, BTreeSet<(String, String)>) {
        let since = format!("{}s", since.as_secs() + 1);
        let out = self.command(&["audit", "--since", &since]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let summary: Value = serde_json::from_str(stderr.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the summary is the last stderr line ({e}):\n{stderr}"));
        let findings: BTreeSet<(String, String)> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let finding: Value = serde_json::from_str(line).unwrap();
                (
                    finding["finding"].as_str().unwrap().to_owned(),
                    finding["order_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let code = out.status.code().unwrap();
        assert_eq!(
            summary["audit"],
            if findings.is_empty() {
                "clean"
            } else {
                "findings"
            },
            "{stderr}"
        );
        (code, findings)
    }
}

fn body(order: &Order) -> String {
    serde_json::json!({"id": order.id(), "amount": order.amount(),
        "currency": order.currency(), "customer": order.customer(),
        "payment_method": order.payment_method()})
    .to_string()
}

/// A customer and the payment method their orders are paid with.
pub type Payer<'a> = (&'a str, &'a str);

/// Sends `orders` in one batch through the pair's consumer (`invoke`): how many failed.
pub fn invoke(pair: &dyn AuditPair, dir: &Path, orders: &[&Order]) -> usize {
    let bodies: Vec<String> = orders.iter().map(|o| body(o)).collect();
    let event = dir.join("event.json");
    std::fs::write(&event, serde_json::to_string(&batch_of(&bodies)).unwrap()).unwrap();
    let out = pair.command(&["invoke", event.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let response: Value = serde_json::from_slice(&out.stdout).unwrap();
    response["batchItemFailures"].as_array().unwrap().len()
}

fn expect(found: &[(&str, &Order)]) -> BTreeSet<(String, String)> {
    found
        .iter()
        .map(|(kind, order)| ((*kind).to_owned(), order.id().to_owned()))
        .collect()
}

/// The scenario, the same on both pairs: `good` pays with a card the provider
/// charges, `declining` with one it declines. Each audit's window reaches back to the
/// scenario's start (whole seconds, and one more), so that only its own payments are
/// in it; it returns that start, for a later audit over the same payments.
pub async fn clean_then_tampered_one_way_at_a_time(
    pair: &dyn AuditPair,
    good: Payer<'_>,
    declining: Payer<'_>,
) -> Instant {
    let started = Instant::now();
    let audit = || pair.audit(started.elapsed());
    let dir = tempfile::tempdir().unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let order = |n: u64, (customer, method): Payer<'_>| {
        Order::new(
            &format!("audit-{run}-{n}"),
            1000 + n,
            "EUR",
            customer,
            method,
        )
        .unwrap()
    };
    let (twice, unrecorded, ghost, changed, stuck) = (
        order(1, good),
        order(2, good),
        order(3, good),
        order(4, good),
        order(5, declining),
    );
    let declined = order(6, declining);
    let failed = invoke(
        pair,
        dir.path(),
        &[&twice, &unrecorded, &ghost, &changed, &declined],
    );
    assert_eq!(failed, 1, "only the declined order fails");

    let (code, findings) = audit();
    assert_eq!(
        (code, findings),
        (0, BTreeSet::new()),
        "a clean run audits clean"
    );

    // A second payment of the same order made at the provider directly, under
    // another key: two succeeded PaymentIntents for one order.
    pair.provider()
        .charge(&twice, &format!("not-ours-{run}"))
        .await
        .unwrap();
    let mut expected = vec![("double_charge", &twice)];
    assert_eq!(audit(), (1, expect(&expected)));

    // A deleted record.
    pair.delete(&Key::for_order(&unrecorded)).await;
    expected.push(("charged_not_recorded", &unrecorded));
    assert_eq!(audit(), (1, expect(&expected)));

    // A receipt the provider never issued.
    pair.overwrite(&Key::for_order(&ghost), attr::RECEIPT, "pi_never_issued")
        .await;
    expected.push(("recorded_without_charge", &ghost));
    assert_eq!(audit(), (1, expect(&expected)));

    // A record whose fingerprint says another amount.
    let other = Order::new(changed.id(), changed.amount() + 1, "EUR", good.0, good.1).unwrap();
    pair.overwrite(
        &Key::for_order(&changed),
        attr::FINGERPRINT,
        &Fingerprint::for_order(&other),
    )
    .await;
    expected.push(("mismatch", &changed));
    assert_eq!(audit(), (1, expect(&expected)));

    // A lease that ended two hours ago (the default --stuck-after is 1h), on an order
    // whose payment of the window was declined and left open: the audit reads the
    // record of each payment of its window, and a lease that made no payment is not
    // read (no money moved; its message is retried or in the DLQ).
    let declined_open = pair
        .provider()
        .charge(&stuck, &Key::for_order(&stuck).provider_key(1))
        .await;
    assert!(declined_open.is_err(), "{declined_open:?}");
    let now = Time::from_ms(clock::wall_ms());
    let hours = |h: u64| Duration::from_secs(3600 * h);
    let store = pair.store();
    Lease::of(&stuck, "died", now - hours(3))
        .until(now - hours(2))
        .make(store.as_ref())
        .await;
    expected.push(("stuck", &stuck));
    assert_eq!(audit(), (1, expect(&expected)));
    started
}
