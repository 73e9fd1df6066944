//! The idempotency table in DynamoDB (the store contract's production adapter). Each
//! contract operation is one conditional `UpdateItem`; a lost condition returns the old
//! item in the same round trip (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), or, on backends that
//! ignore that flag, through one strongly consistent `GetItem`.
//!
//! Every attribute name goes through `ExpressionAttributeNames`: several of them are
//! DynamoDB reserved words, and aliasing all of them leaves no trap for the next one.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::clock::Time;
use crate::record::{Key, Record};
use crate::schema::{self, Problem, Value, attr};
use crate::store::{
    AwaitingCursor, IdempotencyStore, ReleaseKind, Settled, StoreError, Write, WriteOutcome,
};

type Item = HashMap<String, AttributeValue>;

/// The table's attribute names ([`crate::schema::attr`]), aliased as `#<alias>` in every
/// expression (several are DynamoDB reserved words; aliasing all avoids the trap).
const NAMES: &[(&str, &str)] = &[
    ("#pk", attr::PK),
    ("#state", attr::STATE),
    ("#created", attr::CREATED),
    ("#expires", attr::EXPIRES),
    ("#receipt", attr::RECEIPT),
    ("#fingerprint", attr::FINGERPRINT),
    ("#owner", attr::OWNER),
    ("#lease_until", attr::LEASE_UNTIL),
    ("#attempt", attr::ATTEMPT),
    ("#sent", attr::SENT),
    ("#refusals", attr::REFUSALS),
    ("#awaited", attr::AWAITED),
    ("#wait_until", attr::WAIT_UNTIL),
    ("#done_fingerprint", attr::DONE_FINGERPRINT),
];

const RESERVE_UPDATE: &str = "SET #state = :in_progress, #owner = :owner, #lease_until = :lease_until, \
     #fingerprint = :fingerprint, #expires = :expires, #created = if_not_exists(#created, :now_ms), \
     #attempt = if_not_exists(#attempt, :one), #sent = if_not_exists(#sent, :now_ms)";
/// Absent; or a non-`hecho` item of ours past `expira` (counts as absent; items of the
/// legacy consumer have no `huella` and are never taken over); or the same payload
/// (its fingerprint), below the refusal limit, `libre` or with an expired lease.
/// `hecho` is never matched: it is final; nor `incierto`: final too, as what it did is
/// not known; nor `espera`: what it awaits may still happen. `fallido` is reserved as `libre` is (its wait ended, its key moved on),
/// whatever the fingerprint: the producer may send the fact again with other fields.
const RESERVE_CONDITION: &str = "attribute_not_exists(#pk) \
     OR (#state <> :done AND #state <> :awaiting AND #state <> :uncertain AND #expires < :now_s \
         AND attribute_exists(#fingerprint)) \
     OR ((#fingerprint = :fingerprint OR #state = :failed) \
         AND (attribute_not_exists(#refusals) OR #refusals < :max_refusals) \
         AND (#state = :free OR #state = :failed \
              OR (#state = :in_progress AND #lease_until < :now_ms)))";
const FENCE: &str = "#state = :in_progress AND #owner = :owner";
/// A done record keeps only what a done fact is read for ([`crate::table::apply`]).
const COMPLETE_UPDATE: &str = "SET #state = :done, #receipt = :receipt, #expires = :expires \
     REMOVE #owner, #lease_until, #attempt, #sent, #refusals, #awaited, #wait_until";
const COMPLETE_ATTEMPT_CONDITION: &str = "#attempt = :attempt AND #state <> :done";
const RELEASE_UPDATE: &str = "SET #state = :free REMOVE #owner, #lease_until";
const RELEASE_REFUSED_UPDATE: &str = "SET #state = :free, #attempt = #attempt + :one, \
     #refusals = if_not_exists(#refusals, :zero) + :one REMOVE #owner, #lease_until, #sent";
/// An at-most-once effect whose outcome is unknown: `incierto`, never reserved again.
const RELEASE_UNCERTAIN_UPDATE: &str = "SET #state = :uncertain REMOVE #owner, #lease_until";
const RELEASE_NEXT_UPDATE: &str =
    "SET #state = :free, #attempt = #attempt + :one REMOVE #owner, #lease_until, #sent";
