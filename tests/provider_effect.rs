//! The library's effect at a provider (`idempotent_consumer::effect`), on moto: a
//! transfer written to a ledger table that keeps each idempotency key (a second request
//! under a key answers with the first one's transfer) and can be searched by fact. Each
//! transfer is made once however its fact is delivered: many times in parallel, again
//! after it is done, and again after the ledger's answer was lost (the same key
//! replayed, then recorded), and through the library's Lambda consumer, copies in one
//! batch beside a body that is no transfer. The machine, the record, the executor and
//! the consumer are the library's; only the ledger is this test's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use harness::servers::{Backend, Table};
use idempotent_consumer::clock::{self, Time};
use idempotent_consumer::effect::{self, Consumer, Effect, Policy, Traced};
use idempotent_consumer::executor::{Executor, Safeguards, Throttle};
use idempotent_consumer::in_store::Invalid;
use idempotent_consumer::machine::{Cancel, Class, Classify, End, Found, Receipt};
use idempotent_consumer::record::{Fingerprint, Identity, Key, State};
use idempotent_consumer::store::IdempotencyStore;

/// A transfer of `amount` for fact `id`.
struct Transfer {
    id: String,
    amount: u64,
}

impl Transfer {
    fn identity(&self) -> Identity {
        Identity {
            key: Key::new("transfer#", &self.id),
            fingerprint: Fingerprint::new(format!("{}:{}", self.id, self.amount)),
        }
    }
}

/// Why the ledger gave no answer the machine can use.
#[derive(Debug, thiserror::Error)]
enum LedgerError {
    /// The request may or may not have been applied.
    #[error("the ledger's answer was lost")]
    Lost,
    #[error("the ledger failed: {0}")]
    Failed(String),
}

impl Classify for LedgerError {
    fn class(&self) -> Class {
        Class::Unknown
    }
}

impl idempotent_consumer::executor::ProviderFailure for LedgerError {
    fn is_down(&self) -> bool {
        true
    }
    fn throttle(&self) -> Option<Throttle> {
        None
    }
    fn advised_not_to_retry(&self) -> bool {
        false
    }
    fn refuses_the_key(&self) -> bool {
        false
    }
    fn not_sent() -> Self {
        Self::Failed("not sent".to_owned())
    }
}

/// The ledger: one item per idempotency key, holding its transfer.
struct Ledger {
    table: Table,
    /// Answers still to lose, after the write was applied.
    lose: AtomicUsize,
    /// Whether a lost answer is sent again at once, under its key.
    replay: AtomicBool,
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

impl Ledger {
    fn receipt(item: &HashMap<String, AttributeValue>) -> Receipt {
        Receipt {
            id: item["transfer"].as_s().unwrap().clone(),
            detail: None,
        }
    }

    /// Every transfer the ledger made for `fact`.
    async fn transfers(&self, fact: &str) -> Vec<String> {
        let items = self
            .table
            .client
            .scan()
            .table_name(&self.table.name)
            .filter_expression("fact = :fact")
            .expression_attribute_values(":fact", s(fact))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        items
            .items()
            .iter()
            .map(|i| i["transfer"].as_s().unwrap().clone())
            .collect()
    }
}

#[async_trait]
impl Effect for Ledger {
    type Fact = Transfer;
    type Failure = LedgerError;

    fn parse(&self, body: &str) -> Result<Transfer, Invalid> {
        let fact: serde_json::Value =
            serde_json::from_str(body).map_err(|e| Invalid(e.to_string()))?;
        match (fact["id"].as_str(), fact["amount"].as_u64()) {
            (Some(id), Some(amount)) if !id.is_empty() && !id.contains('#') => Ok(Transfer {
                id: id.to_owned(),
                amount,
            }),
            _ => Err(Invalid("a transfer needs its id and amount".to_owned())),
        }
    }

    fn identity(&self, fact: &Transfer) -> Identity {
        fact.identity()
    }

