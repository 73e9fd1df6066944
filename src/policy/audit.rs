//! The audit: the table's records held against the provider's payments, every
//! disagreement named. This module only judges (no I/O); [`crate::drivers::audit`] reads both sides.
//!
//! An order's succeeded payments are counted once each, whatever read them: the
//! listing of the window's payments, the payments that succeeded in the window
//! (a customer who authenticated late confirms a payment created long before), and
//! the payment its record names, looked up by id. What counts as a finding (a `Free`
//! record after declines is not one):
//! * `double_charge`: more than one succeeded payment for one order (a late
//!   confirmation of an old open payment of an order already paid with another);
//! * `charged_not_recorded`: a succeeded payment whose order has no `Done` record
//!   (none, `Free`/`InProgress` with no live lease, or awaiting its customer longer
//!   than `stuck_after` after the payment it awaits succeeded: neither its event nor
//!   the settler recorded it);
//! * `recorded_without_charge`: a `Done` record whose receipt is not a succeeded
//!   payment at the provider;
//! * `mismatch`: a succeeded payment whose amount, currency, customer or payment
//!   method does not match its record's fingerprint;
//! * `stuck`: an `InProgress` record whose lease ended more than `stuck_after` ago, or
//!   one awaiting its customer whose wait ended that long ago (the settler has not
//!   run).
//!
//! And the refunds (each one that took money back, or may still: not failed nor
//! cancelled), with the records of their requests (`reembolso#<refund id>`):
//! * `double_refund`: more than one refund for one refund request
//!   (`metadata[refund_id]`);
//! * `over_refunded`: a payment whose refunds, every one of it whenever made, sum
//!   above what it took;
//! * `refund_not_recorded`: a refund of a request whose record does not name it
//!   (`Done` with it, or awaiting it), longer than `stuck_after` after it was made
//!   and with no live lease.

use crate::domain::{ForOrder, OrderKey};
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::contracts::payment::{Confirmation, ListedPayment, ListedRefund};
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::refund::REFUND_PREFIX;
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
    .is_ok_and(|order| Fingerprint::for_order(&order) == *fingerprint)
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
    DoubleRefund,
    OverRefunded,
    RefundNotRecorded,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::DoubleCharge,
        Kind::ChargedNotRecorded,
        Kind::RecordedWithoutCharge,
        Kind::Mismatch,
        Kind::Stuck,
        Kind::DoubleRefund,
        Kind::OverRefunded,
        Kind::RefundNotRecorded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::DoubleCharge => "double_charge",
            Kind::ChargedNotRecorded => "charged_not_recorded",
            Kind::RecordedWithoutCharge => "recorded_without_charge",
            Kind::Mismatch => "mismatch",
            Kind::Stuck => "stuck",
            Kind::DoubleRefund => "double_refund",
            Kind::OverRefunded => "over_refunded",
            Kind::RefundNotRecorded => "refund_not_recorded",
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
            Kind::DoubleRefund => "audit_double_refund",
            Kind::OverRefunded => "audit_over_refunded",
            Kind::RefundNotRecorded => "audit_refund_not_recorded",
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
    /// Where the window starts: a payment that succeeded and is not among `confirmed`
    /// succeeded before it.
    pub since: Time,
    /// The provider's payments created in the window.
    pub payments: Vec<ListedPayment>,
    /// The payments that succeeded in the window, whenever they were created (a
    /// customer who authenticated late): Stripe's events.
    pub confirmed: Vec<Confirmation>,
    /// The records read, by key: the order of each payment listed or confirmed, and
    /// every record that awaits its customer.
    pub records: BTreeMap<Key, Record>,
    /// Payments looked up by id, the ones a record names that no listing held: a
    /// `Done` record's receipt, an awaiting record's payment (`None`: the provider
    /// has no such payment), a refunded payment.
    pub receipts: BTreeMap<String, Option<ListedPayment>>,
    /// The provider's refunds: those made in the window, and every refund of the
    /// payments they return money of.
    pub refunds: Vec<ListedRefund>,
    /// The records of the refund requests those refunds name, by key.
    pub refund_records: BTreeMap<Key, Record>,
}

impl Evidence {
    /// The payment `id` as it was read: listed by creation, looked up by id, or
    /// named by its success event.
    fn payment(&self, id: &str) -> Option<&ListedPayment> {
        self.payments
            .iter()
            .find(|p| p.id == id)
            .or_else(|| self.receipts.get(id).and_then(Option::as_ref))
            .or_else(|| {
                self.confirmed
                    .iter()
                    .map(|c| &c.payment)
                    .find(|p| p.id == id)
            })
    }

    fn listed(&self, id: &str) -> bool {
        self.payments.iter().any(|p| p.id == id)
            || self.confirmed.iter().any(|c| c.payment.id == id)
    }

