//! Effects inside the store: the pattern's most dangerous case, an increment
//! (`saldo = saldo + 10`), made exactly once with no provider and no key. The effect's
//! writes commit in the same DynamoDB transaction (`TransactWriteItems`) as the record
//! that marks its fact done, conditional on that record not existing: the transaction
//! commits whole or not at all, so a duplicate delivery, a parallel one or a redelivery
//! after a crash finds the record and adds nothing.
//!
//! [`InStoreEffect`] is what an application writes: how a message becomes a fact, the
//! fact's key and fingerprint, and the writes it adds. [`Consumer`] is the rest: the
//! SQS batch (raw bodies, SNS and EventBridge envelopes, FIFO groups, the partial batch
//! response, dead letters with their note) with every store and queue call through
//! the one executor ([`crate::executor`]).

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use sha2::{Digest as _, Sha256};
use tracing::info_span;

use crate::clock::Time;
use crate::consumer::{self, Verdict, Verdicts};
use crate::executor::{Executor, NoAnswer, Safeguards, StoreOnly};
use crate::queue::Queue;
use crate::{BoxError, envelope, error_chain};

/// The record's storage names: the pattern card's, as every record of the table keeps
/// them (`pk`, `estado`, `huella`, `creado`, `expira`).
pub mod attr {
    /// The partition key: `<kind>#<id>`.
    pub const PK: &str = "pk";
    /// The record's state (`hecho` once its fact is done).
    pub const STATE: &str = "estado";
    /// The fingerprint of the fact's fields.
    pub const FINGERPRINT: &str = "huella";
    /// ms epoch when the record was first written.
    pub const CREATED: &str = "creado";
    /// s epoch: the TTL attribute (retention only).
    pub const EXPIRES: &str = "expira";
    /// `estado` of a record whose fact is done.
    pub const DONE: &str = "hecho";
}

/// The most writes an effect adds to one transaction: DynamoDB takes 100 items, the
/// record is one.
pub const MOST_WRITES: usize = 99;

/// A message that is not a fact this effect reads: it fails alone, with its reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// An effect made inside the store, once per fact.
pub trait InStoreEffect: Send + Sync {
    /// What one message says happened.
    type Fact: Send + Sync;
    /// The key's prefix: one per kind of fact, so that facts of two kinds never share
    /// a key (`<kind>#<id>`).
    const PREFIX: &'static str;
    /// Reads a fact from a message body (the envelope already taken off).
    fn parse(&self, body: &str) -> Result<Self::Fact, Invalid>;
    /// The fact's id: the business fact, never the transport's message id (a
    /// producer's retry or a fan-out gives the same fact a new message id).
    fn id<'f>(&self, fact: &'f Self::Fact) -> &'f str;
    /// The fields that make the fact what it is: a second message with the same id
    /// and other fields is refused, never taken as the first one's duplicate.
    fn fields(&self, fact: &Self::Fact) -> Vec<String>;
    /// The writes the effect adds to the record's transaction (at most 99: DynamoDB's
    /// limit is 100 items a transaction, the record included).
    fn writes(&self, fact: &Self::Fact) -> Vec<TransactWriteItem>;
}

/// What the store answered to a fact. Only [`Applied::Done`] wrote anything: the
/// transaction commits whole or not at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The record and the effect's writes committed together: the effect is made.
    Done,
    /// The fact was already done (a duplicate): nothing was written.
    Duplicate,
    /// The key is done with other fields: a different fact under a reused id.
    Mismatch,
    /// One of the effect's own conditions refused it (write `index`, counted from the
    /// effect's first): it will be refused again until someone looks.
    Refused {
        /// The refused write's place among the effect's writes, from 0.
        index: usize,
    },
}

/// Why a fact was not applied. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The store failed, conflicted with another transaction, or could not be
    /// reached: whether it committed is read on the next delivery.
    #[error("the store failed on {key}")]
    Store {
        /// The fact's key.
        key: String,
        /// The store's error, kept whole.
        #[source]
        source: BoxError,
    },
    /// The id cannot be a key (empty, or holding `#`).
    #[error("invalid fact: {0}")]
    Invalid(#[from] Invalid),
    /// The effect asked for more writes than one transaction holds.
    #[error("the effect asks for {0} writes; a transaction holds 99 besides the record")]
    TooManyWrites(usize),
}

/// The table the records and the effect's items live in.
#[derive(Clone, Debug)]
pub struct DynamoLedger {
    client: Client,
    table: String,
}

