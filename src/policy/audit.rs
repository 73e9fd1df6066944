//! The audit: the table's records held against the provider's payments, every
//! disagreement named. This module only judges (no I/O); [`crate::drivers::audit`] reads both sides.
//!
//! What counts as a finding (a `Free` record after declines is not one):
//! * `double_charge`: more than one succeeded payment for one order;
//! * `charged_not_recorded`: a succeeded payment whose order has no `Done` record
//!   (none, or `Free`/`InProgress` with no live lease);
//! * `recorded_without_charge`: a `Done` record whose receipt is not a succeeded
//!   payment at the provider;
//! * `mismatch`: a succeeded payment whose amount, currency or customer does not match
//!   its record's fingerprint;
//! * `stuck`: an `InProgress` record whose lease ended more than `stuck_after` ago.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::contracts::payment::ListedPayment;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::{Fingerprint, Key, Record, State};

/// Whether a payment is this order's payment: its order's fingerprint, recomputed from
/// what the provider lists (amount, currency, customer, payment method), is the record's.
fn payment_matches(payment: &ListedPayment, order_id: &str, fingerprint: &Fingerprint) -> bool {
    let customer = payment.customer.as_deref().unwrap_or_default();
    let payment_method = payment.payment_method.as_deref().unwrap_or_default();
    Order::new(
        order_id,
        payment.amount,
        &payment.currency.to_ascii_uppercase(),
        customer,
        payment_method,
    )
    .is_ok_and(|order| Fingerprint::of(&order) == *fingerprint)
}

fn payment_evidence(payment: &ListedPayment) -> Value {
    json!({
        "payment_id": payment.id,
        "amount": payment.amount,
        "currency": payment.currency,
        "customer": payment.customer,
        "status": payment.status,
        "created_ms": payment.created.as_ms(),
    })
}

/// The kinds of finding, by their names in the output and the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    DoubleCharge,
    ChargedNotRecorded,
    RecordedWithoutCharge,
    Mismatch,
    Stuck,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::DoubleCharge,
        Kind::ChargedNotRecorded,
        Kind::RecordedWithoutCharge,
        Kind::Mismatch,
        Kind::Stuck,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::DoubleCharge => "double_charge",
            Kind::ChargedNotRecorded => "charged_not_recorded",
            Kind::RecordedWithoutCharge => "recorded_without_charge",
            Kind::Mismatch => "mismatch",
            Kind::Stuck => "stuck",
        }
    }

    /// The EMF count of this kind of finding.
    pub fn metric(self) -> &'static str {
        match self {
            Kind::DoubleCharge => "audit_double_charge",
            Kind::ChargedNotRecorded => "audit_charged_not_recorded",
            Kind::RecordedWithoutCharge => "audit_recorded_without_charge",
            Kind::Mismatch => "audit_mismatch",
            Kind::Stuck => "audit_stuck",
        }
    }
}

/// The EMF count of every finding, whatever its kind: what the alarm watches.
pub const FINDINGS_METRIC: &str = "audit_findings";
/// 1 when the scheduled audit could not read everything.
pub const INCOMPLETE_METRIC: &str = "audit_incomplete";

/// One disagreement, with the evidence a human needs to settle it.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub kind: Kind,
    pub order_id: String,
    pub evidence: Value,
}

impl Finding {
    /// The output line: `finding`, `order_id`, then the evidence.
    pub fn to_json(&self) -> Value {
        let mut line = json!({ "finding": self.kind.name(), "order_id": self.order_id });
        if let (Value::Object(line), Value::Object(evidence)) = (&mut line, &self.evidence) {
            line.extend(evidence.clone());
        }
        line
    }
}

/// Everything the audit reads, already read.
#[derive(Debug, Default)]
pub struct Evidence {
    /// The provider's payments in the window.
    pub payments: Vec<ListedPayment>,
    /// The records of the window and of every charged order, by key.
    pub records: BTreeMap<Key, Record>,
    /// Charges looked up by id: the receipts of `Done` records that the listing did
    /// not hold (`None`: the provider has no such payment).
    pub receipts: BTreeMap<String, Option<ListedPayment>>,
}

impl Evidence {
    /// The receipt ids of `Done` records that the listing does not hold: the ones
    /// to look up by id.
    pub fn unlisted_receipts(&self) -> Vec<String> {
        self.records
            .values()
            .filter(|r| r.state == State::Done)
            .filter_map(|r| r.receipt.clone())
            .filter(|id| !self.payments.iter().any(|c| c.id == *id))
            .collect()
    }

