//! The unit tests of `simulated/mod.rs`.

use super::*;

fn order(payment_method: &str) -> Order {
    Order::new("ord-sim", 500, "EUR", "cus_1", payment_method).unwrap()
}

fn provider() -> (tempfile::TempDir, SimulatedProvider) {
    let dir = tempfile::tempdir().unwrap();
    let provider = SimulatedProvider::open(&dir.path().join("sim.sqlite3")).unwrap();
    (dir, provider)
}

#[tokio::test]
async fn a_key_replays_its_payment_and_the_ledger_holds_one_charge() {
    let (_dir, p) = provider();
    let first = p.charge(&order("pm_card_visa"), "k#1").await.unwrap();
    assert!(
        first.id.starts_with("pi_sim_") && first.charge.is_some(),
        "{first:?}"
    );
    assert_eq!(
        p.charge(&order("pm_card_visa"), "k#1").await.unwrap(),
        first
    );
    let ledger = p.ledger("ord-sim").unwrap();
    let statuses: Vec<_> = ledger.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["succeeded", "replayed"]);
    assert_eq!(ledger.iter().map(|r| r.charged).sum::<i64>(), 1);
    assert_eq!(
        p.find_payment(&order("pm_card_visa"), Time::from_ms(0))
            .await
            .unwrap(),
        Lookup::Succeeded(first)
    );
}

#[tokio::test]
async fn a_declined_payment_stays_open_until_cancelled() {
    let (_dir, p) = provider();
    let declining = order("pm_card_chargeDeclined");
    for _ in 0..2 {
        let result = p.charge(&declining, "k#1").await;
        assert!(
            matches!(result, Err(PaymentError::Declined { .. })),
            "{result:?}"
        );
    }
    let Lookup::Open {
        payment_id,
        status,
        awaits_customer: false,
    } = p.find_payment(&declining, Time::from_ms(0)).await.unwrap()
    else {
        panic!("the declined payment is open");
    };
    assert_eq!(status, "requires_payment_method");
    assert_eq!(p.cancel(&payment_id).await.unwrap(), Cancel::Cancelled);
    assert_eq!(p.cancel(&payment_id).await.unwrap(), Cancel::NotCancellable);
    assert_eq!(
        p.find_payment(&declining, Time::from_ms(0)).await.unwrap(),
        Lookup::NotFound
    );
}

#[tokio::test]
async fn authentication_is_required_until_the_customer_confirms_that_payment() {
    let (_dir, p) = provider();
    let strong = order(AUTHENTICATION_REQUIRED);
    let Err(PaymentError::AuthenticationRequired {
        payment_id: Some(id),
    }) = p.charge(&strong, "k#1").await
    else {
        panic!("authentication required");
    };
    // The replay names the same payment; nothing was charged.
    assert!(matches!(
        p.charge(&strong, "k#1").await,
        Err(PaymentError::AuthenticationRequired { payment_id: Some(again) }) if again == id
    ));
    assert!(matches!(
        p.find_payment(&strong, Time::from_ms(0)).await.unwrap(),
        Lookup::Open { .. }
    ));
    assert!(p.authenticate(&id).unwrap());
    assert_eq!(
        p.find_payment(&strong, Time::from_ms(0)).await.unwrap(),
        Lookup::Succeeded(receipt(id.clone()))
    );
    assert_eq!(p.cancel(&id).await.unwrap(), Cancel::NotCancellable);
}

#[tokio::test]
async fn timeout_after_charge_charges_then_the_replay_returns_the_payment() {
    let (_dir, p) = provider();
    let lost_order = Order::new(
        "ord-sim",
        500,
        "EUR",
        TIMEOUT_AFTER_CHARGE_CUSTOMER,
        "pm_card_visa",
    )
    .unwrap();
    let lost = p.charge(&lost_order, "k#1").await;
    assert!(matches!(
        lost,
        Err(PaymentError::Retryable {
            kind: FailureKind::Timeout,
            ..
        })
    ));
    let replay = p.charge(&lost_order, "k#1").await.unwrap();
    let ledger = p.ledger("ord-sim").unwrap();
    assert_eq!(ledger[0].payment_id.as_deref(), Some(replay.id.as_str()));
    assert_eq!(ledger.iter().map(|r| r.charged).sum::<i64>(), 1);
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_is_refused() {
    let (_dir, p) = provider();
    p.charge(&order("pm_card_visa"), "k#1").await.unwrap();
    for other in [
        Order::new("ord-sim", 999, "EUR", "cus_1", "pm_card_visa").unwrap(),
        order("pm_card_mastercard"),
    ] {
        assert!(matches!(
            p.charge(&other, "k#1").await,
            Err(PaymentError::KeyReused)
        ));
    }
}

#[tokio::test]
async fn it_refuses_what_stripe_refuses_and_stores_nothing_under_the_key() {
    let (_dir, p) = provider();
    let with = |amount, currency: &str, customer: &str, method: &str| {
        Order::new("ord-x", amount, currency, customer, method).unwrap()
    };
    for (order, code) in [
        (
            with(500, "ZZZ", "cus_1", "pm_card_visa"),
            "charge_invalid_parameter",
        ),
        (with(49, "EUR", "cus_1", "pm_card_visa"), "amount_too_small"),
        (with(29, "gbp", "cus_1", "pm_card_visa"), "amount_too_small"),
        (
            with(1499, "CZK", "cus_1", "pm_card_visa"),
            "amount_too_small",
        ),
        (
            with(500, "EUR", "pm_card_visa", "pm_card_visa"),
            "resource_missing",
        ),
        (with(500, "EUR", "cus_1", "cus_1"), "resource_missing"),
    ] {
        match p.charge(&order, "k#1").await {
            Err(PaymentError::Rejected {
                status: 400,
                code: Some(c),
            }) => assert_eq!(c, code),
            other => panic!("{order:?}: {other:?}"),
        }
    }
    assert!(p.ledger("ord-x").unwrap().is_empty());
    // At the minimum, and in a currency without a listed minimum, it charges.
    for (amount, currency) in [(50, "EUR"), (30, "GBP"), (1, "ISK")] {
        let order = with(amount, currency, "cus_1", "pm_card_visa");
        let key = format!("k#{currency}");
        assert!(p.charge(&order, &key).await.is_ok(), "{amount} {currency}");
    }
}