const RELEASE_NEXT_RESET_UPDATE: &str = "SET #state = :free, #attempt = #attempt + :one \
     REMOVE #owner, #lease_until, #sent, #refusals";
const RESOLVE_UPDATE: &str = "SET #state = :in_progress, #owner = :owner, #lease_until = :lease_until, \
     #fingerprint = if_not_exists(#fingerprint, :fingerprint), #attempt = if_not_exists(#attempt, :one), \
     #sent = if_not_exists(#sent, :now_ms), #created = if_not_exists(#created, :now_ms)";
const RESOLVE_CONDITION: &str = "attribute_exists(#pk) AND #state <> :done AND #state <> :awaiting \
     AND (#state <> :in_progress OR attribute_not_exists(#lease_until) OR #lease_until < :now_ms) \
     AND (attribute_not_exists(#fingerprint) OR #fingerprint = :fingerprint)";
const NEXT_ATTEMPT_UPDATE: &str = "SET #attempt = #attempt + :one, #sent = :now_ms";
/// Writing `espera_hasta` puts the record in the awaiting index; settling removes it.
const AWAIT_UPDATE: &str = "SET #state = :awaiting, #awaited = :awaited, \
     #wait_until = :wait_until, #expires = :expires REMOVE #owner, #lease_until";
const SETTLE_ENDING_UPDATE: &str = "SET #wait_until = :at";
/// A corrected payload takes a record that ended without its effect ([`crate::table`]).
const CORRECT_UPDATE: &str = "SET #fingerprint = :fingerprint, \
     #attempt = if_not_exists(#attempt, :zero) + :one REMOVE #sent, #refusals";
const CORRECT_CONDITION: &str = "(#state = :free OR #state = :failed) \
     AND attribute_not_exists(#sent) AND attribute_exists(#fingerprint) \
     AND #fingerprint <> :fingerprint";
/// An effect that happened, which the record does not await: the same done record as
/// a complete.
const ADOPT_CONDITION: &str = "(#state = :free OR #state = :failed \
     OR (#state = :in_progress AND #lease_until < :now_ms)) AND #fingerprint = :fingerprint";
const SETTLE_CONDITION: &str = "#state = :awaiting AND #awaited = :awaited";
const SETTLE_DONE_UPDATE: &str = "SET #state = :done, #receipt = :awaited, #expires = :expires \
     REMOVE #awaited, #wait_until, #attempt, #sent, #refusals";
const SETTLE_DONE_OTHER_UPDATE: &str = "SET #state = :done, #receipt = :awaited, \
     #expires = :expires, #done_fingerprint = :done_fingerprint \
     REMOVE #awaited, #wait_until, #attempt, #sent, #refusals";
const SETTLE_ENDED_UPDATE: &str = "SET #state = :failed, #attempt = #attempt + :one \
     REMOVE #awaited, #wait_until, #sent";
/// The awaiting index's key condition: the records whose wait ends before `:until`.
const AWAITING_KEY: &str = "#state = :awaiting AND #wait_until < :until";

/// The values every expression may use: the states and the numbers 0 and 1.
const CONSTANTS: &[(&str, Constant)] = &[
    (":in_progress", Constant::S(schema::state::IN_PROGRESS)),
    (":done", Constant::S(schema::state::DONE)),
    (":free", Constant::S(schema::state::FREE)),
    (":awaiting", Constant::S(schema::state::AWAITING)),
    (":failed", Constant::S(schema::state::FAILED)),
    (":uncertain", Constant::S(schema::state::UNCERTAIN)),
    (":one", Constant::N(1)),
    (":zero", Constant::N(0)),
];

