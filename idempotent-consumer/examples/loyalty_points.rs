//! A whole consumer: ten loyalty points per purchase, credited to the customer's
//! balance exactly once however often the purchase is delivered. The credit is an
//! increment inside the store (`saldo = saldo + 10`), committed in the same transaction
//! as the purchase's record: no provider, no key.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idempotent_consumer::executor::Safeguards;
use idempotent_consumer::in_store::{Consumer, DynamoLedger, InStoreEffect, Invalid};
use idempotent_consumer::sqs::SqsQueue;
use serde_json::Value;

/// Points per purchase.
pub const POINTS: u64 = 10;

/// Ten points per purchase, on the table's `saldo#<customer>` item.
pub struct LoyaltyPoints {
    pub table: String,
}

pub struct Purchase {
    pub id: String,
    pub customer: String,
}

impl InStoreEffect for LoyaltyPoints {
    type Fact = Purchase;
    const PREFIX: &'static str = "puntos";

    fn parse(&self, body: &str) -> Result<Purchase, Invalid> {
        let fact: Value = serde_json::from_str(body).map_err(|e| Invalid(e.to_string()))?;
        let text = |name: &str| fact[name].as_str().map(str::to_owned);
        match (text("id"), text("customer")) {
            (Some(id), Some(customer)) => Ok(Purchase { id, customer }),
            _ => Err(Invalid("a purchase needs its id and customer".to_owned())),
        }
    }

    fn id<'f>(&self, purchase: &'f Purchase) -> &'f str {
        &purchase.id
    }

    fn fields(&self, purchase: &Purchase) -> Vec<String> {
        vec![purchase.customer.clone()]
    }

    fn writes(&self, purchase: &Purchase) -> Vec<TransactWriteItem> {
        let credit = Update::builder()
            .table_name(&self.table)
            .key(
                "pk",
                AttributeValue::S(format!("saldo#{}", purchase.customer)),
            )
            .update_expression("ADD saldo :points")
            .expression_attribute_values(":points", AttributeValue::N(POINTS.to_string()))
            .build();
        // The builder refuses only a missing key or expression, both set above.
        credit.map_or_else(
            |_| Vec::new(),
            |u| vec![TransactWriteItem::builder().update(u).build()],
        )
    }
}

/// The consumer on `client`'s `table`, as the function builds it at cold start.
pub fn consumer(client: aws_sdk_dynamodb::Client, table: &str) -> Consumer<LoyaltyPoints> {
    let points = LoyaltyPoints {
        table: table.to_owned(),
    };
    let retention = Duration::from_secs(90 * 24 * 3600);
    let ledger = DynamoLedger::new(client, table);
    Consumer::new(ledger, points, Safeguards::standard(), retention)
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let table = std::env::var("IDEMPOTENCY_TABLE")?;
    let dead_letters = std::env::var("DEAD_LETTER_QUEUE_URL")?;
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = SqsQueue::new(sqs, dead_letters, "loyalty-points");
    consumer(aws_sdk_dynamodb::Client::new(&sdk), &table)
        .with_dead_letters(Arc::new(queue))
        .serve()
        .await
}