impl DynamoLedger {
    /// The table `table`, reached through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Commits the record of `key` (done, with `fingerprint`) and `writes` in one
    /// transaction, unless the record exists.
    pub async fn apply(
        &self,
        key: &str,
        fingerprint: &str,
        now: Time,
        expires: Time,
        writes: Vec<TransactWriteItem>,
    ) -> Result<Applied, ApplyError> {
        if writes.len() > MOST_WRITES {
            return Err(ApplyError::TooManyWrites(writes.len()));
        }
        let store = |source: BoxError| ApplyError::Store {
            key: key.to_owned(),
            source,
        };
        let record = Put::builder()
            .table_name(&self.table)
            .item(attr::PK, AttributeValue::S(key.to_owned()))
            .item(attr::STATE, AttributeValue::S(attr::DONE.to_owned()))
            .item(attr::FINGERPRINT, AttributeValue::S(fingerprint.to_owned()))
            .item(attr::CREATED, AttributeValue::N(now.as_ms().to_string()))
            .item(
                attr::EXPIRES,
                AttributeValue::N(expires.as_secs().to_string()),
            )
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", attr::PK)
            .build()
            .map_err(|e| store(Box::new(e)))?;
        let items = std::iter::once(TransactWriteItem::builder().put(record).build())
            .chain(writes)
            .collect();
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        let error = match sent {
            Ok(_) => return Ok(Applied::Done),
            Err(e) => e,
        };
        // Which condition refused it: the record's (the fact is done, or a different
        // fact took the id) or one of the effect's own.
        let refused = match &error {
            SdkError::ServiceError(service) => match service.err() {
                TransactWriteItemsError::TransactionCanceledException(cancelled) => cancelled
                    .cancellation_reasons()
                    .iter()
                    .position(|reason| reason.code() == Some("ConditionalCheckFailed")),
                _ => None,
            },
            _ => None,
        };
        match refused {
            Some(0) => self.already_done(key, fingerprint).await,
            Some(index) => Ok(Applied::Refused { index: index - 1 }),
            None => Err(store(Box::new(error))),
        }
    }

    /// The record that refused the transaction: the same fact (a duplicate) or another.
    async fn already_done(&self, key: &str, fingerprint: &str) -> Result<Applied, ApplyError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::PK, AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| ApplyError::Store {
                key: key.to_owned(),
                source: Box::new(e),
            })?;
        let stored = read
            .item()
            .and_then(|item| item.get(attr::FINGERPRINT))
            .and_then(|v| v.as_s().ok());
        match stored {
            Some(stored) if stored == fingerprint => Ok(Applied::Duplicate),
            _ => Ok(Applied::Mismatch),
        }
    }
}

/// The key of a fact: `<kind>#<id>`, refused when the id is empty or holds `#`.
pub fn key_of(prefix: &str, id: &str) -> Result<String, Invalid> {
    if id.is_empty() || id.contains('#') {
        return Err(Invalid(format!(
            "the id {id:?} cannot be a key: it must be non-empty and hold no '#'"
        )));
    }
    Ok(format!("{prefix}#{id}"))
}

/// The fingerprint of a fact's fields: SHA-256 of the fields, each length-prefixed so
/// that no two lists of fields read alike.
pub fn fingerprint_of(fields: &[String]) -> String {
    let mut hash = Sha256::new();
    for field in fields {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field.as_bytes());
    }
    hash.finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A Lambda consumer of an in-store effect: built once at cold start, shared by every
/// invocation.
pub struct Consumer<E> {
    ledger: DynamoLedger,
    effect: E,
    safeguards: Safeguards,
    /// Where a record no retry can fix goes at once, with its note; without it such a
    /// record fails until the queue's redrive policy moves it (without a note).
    dead_letters: Option<Arc<dyn Queue>>,
    /// `expira` = now + this: how long a done record keeps its fact from being done
    /// again (longer than any redelivery: the queue's retention, a replay).
    retention: Duration,
}

impl<E: InStoreEffect> Consumer<E> {
    /// A consumer of `effect` on `ledger`, under `safeguards`, whose done records are
    /// kept `retention` long; no dead-letter queue until [`Self::with_dead_letters`].
    pub fn new(
        ledger: DynamoLedger,
        effect: E,
        safeguards: Safeguards,
        retention: Duration,
    ) -> Self {
        Self {
            ledger,
            effect,
            safeguards,
            dead_letters: None,
            retention,
        }
    }