/// A constant of the expressions, made into an `AttributeValue` only where a write
/// mentions it (each is an allocation, on every write).
enum Constant {
    S(&'static str),
    N(i64),
}

impl Constant {
    fn value(&self) -> AttributeValue {
        match self {
            Self::S(value) => s(value),
            Self::N(value) => n(*value),
        }
    }
}

/// The idempotency table in DynamoDB (or a compatible server).
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

impl DynamoStore {
    /// The idempotency table `table`, reached through `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    /// An `UpdateItem` on `pk` with the names its expressions use, returning the new
    /// item on success and the old one on a failed condition.
    fn update(&self, pk: &Key, update: &str, condition: &str) -> UpdateItemFluentBuilder {
        let mut builder = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::PK, s(pk.as_str()))
            .update_expression(update)
            .condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        // DynamoDB rejects unused names and values, so alias only the names, and bind
        // only the constants, that the expressions mention.
        // One pass over both expressions (this runs on every write).
        let mentioned: Vec<&str> = placeholders(update)
            .chain(placeholders(condition))
            .collect();
        let used = |placeholder: &str| mentioned.contains(&placeholder);
        for (alias, name) in NAMES {
            if used(alias) {
                builder = builder.expression_attribute_names(*alias, *name);
            }
        }
        for (placeholder, constant) in CONSTANTS {
            if used(placeholder) {
                builder = builder.expression_attribute_values(*placeholder, constant.value());
            }
        }
        builder
    }

    async fn send(
        &self,
        operation: &'static str,
        pk: &Key,
        builder: UpdateItemFluentBuilder,
    ) -> Result<WriteOutcome, StoreError> {
        match builder.send().await {
            Ok(output) => match output.attributes() {
                Some(item) => Ok(WriteOutcome::Applied(record_from_item(item)?)),
                // Only a non-conforming backend answers a success without ALL_NEW.
                None => Ok(WriteOutcome::Applied(self.required(pk).await?)),
            },
            Err(err) if is_condition_failure(&err) => {
                let old = match condition_failure_item(&err) {
                    Some(item) => Some(record_from_item(item)?),
                    None => self.get(pk).await?,
                };
                Ok(WriteOutcome::Refused(old))
            }
            Err(err) => Err(StoreError::backend(operation, pk.as_str(), err)),
        }
    }

    async fn required(&self, pk: &Key) -> Result<Record, StoreError> {
        self.get(pk).await?.ok_or_else(|| StoreError::Malformed {
            pk: pk.to_string(),
            attribute: "pk",
            problem: "vanished right after a successful write",
        })
    }
}

