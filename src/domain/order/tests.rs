//! The unit tests of `order.rs`.

use super::*;
use proptest::prelude::*;

const RAW: &str = r#"{"id":"ord-1001","amount":5000,"currency":"EUR","customer":"cus_123","payment_method":"pm_card_visa"}"#;

fn err(body: &str) -> String {
    match Order::parse(body) {
        Ok(o) => panic!("expected an error, parsed {o:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn fingerprint_matches_the_golden_vector() {
    let order = Order::parse(RAW).unwrap();
    assert_eq!(order.payment_method(), "pm_card_visa");
    assert_eq!(
        order.fingerprint(),
        "e2dad7907db2f16826ea2cadffd475167b2af5328a69634aba5176186620b8dd"
    );
}

#[test]
fn a_message_without_a_valid_payment_method_is_invalid_naming_the_field() {
    let missing = r#"{"id":"ord-1001","amount":5000,"currency":"EUR","customer":"cus_123"}"#;
    assert!(
        err(missing).contains("`payment_method` is missing"),
        "{}",
        err(missing)
    );
    for bad in ["\"\"", "\"pm card\"", "5", "\"pm-1\""] {
        let body = format!(
            r#"{{"id":"a","amount":5,"currency":"EUR","customer":"c","payment_method":{bad}}}"#
        );
        let err = Order::parse(&body).unwrap_err().to_string();
        assert!(err.contains("`payment_method`"), "{bad}: {err}");
    }
}

#[test]
fn currency_case_does_not_change_the_fingerprint() {
    let lower = Order::parse(
            r#"{"id":"ord-1001","amount":5000,"currency":"eur","customer":"cus_123","payment_method":"pm_card_visa"}"#,
        )
        .unwrap();
    assert_eq!(lower.currency(), "EUR");
    assert_eq!(
        lower.fingerprint(),
        Order::parse(RAW).unwrap().fingerprint()
    );
}

#[test]
fn unknown_fields_are_ignored_and_not_fingerprinted() {
    let extra = Order::parse(
            r#"{"id":"ord-1001","amount":5000,"currency":"EUR","customer":"cus_123","payment_method":"pm_card_visa","note":"x","ts":1}"#,
        )
        .unwrap();
    assert_eq!(extra, Order::parse(RAW).unwrap());
}

#[test]
fn sns_envelope_is_unwrapped_to_the_same_fact() {
    let envelope = serde_json::json!({
        "Type": "Notification",
        "MessageId": "abc",
        "TopicArn": "arn:aws:sns:eu-west-1:123456789012:orders",
        "Message": RAW,
    })
    .to_string();
    assert_eq!(Order::parse(&envelope).unwrap(), Order::parse(RAW).unwrap());
}

#[test]
fn a_field_named_twice_is_invalid_raw_or_in_an_envelope() {
    // serde_json keeps the last value, other parsers the first: the charge must not
    // depend on which one the producer's parser thought won (I-JSON, RFC 7493).
    let twice = r#"{"id":"A-3","id":"A-4","amount":5000,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}"#;
    assert!(err(twice).contains("`id` appears twice"), "{}", err(twice));
    let amount_twice = r#"{"id":"A-3","amount":1,"amount":5000,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#;
    assert!(err(amount_twice).contains("`amount` appears twice"));

    let sns = serde_json::json!({"Type": "Notification", "Message": twice}).to_string();
    assert!(err(&sns).contains("`id` appears twice"), "{}", err(&sns));
    let outer_twice = format!(
        r#"{{"Type":"Notification","Message":{},"Message":"{{}}"}}"#,
        serde_json::json!(RAW)
    );
    assert!(
        err(&outer_twice).contains("`Message` appears twice"),
        "{}",
        err(&outer_twice)
    );

    let eventbridge = format!(
        r#"{{"version":"0","id":"e-1","detail-type":"OrderPlaced","source":"shop","account":"123456789012","time":"2026-11-30T00:00:00Z","region":"eu-west-1","resources":[],"detail":{}}}"#,
        twice
    );
    assert!(
        err(&eventbridge).contains("`id` appears twice"),
        "{}",
        err(&eventbridge)
    );
    // Nested deeper, in a field we otherwise ignore, it is still refused.
    let nested = r#"{"id":"A-3","amount":5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa","extra":{"k":1,"k":2}}"#;
    assert!(err(nested).contains("`k` appears twice"), "{}", err(nested));
}

#[test]
fn an_eventbridge_event_is_unwrapped_to_its_detail() {
    let event = format!(
        r#"{{"version":"0","id":"6a7e8feb","detail-type":"OrderPlaced","source":"shop.orders","account":"123456789012","time":"2026-11-30T00:00:00Z","region":"eu-west-1","resources":[],"detail":{RAW}}}"#
    );
    assert_eq!(Order::parse(&event).unwrap(), Order::parse(RAW).unwrap());
    let no_detail =
        r#"{"version":"0","id":"e","detail-type":"OrderPlaced","source":"shop","detail":"x"}"#;
    assert!(err(no_detail).contains("EventBridge event: detail is not a JSON object"));
}

#[test]
fn each_invalid_body_names_its_problem() {
    assert!(err("not json").contains("not JSON"));
    assert!(err("[1,2]").contains("not a JSON object"));
    assert!(
        err(r#"{"amount":1,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#)
            .contains("`id` is missing")
    );
    assert!(
            err(r#"{"id":"a","amount":50.5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("amount")
        );
    assert!(
            err(r#"{"id":"a","amount":50.0,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("amount")
        );
    assert!(
            err(r#"{"id":"a","amount":"50","currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("amount")
        );
    assert!(err(r#"{"id":"a","amount":0,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("amount"));
    assert!(
            err(r#"{"id":"a","amount":100000000,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#)
                .contains("amount")
        );
    assert!(
            err(r#"{"id":"a","amount":-5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("amount")
        );
    assert!(
            err(r#"{"id":"a","amount":5,"currency":"EURO","customer":"c","payment_method":"pm_card_visa"}"#).contains("currency")
        );
    assert!(
            err(r#"{"id":"a","amount":5,"currency":"E1R","customer":"c","payment_method":"pm_card_visa"}"#).contains("currency")
        );
    assert!(err(r#"{"id":"a#b","amount":5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("`#`"));
    let long = "x".repeat(129);
    assert!(
            err(&format!(
                r#"{{"id":"{long}","amount":5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}}"#
            ))
            .contains("128")
        );
    assert!(err(r#"{"id":"a b","amount":5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}"#).contains("`id`"));
    assert!(
            err(r#"{"id":"a","amount":5,"currency":"EUR","customer":"","payment_method":"pm_card_visa"}"#).contains("customer")
        );
    assert!(err(r#"{"id":"a","amount":5,"currency":"EUR"}"#).contains("`customer` is missing"));
    assert!(err(r#"{"Type":"Notification"}"#).contains("Message is missing"));
    assert!(err(r#"{"Type":"Notification","Message":"{oops"}"#).contains("SNS envelope"));
    assert!(err(r#"{"Type":"Notification","Message":{"id":"a"}}"#).contains("not a string"));
}

#[test]
fn an_id_of_exactly_128_characters_is_accepted() {
    let id = "x".repeat(128);
    let body = format!(
        r#"{{"id":"{id}","amount":5,"currency":"EUR","customer":"c","payment_method":"pm_card_visa"}}"#
    );
    assert_eq!(Order::parse(&body).unwrap().id(), id);
}

/// Every accepted order satisfies the rules of ARCHITECTURE.md, "The message"; every rejection names
/// a field or the envelope, so a log line always says what is wrong.
fn check_parse(body: &str) {
    match Order::parse(body) {
        Ok(o) => {
            assert!(!o.id().is_empty() && o.id().len() <= MAX_ID_LEN);
            assert!(!o.id().contains('#'));
            assert!((1..=MAX_AMOUNT).contains(&o.amount()));
            assert!(
                o.currency().len() == 3 && o.currency().bytes().all(|b| b.is_ascii_uppercase())
            );
            assert!(!o.customer().is_empty());
            assert_eq!(o.fingerprint().len(), 64);
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                [
                    "JSON",
                    "SNS",
                    "EventBridge",
                    "`id`",
                    "`amount`",
                    "`currency`",
                    "`customer`",
                    "`payment_method`"
                ]
                .iter()
                .any(|w| text.contains(w)),
                "error does not name the problem: {text}"
            );
        }
    }
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[A-Za-z0-9#._:\\- ]{0,140}".prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("id".to_owned()),
                    Just("amount".to_owned()),
                    Just("currency".to_owned()),
                    Just("customer".to_owned()),
                    Just("Type".to_owned()),
                    Just("Message".to_owned()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn order_like() -> impl Strategy<Value = Value> {
    (
            prop_oneof![
                "[A-Za-z0-9._:\\-]{1,130}".prop_map(Value::from),
                "[A-Za-z0-9#]{0,5}".prop_map(Value::from),
                json_leaf()
            ],
            prop_oneof![
                (0u64..200_000_000).prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                json_leaf()
            ],
            prop_oneof!["[A-Za-z]{3}".prop_map(Value::from), json_leaf()],
            prop_oneof!["cus_[a-z0-9]{1,10}".prop_map(Value::from), json_leaf()],
        )
            .prop_map(|(id, amount, currency, customer)| {
                serde_json::json!({"id": id, "amount": amount, "currency": currency, "customer": customer})
            })
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_and_is_explained(body in "\\PC{0,200}") {
        check_parse(&body);
    }

    #[test]
    fn arbitrary_json_never_panics_and_is_explained(value in json_value()) {
        check_parse(&value.to_string());
    }

    #[test]
    fn order_shaped_json_raw_or_wrapped_is_valid_or_explained(
        value in order_like(),
        wrap in any::<bool>(),
    ) {
        let raw = value.to_string();
        let body = if wrap {
            serde_json::json!({"Type": "Notification", "Message": raw}).to_string()
        } else {
            raw.clone()
        };
        check_parse(&body);
        // Wrapping never changes the verdict or the order.
        prop_assert_eq!(Order::parse(&raw).ok(), Order::parse(&body).ok());
    }
}
