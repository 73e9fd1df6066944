//! The event source mapping emulator: pollers that receive from moto's SQS, invoke
//! through a Runtime API, and delete what was not reported failed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use serde_json::{Value, json};

use crate::runtime_api::{Endpoints, Reply, RuntimeApi};
use crate::servers::Backend;

pub struct Queues {
    pub client: aws_sdk_sqs::Client,
    pub url: String,
    pub arn: String,
    pub dlq_url: String,
}

impl Queues {
    pub async fn create(visibility: Duration, max_receive_count: u32) -> Self {
        let client = moto_sqs();
        let name = format!("orders-{}", uuid::Uuid::new_v4().simple());
        let dlq_url = client
            .create_queue()
            .queue_name(format!("{name}-dlq"))
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let dlq_arn = queue_arn(&client, &dlq_url).await;
        let redrive = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count.to_string()});
        let url = client
            .create_queue()
            .queue_name(&name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                visibility.as_secs().to_string(),
            )
            .attributes(QueueAttributeName::RedrivePolicy, redrive.to_string())
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let arn = queue_arn(&client, &url).await;
        Self {
            client,
            url,
            arn,
            dlq_url,
        }
    }

    pub async fn send(&self, bodies: &[String]) {
        for chunk in bodies.chunks(10) {
            let mut batch = self.client.send_message_batch().queue_url(&self.url);
            for (i, body) in chunk.iter().enumerate() {
                batch = batch.entries(
                    aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .build()
                        .unwrap(),
                );
            }
            let out = batch.send().await.unwrap();
            assert!(out.failed.is_empty(), "send failed: {:?}", out.failed);
        }
    }

    /// Sends `bodies` in waves, keeping at most about `max_pending` messages in the
    /// queue: moto's SQS slows down with queue depth, and producers in real life do
    /// not dump hours of traffic at once.
    pub async fn send_paced(&self, bodies: &[String], max_pending: u64) {
        for wave in bodies.chunks(50) {
            for _ in 0..600 {
                if self.pending().await < max_pending {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            self.send(wave).await;
        }
    }

    /// Receives up to 10 messages as the event source would (all attributes), hidden
    /// for `visibility`.
    pub async fn receive(&self, visibility: Duration) -> Vec<aws_sdk_sqs::types::Message> {
        self.client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(10)
            .visibility_timeout(i32::try_from(visibility.as_secs()).unwrap())
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    /// A fresh queue on moto for the reports of waits that ended
    /// (`AUTHENTICATION_ENDED_QUEUE_URL`, read by `SqsReports`): each test gets its own,
    /// so its reports are only its own. Returns the queue's URL.
    pub async fn create_report_queue(&self) -> String {
        self.client
            .create_queue()
            .queue_name(format!("ended-{}", uuid::Uuid::new_v4().simple()))
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap()
    }

    /// Every message of the report queue at `queue_url` (one made by
    /// `create_report_queue`), each body parsed as the JSON report it is: receives
    /// until the queue answers empty, at most 100 rounds, leaving each hidden.
    pub async fn drain_reports(&self, queue_url: &str) -> Vec<Value> {
        let mut reports = Vec::new();
        for _ in 0..100 {
            let messages = self.take_batch(queue_url).await;
            if messages.is_empty() {
                break;
            }
            for m in messages {
                reports.push(serde_json::from_str(m.body().unwrap()).unwrap());
            }
        }
        reports
    }

    /// Up to 10 messages of `queue_url` with their message attributes, hidden for a
    /// minute so that a drain loop sees each once: the one receive of `drain_reports`
    /// and `drain_dlq`.
    async fn take_batch(&self, queue_url: &str) -> Vec<aws_sdk_sqs::types::Message> {
        self.client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    /// Messages visible or in flight in the source queue.
    pub async fn pending(&self) -> u64 {
        let attrs = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        attrs
            .attributes()
            .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0)
    }

    /// The endpoints of a consumer that uses these queues (SQS on moto, this DLQ).
    pub fn endpoints(&self, dynamodb: String, payment: String, table: String) -> Endpoints {
        Endpoints {
            dynamodb,
            payment,
            table,
            sqs: Backend::Moto.url().to_owned(),
            dead_letter_queue: self.dlq_url.clone(),
        }
    }

    /// Takes every message out of the DLQ (a redrive re-sends them as new messages).
    pub async fn drain_dlq(&self) -> Vec<DlqMessage> {
        let mut drained = Vec::new();
        for _ in 0..1000 {
            let messages = self.take_batch(&self.dlq_url).await;
            if messages.is_empty() {
                break;
            }
            for m in messages {
                let note = m
                    .message_attributes()
                    .and_then(|a| a.get(charge_once::contracts::queue::NOTE_ATTRIBUTE))
                    .and_then(|v| v.string_value())
                    .map(|v| serde_json::from_str(v).unwrap());
                let mut attributes: Vec<String> = m
                    .message_attributes()
                    .map(|a| a.keys().cloned().collect())
                    .unwrap_or_default();
                attributes.sort();
                drained.push(DlqMessage {
                    body: m.body.clone().unwrap_or_default(),
                    note,
                    attributes,
                });
                self.client
                    .delete_message()
                    .queue_url(&self.dlq_url)
                    .receipt_handle(m.receipt_handle.unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
        drained
    }
}

/// A message taken out of the DLQ.
#[derive(Clone, Debug)]
pub struct DlqMessage {
    pub body: String,
    /// Its `charge-once` attribute, when the consumer sent it there; `None` when the
    /// queue's redrive policy moved it.
    pub note: Option<Value>,
    /// The names of its message attributes, sorted.
    pub attributes: Vec<String>,
}

impl DlqMessage {
    /// The note's field `name` as text.
    pub fn note_str(&self, name: &str) -> Option<&str> {
        self.note.as_ref()?.get(name)?.as_str()
    }
}

/// The queue the bench's events name (`arn:aws:sqs:us-east-1:123456789012:orders`) and
/// a DLQ, on moto, created once per process: a consumer that sets failed records'
/// delays and sends dead letters finds real queues there. `(moto's URL, the DLQ's URL)`.
pub async fn orders_queue_and_dlq() -> (String, String) {
    static QUEUES: tokio::sync::OnceCell<(String, String)> = tokio::sync::OnceCell::const_new();
    QUEUES
        .get_or_init(|| async {
            let client = moto_sqs();
            let create = |name: &'static str| {
                let client = client.clone();
                async move {
                    let out = client.create_queue().queue_name(name).send().await.unwrap();
                    out.queue_url.unwrap()
                }
            };
            create("orders").await;
            (Backend::Moto.url().to_owned(), create("orders-dlq").await)
        })
        .await
        .clone()
}

fn moto_sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test", "test", None, None, "tests",
            ))
            .endpoint_url(Backend::Moto.url())
            .http_client(crate::sdk_http_client())
            .build(),
    )
}