impl DynamoStore {
    /// The `UpdateItem` of one write: its expressions and values.
    fn request(&self, write: &Write<'_>) -> UpdateItemFluentBuilder {
        match write {
            Write::Reserve(req) => self
                .update(req.pk, RESERVE_UPDATE, RESERVE_CONDITION)
                .expression_attribute_values(":owner", s(req.owner))
                .expression_attribute_values(":fingerprint", s(req.fingerprint))
                .expression_attribute_values(":lease_until", n(req.lease_until.as_ms()))
                .expression_attribute_values(":expires", n(req.expires.as_secs()))
                .expression_attribute_values(":now_ms", n(req.now.as_ms()))
                .expression_attribute_values(":now_s", n(req.now.as_secs()))
                .expression_attribute_values(":max_refusals", n(i64::from(req.max_refusals))),
            Write::Complete(req) => self
                .update(req.pk, COMPLETE_UPDATE, FENCE)
                .expression_attribute_values(":owner", s(req.owner))
                .expression_attribute_values(":receipt", s(req.receipt))
                .expression_attribute_values(":expires", n(req.expires.as_secs())),
            Write::CompleteAttempt(req) => self
                .update(req.pk, COMPLETE_UPDATE, COMPLETE_ATTEMPT_CONDITION)
                .expression_attribute_values(":attempt", n(i64::from(req.attempt)))
                .expression_attribute_values(":receipt", s(req.receipt))
                .expression_attribute_values(":expires", n(req.expires.as_secs())),
            Write::Release(req) => self
                .update(req.pk, release_update(req.kind), FENCE)
                .expression_attribute_values(":owner", s(req.owner)),
            Write::NextAttempt { pk, owner, now } => self
                .update(pk, NEXT_ATTEMPT_UPDATE, FENCE)
                .expression_attribute_values(":owner", s(owner))
                .expression_attribute_values(":now_ms", n(now.as_ms())),
            Write::LeaseForResolve(req) => self
                .update(req.pk, RESOLVE_UPDATE, RESOLVE_CONDITION)
                .expression_attribute_values(":owner", s(req.owner))
                .expression_attribute_values(":lease_until", n(req.lease_until.as_ms()))
                .expression_attribute_values(":fingerprint", s(req.fingerprint))
                .expression_attribute_values(":now_ms", n(req.now.as_ms())),
            Write::Await(req) => self
                .update(req.pk, AWAIT_UPDATE, FENCE)
                .expression_attribute_values(":owner", s(req.owner))
                .expression_attribute_values(":awaited", s(req.awaited))
                .expression_attribute_values(":wait_until", n(req.wait_until.as_secs()))
                .expression_attribute_values(":expires", n(req.expires.as_secs())),
            Write::Settle(req) => match &req.settled {
                Settled::Done {
                    expires,
                    done_fingerprint: None,
                } => self
                    .update(req.pk, SETTLE_DONE_UPDATE, SETTLE_CONDITION)
                    .expression_attribute_values(":expires", n(expires.as_secs())),
                Settled::Done {
                    expires,
                    done_fingerprint: Some(done),
                } => self
                    .update(req.pk, SETTLE_DONE_OTHER_UPDATE, SETTLE_CONDITION)
                    .expression_attribute_values(":expires", n(expires.as_secs()))
                    .expression_attribute_values(":done_fingerprint", s(done)),
                Settled::Ended => self.update(req.pk, SETTLE_ENDED_UPDATE, SETTLE_CONDITION),
                Settled::Ending { at } => self
                    .update(req.pk, SETTLE_ENDING_UPDATE, SETTLE_CONDITION)
                    .expression_attribute_values(":at", n(at.as_secs())),
            }
            .expression_attribute_values(":awaited", s(req.awaited)),
            Write::Correct(req) => self
                .update(req.pk, CORRECT_UPDATE, CORRECT_CONDITION)
                .expression_attribute_values(":fingerprint", s(req.fingerprint)),
            Write::Adopt(req) => self
                .update(req.pk, COMPLETE_UPDATE, ADOPT_CONDITION)
                .expression_attribute_values(":receipt", s(req.receipt))
                .expression_attribute_values(":fingerprint", s(req.fingerprint))
                .expression_attribute_values(":now_ms", n(req.now.as_ms()))
                .expression_attribute_values(":expires", n(req.expires.as_secs())),
        }
    }
}

/// The update of a release: what it does to the key and the refusal count.
fn release_update(kind: ReleaseKind) -> &'static str {
    match kind {
        ReleaseKind::KeepKey => RELEASE_UPDATE,
        ReleaseKind::Uncertain => RELEASE_UNCERTAIN_UPDATE,
        ReleaseKind::Refused => RELEASE_REFUSED_UPDATE,
        ReleaseKind::NextKey {
            reset_refusals: false,
        } => RELEASE_NEXT_UPDATE,
        ReleaseKind::NextKey {
            reset_refusals: true,
        } => RELEASE_NEXT_RESET_UPDATE,
    }
}

#[async_trait]
impl IdempotencyStore for DynamoStore {
    async fn write(&self, write: &Write<'_>) -> Result<WriteOutcome, StoreError> {
        self.send(write.operation(), write.pk(), self.request(write))
            .await
    }

