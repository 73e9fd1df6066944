//! Refunds as Stripe keeps them, where localstripe alone is kinder: a refund takes at
//! most what remains of its charge, the rest of it when no amount is named, nothing of
//! a payment that did not succeed; `reason` is taken. Each refused request refunds
//! nothing.

use super::*;

/// A PaymentIntent of a new payer, charged `amount`.
async fn charged(amount: u64) -> String {
    let payer = localstripe::payer(Card::Visa).await;
    let intent = localstripe::charge_directly(&payer, amount, &unique("ord")).await;
    assert_eq!(intent["status"], "succeeded", "{intent}");
    intent["id"].as_str().unwrap().to_owned()
}

fn amounts(refunds: &[Value]) -> Vec<u64> {
    refunds
        .iter()
        .map(|r| r["amount"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_refund_above_what_remains_of_the_charge_is_refused_and_refunds_nothing() {
    let intent = charged(1000).await;
    let (status, first) = localstripe::refund_directly(&[
        ("payment_intent", &intent),
        ("amount", "700"),
        ("reason", "requested_by_customer"),
    ])
    .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["reason"], "requested_by_customer", "the reason kept");

    // localstripe alone refunds any amount: 400 more would make 1100 of 1000.
    let (status, over) =
        localstripe::refund_directly(&[("payment_intent", &intent), ("amount", "400")]).await;
    assert_eq!(status, 400, "{over}");
    assert_eq!(over["error"]["type"], "invalid_request_error", "{over}");
    assert_eq!(over["error"]["param"], "amount", "{over}");
    assert_eq!(amounts(&localstripe::refunds_of(&intent).await), vec![700]);

    // Without an amount, what remains: 300, not the whole charge.
    let (status, rest) = localstripe::refund_directly(&[("payment_intent", &intent)]).await;
    assert_eq!(
        (status, rest["amount"].as_u64()),
        (200, Some(300)),
        "{rest}"
    );

    let (status, again) = localstripe::refund_directly(&[("payment_intent", &intent)]).await;
    assert_eq!(status, 400, "{again}");
    assert_eq!(again["error"]["code"], "charge_already_refunded", "{again}");
    let mut refunded = amounts(&localstripe::refunds_of(&intent).await);
    refunded.sort_unstable();
    assert_eq!(refunded, vec![300, 700], "never more than the charge");
}

#[tokio::test]
async fn a_refund_of_a_payment_that_did_not_succeed_or_with_an_unknown_reason_is_refused() {
    let payer = localstripe::payer(Card::RequiresAuthentication).await;
    let intent = localstripe::charge_directly(&payer, 1000, &unique("ord")).await;
    assert_eq!(intent["status"], "requires_action", "{intent}");
    let intent = intent["id"].as_str().unwrap();
    let (status, refused) = localstripe::refund_directly(&[("payment_intent", intent)]).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "payment_intent", "{refused}");
    assert!(localstripe::refunds_of(intent).await.is_empty());

    let paid = charged(500).await;
    let (status, refused) =
        localstripe::refund_directly(&[("payment_intent", &paid), ("reason", "bored")]).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "reason", "{refused}");
    assert!(localstripe::refunds_of(&paid).await.is_empty());
}
