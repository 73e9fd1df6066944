//! The batch's plan, pure (ARCHITECTURE.md, "The batch" and "Retries"): one
//! [`Entry`] per record, and the rules that fill it in. Parsing, grouping (by order;
//! FIFO: by message group or the whole batch), the rule that stops a group after its
//! first failure, each record's disposition, the queue calls to ask for, and the
//! partial batch response. No I/O, clock, randomness or AWS types in here: the plan
//! reads its own [`Message`] and answers its own [`Response`]; the batch's I/O layer
//! (`drivers/batch/`) converts them from and to the event source's types, runs the
//! records, makes the queue calls, and hands the time and the jitter in.

use crate::domain::{ForOrder, OrderKey};
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use crate::contracts::queue::{QueueError, VisibilityChange};
use crate::domain::clock::Time;
use crate::domain::event::PaymentEvent;
use crate::domain::message::Incoming;
use crate::domain::order::Order;
use crate::domain::{Identity, Key};
use crate::policy::batch::ending::{InvalidRecord, RecordOutcome, Skip};
use crate::policy::outcome_kind::{Handling, Wait};
use crate::policy::retry::{self, Backoff, Disposition, Jitter};

/// The batch cannot be judged at all: the whole batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("record {index} has no messageId, so no partial failure can name it")]
    MissingMessageId { index: usize },
}

/// What the first failure in a FIFO batch stops (`FIFO_FAILURE_SCOPE`). Order in a
/// FIFO queue holds per `MessageGroupId`, so `Group` keeps every group's order while
/// other groups go on, as Powertools' `skip_group_on_error` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FifoScope {
    #[default]
    Group,
    Batch,
}

/// One message of the batch, as the plan reads it: only what it decides on, borrowed
/// from the event source's record, which the driver keeps (a dead letter is sent from
/// it, body and attributes unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Message<'a> {
    pub message_id: Option<&'a str>,
    pub body: Option<&'a str>,
    /// `ApproximateReceiveCount`, when it is a number.
    pub receive_count: Option<u32>,
    /// `AWSTraceHeader` (X-Ray), when present.
    pub trace_header: Option<&'a str>,
    /// `MessageGroupId`: FIFO queues only.
    pub message_group_id: Option<&'a str>,
    /// The queue it came from; a FIFO queue's ends in `.fifo`.
    pub event_source_arn: Option<&'a str>,
    /// What a visibility change names it by.
    pub receipt_handle: Option<&'a str>,
}

/// The partial batch response: the message ids to deliver again, each once, in
/// message order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response<'a> {
    pub failures: Vec<&'a str>,
}

/// A valid record: an order with what the table knows it by (derived once per
/// record), or a provider's payment event with the key of the order it names (none:
/// it names no order, and ends at once).
#[derive(Debug)]
pub enum Valid {
    Order {
        order: Order,
        identity: Identity,
    },
    Event {
        event: PaymentEvent,
        key: Option<Key>,
    },
}

impl Valid {
    /// The key of the order the record is about.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Self::Order { identity, .. } => Some(&identity.key),
            Self::Event { key, .. } => key.as_ref(),
        }
    }
}

/// One record of the batch, from its parse to its place in the response.
#[derive(Debug)]
pub struct Entry<'a> {
    pub message: Message<'a>,
    pub message_id: &'a str,
    /// `ApproximateReceiveCount`: the last delivery before the DLQ stands out.
    pub receive_count: Option<u32>,
    /// The `Root=` of the record's `AWSTraceHeader` (X-Ray), when present.
    pub trace_id: Option<&'a str>,
    /// The order, or why the record is not one.
    pub order: Result<Valid, InvalidRecord>,
    /// The group it runs in (`None`: it runs in none, being invalid on a standard
    /// queue).
    pub group: Option<usize>,
    /// How it ended, and how long that took. `NoOutcome` until it is run.
    pub outcome: RecordOutcome,
    pub latency: Duration,
    /// What the batch does with it; chosen by [`dispose`] once every record has ended.
    pub disposition: Disposition,
    /// A dead letter: whether the send succeeded (only then is it acknowledged).
    pub dead_lettered: Option<bool>,
    /// A queue call for it that failed or was not made.
    pub queue_error: Option<QueueError>,
}