    async fn perform(&self, fact: &Transfer, key: &str) -> Result<Receipt, LedgerError> {
        let transfer = format!("tr_{}", uuid::Uuid::new_v4().simple());
        let put = self
            .table
            .client
            .put_item()
            .table_name(&self.table.name)
            .item("pk", s(key))
            .item("fact", s(&fact.id))
            .item("amount", AttributeValue::N(fact.amount.to_string()))
            .item("transfer", s(&transfer))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        let receipt = match put {
            Ok(_) => Receipt {
                id: transfer,
                detail: None,
            },
            // The key was used: its first answer again.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                let got = self
                    .table
                    .client
                    .get_item()
                    .table_name(&self.table.name)
                    .key("pk", s(key))
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| LedgerError::Failed(e.to_string()))?;
                Self::receipt(got.item().ok_or(LedgerError::Lost)?)
            }
            Err(e) => return Err(LedgerError::Failed(e.to_string())),
        };
        let lose = self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            Err(LedgerError::Lost)
        } else {
            Ok(receipt)
        }
    }

    async fn look_up(&self, fact: &Transfer, _since: Time) -> Result<Found, LedgerError> {
        let found = self.transfers(&fact.id).await;
        Ok(match found.first() {
            Some(id) => Found::Done(Receipt {
                id: id.clone(),
                detail: None,
            }),
            None => Found::Nothing,
        })
    }

    async fn cancel(&self, _reference: &str) -> Result<Cancel, LedgerError> {
        Ok(Cancel::NotCancellable)
    }

    fn replay_now(&self, failure: &LedgerError) -> bool {
        self.replay.load(Ordering::SeqCst) && matches!(failure, LedgerError::Lost)
    }
}

struct Rig {
    records: Table,
    ledger: Ledger,
    safeguards: Safeguards,
    observe: Traced<LedgerError>,
}

async fn rig() -> Rig {
    Rig {
        records: Backend::Moto.fresh_table().await,
        ledger: Ledger {
            table: Backend::Moto.fresh_table().await,
            lose: AtomicUsize::new(0),
            replay: AtomicBool::new(false),
        },
        safeguards: Safeguards::standard(),
        observe: Traced::default(),
    }
}

impl Rig {
    async fn apply(
        &self,
        fact: &Transfer,
    ) -> End<idempotent_consumer::machine::Shared<LedgerError>> {
        let deadline = Time::from_ms(clock::wall_ms()) + Duration::from_secs(60);
        let executor = Executor::new(self.safeguards.clone(), &self.observe, deadline);
        effect::apply(
            &self.ledger,
            self.records.store.as_ref(),
            &executor,
            &Policy::standard(),
            fact,
            &fact.identity(),
        )
        .await
        .expect("the breakers are closed")
    }
}

impl Rig {
    /// `fact`'s record, which must exist.
    async fn record(&self, fact: &Transfer) -> idempotent_consumer::record::Record {
        let key = fact.identity().key;
        self.records.store.get(&key).await.unwrap().unwrap()
    }
}

fn transfer(id: &str) -> Transfer {
    Transfer {
        id: id.to_owned(),
        amount: 500,
    }
}

#[tokio::test]
async fn a_transfer_delivered_many_times_at_once_and_again_after_is_made_once() {
    let rig = rig().await;
    let fact = transfer("t-1");
    let ends = futures::future::join_all((0..8).map(|_| rig.apply(&fact))).await;
    let done = ends
        .iter()
        .filter(|e| matches!(e, End::Done { found: false, .. }))
        .count();
    assert_eq!(done, 1, "one delivery makes it: {ends:?}");
    // The others found it leased or done: none made a transfer.
    assert!(
        ends.iter().all(|e| matches!(
            e,
            End::Done { .. } | End::InProgress { .. } | End::Duplicate { .. }
        )),
        "{ends:?}"
    );
    let again = rig.apply(&fact).await;
    assert!(matches!(again, End::Duplicate { .. }), "{again:?}");
    assert_eq!(rig.ledger.transfers("t-1").await.len(), 1);
    let record = rig.record(&fact).await;
    assert_eq!(record.state, State::Done);
    assert_eq!(
        record.receipt,
        rig.ledger.transfers("t-1").await.first().cloned()
    );
}

