//! The batch's plan for any fact, pure: one [`Entry`] per record of an SQS batch, and
//! the rules that fill it in. Parsing (the fact's own parser, through an SNS or
//! EventBridge envelope), grouping (by the fact's key, chained by what the provider
//! locks; FIFO: by message group or the whole batch), the rule that stops a group after
//! its first failure, each record's disposition (acknowledged, dead-lettered, or
//! retried after a delay by cause: [`crate::retry`]), the queue calls to ask for, and
//! the partial batch response. No I/O, clock, randomness or AWS types in here: the plan
//! reads its own [`Message`] and answers its own [`Response`]; a driver converts them
//! from and to the event source's types, runs the records, makes the queue calls, and
//! hands the time and the jitter in.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use crate::clock::Time;
use crate::queue::{QueueError, VisibilityChange};
use crate::record::Key;
use crate::retry::{self, Backoff, Disposition, Handling, Jitter, Wait};

mod ending;
#[cfg(test)]
mod tests;

pub use ending::{Ending, Invalid, RecordOutcome, Skip, Unit};

/// The batch cannot be judged at all: the whole batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A record without a message id: no partial failure can name it.
    #[error("record {index} has no messageId, so no partial failure can name it")]
    MissingMessageId {
        /// The record's index in the batch.
        index: usize,
    },
}

/// What the first failure in a FIFO batch stops. Ordering in a
/// FIFO queue holds per `MessageGroupId`, so `Group` keeps every group's order while
/// other groups go on, as Powertools' `skip_group_on_error` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FifoScope {
    /// The failed record's message group stops; the other groups go on.
    #[default]
    Group,
    /// The whole batch stops.
    Batch,
}

/// One message of the batch, as the plan reads it: only what it decides on, borrowed
/// from the event source's record, which the driver keeps (a dead letter is sent from
/// it, body and attributes unchanged).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Message<'a> {
    /// The message's id (`None`: the record has none).
    pub message_id: Option<&'a str>,
    /// The message's body.
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

/// The partial batch response: the message ids to deliver again, each once, as
/// the messages came.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response<'a> {
    /// The ids of the messages to deliver again.
    pub failures: Vec<&'a str>,
}

/// One record of the batch, from its parse to its place in the response: `V` the valid
/// record, `O` how a run ends, `E` why a body is not a valid fact.
#[derive(Debug)]
pub struct Entry<'a, V, O, E: std::error::Error + 'static> {
    /// The message, as the plan reads it.
    pub message: Message<'a>,
    /// The message's id: what the response names it by.
    pub message_id: &'a str,
    /// `ApproximateReceiveCount`: the last delivery before the DLQ stands out.
    pub receive_count: Option<u32>,
    /// The `Root=` of the record's `AWSTraceHeader` (X-Ray), when present.
    pub trace_id: Option<&'a str>,
    /// The valid record, or why the record is not one.
    pub fact: Result<V, Invalid<E>>,
    /// The group it runs in (`None`: it runs in none, being invalid on a standard
    /// queue).
    pub group: Option<usize>,
    /// How it ended, and how long that took. `NoOutcome` until it is run.
    pub outcome: RecordOutcome<O>,
    /// How long its run took.
    pub latency: Duration,
    /// What the batch does with it; chosen by [`dispose`] once every record has ended.
    pub disposition: Disposition,
    /// A dead letter: whether the send succeeded (only then is it acknowledged).
    pub dead_lettered: Option<bool>,
    /// A queue call for it that failed or was not made.
    pub queue_error: Option<QueueError>,
}

impl<V: Unit, O: Ending, E: std::error::Error + 'static> Entry<'_, V, O, E> {
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

    /// The key, for a valid record that names one.
    pub fn key(&self) -> Option<&str> {
        self.fact.as_ref().ok().and_then(Unit::key).map(Key::as_str)
    }

    /// What the record is grouped by ([`Unit::group_key`]).
    fn group_key(&self) -> Option<&str> {
        self.fact.as_ref().ok().and_then(Unit::group_key)
    }

    /// Why it failed, with the whole chain of the cause.
    pub fn reason(&self) -> Option<Cow<'static, str>> {
        match (&self.outcome, &self.fact) {
            (RecordOutcome::Invalid, Err(invalid)) => Some(crate::error_chain(invalid).into()),
            (
                RecordOutcome::Skipped {
                    why: Skip::SameFact,
                    ..
                },
                _,
            ) => Some(
                format!(
                    "an earlier record of the same {} failed in this batch",
                    V::NAME
                )
                .into(),
            ),
            (outcome, _) => outcome.reason(),
        }
    }
}

/// A record retried for want of anything better: the failure ahead of it went to the
/// DLQ, or its own dead letter's send failed (the next delivery sends it again).
const BACKOFF: Handling = Handling::Retry(Wait::Backoff);