impl Entry<'_> {
    /// Whether the message is left out of `batchItemFailures`: acknowledged with its
    /// effect, or a dead letter whose send succeeded.
    pub fn acknowledged(&self) -> bool {
        self.outcome.handling().is_ack() || self.dead_lettered == Some(true)
    }

    /// The delay SQS is told, in whole seconds; `None` when it is not retried.
    pub fn retry_in_s(&self) -> Option<u32> {
        match self.disposition {
            Disposition::Retry(delay) if self.dead_lettered != Some(true) => {
                Some(retry::whole_seconds(delay))
            }
            _ => None,
        }
    }

    /// The key, for a valid order (or an event that names one).
    pub fn key(&self) -> Option<&str> {
        self.order
            .as_ref()
            .ok()
            .and_then(Valid::key)
            .map(Key::as_str)
    }

    /// What the record is grouped by: its order's key, or, for an event that names no
    /// order (a thin event: the payment's order is read from the provider), its
    /// payment, so that copies of one event run one after another.
    fn group_key(&self) -> Option<&str> {
        self.key().or(match &self.order {
            Ok(Valid::Event { event, key: None }) => Some(event.payment_id.as_str()),
            _ => None,
        })
    }

    /// Why it failed, with the whole chain of the cause.
    pub fn reason(&self) -> Option<std::borrow::Cow<'static, str>> {
        match (&self.outcome, &self.order) {
            (RecordOutcome::Invalid, Err(invalid)) => Some(crate::error_chain(invalid).into()),
            (outcome, _) => outcome.reason(),
        }
    }
}

/// A record retried for want of anything better: the failure ahead of it went to the
/// DLQ, or its own dead letter's send failed (the next delivery sends it again).
const BACKOFF: Handling = Handling::Retry(Wait::Backoff);

/// Parses every record; an invalid one has its outcome at once.
pub fn parse<'a>(messages: &[Message<'a>]) -> Result<Vec<Entry<'a>>, BatchError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, &message)| {
            let message_id = message
                .message_id
                .filter(|id| !id.is_empty())
                .ok_or(BatchError::MissingMessageId { index })?;
            let order = match message.body {
                None => Err(InvalidRecord::NoBody),
                Some(body) => Incoming::parse(body)
                    .map(|incoming| match incoming {
                        Incoming::Order(order) => Valid::Order {
                            identity: Identity::for_order(&order),
                            order,
                        },
                        Incoming::PaymentEvent(event) => Valid::Event {
                            key: event.order_id.as_deref().map(Key::for_order_id),
                            event,
                        },
                    })
                    .map_err(InvalidRecord::from),
            };
            Ok(Entry {
                message,
                message_id,
                receive_count: message.receive_count,
                trace_id: message.trace_header.and_then(trace_root),
                outcome: match &order {
                    Ok(_) => RecordOutcome::NoOutcome,
                    Err(_) => RecordOutcome::Invalid,
                },
                order,
                group: None,
                latency: Duration::ZERO,
                disposition: Disposition::Ack,
                dead_lettered: None,
                queue_error: None,
            })
        })
        .collect()
}

/// The `Root=` of an X-Ray trace header (`Root=1-…;Parent=…;Sampled=1`).
fn trace_root(header: &str) -> Option<&str> {
    header
        .split(';')
        .find_map(|part| part.trim().strip_prefix("Root="))
        .filter(|root| !root.is_empty())
}

/// The groups, each run in message order; the chains that run concurrently, each a
/// list of groups run one after another; and why a group's records after a failure
/// are skipped.
#[derive(Debug, PartialEq, Eq)]
pub struct Schedule {
    pub groups: Vec<Vec<usize>>,
    /// Indices into `groups`. A standard queue chains the groups of one customer: the
    /// provider locks a customer during a payment, so their orders sent at once would
    /// refuse each other (`lock_timeout`). FIFO batches: one chain per group.
    pub chains: Vec<Vec<usize>>,
    pub skip: Skip,
}