    /// The orders charged in the window whose record was not read yet.
    pub fn unread_orders(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .payments
            .iter()
            .filter_map(|c| c.order_id.as_deref())
            .map(Key::for_order_id)
            .filter(|k| !self.records.contains_key(k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

fn record_evidence(record: &Record) -> Value {
    json!({
        "key": record.pk.as_str(),
        "state": crate::contracts::schema::state_value(&record.state),
        "receipt": record.receipt,
        "attempt": record.attempt,
        "lease_until_ms": record.lease_until.map(Time::as_ms),
        "created_ms": record.created.map(Time::as_ms),
    })
}

/// The findings, in order: by kind, then order id.
pub fn findings(evidence: &Evidence, now: Time, stuck_after: Duration) -> Vec<Finding> {
    let mut succeeded: BTreeMap<&str, Vec<&ListedPayment>> = BTreeMap::new();
    for payment in evidence.payments.iter().filter(|c| c.succeeded()) {
        if let Some(order_id) = payment.order_id.as_deref() {
            succeeded.entry(order_id).or_default().push(payment);
        }
    }
    let mut out: Vec<Finding> = succeeded
        .iter()
        .flat_map(|(order_id, payments)| payment_findings(evidence, order_id, payments, now))
        .collect();
    out.extend(
        evidence
            .records
            .values()
            .filter_map(|record| record_finding(evidence, record, now, stuck_after)),
    );
    out.sort_by(|a, b| (a.kind, &a.order_id).cmp(&(b.kind, &b.order_id)));
    out
}

/// What an order's succeeded payments say against its record: charged twice, charged
/// but not recorded, charged for something else.
fn payment_findings(
    evidence: &Evidence,
    order_id: &str,
    payments: &[&ListedPayment],
    now: Time,
) -> Vec<Finding> {
    let record = evidence.records.get(&Key::for_order_id(order_id));
    let finding = |kind, extra: Value| {
        let mut e = json!({
            "payments": payments.iter().map(|c| payment_evidence(c)).collect::<Vec<_>>(),
            "record": record.map(record_evidence),
        });
        if let (Value::Object(e), Value::Object(extra)) = (&mut e, extra) {
            e.extend(extra);
        }
        Finding {
            kind,
            order_id: order_id.to_owned(),
            evidence: e,
        }
    };
    let mut out = Vec::new();
    if payments.len() > 1 {
        out.push(finding(Kind::DoubleCharge, json!({})));
    }
    let recorded = record.is_some_and(|r| r.state == State::Done);
    // A live lease is an attempt still running: its record is about to say `Done`.
    let running = record.is_some_and(|r| {
        r.state == State::InProgress && r.lease_until.is_some_and(|until| until > now)
    });
    if !recorded && !running {
        out.push(finding(Kind::ChargedNotRecorded, json!({})));
    }
    if let Some(fingerprint) = record.and_then(|r| r.fingerprint.as_ref()) {
        let wrong: Vec<&str> = payments
            .iter()
            .filter(|c| !payment_matches(c, order_id, fingerprint))
            .map(|c| c.id.as_str())
            .collect();
        if !wrong.is_empty() {
            out.push(finding(
                Kind::Mismatch,
                json!({ "fingerprint": fingerprint.to_string(), "mismatched": wrong }),
            ));
        }
    }
    out
}

/// What a record says against the payments: `Done` without a succeeded payment, or a
/// lease that ended long ago.
fn record_finding(
    evidence: &Evidence,
    record: &Record,
    now: Time,
    stuck_after: Duration,
) -> Option<Finding> {
    let order_id = record.pk.order_id().to_owned();
    match &record.state {
        State::Done => {
            let receipt = record.receipt.as_deref();
            let payment = receipt.and_then(|id| {
                evidence
                    .payments
                    .iter()
                    .find(|c| c.id == id)
                    .or_else(|| evidence.receipts.get(id).and_then(Option::as_ref))
            });
            (!payment.is_some_and(ListedPayment::succeeded)).then(|| Finding {
                kind: Kind::RecordedWithoutCharge,
                order_id,
                evidence: json!({
                    "record": record_evidence(record),
                    "payment": payment.map(payment_evidence),
                }),
            })
        }
        State::InProgress => {
            let ended = record.lease_until.unwrap_or(Time::from_ms(0));
            (ended + stuck_after < now).then(|| Finding {
                kind: Kind::Stuck,
                order_id,
                evidence: json!({
                    "record": record_evidence(record),
                    "lease_ended_s_ago": ended.until(now).as_secs(),
                }),
            })
        }
        State::Free | State::Awaiting | State::Failed | State::Other(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Time = Time::from_ms(1_800_000_000_000);
    const HOUR: Duration = Duration::from_secs(3600);

    fn order(id: &str) -> Order {
        Order::new(id, 500, "EUR", "cus_1", "pm_card_visa").unwrap()
    }

    fn payment(id: &str, order_id: &str, status: &str) -> ListedPayment {
        ListedPayment {
            id: id.to_owned(),
            order_id: Some(order_id.to_owned()),
            amount: 500,
            currency: "eur".to_owned(),
            customer: Some("cus_1".to_owned()),
            payment_method: Some("pm_card_visa".to_owned()),
            status: status.to_owned(),
            created: NOW - HOUR,
        }
    }

    fn record(order_id: &str, state: State) -> Record {
        let mut r = Record::new(Key::for_order_id(order_id), state);
        r.fingerprint = Some(Fingerprint::of(&order(order_id)));
        r.created = Some(NOW - HOUR);
        r
    }

    fn done(order_id: &str, receipt: &str) -> Record {
        let mut r = record(order_id, State::Done);
        r.receipt = Some(receipt.to_owned());
        r
    }

    fn judge(payments: Vec<ListedPayment>, records: Vec<Record>) -> Vec<(Kind, String)> {
        let evidence = Evidence {
            payments,
            records: records.into_iter().map(|r| (r.pk.clone(), r)).collect(),
            receipts: BTreeMap::new(),
        };
        findings(&evidence, NOW, HOUR)
            .into_iter()
            .map(|f| (f.kind, f.order_id))
            .collect()
    }

    #[test]
    fn a_charged_and_recorded_order_is_no_finding_and_a_declined_free_one_neither() {
        let mut declined = record("o-2", State::Free);
        declined.declines = Some(2);
        let found = judge(
            vec![
                payment("ch_1", "o-1", "succeeded"),
                payment("ch_2", "o-2", "failed"),
            ],
            vec![done("o-1", "ch_1"), declined],
        );
        assert_eq!(found, []);
    }

    #[test]
    fn a_charge_under_a_live_lease_is_an_attempt_still_running_not_a_finding() {
        let mut running = record("o-1", State::InProgress);
        running.lease_until = Some(NOW + Duration::from_secs(30));
        assert_eq!(
            judge(
                vec![payment("ch_1", "o-1", "succeeded")],
                vec![running.clone()]
            ),
            []
        );
        // Once the lease has ended, the payment is not recorded.
        running.lease_until = Some(NOW - Duration::from_secs(30));
        assert_eq!(
            judge(vec![payment("ch_1", "o-1", "succeeded")], vec![running]),
            [(Kind::ChargedNotRecorded, "o-1".to_owned())]
        );
    }

    #[test]
    fn a_receipt_that_names_a_failed_charge_is_recorded_without_charge() {
        assert_eq!(
            judge(
                vec![payment("ch_1", "o-1", "failed")],
                vec![done("o-1", "ch_1")]
            ),
            [(Kind::RecordedWithoutCharge, "o-1".to_owned())]
        );
        // Looked up by id (a payment older than the window) and succeeded: fine.
        let evidence = Evidence {
            records: [(Key::for_order_id("o-1"), done("o-1", "ch_old"))].into(),
            receipts: [(
                "ch_old".to_owned(),
                Some(payment("ch_old", "o-1", "succeeded")),
            )]
            .into(),
            ..Evidence::default()
        };
        assert_eq!(evidence.unlisted_receipts(), ["ch_old"]);
        assert_eq!(findings(&evidence, NOW, HOUR), []);
    }

    #[test]
    fn a_lease_is_stuck_only_after_stuck_after() {
        let mut lease = record("o-1", State::InProgress);
        lease.lease_until = Some(NOW - HOUR + Duration::from_secs(1));
        assert_eq!(judge(vec![], vec![lease.clone()]), []);
        lease.lease_until = Some(NOW - HOUR - Duration::from_secs(1));
        assert_eq!(
            judge(vec![], vec![lease]),
            [(Kind::Stuck, "o-1".to_owned())]
        );
    }

    #[test]
    fn each_finding_line_names_its_kind_its_order_and_its_evidence() {
        let mut other_customer = payment("ch_2", "o-1", "succeeded");
        other_customer.customer = Some("cus_2".to_owned());
        let evidence = Evidence {
            payments: vec![payment("ch_1", "o-1", "succeeded"), other_customer],
            records: [(Key::for_order_id("o-1"), done("o-1", "ch_1"))].into(),
            ..Evidence::default()
        };
        let found = findings(&evidence, NOW, HOUR);
        let kinds: Vec<Kind> = found.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [Kind::DoubleCharge, Kind::Mismatch]);
        let line = found[1].to_json();
        assert_eq!(line["finding"], "mismatch");
        assert_eq!(line["order_id"], "o-1");
        assert_eq!(line["mismatched"], serde_json::json!(["ch_2"]));
        assert_eq!(line["record"]["receipt"], "ch_1");
        assert_eq!(line["payments"].as_array().unwrap().len(), 2);
    }
}
