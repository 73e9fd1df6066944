//! The unit tests of `payment_http/mod.rs`.

use super::*;

/// The PaymentIntent object of Stripe's API reference, as the pinned version
/// shapes it, with `status` and `latest_charge` set by each test.
fn fixture(status: &str, latest_charge: &str) -> String {
    format!(
        r#"{{
  "id": "pi_3MtwBwLkdIwHu7ix28a3tqPa",
  "object": "payment_intent",
  "amount": 2000,
  "amount_capturable": 0,
  "amount_received": 2000,
  "automatic_payment_methods": {{"allow_redirects": "never", "enabled": true}},
  "canceled_at": null,
  "cancellation_reason": null,
  "capture_method": "automatic",
  "client_secret": "pi_3MtwBwLkdIwHu7ix28a3tqPa_secret_YrKJUKribcBjcG8HVhfZluoGH",
  "confirmation_method": "automatic",
  "created": 1680800504,
  "currency": "eur",
  "customer": "cus_NffrFeUfNV2Hib",
  "description": null,
  "last_payment_error": null,
  "latest_charge": {latest_charge},
  "livemode": false,
  "metadata": {{"order_id": "ord-1001"}},
  "next_action": null,
  "payment_method": "pm_1MtwBwLkdIwHu7ixAWpJ1oFu",
  "payment_method_types": ["card"],
  "processing": null,
  "setup_future_usage": null,
  "status": "{status}"
}}"#
    )
}

fn parsed(status: &str, latest_charge: &str) -> Intent {
    serde_json::from_str(&fixture(status, latest_charge)).unwrap()
}