/// Standard queues group valid records by key, so two copies of one order never run
/// at once (invalid ones fail on their own); FIFO queues by message group, or the
/// whole batch as one group (the batch scope, or a record without a group: then only
/// the whole batch's order is known).
pub fn schedule(entries: &mut [Entry<'_>], scope: FifoScope) -> Schedule {
    let schedule = if !entries.iter().any(|e| is_fifo(&e.message)) {
        let keyed = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i, e.group_key()?)));
        let groups = group_in_order(keyed);
        let customers = groups
            .iter()
            .enumerate()
            .filter_map(|(g, members)| Some((g, chain_key(entries, members)?)));
        Schedule {
            chains: group_in_order(customers),
            groups,
            skip: Skip::SameOrder,
        }
    } else {
        let by_group = match scope {
            FifoScope::Group => message_groups(entries),
            FifoScope::Batch => None,
        };
        match by_group {
            Some(groups) => Schedule {
                chains: (0..groups.len()).map(|g| vec![g]).collect(),
                groups,
                skip: Skip::FifoGroup,
            },
            None => Schedule {
                groups: vec![(0..entries.len()).collect()],
                chains: vec![vec![0]],
                skip: Skip::Fifo,
            },
        }
    };
    for (g, members) in schedule.groups.iter().enumerate() {
        for &i in members {
            entries[i].group = Some(g);
        }
    }
    schedule
}