    /// The payment ids the records name (a `Done` record's receipt, an awaiting
    /// record's payment) or a refund returns money of that no listing holds: the ones
    /// to look up by id.
    pub fn unlisted_payments(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .records
            .values()
            .flat_map(named_payments)
            .chain(self.refunds.iter().map(|r| r.payment_id.as_str()))
            .filter(|id| !self.listed(id))
            .map(str::to_owned)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The orders of the payments listed or confirmed in the window whose record was
    /// not read yet: the ones to read by key.
    pub fn unread_orders(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .payments
            .iter()
            .chain(self.confirmed.iter().map(|c| &c.payment))
            .filter_map(|c| c.order_id.as_deref())
            .map(Key::for_order_id)
            .filter(|k| !self.records.contains_key(k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// The refund requests the refunds name whose record was not read yet: the ones
    /// to read by key.
    pub fn unread_refunds(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .refunds
            .iter()
            .filter_map(|r| r.refund_id.as_deref())
            .map(|id| Key::new(REFUND_PREFIX, id))
            .filter(|k| !self.refund_records.contains_key(k))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// When payment `id` succeeded: its event's time, or, with no event in the
    /// window, the window's start (it succeeded before).
    fn confirmed_at(&self, id: &str) -> Time {
        self.confirmed
            .iter()
            .find(|c| c.payment.id == id)
            .map_or(self.since, |c| c.at)
    }

    /// Every order's succeeded payments, each once, whatever read it: the listing by
    /// creation, the success events, the lookups of the payments records name.
    fn succeeded_by_order(&self) -> BTreeMap<&str, BTreeMap<&str, &ListedPayment>> {
        let mut by_order: BTreeMap<&str, BTreeMap<&str, &ListedPayment>> = BTreeMap::new();
        let listed = self
            .payments
            .iter()
            .chain(self.confirmed.iter().map(|c| &c.payment))
            .filter(|p| p.succeeded())
            .filter_map(|p| Some((p.order_id.as_deref()?, p)));
        // A payment a record names is that record's order's, whatever its metadata.
        let named = self.records.values().flat_map(|record| {
            named_payments(record)
                .filter_map(|id| self.payment(id))
                .filter(|p| p.succeeded())
                .map(|p| (record.pk.order_id(), p))
        });
        for (order_id, payment) in listed.chain(named) {
            by_order
                .entry(order_id)
                .or_default()
                .insert(payment.id.as_str(), payment);
        }
        by_order
    }
}

/// The payments a record names: its receipt, and the payment it awaits.
fn named_payments(record: &Record) -> impl Iterator<Item = &str> {
    record
        .receipt
        .as_deref()
        .into_iter()
        .chain(record.awaited.as_deref())
}

fn record_evidence(record: &Record) -> Value {
    json!({
        "key": record.pk.as_str(),
        "state": crate::contracts::schema::state_value(&record.state),
        "receipt": record.receipt,
        "attempt": record.attempt,
        "lease_until_ms": record.lease_until.map(Time::as_ms),
        "payment": record.awaited,
        "wait_until_s": record.wait_until.map(Time::as_secs),
        "created_ms": record.created.map(Time::as_ms),
    })
}

/// The findings, in order: by kind, then order id.
pub fn findings(evidence: &Evidence, now: Time, stuck_after: Duration) -> Vec<Finding> {
    let succeeded = evidence.succeeded_by_order();
    let mut out: Vec<Finding> = succeeded
        .iter()
        .flat_map(|(order_id, payments)| {
            let payments: Vec<&ListedPayment> = payments.values().copied().collect();
            payment_findings(evidence, order_id, &payments, now, stuck_after)
        })
        .collect();
    out.extend(
        evidence
            .records
            .values()
            .filter_map(|record| record_finding(evidence, record, now, stuck_after)),
    );
    out.extend(refund_findings(evidence, now, stuck_after));
    out.sort_by(|a, b| (a.kind, &a.order_id).cmp(&(b.kind, &b.order_id)));
    out
}

/// What an order's succeeded payments (each counted once) say against its record:
/// charged twice, charged but not recorded, charged for something else.
fn payment_findings(
    evidence: &Evidence,
    order_id: &str,
    payments: &[&ListedPayment],
    now: Time,
    stuck_after: Duration,
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
    // The customer confirmed the payment the record awaits, lately: its event, or
    // the settler's next run, is about to record it. Longer than `stuck_after`, and
    // neither did.
    let settling = record.is_some_and(|r| {
        r.state == State::Awaiting
            && r.awaited.as_deref().is_some_and(|id| {
                payments.iter().any(|p| p.id == id)
                    && evidence.confirmed_at(id) + stuck_after >= now
            })
    });
    if !recorded && !running && !settling {
        out.push(finding(Kind::ChargedNotRecorded, json!({})));
    }
    if let Some(r) = record
        && let Some(fingerprint) = r.fingerprint.as_ref()
    {
        // The payment an awaited order was paid by may carry another card (the
        // customer chose it on the shop's page): it is held to what the settle
        // recorded of it (`done_fingerprint`), every other payment to the order.
        let is_paid_as_recorded = |c: &ListedPayment| {
            r.receipt.as_deref() == Some(c.id.as_str())
                && r.done_fingerprint
                    .as_ref()
                    .is_some_and(|paid| payment_matches(c, order_id, paid))
        };
        let wrong: Vec<&str> = payments
            .iter()
            .filter(|c| !payment_matches(c, order_id, fingerprint) && !is_paid_as_recorded(c))
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

/// What a record says against the payments: `Done` without a succeeded payment, a
/// lease that ended long ago, or a wait that ended long ago and was never settled.
fn record_finding(
    evidence: &Evidence,
    record: &Record,
    now: Time,
    stuck_after: Duration,
) -> Option<Finding> {
    let order_id = record.pk.order_id().to_owned();
    match &record.state {
        State::Done => {
            let payment = record
                .receipt
                .as_deref()
                .and_then(|id| evidence.payment(id));
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
        State::Awaiting => {
            // Its payment succeeded: `charged_not_recorded` names it once it is late.
            let paid = record
                .awaited
                .as_deref()
                .and_then(|id| evidence.payment(id))
                .is_some_and(ListedPayment::succeeded);
            let ended = record.wait_until.unwrap_or(Time::from_ms(0));
            // The settler cancels a payment whose wait ended; still awaiting long after
            // that, it has not run.
            (!paid && ended + stuck_after < now).then(|| Finding {
                kind: Kind::Stuck,
                order_id,
                evidence: json!({
                    "record": record_evidence(record),
                    "wait_ended_s_ago": ended.until(now).as_secs(),
                }),
            })
        }
        // charge-once never writes `Uncertain` (its provider keeps every key).
        State::Free | State::Failed | State::Uncertain | State::Other(_) => None,
    }
}

fn refund_evidence(refund: &ListedRefund) -> Value {
    json!({
        "refund": refund.id,
        "refund_id": refund.refund_id,
        "payment_id": refund.payment_id,
        "amount": refund.amount,
        "status": refund.status,
        "created_ms": refund.created.as_ms(),
    })
}

/// What the refunds say, each counted once: a request refunded twice or not recorded,
/// a payment refunded above what it took.
fn refund_findings(evidence: &Evidence, now: Time, stuck_after: Duration) -> Vec<Finding> {
    let mut taking: BTreeMap<&str, &ListedRefund> = BTreeMap::new();
    for refund in evidence.refunds.iter().filter(|r| r.takes()) {
        taking.insert(refund.id.as_str(), refund);
    }
    let mut by_request: BTreeMap<&str, Vec<&ListedRefund>> = BTreeMap::new();
    let mut by_payment: BTreeMap<&str, Vec<&ListedRefund>> = BTreeMap::new();
    for refund in taking.values() {
        if let Some(request) = refund.refund_id.as_deref() {
            by_request.entry(request).or_default().push(refund);
        }
        by_payment
            .entry(refund.payment_id.as_str())
            .or_default()
            .push(refund);
    }
    let mut out = Vec::new();
    for (request, refunds) in &by_request {
        let record = evidence
            .refund_records
            .get(&Key::new(REFUND_PREFIX, request));
        let finding = |kind| Finding {
            kind,
            order_id: refunds[0].order_id.clone().unwrap_or_default(),
            evidence: json!({
                "refund_id": request,
                "refunds": refunds.iter().map(|r| refund_evidence(r)).collect::<Vec<_>>(),
                "record": record.map(record_evidence),
            }),
        };
        if refunds.len() > 1 {
            out.push(finding(Kind::DoubleRefund));
        }
        let names = |id: Option<&str>| id.is_some_and(|id| refunds.iter().any(|r| r.id == id));
        let recorded = record.is_some_and(|r| match r.state {
            State::Done => names(r.receipt.as_deref()),
            State::Awaiting => names(r.awaited.as_deref()),
            _ => false,
        });
        // A live lease is an attempt still running, about to record it; a refund made
        // moments ago may be its attempt's, between the call and the write.
        let running = record.is_some_and(|r| {
            r.state == State::InProgress && r.lease_until.is_some_and(|until| until > now)
        });
        let recent = refunds.iter().any(|r| r.created + stuck_after >= now);
        if !recorded && !running && !recent {
            out.push(finding(Kind::RefundNotRecorded));
        }
    }
    for (payment_id, refunds) in &by_payment {
        let refunded: u64 = refunds.iter().map(|r| r.amount).sum();
        if let Some(paid) = evidence.payment(payment_id)
            && refunded > paid.amount
        {
            out.push(Finding {
                kind: Kind::OverRefunded,
                order_id: paid.order_id.clone().unwrap_or_default(),
                evidence: json!({
                    "payment": payment_evidence(paid),
                    "refunded": refunded,
                    "refunds": refunds.iter().map(|r| refund_evidence(r)).collect::<Vec<_>>(),
                }),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
