//! Helpers for stripe-stateful-mock: customers with cards, and the charges it holds.

use serde_json::Value;

/// Any `sk_test_` key is accepted by the mock.
pub const TEST_KEY: &str = "sk_test_chargeonce0000000000000";

fn client() -> reqwest::Client {
    crate::http_client()
}

async fn post(path: &str, form: &[(&str, &str)]) -> Value {
    let response = client()
        .post(format!("{}{path}", crate::servers::stripe_mock_url()))
        .bearer_auth(TEST_KEY)
        .form(form)
        .send()
        .await
        .expect("stripe mock reachable");
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    assert!(status.is_success(), "POST {path}: {status} {body}");
    body
}

/// A customer whose default card is `token` (`tok_visa` charges,
/// `tok_chargeCustomerFail` declines).
pub async fn customer(token: &str) -> String {
    let body = post("/v1/customers", &[("source", token)]).await;
    body["id"].as_str().expect("customer id").to_owned()
}

/// Gives `customer` a new default card.
pub async fn replace_card(customer: &str, token: &str) {
    let card = post(
        &format!("/v1/customers/{customer}/sources"),
        &[("source", token)],
    )
    .await;
    let card_id = card["id"].as_str().expect("card id").to_owned();
    post(
        &format!("/v1/customers/{customer}"),
        &[("default_source", &card_id)],
    )
    .await;
}

/// Every charge the mock holds for `customer`, succeeded or failed.
pub async fn charges_of(customer: &str) -> Vec<Value> {
    let response = client()
        .get(format!("{}/v1/charges", crate::servers::stripe_mock_url()))
        .bearer_auth(TEST_KEY)
        .query(&[("customer", customer), ("limit", "100")])
        .send()
        .await
        .expect("stripe mock reachable");
    let body: Value = response.json().await.expect("json");
    body["data"].as_array().expect("list").clone()
}

/// Charges that took money.
pub async fn succeeded_charges_of(customer: &str) -> Vec<String> {
    charges_of(customer)
        .await
        .into_iter()
        .filter(|c| c["status"] == "succeeded")
        .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}