/// What a group is chained by: its first order's customer, or, for a group of events
/// alone, their order's key.
fn chain_key<'e>(entries: &'e [Entry<'_>], members: &[usize]) -> Option<&'e str> {
    members
        .iter()
        .find(|&&i| matches!(entries[i].order, Ok(Valid::Order { .. })))
        .or(members.first())
        .and_then(|&i| customer(&entries[i]))
}

/// What a valid record's group is chained by: the customer of an order (the provider
/// locks a customer during a payment), the order's key for an event (it calls no
/// provider). The two never meet: a key starts with `cobro#`, a customer never does.
fn customer<'e>(entry: &'e Entry<'_>) -> Option<&'e str> {
    match entry.order.as_ref().ok()? {
        Valid::Order { order, .. } => Some(order.customer()),
        Valid::Event { key, .. } => key.as_ref().map(Key::as_str),
    }
}

fn is_fifo(message: &Message<'_>) -> bool {
    message
        .event_source_arn
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// The records' indices by `MessageGroupId`, each group in message order; `None` when
/// a record has no group.
fn message_groups(entries: &[Entry<'_>]) -> Option<Vec<Vec<usize>>> {
    let keyed: Option<Vec<(usize, &str)>> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| Some((i, e.message.message_group_id?)))
        .collect();
    keyed.map(group_in_order)
}

/// Indices grouped by their key: groups in order of first appearance, each in message
/// order.
fn group_in_order<K: Hash + Eq>(keyed: impl IntoIterator<Item = (usize, K)>) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<K, usize> = HashMap::new();
    for (i, key) in keyed {
        let g = *group_of.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// The skip rule of one group run in order: after its first record that is not
/// acknowledged, the rest are skipped without any store or provider call.
#[derive(Debug)]
pub struct InOrder {
    why: Skip,
    stopped_at: Option<usize>,
}

impl InOrder {
    pub fn new(why: Skip) -> Self {
        Self {
            why,
            stopped_at: None,
        }
    }

    /// The next record's outcome when it must not run.
    pub fn skipped(&self) -> Option<RecordOutcome> {
        self.stopped_at.map(|behind| RecordOutcome::Skipped {
            why: self.why,
            behind,
        })
    }

    /// Record `i` ended with `outcome`.
    pub fn ended(&mut self, i: usize, outcome: &RecordOutcome) {
        if !outcome.handling().is_ack() {
            self.stopped_at = self.stopped_at.or(Some(i));
        }
    }
}

/// What a disposition is chosen from: the time, the backoff, and the longest delay
/// SQS still allows.
#[derive(Clone, Copy, Debug)]
pub struct Retries<'b> {
    pub now: Time,
    pub backoff: &'b Backoff,
    pub longest: Duration,
}

impl Retries<'_> {
    /// One record's disposition, delivered `receive_count` times (1 when the attribute
    /// is missing), its wait ending `until` when it has an end.
    pub fn dispose(
        &self,
        handling: Handling,
        until: Option<Time>,
        receive_count: Option<u32>,
        jitter: Jitter,
    ) -> Disposition {
        let receives = receive_count.unwrap_or(1);
        retry::dispose(
            handling,
            until,
            receives,
            self.now,
            self.backoff,
            jitter,
            self.longest,
        )
    }
}

/// Each record's disposition by its handling (`policy/outcome_kind.rs`, drawn by
/// `policy/retry/mod.rs`); a skipped record waits as long as the failure ahead of it, or
/// the backoff when that one went to the DLQ.
pub fn dispose(
    entries: &mut [Entry<'_>],
    retries: &Retries<'_>,
    mut jitter: impl FnMut() -> Jitter,
) {
    let own: Vec<Disposition> = entries
        .iter()
        .map(|e| {
            let (handling, until) = (e.outcome.handling(), e.outcome.until());
            retries.dispose(handling, until, e.receive_count, jitter())
        })
        .collect();
    for (entry, mine) in entries.iter_mut().zip(&own) {
        entry.disposition = match entry.outcome {
            RecordOutcome::Skipped { behind, .. } => match own.get(behind) {
                Some(&Disposition::Retry(delay)) => Disposition::Retry(delay),
                _ => retries.dispose(BACKOFF, None, entry.receive_count, jitter()),
            },
            _ => *mine,
        };
    }
}

/// The records to send to the dead-letter queue.
pub fn dead_letters(entries: &[Entry<'_>]) -> Vec<usize> {
    (0..entries.len())
        .filter(|&i| entries[i].disposition == Disposition::DeadLetter)
        .collect()
}

/// A dead letter's send ended: acknowledged only once it succeeded, else retried with
/// the backoff (the next delivery sends it again).
pub fn dead_lettered(
    entry: &mut Entry<'_>,
    sent: Result<(), QueueError>,
    retries: &Retries<'_>,
    jitter: Jitter,
) {
    entry.dead_lettered = Some(sent.is_ok());
    if let Err(e) = sent {
        entry.disposition = retries.dispose(BACKOFF, None, entry.receive_count, jitter);
        entry.queue_error = Some(e);
    }
}

/// The visibility change of each retried record; a record without the attributes the
/// call needs gets its queue error instead.
pub fn visibility_changes<'a>(entries: &mut [Entry<'a>]) -> Vec<(usize, VisibilityChange<'a>)> {
    let mut changes = Vec::new();
    for (i, entry) in entries.iter_mut().enumerate() {
        let Some(delay_s) = entry.retry_in_s() else {
            continue;
        };
        let message = entry.message;
        match (message.event_source_arn, message.receipt_handle) {
            (Some(queue_arn), Some(receipt_handle)) => changes.push((
                i,
                VisibilityChange {
                    queue_arn,
                    receipt_handle,
                    delay_s,
                },
            )),
            (None, _) => entry.queue_error = Some(QueueError::Missing("eventSourceARN")),
            (_, None) => entry.queue_error = Some(QueueError::Missing("receiptHandle")),
        }
    }
    changes
}

/// The partial batch response: every record not acknowledged, each message id once
/// (SQS can hand one message twice in a batch).
pub fn response<'a>(entries: &[Entry<'a>]) -> Response<'a> {
    let mut listed = HashSet::new();
    let failures = entries
        .iter()
        .filter(|entry| !entry.acknowledged() && listed.insert(entry.message_id))
        .map(|entry| entry.message_id)
        .collect();
    Response { failures }
}

#[cfg(test)]
mod tests;
