//! The SQS adapter of the queue contract ([`crate::queue`]): `ChangeMessageVisibilityBatch`
//! on the source queue (its URL found once per queue and execution environment with
//! `GetQueueUrl`, from the record's `eventSourceARN`) and `SendMessageBatch` to the
//! dead-letter queue, each dead letter with its note in a message attribute named for
//! the consumer.
//! Only I/O: which records, which delays and which reasons are the batch's to decide.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsMessage, SqsMessageAttribute};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry, MessageAttributeValue,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use futures::future::join_all;
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::queue::{
    DeadLetter, MAX_ATTRIBUTES, Queue, QueueError, VisibilityChange, parse_queue_arn,
};

/// Entries per batch call: SQS's limit.
const BATCH: usize = 10;
/// The most bytes one `SendMessageBatch` carries (bodies and attributes), SQS's
/// historical limit; a larger message goes alone.
const BATCH_BYTES: usize = 256 * 1024;

/// The queue calls of one execution environment.
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    /// The consumer's name: the message attribute that carries a dead letter's note,
    /// and the message group of a dead letter for a FIFO DLQ when the record has none.
    name: &'static str,
    dead_letter_queue_url: String,
    /// Queue URL by ARN, found once per queue.
    urls: Mutex<HashMap<String, String>>,
    /// The DLQ's `MaximumMessageSize`, asked of SQS at the first dead letter.
    dead_letter_limit: tokio::sync::OnceCell<usize>,
}

/// SQS's smallest default `MaximumMessageSize`: what a dead letter is fitted to when
/// the DLQ's own cannot be read.
const DEFAULT_MESSAGE_BYTES: usize = 256 * 1024;

impl SqsQueue {
    /// The queue calls of the consumer `name` (its dead letters' note attribute).
    pub fn new(
        client: aws_sdk_sqs::Client,
        dead_letter_queue_url: impl Into<String>,
        name: &'static str,
    ) -> Self {
        Self {
            client,
            name,
            dead_letter_queue_url: dead_letter_queue_url.into(),
            urls: Mutex::new(HashMap::new()),
            dead_letter_limit: tokio::sync::OnceCell::new(),
        }
    }

    /// The most bytes (body and attributes) the DLQ takes in one message: its
    /// `MaximumMessageSize`, read once; SQS's smallest default while it cannot be read
    /// (not kept: the next dead letter asks again).
    async fn dead_letter_limit(&self) -> usize {
        if let Some(limit) = self.dead_letter_limit.get() {
            return *limit;
        }
        let read = self
            .client
            .get_queue_attributes()
            .queue_url(&self.dead_letter_queue_url)
            .attribute_names(QueueAttributeName::MaximumMessageSize)
            .send()
            .await;
        let limit = read.ok().and_then(|out| {
            out.attributes?
                .get(&QueueAttributeName::MaximumMessageSize)?
                .parse()
                .ok()
        });
        match limit {
            Some(limit) => *self.dead_letter_limit.get_or_init(|| async { limit }).await,
            None => {
                warn!(
                    assumed = DEFAULT_MESSAGE_BYTES,
                    "the DLQ's MaximumMessageSize could not be read: this dead letter is \
                     fitted to SQS's smallest default"
                );
                DEFAULT_MESSAGE_BYTES
            }
        }
    }

    fn cached_url(&self, arn: &str) -> Option<String> {
        self.urls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(arn)
            .cloned()
    }

    /// The URL of the queue `arn`, asked of SQS once.
    async fn url_of(&self, arn: &str) -> Result<String, QueueError> {
        if let Some(url) = self.cached_url(arn) {
            return Ok(url);
        }
        let (account, name) = parse_queue_arn(arn)?;
        let out = self
            .client
            .get_queue_url()
            .queue_name(name)
            .queue_owner_aws_account_id(account)
            .send()
            .await
            .map_err(|e| QueueError::call("GetQueueUrl", e))?;
        let url = out.queue_url.ok_or(QueueError::Missing("queue URL"))?;
        self.urls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(arn.to_owned(), url.clone());
        Ok(url)
    }

