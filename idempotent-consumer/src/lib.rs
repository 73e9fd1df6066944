//! # idempotent-consumer
//!
//! An idempotent consumer for AWS Lambda: each fact a message carries takes effect
//! **exactly once in effect**, although SQS, SNS and EventBridge deliver at least once.
//! A fact's key is the business fact, never the transport's message id; a record per
//! key in a DynamoDB table, written only by conditional writes, says whether the fact
//! is done.
//!
//! Every call a consumer makes goes through one [`executor::Executor`], which owns the
//! safeguards, so each holds on every path by construction: the breakers
//! ([`breaker`]), the deadline budget ([`deadline`]), the pace of provider calls
//! ([`pacing`]), spans and metrics.
//!
//! An effect inside the store ([`in_store`]) commits in the same transaction as its
//! record: the pattern's dangerous increment (`saldo = saldo + 10`) happens once, with
//! no provider key at all. A whole consumer of one's own:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
//! use idempotent_consumer::breaker::Breakers;
//! use idempotent_consumer::clock;
//! use idempotent_consumer::deadline::Budget;
//! use idempotent_consumer::executor::Safeguards;
//! use idempotent_consumer::in_store::{Consumer, DynamoLedger, InStoreEffect, Invalid};
//! use serde_json::Value;
//!
//! /// A deposit credited to its account's balance once, however often it is delivered.
//! struct Deposits {
//!     table: String,
//! }
//!
//! struct Deposit {
//!     id: String,
//!     account: String,
//!     amount: u64,
//! }
//!
//! impl InStoreEffect for Deposits {
//!     type Fact = Deposit;
//!     const PREFIX: &'static str = "deposito";
//!
//!     fn parse(&self, body: &str) -> Result<Deposit, Invalid> {
//!         let v: Value = serde_json::from_str(body).map_err(|e| Invalid(e.to_string()))?;
//!         let text = |name: &str| v[name].as_str().map(str::to_owned);
//!         match (text("id"), text("account"), v["amount"].as_u64()) {
//!             (Some(id), Some(account), Some(amount)) => Ok(Deposit { id, account, amount }),
//!             _ => Err(Invalid("a deposit needs id, account and amount".into())),
//!         }
//!     }
//!
//!     fn id<'f>(&self, deposit: &'f Deposit) -> &'f str {
//!         &deposit.id
//!     }
//!
//!     fn fields(&self, deposit: &Deposit) -> Vec<String> {
//!         vec![deposit.account.clone(), deposit.amount.to_string()]
//!     }
//!
//!     fn writes(&self, deposit: &Deposit) -> Vec<TransactWriteItem> {
//!         let credit = Update::builder()
//!             .table_name(&self.table)
//!             .key("pk", AttributeValue::S(format!("saldo#{}", deposit.account)))
//!             .update_expression("ADD saldo :amount")
//!             .expression_attribute_values(":amount", AttributeValue::N(deposit.amount.to_string()))
//!             .build()
//!             .expect("key and expression are set");
//!         vec![TransactWriteItem::builder().update(credit).build()]
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let table = std::env::var("IDEMPOTENCY_TABLE")?;
//!     let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//!     let ledger = DynamoLedger::new(aws_sdk_dynamodb::Client::new(&sdk), &table);
//!     let safeguards = Safeguards {
//!         clock: clock::system(),
//!         budget: Budget::new(Duration::from_secs(3), Duration::from_secs(1)),
//!         breakers: Arc::new(Breakers::new(5, Duration::from_secs(30), Duration::from_secs(900))),
//!     };
//!     let retention = Duration::from_secs(90 * 24 * 3600);
//!     Consumer::new(ledger, Deposits { table }, safeguards, retention).serve().await
//! }
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`clock`] | one type for every instant, the clock type, the wall clock |
//! | [`deadline`] | every margin before the invocation deadline, in one budget |
//! | [`breaker`] | a breaker per dependency and execution environment |
//! | [`pacing`] | the pace of provider calls, adapted to the provider's rate limits |
//! | [`jitter`] | the jitter of pauses and retry delays |
//! | [`executor`] | the one executor: every call under the safeguards above |
//! | [`envelope`] | the body inside an SNS or EventBridge envelope |
//! | [`in_store`] | effects inside the store: the record and the effect in one transaction |

// The Lambda runtime's future (`in_store::serve_batches`) is laid out here, deeper than
// the default limit of 128.
#![recursion_limit = "256"]

pub mod breaker;
pub mod clock;
pub mod deadline;
pub mod envelope;
pub mod executor;
pub mod in_store;
pub mod jitter;
pub mod pacing;

/// A boxed source error, kept whole (never stringified).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error and all its sources on one line, `outer: inner: root`, for log fields.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some SDK errors repeat their source's text; say each thing once.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