/// Parses every record with the fact's parser; an invalid one has its outcome at once.
pub fn parse<'a, V, O, E: std::error::Error + 'static>(
    messages: &[Message<'a>],
    parse_fact: impl Fn(&str) -> Result<V, E>,
) -> Result<Vec<Entry<'a, V, O, E>>, BatchError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, &message)| {
            let message_id = message
                .message_id
                .filter(|id| !id.is_empty())
                .ok_or(BatchError::MissingMessageId { index })?;
            let fact = match message.body {
                None => Err(Invalid::NoBody),
                Some(body) => parse_fact(body).map_err(Invalid::Fact),
            };
            Ok(Entry {
                message,
                message_id,
                receive_count: message.receive_count,
                trace_id: message.trace_header.and_then(trace_root),
                outcome: match &fact {
                    Ok(_) => RecordOutcome::NoOutcome,
                    Err(_) => RecordOutcome::Invalid,
                },
                fact,
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
    /// Each group's record indices, as the messages came.
    pub groups: Vec<Vec<usize>>,
    /// Indices into `groups`. A standard queue chains the groups of one chain key
    /// ([`Unit::chain_key`]: what the provider locks), so their records sent at once do
    /// not refuse each other. FIFO batches: one chain per group.
    pub chains: Vec<Vec<usize>>,
    /// Why a group's records after its failure are skipped.
    pub skip: Skip,
}

/// Standard queues group valid records by key, so two copies of one fact never run
/// at once (invalid ones fail on their own); FIFO queues by message group, or the
/// whole batch as one group (the batch scope, or a record without a group: then only
/// the whole batch's order is known).
pub fn schedule<V: Unit, O: Ending, E: std::error::Error + 'static>(
    entries: &mut [Entry<'_, V, O, E>],
    scope: FifoScope,
) -> Schedule {
    let schedule = if !entries.iter().any(|e| is_fifo(&e.message)) {
        let keyed = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i, e.group_key()?)));
        let groups = group_in_order(keyed);
        let chained = groups.iter().enumerate().map(|(g, members)| {
            match chain_key(entries, members) {
                Some(key) => (g, Chain::Key(key)),
                // A group no chain key names (an event that names no fact yet) runs
                // on a chain of its own.
                None => (g, Chain::Alone(g)),
            }
        });
        let chains = group_in_order(chained);
        Schedule {
            chains,
            groups,
            skip: Skip::SameFact,
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

/// The chain a group runs on: shared by its chain key, or its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Chain<'k> {
    Key(&'k str),
    Alone(usize),
}

/// What a group is chained by: its leading record's chain key, or its first record's.
fn chain_key<'e, V: Unit, O, E: std::error::Error + 'static>(
    entries: &'e [Entry<'_, V, O, E>],
    members: &[usize],
) -> Option<&'e str> {
    let valid = |i: usize| entries[i].fact.as_ref().ok();
    members
        .iter()
        .find(|&&i| valid(i).is_some_and(Unit::leads_chain))
        .or(members.first())
        .and_then(|&i| valid(i)?.chain_key())
}

fn is_fifo(message: &Message<'_>) -> bool {
    message
        .event_source_arn
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// The records' indices by `MessageGroupId`, each group in message order; `None` when
/// a record has no group.
fn message_groups<V, O, E: std::error::Error + 'static>(
    entries: &[Entry<'_, V, O, E>],
) -> Option<Vec<Vec<usize>>> {
    let keyed: Option<Vec<(usize, &str)>> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| Some((i, e.message.message_group_id?)))
        .collect();
    keyed.map(group_in_order)
}

/// Indices grouped by their key: groups as they first appear, each as its
/// messages came.
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
    /// A group's rule, whose skipped records say `why`.
    pub fn new(why: Skip) -> Self {
        Self {
            why,
            stopped_at: None,
        }
    }

    /// The next record's outcome when it must not run.
    pub fn skipped<O>(&self) -> Option<RecordOutcome<O>> {
        self.stopped_at.map(|behind| RecordOutcome::Skipped {
            why: self.why,
            behind,
        })
    }

    /// Record `i` ended with `outcome`.
    pub fn ended<O: Ending>(&mut self, i: usize, outcome: &RecordOutcome<O>) {
        if !outcome.handling().is_ack() {
            self.stopped_at = self.stopped_at.or(Some(i));
        }
    }
}

/// What a disposition is chosen from: the time, the backoff, and the longest delay
/// SQS still allows.
#[derive(Clone, Copy, Debug)]
pub struct Retries<'b> {
    /// The time now.
    pub now: Time,
    /// The backoff of transient failures.
    pub backoff: &'b Backoff,
    /// The longest delay SQS still allows ([`retry::longest_delay`]).
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

/// Each record's disposition by its handling (drawn by [`retry::dispose`]); a skipped
/// record waits as long as the failure ahead of it, or the backoff when that one went to
/// the dead-letter queue.
pub fn dispose<V: Unit, O: Ending, E: std::error::Error + 'static>(
    entries: &mut [Entry<'_, V, O, E>],
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
pub fn dead_letters<V, O, E: std::error::Error + 'static>(
    entries: &[Entry<'_, V, O, E>],
) -> Vec<usize> {
    (0..entries.len())
        .filter(|&i| entries[i].disposition == Disposition::DeadLetter)
        .collect()
}

/// A dead letter's send ended: acknowledged only once it succeeded, else retried with
/// the backoff (the next delivery sends it again).
pub fn dead_lettered<V, O, E: std::error::Error + 'static>(
    entry: &mut Entry<'_, V, O, E>,
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
pub fn visibility_changes<'a, V: Unit, O: Ending, E: std::error::Error + 'static>(
    entries: &mut [Entry<'a, V, O, E>],
) -> Vec<(usize, VisibilityChange<'a>)> {
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
pub fn response<'a, V: Unit, O: Ending, E: std::error::Error + 'static>(
    entries: &[Entry<'a, V, O, E>],
) -> Response<'a> {
    let mut listed = HashSet::new();
    let failures = entries
        .iter()
        .filter(|entry| !entry.acknowledged() && listed.insert(entry.message_id))
        .map(|entry| entry.message_id)
        .collect();
    Response { failures }
}