    async fn change_in_queue(
        &self,
        arn: &str,
        changes: &[(usize, &VisibilityChange<'_>)],
    ) -> Vec<(usize, Result<(), QueueError>)> {
        let url = match self.url_of(arn).await {
            Ok(url) => url,
            Err(e) => return changes.iter().map(|(i, _)| (*i, Err(e.clone()))).collect(),
        };
        let calls = changes.chunks(BATCH).map(|chunk| {
            let url = &url;
            async move {
                let entries: Vec<_> = chunk
                    .iter()
                    .enumerate()
                    .map(|(id, (_, change))| {
                        ChangeMessageVisibilityBatchRequestEntry::builder()
                            .id(id.to_string())
                            .receipt_handle(change.receipt_handle)
                            .visibility_timeout(i32::try_from(change.delay_s).unwrap_or(i32::MAX))
                            .build()
                    })
                    .collect();
                let operation = "ChangeMessageVisibilityBatch";
                let built = entries.into_iter().collect::<Result<Vec<_>, _>>();
                batch_call(operation, chunk.len(), built, |entries| async move {
                    self.client
                        .change_message_visibility_batch()
                        .queue_url(url)
                        .set_entries(Some(entries))
                        .send()
                        .await
                        .map(|out| out.failed)
                        .map_err(|e| QueueError::call(operation, e))
                })
                .await
                .into_iter()
                .zip(chunk)
                .map(|(r, (i, _))| (*i, r))
                .collect::<Vec<_>>()
            }
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    async fn send_chunk(&self, chunk: &[&DeadLetter<'_>]) -> Vec<Result<(), QueueError>> {
        let operation = "SendMessageBatch";
        let fifo = self.dead_letter_queue_url.ends_with(".fifo");
        let entries: Result<Vec<_>, _> = chunk
            .iter()
            .enumerate()
            .map(|(id, letter)| entry(id, letter, fifo, self.name))
            .collect();
        batch_call(operation, chunk.len(), entries, |entries| async move {
            self.client
                .send_message_batch()
                .queue_url(&self.dead_letter_queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map(|out| out.failed)
                .map_err(|e| QueueError::call(operation, e))
        })
        .await
    }
}

/// One batch call of `len` entries, once they are built: each entry's result.
async fn batch_call<E, Fut>(
    operation: &'static str,
    len: usize,
    built: Result<Vec<E>, aws_sdk_sqs::error::BuildError>,
    send: impl FnOnce(Vec<E>) -> Fut,
) -> Vec<Result<(), QueueError>>
where
    Fut: std::future::Future<Output = Result<Vec<BatchResultErrorEntry>, QueueError>>,
{
    let result = match built {
        Err(e) => Err(QueueError::call(operation, e)),
        Ok(entries) => send(entries).await,
    };
    per_entry(operation, len, result)
}

/// Each entry's result of a batch call: the call's error for all, or the entries SQS
/// refused (by their ids, which are their positions).
fn per_entry(
    operation: &'static str,
    len: usize,
    result: Result<Vec<BatchResultErrorEntry>, QueueError>,
) -> Vec<Result<(), QueueError>> {
    match result {
        Err(e) => vec![Err(e); len],
        Ok(failed) => {
            let mut out = vec![Ok(()); len];
            for f in failed {
                if let Some(slot) = f.id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
                    *slot = Err(QueueError::Entry {
                        operation,
                        code: f.code,
                        message: f.message.unwrap_or_default(),
                    });
                }
            }
            out
        }
    }
}

/// A dead letter as SQS takes it: the body and attributes unchanged, plus the note.
fn entry(
    id: usize,
    letter: &DeadLetter<'_>,
    fifo: bool,
    note_attribute: &str,
) -> Result<SendMessageBatchRequestEntry, aws_sdk_sqs::error::BuildError> {
    let message = letter.message;
    let mut attributes = HashMap::with_capacity(message.message_attributes.len() + 1);
    for (name, value) in &message.message_attributes {
        // A message redriven from the DLQ may carry an earlier note: the new one wins.
        if name != note_attribute {
            attributes.insert(name.clone(), attribute(value)?);
        }
    }
    if letter.note.is_empty() {
        // Fitted away (`fitted_note`): said at that point.
    } else if attributes.len() < MAX_ATTRIBUTES {
        let note = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(&letter.note)
            .build()?;
        attributes.insert(note_attribute.to_owned(), note);
    } else {
        warn!(
            message_id = letter.message_id,
            attributes = attributes.len(),
            attribute = note_attribute,
            "dead letter sent without its note attribute: the message already has SQS's \
             maximum of 10; its reason is in this record's outcome line"
        );
    }
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(id.to_string())
        .message_body(message.body.as_deref().unwrap_or_default())
        .set_message_attributes(Some(attributes).filter(|a| !a.is_empty()));
    if fifo {
        let group = message
            .attributes
            .get("MessageGroupId")
            .map_or(note_attribute, String::as_str);
        builder = builder
            .message_group_id(group)
            .message_deduplication_id(deduplication_id(note_attribute, letter.message_id));
    }
    builder.build()
}

/// A FIFO DLQ's deduplication id for a record: derived from its message id, so a copy
/// sent again within five minutes (an acknowledgement lost) is dropped by SQS.
fn deduplication_id(consumer: &str, message_id: &str) -> String {
    let digest = Sha256::digest(format!("{consumer} dead letter {message_id}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(
    value: &SqsMessageAttribute,
) -> Result<MessageAttributeValue, aws_sdk_sqs::error::BuildError> {
    MessageAttributeValue::builder()
        .set_data_type(value.data_type.clone())
        .set_string_value(value.string_value.clone())
        .set_binary_value(value.binary_value.as_ref().map(|b| Blob::new(b.0.clone())))
        .set_string_list_values(
            Some(value.string_list_values.clone()).filter(|list| !list.is_empty()),
        )
        .set_binary_list_values(
            Some(
                value
                    .binary_list_values
                    .iter()
                    .map(|b| Blob::new(b.0.clone()))
                    .collect::<Vec<_>>(),
            )
            .filter(|list| !list.is_empty()),
        )
        .build()
}

/// What a dead letter weighs against the batch call's size limit.
fn weight(message: &SqsMessage, note: &str, note_attribute: &str) -> usize {
    // An earlier note (a message redriven from the DLQ) is replaced, not kept.
    let attributes: usize = message
        .message_attributes
        .iter()
        .filter(|(name, _)| name.as_str() != note_attribute)
        .map(|(name, v)| {
            name.len()
                + v.data_type.as_deref().map_or(0, str::len)
                + v.string_value.as_deref().map_or(0, str::len)
                + v.binary_value.as_ref().map_or(0, |b| b.0.len())
        })
        .sum();
    message.body.as_deref().map_or(0, str::len) + attributes + note_attribute.len() + note.len()
}

/// `letter`'s note as the DLQ can take it beside the message (`limit` bytes in all,
/// body and attributes, as SQS counts them): whole when it fits; else trimmed to its
/// outcome, ids and as much of its reason as fits, marked `"note_trimmed": true`; else
/// empty (the message goes without it, its reason in the record's line).
fn fitted_note(letter: &DeadLetter<'_>, limit: usize, note_attribute: &str) -> String {
    let room = |note: &str| weight(letter.message, note, note_attribute) + "String".len() <= limit;
    if room(&letter.note) {
        return letter.note.clone();
    }
    let Ok(mut note) = serde_json::from_str::<serde_json::Value>(&letter.note) else {
        return String::new();
    };
    let reason = note["reason"].as_str().unwrap_or_default().to_owned();
    note["note_trimmed"] = true.into();
    // A prefix of the reason (on a character boundary) that fits: first what the
    // overshoot leaves, then halves.
    let whole = weight(letter.message, &note.to_string(), note_attribute) + "String".len();
    let over = whole.saturating_sub(limit);
    let mut cut = (0..=reason.len().saturating_sub(over))
        .rev()
        .find(|i| reason.is_char_boundary(*i))
        .unwrap_or(0);
    for _ in 0..64 {
        note["reason"] = reason[..cut].into();
        let text = note.to_string();
        if room(&text) {
            warn!(
                message_id = letter.message_id,
                limit, "dead letter's note trimmed to fit the DLQ's message size"
            );
            return text;
        }
        if cut == 0 {
            break;
        }
        cut = (0..cut / 2 + 1)
            .rev()
            .find(|i| reason.is_char_boundary(*i))
            .unwrap_or(0);
    }
    warn!(
        message_id = letter.message_id,
        limit, "dead letter sent without its note: the message alone fills the DLQ's size"
    );
    String::new()
}

#[async_trait]
impl Queue for SqsQueue {
    async fn change_visibility(
        &self,
        changes: &[VisibilityChange<'_>],
    ) -> Vec<Result<(), QueueError>> {
        let mut by_queue: HashMap<&str, Vec<(usize, &VisibilityChange<'_>)>> = HashMap::new();
        for (i, change) in changes.iter().enumerate() {
            by_queue
                .entry(change.queue_arn)
                .or_default()
                .push((i, change));
        }
        let calls = by_queue
            .iter()
            .map(|(arn, changes)| self.change_in_queue(arn, changes));
        let mut out = vec![Err(QueueError::Missing("answer")); changes.len()];
        for (i, result) in join_all(calls).await.into_iter().flatten() {
            out[i] = result;
        }
        out
    }

    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Vec<Result<(), QueueError>> {
        // Each note fitted to what the DLQ takes beside the message as it came: the
        // body and its attributes are never cut.
        let limit = self.dead_letter_limit().await;
        let fitted: Vec<DeadLetter<'_>> = letters
            .iter()
            .map(|letter| DeadLetter {
                message: letter.message,
                message_id: letter.message_id,
                note: fitted_note(letter, limit, self.name),
            })
            .collect();
        let letters = &fitted[..];
        // Chunks of at most 10 entries and BATCH_BYTES, in order.
        let mut chunks: Vec<Vec<&DeadLetter<'_>>> = Vec::new();
        let mut bytes = 0;
        for letter in letters {
            let w = weight(letter.message, &letter.note, self.name);
            match chunks.last_mut() {
                Some(chunk) if chunk.len() < BATCH && bytes + w <= BATCH_BYTES => {
                    chunk.push(letter);
                    bytes += w;
                }
                _ => {
                    chunks.push(vec![letter]);
                    bytes = w;
                }
            }
        }
        join_all(chunks.iter().map(|chunk| self.send_chunk(chunk)))
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

#[cfg(test)]
mod tests;
