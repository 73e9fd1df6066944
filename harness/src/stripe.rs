//! stripe-stateful-mock, kept only as the reference that localstripe's layer is held
//! against (`tests/stripe_layer/`): its test key and customers with a card.

use serde_json::Value;

/// Any `sk_test_` key is accepted by the mock, and by localstripe's layer.
pub const TEST_KEY: &str = "sk_test_chargeonce0000000000000";

/// A customer whose default card is `token` (`tok_visa` charges,
/// `tok_chargeCustomerFail` declines).
pub async fn customer(token: &str) -> String {
    let path = "/v1/customers";
    let response = crate::http_client()
        .post(format!("{}{path}", crate::servers::stripe_mock_url()))
        .bearer_auth(TEST_KEY)
        .form(&[("source", token)])
        .send()
        .await
        .expect("stripe mock reachable");
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    assert!(status.is_success(), "POST {path}: {status} {body}");
    body["id"].as_str().expect("customer id").to_owned()
}
