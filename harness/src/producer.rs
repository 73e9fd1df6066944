//! Producers that duplicate, fan out, conflict and decline, and the provider's side of
//! the invariant check: succeeded charges per order.

use std::collections::BTreeMap;

use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use crate::stripe;

use std::collections::BTreeSet;

/// What the producers sent, to check the outcome against.
#[derive(Default)]
pub struct Plan {
    /// Order id → the body that must be charged (once).
    pub must_charge: BTreeMap<String, String>,
    /// Orders whose customer declines: never charged, in the DLQ.
    pub declined: BTreeSet<String>,
    /// Bodies that must end in the DLQ (invalid).
    pub invalid: Vec<String>,
    /// Order id → its two conflicting bodies: one charged, the other in the DLQ.
    pub conflicting: BTreeMap<String, (String, String)>,
    /// Everything sent, duplicates included.
    pub messages: Vec<String>,
}

fn order_body(id: &str, amount: u64, customer: &str) -> String {
    json!({"id": id, "amount": amount, "currency": "EUR", "customer": customer, "sent_by": "system-test"}).to_string()
}

fn sns(body: &str) -> String {
    json!({"Type": "Notification", "MessageId": uuid::Uuid::new_v4().to_string(), "Message": body})
        .to_string()
}

/// `orders` orders from several producers: plain, retried (same body twice), fanned
/// out (raw + SNS copy), declining, invalid, conflicting.
pub async fn produce(run: &str, orders: usize) -> Plan {
    let good = [
        stripe::customer("tok_visa").await,
        stripe::customer("tok_visa").await,
        stripe::customer("tok_visa").await,
    ];
    let declining = stripe::customer("tok_chargeCustomerFail").await;
    let mut rng = rand::rng();
    let mut plan = Plan::default();
    for n in 0..orders {
        let id = format!("{run}-{n}");
        let amount = rng.random_range(100..100_000);
        let customer = good.choose(&mut rng).unwrap();
        let body = order_body(&id, amount, customer);
        match rng.random_range(0..100) {
            0..5 => {
                let bad = order_body(&id, amount, &declining);
                plan.declined.insert(id);
                plan.messages.push(bad);
            }
            5..10 => {
                let invalid = json!({"id": id, "amount": amount as f64 + 0.5, "currency": "EUR", "customer": customer}).to_string();
                plan.invalid.push(invalid.clone());
                plan.messages.push(invalid);
            }
            10..15 => {
                let other = order_body(&id, amount + 1, customer);
                plan.conflicting.insert(id, (body.clone(), other.clone()));
                plan.messages.push(body);
                plan.messages.push(other);
            }
            15..35 => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(body.clone());
                plan.messages.push(body);
            }
            35..55 => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(sns(&body));
                plan.messages.push(body);
            }
            _ => {
                plan.must_charge.insert(id, body.clone());
                plan.messages.push(body);
            }
        }
    }
    // Interleave producers: duplicates and conflicts do not arrive side by side.
    use rand::seq::SliceRandom;
    plan.messages.shuffle(&mut rng);
    plan
}

/// Succeeded charges in the mock per order id of this run.
pub async fn charges_by_order(run: &str) -> BTreeMap<String, Vec<(u64, String)>> {
    let client = crate::http_client();
    let mut by_order: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let mut query = vec![("limit", "100".to_owned())];
        if let Some(a) = &after {
            query.push(("starting_after", a.clone()));
        }
        let page: Value = client
            .get(format!("{}/v1/charges", crate::servers::stripe_mock_url()))
            .bearer_auth(stripe::TEST_KEY)
            .query(&query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = page["data"].as_array().unwrap();
        for charge in data {
            let order = charge["metadata"]["order_id"].as_str().unwrap_or_default();
            if order.starts_with(run) && charge["status"] == "succeeded" {
                by_order.entry(order.to_owned()).or_default().push((
                    charge["amount"].as_u64().unwrap(),
                    charge["id"].as_str().unwrap().to_owned(),
                ));
            }
        }
        match data.last() {
            Some(last) if page["has_more"] == true => {
                after = last["id"].as_str().map(str::to_owned)
            }
            _ => break,
        }
    }
    by_order
}