    /// The consumer that sends a record no retry can fix (an invalid body, a reused
    /// id, a write its own condition refuses) to the dead-letter queue at once, with a
    /// note saying why, and acknowledges it once the send succeeded. In Lambda:
    /// `SqsQueue::new(client, dead_letter_queue_url, "<the consumer's name>")`.
    pub fn with_dead_letters(self, queue: Arc<dyn Queue>) -> Self {
        Self {
            dead_letters: Some(queue),
            ..self
        }
    }

    /// The Lambda handler: each record applied in message order; a failed one, and in
    /// a FIFO queue every later one of its message group, is listed in the partial
    /// batch response and comes back (the queue's redrive policy dead-letters it after
    /// its receive count).
    pub async fn handle(
        &self,
        event: lambda_runtime::LambdaEvent<SqsEvent>,
    ) -> Result<SqsBatchResponse, std::convert::Infallible> {
        let deadline = consumer::deadline_of(&event.context, &self.safeguards);
        Ok(self.run(&event.payload, deadline).await)
    }

    /// Serves Lambda's invocations until the runtime stops: the consumer's whole
    /// life in a Lambda function.
    pub async fn serve(self) -> Result<(), lambda_runtime::Error>
    where
        E: 'static,
    {
        consumer::serve_batches(Arc::new(self)).await
    }

    /// Runs a batch whose invocation ends at `deadline`.
    pub async fn run(&self, event: &SqsEvent, deadline: Time) -> SqsBatchResponse {
        consumer::run(self, event, deadline).await
    }

    /// How one record ends, before the queue is told.
    async fn verdict(&self, message: &SqsMessage, deadline: Time) -> Verdict {
        let fact = match envelope::body(message.body.as_deref().unwrap_or_default())
            .and_then(|body| self.effect.parse(&body))
        {
            Ok(fact) => fact,
            Err(invalid) => return Verdict::dead("invalid", invalid.0),
        };
        match self.apply(&fact, deadline).await {
            Ok(Applied::Done) => Verdict::Acked("done"),
            Ok(Applied::Duplicate) => Verdict::Acked("duplicate"),
            Ok(Applied::Mismatch) => Verdict::dead(
                "mismatch",
                "its id is done with other fields (a different fact under a reused id)".to_owned(),
            ),
            Ok(Applied::Refused { index }) => Verdict::dead(
                "refused",
                format!("the effect's write {index} refused its condition; nothing was written"),
            ),
            Err(e @ (ApplyError::Invalid(_) | ApplyError::TooManyWrites(_))) => {
                Verdict::dead("invalid", error_chain(&e))
            }
            Err(e) => Verdict::Retry(error_chain(&e)),
        }
    }

    /// Applies `fact` once, through the executor: under the store's breaker and the
    /// deadline budget.
    pub async fn apply(&self, fact: &E::Fact, deadline: Time) -> Result<Applied, ApplyError> {
        let key = key_of(E::PREFIX, self.effect.id(fact))?;
        let fingerprint = fingerprint_of(&self.effect.fields(fact));
        let executor = Executor::new(self.safeguards.clone(), &StoreOnly, deadline);
        let now = executor.now();
        let expires = now + self.retention;
        let writes = self.effect.writes(fact);
        // Checked before the executor: a fact that asks too much says nothing of the
        // store, so it must not count toward its breaker.
        if writes.len() > MOST_WRITES {
            return Err(ApplyError::TooManyWrites(writes.len()));
        }
        let span = info_span!("store", operation = "apply");
        let call = self.ledger.apply(&key, &fingerprint, now, expires, writes);
        let answer = executor
            .admitted(executor.store(&span, call))
            .await
            .map_err(|closed| ApplyError::Store {
                key: key.clone(),
                source: format!("the {:?} breaker is open", closed.dependency).into(),
            })?;
        match answer {
            Ok(applied) => Ok(applied),
            Err(NoAnswer::Failed(e)) => Err(e),
            Err(NoAnswer::NoTime) => Err(ApplyError::Store {
                key,
                source: "not started: too little time left before the deadline".into(),
            }),
            Err(NoAnswer::TimedOut) => Err(ApplyError::Store {
                key,
                source: "timed out: whether it committed is read on the next delivery".into(),
            }),
        }
    }
}

impl<E: InStoreEffect> Verdicts for Consumer<E> {
    fn safeguards(&self) -> &Safeguards {
        &self.safeguards
    }

    fn dead_letters(&self) -> Option<&Arc<dyn Queue>> {
        self.dead_letters.as_ref()
    }

    fn verdict<'a>(
        &'a self,
        message: &'a SqsMessage,
        deadline: Time,
    ) -> consumer::VerdictFuture<'a> {
        Box::pin(Consumer::verdict(self, message, deadline))
    }
}

#[cfg(test)]
mod tests;
