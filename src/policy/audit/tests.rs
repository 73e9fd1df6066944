//! The unit tests of `audit.rs`.

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
    r.fingerprint = Some(Fingerprint::for_order(&order(order_id)));
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
        ..Evidence::default()
    };
    findings(&evidence, NOW, HOUR)
        .into_iter()
        .map(|f| (f.kind, f.order_id))
        .collect()
}

#[test]
fn a_charged_and_recorded_order_is_no_finding_and_a_declined_free_one_neither() {
    let mut declined = record("o-2", State::Free);
    declined.refusals = Some(2);
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
    assert_eq!(evidence.unlisted_payments(), ["ch_old"]);
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
fn an_awaited_order_paid_with_another_card_is_no_mismatch_and_any_other_change_is() {
    let mut other_card = payment("ch_1", "o-1", "succeeded");
    other_card.payment_method = Some("pm_another_card".to_owned());
    let paid_as = Order::new("o-1", 500, "EUR", "cus_1", "pm_another_card").unwrap();
    // The settle recorded what the customer paid with.
    let mut settled = done("o-1", "ch_1");
    settled.done_fingerprint = Some(Fingerprint::for_order(&paid_as));
    assert_eq!(judge(vec![other_card.clone()], vec![settled.clone()]), []);
    // Without that record of it, the other card is a mismatch, as before.
    assert_eq!(
        judge(vec![other_card.clone()], vec![done("o-1", "ch_1")]),
        [(Kind::Mismatch, "o-1".to_owned())]
    );
    // What was recorded holds the receipt alone: another amount is a mismatch, and
    // so is a second payment with the recorded card.
    let mut more = other_card.clone();
    more.amount = 900;
    assert_eq!(
        judge(vec![more], vec![settled.clone()]),
        [(Kind::Mismatch, "o-1".to_owned())]
    );
    let mut second = other_card.clone();
    second.id = "ch_2".to_owned();
    let kinds: Vec<Kind> = judge(vec![other_card, second], vec![settled])
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(kinds, [Kind::DoubleCharge, Kind::Mismatch]);
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

fn confirmed(id: &str, order_id: &str, ago: Duration) -> Confirmation {
    let mut payment = payment(id, order_id, "succeeded");
    // Created long before the window: only its success event lists it.
    payment.created = NOW - 30 * HOUR;
    Confirmation {
        at: NOW - ago,
        payment,
    }
}

fn awaiting(order_id: &str, payment_id: &str, wait_ends_in: i64) -> Record {
    let mut r = record(order_id, State::Awaiting);
    r.awaited = Some(payment_id.to_owned());
    let wait_until = NOW.as_ms() + wait_ends_in * 1000;
    r.wait_until = Some(Time::from_ms(wait_until));
    r
}

fn old_succeeded(id: &str, order_id: &str) -> (String, Option<ListedPayment>) {
    let mut p = payment(id, order_id, "succeeded");
    p.created = NOW - 48 * HOUR;
    (id.to_owned(), Some(p))
}

/// One case of the late confirmations: what was read, and what it must say.
struct Late {
    case: &'static str,
    payments: Vec<ListedPayment>,
    confirmed: Vec<Confirmation>,
    records: Vec<Record>,
    receipts: Vec<(String, Option<ListedPayment>)>,
    found: Vec<Kind>,
}

#[test]
fn a_late_confirmation_is_counted_once_and_a_second_succeeded_payment_is_a_double_charge() {
    let minutes = |m: u64| Duration::from_secs(60 * m);
    let day = 24 * 3600;
    let cases = [
        Late {
            case: "an old open payment confirmed late, the order already paid with another",
            payments: vec![],
            confirmed: vec![confirmed("pi_old", "o-1", minutes(5))],
            records: vec![done("o-1", "pi_paid")],
            receipts: vec![old_succeeded("pi_paid", "o-1")],
            found: vec![Kind::DoubleCharge],
        },
        Late {
            case: "the same, the other payment listed in the window",
            payments: vec![payment("pi_paid", "o-1", "succeeded")],
            confirmed: vec![confirmed("pi_old", "o-1", minutes(5))],
            records: vec![done("o-1", "pi_paid")],
            receipts: vec![],
            found: vec![Kind::DoubleCharge],
        },
        Late {
            case: "the late confirmation is the order's receipt",
            payments: vec![],
            confirmed: vec![confirmed("pi_old", "o-1", minutes(5))],
            records: vec![done("o-1", "pi_old")],
            receipts: vec![],
            found: vec![],
        },
        Late {
            case: "one payment listed, confirmed and the receipt: counted once",
            payments: vec![payment("pi_1", "o-1", "succeeded")],
            confirmed: vec![confirmed("pi_1", "o-1", minutes(5))],
            records: vec![done("o-1", "pi_1")],
            receipts: vec![],
            found: vec![],
        },
        Late {
            case: "the awaited payment confirmed minutes ago: being settled",
            payments: vec![],
            confirmed: vec![confirmed("pi_wait", "o-1", minutes(5))],
            records: vec![awaiting("o-1", "pi_wait", day)],
            receipts: vec![],
            found: vec![],
        },
        Late {
            case: "the awaited payment confirmed longer than stuck_after ago",
            payments: vec![],
            confirmed: vec![confirmed("pi_wait", "o-1", 2 * HOUR)],
            records: vec![awaiting("o-1", "pi_wait", day)],
            receipts: vec![],
            found: vec![Kind::ChargedNotRecorded],
        },
        Late {
            case: "the awaited payment succeeded before the window (no event in it)",
            payments: vec![],
            confirmed: vec![],
            records: vec![awaiting("o-1", "pi_wait", day)],
            receipts: vec![old_succeeded("pi_wait", "o-1")],
            found: vec![Kind::ChargedNotRecorded],
        },
        Late {
            case: "the awaited payment confirmed, and another payment of the order",
            payments: vec![payment("pi_other", "o-1", "succeeded")],
            confirmed: vec![confirmed("pi_wait", "o-1", minutes(5))],
            records: vec![awaiting("o-1", "pi_wait", day)],
            receipts: vec![],
            found: vec![Kind::DoubleCharge],
        },
        Late {
            case: "an open awaited payment whose wait ends tomorrow",
            payments: vec![payment("pi_wait", "o-1", "requires_action")],
            confirmed: vec![],
            records: vec![awaiting("o-1", "pi_wait", day)],
            receipts: vec![],
            found: vec![],
        },
        Late {
            case: "an open awaited payment whose wait ended two hours ago: unsettled",
            payments: vec![],
            confirmed: vec![],
            records: vec![awaiting("o-1", "pi_wait", -2 * 3600)],
            receipts: vec![(
                "pi_wait".to_owned(),
                Some(payment("pi_wait", "o-1", "requires_action")),
            )],
            found: vec![Kind::Stuck],
        },
    ];
    for late in cases {
        let evidence = Evidence {
            since: NOW - 3 * HOUR,
            payments: late.payments,
            confirmed: late.confirmed,
            records: late
                .records
                .into_iter()
                .map(|r| (r.pk.clone(), r))
                .collect(),
            receipts: late.receipts.into_iter().collect(),
            ..Evidence::default()
        };
        let found: Vec<Kind> = findings(&evidence, NOW, HOUR)
            .into_iter()
            .map(|f| f.kind)
            .collect();
        assert_eq!(found, late.found, "{}", late.case);
    }
}

#[test]
fn the_records_to_read_are_the_orders_of_the_listed_and_the_confirmed_payments() {
    let mut evidence = Evidence {
        payments: vec![payment("pi_1", "o-1", "requires_action")],
        confirmed: vec![confirmed("pi_old", "o-2", HOUR)],
        ..Evidence::default()
    };
    assert_eq!(
        evidence.unread_orders(),
        [Key::for_order_id("o-1"), Key::for_order_id("o-2")]
    );
    // The payments records name that no listing holds are looked up by id.
    for r in [done("o-2", "pi_paid"), awaiting("o-3", "pi_wait", 60)] {
        evidence.records.insert(r.pk.clone(), r);
    }
    evidence
        .records
        .insert(Key::for_order_id("o-4"), done("o-4", "pi_old"));
    assert_eq!(evidence.unlisted_payments(), ["pi_paid", "pi_wait"]);
}

fn refund(
    id: &str,
    request: Option<&str>,
    payment: &str,
    amount: u64,
    age: Duration,
) -> ListedRefund {
    ListedRefund {
        id: id.to_owned(),
        refund_id: request.map(str::to_owned),
        order_id: Some("o-1".to_owned()),
        payment_id: payment.to_owned(),
        amount,
        status: "succeeded".to_owned(),
        created: NOW - age,
    }
}

fn refund_done(request: &str, receipt: &str) -> Record {
    let mut r = Record::new(Key::new(REFUND_PREFIX, request), State::Done);
    r.receipt = Some(receipt.to_owned());
    r
}

fn judge_refunds(refunds: Vec<ListedRefund>, records: Vec<Record>) -> Vec<Kind> {
    let evidence = Evidence {
        payments: vec![payment("pi_1", "o-1", "succeeded")],
        records: [done("o-1", "pi_1")]
            .into_iter()
            .map(|r| (r.pk.clone(), r))
            .collect(),
        refunds,
        refund_records: records.into_iter().map(|r| (r.pk.clone(), r)).collect(),
        ..Evidence::default()
    };
    findings(&evidence, NOW, HOUR)
        .into_iter()
        .map(|f| f.kind)
        .collect()
}

#[test]
fn refunds_recorded_within_the_payment_are_no_finding_and_a_failed_one_takes_nothing() {
    let mut failed = refund("re_3", Some("ref-3"), "pi_1", 500, 2 * HOUR);
    failed.status = "failed".to_owned();
    let found = judge_refunds(
        vec![
            refund("re_1", Some("ref-1"), "pi_1", 300, 2 * HOUR),
            refund("re_2", Some("ref-2"), "pi_1", 200, 2 * HOUR),
            failed,
        ],
        vec![refund_done("ref-1", "re_1"), refund_done("ref-2", "re_2")],
    );
    assert_eq!(found, []);
}

#[test]
fn a_request_refunded_twice_or_not_recorded_and_a_payment_refunded_above_it_are_found() {
    let found = judge_refunds(
        vec![
            refund("re_1", Some("ref-1"), "pi_1", 300, 2 * HOUR),
            refund("re_2", Some("ref-1"), "pi_1", 300, 2 * HOUR),
        ],
        vec![refund_done("ref-1", "re_1")],
    );
    assert_eq!(found, [Kind::DoubleRefund, Kind::OverRefunded]);

    // Made two hours ago and its record names another refund (or none): not recorded;
    // made moments ago, its attempt may be between the call and the write.
    let found = judge_refunds(
        vec![
            refund("re_1", Some("ref-1"), "pi_1", 100, 2 * HOUR),
            refund("re_9", Some("ref-9"), "pi_1", 100, Duration::from_secs(60)),
        ],
        vec![],
    );
    assert_eq!(found, [Kind::RefundNotRecorded]);
}

#[test]
fn a_refund_made_outside_the_consumer_counts_against_its_payment_but_is_no_request_of_ours() {
    let found = judge_refunds(
        vec![
            refund("re_1", Some("ref-1"), "pi_1", 300, 2 * HOUR),
            refund("re_dash", None, "pi_1", 300, 2 * HOUR),
        ],
        vec![refund_done("ref-1", "re_1")],
    );
    assert_eq!(found, [Kind::OverRefunded]);
}