async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> String {
    let attrs = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap();
    attrs.attributes().unwrap()[&QueueAttributeName::QueueArn].clone()
}

#[derive(Default)]
pub struct EsmStats {
    pub deliveries: AtomicU64,
    pub invocations: AtomicU64,
    pub batch_failures: AtomicU64,
}

/// One poller per environment, as Lambda's event source mapping: receive up to
/// `batch` messages, build the SQS event, invoke, delete what was not reported failed.
/// A malformed response, an unknown or empty identifier, an error or a timeout fails
/// the whole batch (nothing deleted).
pub async fn poll(
    queues: Arc<Queues>,
    runtime: Arc<RuntimeApi>,
    stats: Arc<EsmStats>,
    stop: Arc<AtomicBool>,
    function_timeout: Duration,
) {
    while !stop.load(Ordering::Relaxed) {
        let received = queues
            .client
            .receive_message()
            .queue_url(&queues.url)
            .max_number_of_messages(10)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await;
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        stats
            .deliveries
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        stats.invocations.fetch_add(1, Ordering::Relaxed);
        let event = event_of(&messages, &queues.arn).to_string();
        let ids: HashSet<&str> = messages.iter().filter_map(|m| m.message_id()).collect();
        let failed: Option<HashSet<String>> = match runtime.invoke(event, function_timeout).await {
            Reply::Response(body) => parse_failures(&body, &ids),
            Reply::Error | Reply::Timeout => None,
        };
        let Some(failed) = failed else {
            stats.batch_failures.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        for m in &messages {
            if !failed.contains(m.message_id().unwrap_or_default()) {
                let _ = queues
                    .client
                    .delete_message()
                    .queue_url(&queues.url)
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .send()
                    .await;
            }
        }
    }
}

/// The SQS event Lambda's event source mapping builds from received messages.
pub fn event_of(messages: &[aws_sdk_sqs::types::Message], arn: &str) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| {
            let attributes: BTreeMap<String, String> = m
                .attributes()
                .map(|a| {
                    a.iter()
                        .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            // String and Number attributes as Lambda passes them (the tests send no
            // binary ones).
            let message_attributes: BTreeMap<String, Value> = m
                .message_attributes()
                .map(|a| {
                    a.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                json!({"stringValue": v.string_value(),
                                "dataType": v.data_type(), "stringListValues": [],
                                "binaryListValues": []}),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({
                "messageId": m.message_id(),
                "receiptHandle": m.receipt_handle(),
                "body": m.body(),
                "attributes": attributes,
                "messageAttributes": message_attributes,
                "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": "us-east-1",
            })
        })
        .collect();
    json!({ "Records": records })
}

/// The failed ids of a partial batch response, or `None` when Lambda would fail the
/// whole batch.
fn parse_failures(body: &[u8], ids: &HashSet<&str>) -> Option<HashSet<String>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let failures = value.get("batchItemFailures")?.as_array()?;
    let mut out = HashSet::new();
    for f in failures {
        let id = f.get("itemIdentifier")?.as_str()?;
        if id.is_empty() || !ids.contains(id) {
            return None;
        }
        out.insert(id.to_owned());
    }
    Some(out)
}

/// Waits until the source queue is empty twice in a row, at most `limit`.
pub async fn drain(queues: &Queues, limit: Duration) -> bool {
    let started = Instant::now();
    let mut empty_in_a_row = 0;
    while started.elapsed() < limit {
        if queues.pending().await == 0 {
            empty_in_a_row += 1;
            if empty_in_a_row >= 3 {
                return true;
            }
        } else {
            empty_in_a_row = 0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}