#[test]
fn each_status_of_the_reference_object_reads_as_its_outcome() {
    let paid = settle(parsed("succeeded", r#""ch_3MtwBwLkdIwHu7ix28a3tqPa""#)).unwrap();
    assert_eq!(paid.id, "pi_3MtwBwLkdIwHu7ix28a3tqPa");
    assert_eq!(paid.charge.as_deref(), Some("ch_3MtwBwLkdIwHu7ix28a3tqPa"));
    // A server that expands `latest_charge` answers with the Charge itself.
    let expanded = settle(parsed("succeeded", r#"{"id":"ch_x","object":"charge"}"#));
    assert_eq!(expanded.unwrap().charge.as_deref(), Some("ch_x"));
    assert!(matches!(
        settle(parsed("processing", "null")),
        Err(PaymentError::Pending { status, .. }) if status == "processing"
    ));
    assert!(matches!(
        settle(parsed("requires_action", "null")),
        Err(PaymentError::AuthenticationRequired { payment_id: Some(id) })
            if id == "pi_3MtwBwLkdIwHu7ix28a3tqPa"
    ));
    assert!(matches!(
        settle(parsed("requires_payment_method", "null")),
        Err(PaymentError::Declined { .. })
    ));
    for other in ["requires_capture", "requires_confirmation", "canceled"] {
        assert!(
            matches!(
                settle(parsed(other, "null")),
                Err(PaymentError::UnexpectedStatus { status, .. }) if status == other
            ),
            "{other}"
        );
    }
}

/// `last_payment_error` as the pinned version's reference shapes it: the card
/// error's fields, the PaymentMethod, and `payment_method_type` beside them.
const LAST_PAYMENT_ERROR: &str = r#"{
    "advice_code": null,
    "charge": "ch_3MtwBwLkdIwHu7ix28a3tqPa",
    "code": "authentication_required",
    "decline_code": "authentication_required",
    "doc_url": "https://docs.stripe.com/error-codes/authentication-required",
    "message": "Your card was declined. This transaction requires authentication.",
    "network_advice_code": null,
    "network_decline_code": null,
    "payment_method": {
      "id": "pm_1MtwBwLkdIwHu7ixAWpJ1oFu",
      "object": "payment_method",
      "type": "card"
    },
    "payment_method_type": "card",
    "type": "card_error"
  }"#;

#[test]
fn the_last_error_of_an_open_payment_names_its_code_and_the_kind_of_method_that_failed() {
    let text = fixture("requires_payment_method", "null").replace(
        r#""last_payment_error": null"#,
        &format!(r#""last_payment_error": {LAST_PAYMENT_ERROR}"#),
    );
    let intent: Intent = serde_json::from_str(&text).unwrap();
    let error = intent.last_payment_error.as_ref().expect("parsed");
    assert_eq!(error.code.as_deref(), Some("authentication_required"));
    assert_eq!(error.payment_method_type.as_deref(), Some("card"));
    assert!(intent.awaits_customer());
    // An error of an earlier version, without the field, reads as well.
    let older: answers::LastError =
        serde_json::from_str(r#"{"code":"card_declined","type":"card_error"}"#).unwrap();
    assert_eq!(older.payment_method_type, None);
}

#[test]
fn a_lookup_reads_a_decline_that_asks_for_authentication_from_its_decline_code_too() {
    // The issuer's reason under the generic code, as the charge's 402 carries it.
    let with_error = |error: &str| {
        let text = fixture("requires_payment_method", "null").replace(
            r#""last_payment_error": null"#,
            &format!(r#""last_payment_error": {error}"#),
        );
        serde_json::from_str::<Intent>(&text).unwrap()
    };
    let asks = with_error(
        r#"{"code":"card_declined","decline_code":"authentication_required","type":"card_error"}"#,
    );
    assert!(asks.awaits_customer());
    let refused = with_error(
        r#"{"code":"card_declined","decline_code":"insufficient_funds","type":"card_error"}"#,
    );
    assert!(!refused.awaits_customer());
}

#[test]
fn the_body_is_a_pure_function_of_the_fingerprinted_fields() {
    let body = |extra: &str| {
        Order::parse(&format!(
                r#"{{"id":"o-1","amount":5000,"currency":"eur","customer":"cus_1","payment_method":"pm_card_visa"{extra}}}"#
            ))
            .unwrap()
    };
    let (a, b) = (body(r#","ts":1"#), body(r#","ts":2,"note":"x""#));
    let usage = StoredCredentialUsage::default();
    assert_eq!(charge_form(&a, usage), charge_form(&b, usage));
    let body = charge_form(&a, usage);
    let form: Vec<(&str, &str)> = body.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        form,
        [
            ("amount", "5000"),
            ("currency", "eur"),
            ("customer", "cus_1"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("off_session", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
            (
                "payment_method_options[card][stored_credential_usage]",
                "unscheduled"
            ),
            ("description", "order o-1"),
            ("metadata[order_id]", "o-1"),
        ]
    );
    // The setting is the only other input.
    let recurring = charge_form(&a, StoredCredentialUsage::Recurring);
    assert_eq!(recurring[8].1, "recurring");
    assert_eq!(
        StoredCredentialUsage::Installment.as_str(),
        "installment",
        "Stripe's enum value"
    );
}

fn intent(id: &str, status: &str, amount: u64, currency: &str, order_id: &str) -> Intent {
    Intent {
        id: id.to_owned(),
        amount: Some(amount),
        currency: Some(currency.to_owned()),
        status: Some(status.to_owned()),
        metadata: Some([("order_id".to_owned(), order_id.to_owned())].into()),
        customer: Some("cus_1".to_owned()),
        payment_method: Some("pm_1".to_owned()),
        latest_charge: None,
        created: Some(1_700_000_000),
        last_payment_error: None,
    }
}

#[test]
fn a_lookup_prefers_succeeded_then_in_flight_then_open_and_skips_cancelled() {
    let order = Order::new("o-1", 5000, "EUR", "cus_1", "pm_card_visa").unwrap();
    let one = |status| intent(&format!("pi_{status}"), status, 5000, "eur", "o-1");
    assert_eq!(pick(&[one("canceled")], &order), Lookup::NotFound);
    assert_eq!(
        pick(&[one("canceled"), one("requires_payment_method")], &order),
        Lookup::Open {
            payment_id: "pi_requires_payment_method".into(),
            status: "requires_payment_method".into(),
            awaits_customer: false,
        }
    );
    // Off-session, Stripe leaves a payment that needs authentication
    // `requires_payment_method` with `last_payment_error.code`: it awaits the customer.
    let mut asked = one("requires_payment_method");
    asked.last_payment_error = Some(answers::LastError {
        code: Some("authentication_required".into()),
        decline_code: None,
        payment_method_type: Some("card".into()),
    });
    assert!(matches!(
        pick(&[asked], &order),
        Lookup::Open {
            awaits_customer: true,
            ..
        }
    ));
    assert!(matches!(
        pick(&[one("requires_action")], &order),
        Lookup::Open {
            awaits_customer: true,
            ..
        }
    ));
    assert_eq!(
        pick(&[one("requires_action"), one("processing")], &order),
        Lookup::Pending {
            payment_id: "pi_processing".into(),
            status: "processing".into()
        }
    );
    assert_eq!(
        pick(&[one("processing"), one("succeeded")], &order),
        Lookup::Succeeded(Receipt::new("pi_succeeded"))
    );
    // Another order, amount or currency is not this order's payment.
    for other in [
        intent("x", "succeeded", 5000, "eur", "o-2"),
        intent("x", "succeeded", 5001, "eur", "o-1"),
        intent("x", "succeeded", 5000, "usd", "o-1"),
    ] {
        assert_eq!(pick(&[other], &order), Lookup::NotFound);
    }
    // Across pages, the better answer stays.
    let open = pick(&[one("requires_action")], &order);
    let kept = better(better(None, open.clone()), Lookup::NotFound);
    assert_eq!(kept, Some(open));
}

#[test]
fn debug_output_hides_the_api_key() {
    let key = Secret::new("sk_test_hideme12345".to_owned());
    let provider = HttpProvider::new(
        "http://127.0.0.1:1",
        &key,
        Duration::from_secs(1),
        &crate::adapters::tls::Tls::new(None).unwrap(),
    )
    .unwrap();
    assert!(!format!("{provider:?}").contains("hideme"));
}
