//! Producers that duplicate, fan out, conflict, decline and need the customer's
//! authentication, and the provider's side of the invariant check: succeeded
//! PaymentIntents per order, at localstripe.

use std::collections::BTreeMap;

use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use crate::localstripe::{self, Card, Payer};

use std::collections::BTreeSet;

/// What the producers sent, to check the outcome against.
#[derive(Default)]
pub struct Plan {
    /// Order id → the body that must be charged (once).
    pub must_charge: BTreeMap<String, String>,
    /// Orders whose card declines: never charged, in the DLQ.
    pub declined: BTreeSet<String>,
    /// Order id → its body, paid with a card that always asks for authentication: its
    /// record awaits the customer (`espera`, the message acknowledged) until the
    /// customer confirms the payment on-session or the wait ends.
    pub authenticating: BTreeMap<String, String>,
    /// Bodies that must end in the DLQ (invalid).
    pub invalid: Vec<String>,
    /// Order id → its two conflicting bodies: one charged, the other in the DLQ.
    pub conflicting: BTreeMap<String, (String, String)>,
    /// Everything sent, duplicates included.
    pub messages: Vec<String>,
    /// The customer whose card always asks for authentication.
    pub authenticating_customer: String,
}

fn order_body(id: &str, amount: u64, payer: &Payer) -> String {
    json!({"id": id, "amount": amount, "currency": "EUR", "customer": payer.customer,
        "payment_method": payer.card, "sent_by": "system-test"})
    .to_string()
}

fn sns(body: &str) -> String {
    json!({"Type": "Notification", "MessageId": uuid::Uuid::new_v4().to_string(), "Message": body})
        .to_string()
}

/// `orders` orders from several producers: plain, retried (same body twice), fanned
/// out (raw + SNS copy), declining, needing authentication, invalid, conflicting.
pub async fn produce(run: &str, orders: usize) -> Plan {
    produce_with(run, orders, 0).await
}

/// The same, with `authenticating_percent` % of the orders (on top of the usual 4 % of
/// the rest) paid with the card that always asks for authentication.
pub async fn produce_with(run: &str, orders: usize, authenticating_percent: u32) -> Plan {
    let good = [
        localstripe::payer(Card::Visa).await,
        localstripe::payer(Card::Visa).await,
        localstripe::payer(Card::Visa).await,
    ];
    let declining = localstripe::payer(Card::DeclinesOnCharge).await;
    let authenticating = localstripe::payer(Card::RequiresAuthentication).await;
    let mut rng = rand::rng();
    let mut plan = Plan {
        authenticating_customer: authenticating.customer.clone(),
        ..Plan::default()
    };
    for n in 0..orders {
        let id = format!("{run}-{n}");
        let amount = rng.random_range(100..100_000);
        let payer = good.choose(&mut rng).unwrap();
        let body = order_body(&id, amount, payer);
        if rng.random_range(0..100) < authenticating_percent {
            let needs = order_body(&id, amount, &authenticating);
            plan.authenticating.insert(id, needs.clone());
            plan.messages.push(needs);
            continue;
        }
        match rng.random_range(0..100) {
            0..5 => {
                let bad = order_body(&id, amount, &declining);
                plan.declined.insert(id);
                plan.messages.push(bad);
            }
            5..10 => {
                let invalid = json!({"id": id, "amount": amount as f64 + 0.5, "currency": "EUR",
                    "customer": payer.customer, "payment_method": payer.card})
                .to_string();
                plan.invalid.push(invalid.clone());
                plan.messages.push(invalid);
            }
            10..15 => {
                let other = order_body(&id, amount + 1, payer);
                plan.conflicting.insert(id, (body.clone(), other.clone()));
                plan.messages.push(body);
                plan.messages.push(other);
            }
            15..19 => {
                let needs = order_body(&id, amount, &authenticating);
                plan.authenticating.insert(id, needs.clone());
                plan.messages.push(needs);
            }
            19..35 => {
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

/// Succeeded PaymentIntents at localstripe per order id of this run: (amount, id).
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
            .get(format!(
                "{}/v1/payment_intents",
                crate::servers::localstripe_url()
            ))
            .bearer_auth(localstripe::TEST_KEY)
            .query(&query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = page["data"].as_array().unwrap();
        for intent in data {
            let order = intent["metadata"]["order_id"].as_str().unwrap_or_default();
            if order.starts_with(run) && intent["status"] == "succeeded" {
                by_order.entry(order.to_owned()).or_default().push((
                    intent["amount"].as_u64().unwrap(),
                    intent["id"].as_str().unwrap().to_owned(),
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