    async fn get(&self, pk: &Key) -> Result<Option<Record>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::PK, s(pk.as_str()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::backend("get", pk.as_str(), e))?;
        output.item().map(record_from_item).transpose()
    }

    async fn awaiting(
        &self,
        after: Option<&AwaitingCursor>,
        until: Time,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.query_awaiting(after, until, limit).await
    }

    async fn settle_cursor(&self) -> Result<Option<AwaitingCursor>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(attr::PK, s(schema::SETTLE_CURSOR_PK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::backend("get", schema::SETTLE_CURSOR_PK, e))?;
        let Some(item) = output.item() else {
            return Ok(None);
        };
        let wait_until = item
            .get(schema::cursor::WAIT_UNTIL)
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok());
        let pk = item
            .get(schema::cursor::PK)
            .and_then(|v| v.as_s().ok())
            .and_then(|v| Key::from_stored(v));
        Ok(wait_until.zip(pk).map(|(secs, pk)| AwaitingCursor {
            wait_until: Time::from_secs(secs),
            pk,
        }))
    }

    async fn save_settle_cursor(&self, cursor: Option<&AwaitingCursor>) -> Result<(), StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(attr::PK, s(schema::SETTLE_CURSOR_PK))
            .expression_attribute_names("#wait_until", schema::cursor::WAIT_UNTIL)
            .expression_attribute_names("#pk", schema::cursor::PK);
        let update = match cursor {
            Some(cursor) => update
                .update_expression("SET #wait_until = :wait_until, #pk = :pk")
                .expression_attribute_values(":wait_until", n(cursor.wait_until.as_secs()))
                .expression_attribute_values(":pk", s(cursor.pk.as_str())),
            None => update.update_expression("REMOVE #wait_until, #pk"),
        };
        update
            .send()
            .await
            .map_err(|e| StoreError::backend("update", schema::SETTLE_CURSOR_PK, e))?;
        Ok(())
    }
}

impl DynamoStore {
    /// The awaiting index, page after page, soonest wait end first, up to `limit`.
    async fn query_awaiting(
        &self,
        after: Option<&AwaitingCursor>,
        until: Time,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records = Vec::new();
        // An index's start key holds the table's key and the index's.
        let mut start: Option<Item> = after.map(|cursor| {
            HashMap::from([
                (attr::PK.to_owned(), s(cursor.pk.as_str())),
                (attr::STATE.to_owned(), s(schema::state::AWAITING)),
                (attr::WAIT_UNTIL.to_owned(), n(cursor.wait_until.as_secs())),
            ])
        });
        // Bounded: every page but the last holds at least one record.
        for _page in 0..=limit {
            let page = i32::try_from((limit - records.len()).clamp(1, 100)).unwrap_or(100);
            let output = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(schema::AWAITING_INDEX)
                .key_condition_expression(AWAITING_KEY)
                .expression_attribute_names("#state", attr::STATE)
                .expression_attribute_names("#wait_until", attr::WAIT_UNTIL)
                .expression_attribute_values(":awaiting", s(schema::state::AWAITING))
                .expression_attribute_values(":until", n(until.as_secs()))
                .limit(page)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| StoreError::backend("query", &self.table, e))?;
            for item in output.items() {
                records.push(record_from_item(item)?);
            }
            match output.last_evaluated_key() {
                Some(last) if !last.is_empty() && records.len() < limit => {
                    start = Some(last.clone());
                }
                _ => break,
            }
        }
        records.truncate(limit);
        Ok(records)
    }
}

/// The placeholders an expression mentions: each `#name` and `:value`, whole.
fn placeholders(expression: &str) -> impl Iterator<Item = &str> {
    expression.match_indices(['#', ':']).map(|(at, _)| {
        let rest = &expression[at + 1..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &expression[at..=at + len]
    })
}

fn is_condition_failure<R>(err: &SdkError<UpdateItemError, R>) -> bool {
    err.as_service_error()
        .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
}

fn condition_failure_item<R>(err: &SdkError<UpdateItemError, R>) -> Option<&Item> {
    match err.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(e)) => e.item(),
        _ => None,
    }
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: i64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// Reads an item into a record through the one schema mapping.
pub fn record_from_item(item: &Item) -> Result<Record, StoreError> {
    schema::read(&Attributes(item))
}

/// A DynamoDB item as the schema reads it.
struct Attributes<'a>(&'a Item);

impl schema::Item for Attributes<'_> {
    fn value(&self, attribute: &'static str) -> Result<Option<Value>, Problem> {
        match self.0.get(attribute) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(v)) => Ok(Some(Value::S(v.clone()))),
            // DynamoDB numbers are decimal strings; ours are integers, and a decimal
            // one written by another tool is read as its integer part.
            Some(AttributeValue::N(v)) => v
                .parse::<i64>()
                .or_else(|_| v.parse::<f64>().map(|f| f as i64))
                .map(|v| Some(Value::N(v)))
                .map_err(|_| Problem::NotANumber),
            Some(_) => Err(Problem::NotAString),
        }
    }
}

#[cfg(test)]
mod tests;