#[tokio::test]
async fn a_lost_answer_keeps_the_key_and_the_next_delivery_records_the_one_transfer() {
    let rig = rig().await;
    rig.ledger.lose.store(1, Ordering::SeqCst);
    let fact = transfer("t-2");
    let first = rig.apply(&fact).await;
    assert!(
        matches!(
            first,
            End::Retry {
                attempt: Some(1),
                ..
            }
        ),
        "{first:?}"
    );
    let record = rig.record(&fact).await;
    assert_eq!(
        (record.state, record.attempt),
        (State::Free, Some(1)),
        "the key kept"
    );

    let second = rig.apply(&fact).await;
    assert!(matches!(second, End::Done { attempt: 1, .. }), "{second:?}");
    let transfers = rig.ledger.transfers("t-2").await;
    assert_eq!(transfers.len(), 1, "replayed under its key: {transfers:?}");
    let End::Done { receipt, .. } = second else {
        unreachable!()
    };
    assert_eq!(
        receipt.id, transfers[0],
        "recorded with the first request's transfer"
    );
}

#[tokio::test]
async fn a_lost_answer_the_effect_replays_at_once_is_done_in_the_same_delivery_with_one_transfer() {
    let rig = rig().await;
    rig.ledger.lose.store(1, Ordering::SeqCst);
    rig.ledger.replay.store(true, Ordering::SeqCst);
    let fact = transfer("t-3");
    let end = rig.apply(&fact).await;
    let End::Done {
        receipt,
        attempt: 1,
        found: false,
    } = end
    else {
        panic!("replayed under its key and done: {end:?}");
    };
    let transfers = rig.ledger.transfers("t-3").await;
    assert_eq!(
        transfers,
        vec![receipt.id],
        "one transfer, the first request's"
    );
    assert_eq!(
        rig.ledger.lose.load(Ordering::SeqCst),
        0,
        "its answer was lost"
    );
    assert_eq!(rig.record(&fact).await.state, State::Done);
}

#[tokio::test]
async fn the_consumer_makes_each_transfer_of_a_batch_once_and_fails_a_body_that_is_none() {
    let rig = rig().await;
    let view = Ledger {
        table: Table {
            client: rig.ledger.table.client.clone(),
            name: rig.ledger.table.name.clone(),
            store: rig.ledger.table.store.clone(),
        },
        lose: AtomicUsize::new(0),
        replay: AtomicBool::new(false),
    };
    let consumer = Consumer::new(
        rig.records.dyn_store(),
        rig.ledger,
        Safeguards::standard(),
        Policy::standard(),
    );
    let t3 = r#"{"id":"t-3","amount":500}"#;
    let t4 = r#"{"id":"t-4","amount":700}"#;
    let sns =
        serde_json::json!({"Type": "Notification", "MessageId": "n-1", "Message": t3}).to_string();
    let batch = harness::rig::batch_of(&[t3, t4, &sns, "not a transfer", t3]);
    let deadline = Time::from_ms(clock::wall_ms()) + Duration::from_secs(60);
    let response = consumer.run(&batch, deadline).await;
    let failed: Vec<&str> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(
        failed,
        [batch.records[3].message_id.as_deref().unwrap()],
        "only the body that is no transfer comes back (no dead-letter queue here)"
    );
    assert_eq!(
        view.transfers("t-3").await.len(),
        1,
        "three copies, one transfer"
    );
    assert_eq!(view.transfers("t-4").await.len(), 1);
}
