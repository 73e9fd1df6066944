//! Handler tests: the real handler, driven with `LambdaEvent`s parsed from the JSON
//! files in `events/`, against moto (behind its lock) and an in-process provider that
//! honours idempotency keys. Every test ends by checking that no order was charged
//! twice. Stripe's events are tested end to end on the real parts: localstripe behind
//! its layer puts them on a partner event bus on moto, whose rule delivers them to a
//! queue, from which the handler is invoked as Lambda would invoke it.
//!
//! By theme: `batches.rs` (the batch, FIFO groups, failures and their keys, the
//! deadline), `provider.rs` (the provider's answers, old keys, the breaker, `resolve`
//! beside the consumer), `awaiting.rs` (orders that await their customer, events, the
//! settler); the helpers they share are here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use charge_once::adapters::payment_http::HttpProvider;
use charge_once::adapters::sqs::SqsReports;
use charge_once::config::{FifoScope, Secret};
use charge_once::contracts::queue::Unreported;
use charge_once::contracts::schema;
use charge_once::contracts::store::{AwaitRequest, IdempotencyStore, Write, WriteOutcome};
use charge_once::domain::order::Order;
use charge_once::domain::{Key, Owner, Record, State};
use charge_once::drivers::charge::resolve;
use charge_once::drivers::settle::Settler;
use charge_once::policy::resolve::{Confirmed, Resolution, ResolveError};
use harness::event_source::{Queues, event_of};
use harness::eventbridge::{stripe_event, stripe_events_to};
use harness::lease::Lease;
use harness::localstripe::{self, Card, Payer};
use harness::logs::Captured;
use harness::provider::{Fault, TestProvider};
use harness::rig::{
    DEADLINE_MARGIN, Harness, INVOCATION, Options, PAYMENT_TIMEOUT, PROVIDER_KEY_TTL, batch_of,
    event, message_ids,
};
use harness::servers::localstripe_url;

async fn harness() -> Harness<TestProvider> {
    Harness::new(TestProvider::new()).await
}

/// `faults` fail the first delivery's charge (a 5xx is retried once within the
/// invocation, so it takes two); the retry replays the same key and charges.
async fn failure_keeps_the_key(faults: &[Fault]) {
    let fault = faults[0];
    let h = harness().await;
    h.provider.script("ord-1001", faults);
    assert_eq!(
        h.invoke("sqs-single.json").await,
        message_ids("sqs-single.json", &[0])
    );
    let record = h.record("ord-1001").await.unwrap();
    assert_eq!(record.state, State::Free, "released after {fault:?}");
    assert_eq!(record.attempt, Some(1), "{fault:?} keeps the attempt");
    assert_eq!(record.owner, None);

    h.redeliver_later();
    assert_eq!(h.invoke("sqs-single.json").await, Vec::<String>::new());
    assert_eq!(
        h.provider.keys_for("ord-1001"),
        vec!["cobro#ord-1001#1"; faults.len() + 1]
    );
    let charges = h.provider.charges_for("ord-1001");
    assert_eq!(charges.len(), 1);
    assert_eq!(
        h.record("ord-1001").await.unwrap().receipt,
        Some(charges[0].clone())
    );
    h.provider.assert_no_order_charged_twice();
}

/// A FIFO batch of `(order id, MessageGroupId)`, in message order.
fn fifo_batch(records: &[(&str, Option<&str>)]) -> SqsEvent {
    let bodies: Vec<String> = records
        .iter()
        .map(|(id, _)| {
            format!(r#"{{"id":"{id}","amount":700,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}}"#)
        })
        .collect();
    let mut batch = batch_of(&bodies);
    for (record, (_, group)) in batch.records.iter_mut().zip(records) {
        record.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:orders.fifo".into());
        record.attributes.remove("MessageGroupId");
        if let Some(group) = group {
            record
                .attributes
                .insert("MessageGroupId".into(), (*group).into());
        }
    }
    batch
}

fn ids_of(event: &SqsEvent, positions: &[usize]) -> Vec<String> {
    positions
        .iter()
        .map(|&i| event.records[i].message_id.clone().unwrap())
        .collect()
}

// --- Lambda conventions: message shapes, trace ids, log format --------------------

/// An order as an EventBridge rule delivers it to SQS: the order is `detail`.
fn eventbridge(order: &str) -> String {
    format!(
        r#"{{"version":"0","id":"6a7e8feb-b491-4cf7-a9f1-bf3703467718","detail-type":"OrderPlaced","source":"shop.orders","account":"123456789012","time":"2026-11-30T12:00:00Z","region":"eu-west-1","resources":[],"detail":{order}}}"#
    )
}

// --- Hardening: bad input, outcome lines, one line per record ---------------------

/// The outcome lines of a captured log: (message id, outcome, level, fields).
fn outcome_lines(logs: &Captured) -> Vec<(String, String, String, serde_json::Value)> {
    logs.text()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["fields"]["outcome"].is_string())
        .map(|l| {
            (
                l["span"]["message_id"].as_str().unwrap_or("").to_owned(),
                l["fields"]["outcome"].as_str().unwrap().to_owned(),
                l["level"].as_str().unwrap().to_owned(),
                l["fields"].clone(),
            )
        })
        .collect()
}

/// `events/sqs-single.json` with another message id: the same order delivered again
/// as a new message (SNS fan-out, producer retry, redrive).
fn another_copy() -> SqsEvent {
    let mut copy = event("sqs-single.json");
    copy.records[0].message_id = Some("a-second-copy-of-ord-1001".to_owned());
    copy
}

/// Asserts the handler answered before its deadline, with every record failed.
async fn answers_before_the_deadline<P: charge_once::contracts::payment::ChargePath + 'static>(
    h: &Harness<P>,
    event: SqsEvent,
    time_left: Duration,
) -> Vec<String> {
    let started = std::time::Instant::now();
    let failed = h.invoke_event_with(event, time_left).await;
    let took = started.elapsed();
    assert!(
        took < time_left,
        "the handler answered after its deadline: {took:?} > {time_left:?}"
    );
    failed
}

/// The order of `events/sqs-single.json`, as `resolve` gets it from the DLQ message.
fn ord_1001() -> Order {
    Order::new("ord-1001", 5000, "EUR", "cus_123", "pm_card_visa").unwrap()
}

/// A body of order `id` paid with the test provider's card, or with no payment method.
fn paid(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","amount":900,"currency":"EUR","customer":"cus_1","payment_method":"pm_card_visa"}}"#
    )
}

fn unpaid(id: &str) -> String {
    format!(r#"{{"id":"{id}","amount":900,"currency":"EUR","customer":"cus_1"}}"#)
}

/// The settler on `table` and `provider` with the consumer's `settings` (its clock,
/// breakers and pace), reporting to nobody, with two minutes to run.
fn settler<'a>(
    table: &'a harness::servers::Table,
    provider: &'a dyn charge_once::contracts::payment::ChargePath,
    settings: &'a charge_once::drivers::charge::Settings,
) -> Settler<'a> {
    Settler {
        store: table.store.as_ref(),
        provider,
        refunds: None,
        reports: &Unreported,
        settings,
        time: Duration::from_secs(120),
        limit: 100,
        per_run: usize::MAX,
    }
}

// --- Stripe's events: localstripe (behind its layer) puts them on a partner event bus
// on moto, whose rule delivers them to a queue; the handler reads them from there. ---

/// The handler on moto and localstripe, with the events of this test's orders routed
/// to a queue of its own.
struct Events {
    h: Harness<HttpProvider>,
    queues: Queues,
    destination: String,
    run: String,
    payer: Payer,
    /// SQS events of one record each, received and not yet taken.
    received: tokio::sync::Mutex<Vec<SqsEvent>>,
}

impl Events {
    /// Asserts that `order_id`'s record is `hecho` with `payment` as its receipt.
    async fn assert_done_with(&self, order_id: &str, payment: &str) {
        let done = self.h.record(order_id).await.unwrap();
        assert_eq!(
            (done.state, done.receipt.as_deref()),
            (State::Done, Some(payment))
        );
    }

    async fn new() -> Self {
        Self::with(Options::default()).await
    }

    async fn with(options: Options) -> Self {
        let provider = HttpProvider::new(
            localstripe_url(),
            &Secret::new(localstripe::TEST_KEY.to_owned()),
            PAYMENT_TIMEOUT,
            &harness::tls(),
        )
        .unwrap();
        let h = Harness::with(provider, options).await;
        let queues = Queues::create(Duration::from_secs(30), 10).await;
        let run = format!("ev{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let destination = stripe_events_to(&queues.arn, Some(&run), ("test", "test")).await;
        Self {
            h,
            queues,
            destination,
            run,
            payer: localstripe::payer(Card::RequiresAuthentication).await,
            received: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    fn order_id(&self, n: usize) -> String {
        format!("{}-{n}", self.run)
    }

    /// Order `n`, paid with the card that always asks for authentication.
    fn order(&self, n: usize) -> SqsEvent {
        let body = serde_json::json!({"id": self.order_id(n), "amount": 900, "currency": "EUR",
            "customer": self.payer.customer, "payment_method": self.payer.card});
        batch_of(&[body.to_string()])
    }

    /// Delivers order `n`: acknowledged, its record awaits the customer. Returns the
    /// PaymentIntent it awaits.
    async fn awaiting(&self, n: usize) -> String {
        assert_eq!(
            self.h.invoke_event_with(self.order(n), INVOCATION).await,
            Vec::<String>::new(),
            "acknowledged: the table holds the order"
        );
        let record = self.h.record(&self.order_id(n)).await.unwrap();
        assert_eq!(record.state, State::Awaiting, "{record:?}");
        record.awaited.unwrap()
    }

    /// The event `kind` of `payment` as the queue delivers it (at most 10 s).
    async fn event(&self, kind: &str, payment: &str) -> SqsEvent {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let mut received = self.received.lock().await;
            let found = received.iter().position(|e| {
                let body: serde_json::Value =
                    serde_json::from_str(e.records[0].body.as_deref().unwrap()).unwrap();
                body["detail-type"] == kind && body["detail"]["data"]["object"]["id"] == payment
            });
            if let Some(at) = found {
                return received.remove(at);
            }
            for m in self.queues.receive(Duration::from_secs(60)).await {
                let one = event_of(std::slice::from_ref(&m), &self.queues.arn);
                received.push(serde_json::from_value(one).unwrap());
            }
            drop(received);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no {kind} event of {payment} within 10 s")
    }

    /// A PaymentIntent for order `n` made at localstripe outside the consumer, off
    /// session with the card that asks for authentication: `requires_action`.
    async fn open_payment(&self, n: usize) -> String {
        let form = [
            ("amount", "900"),
            ("currency", "eur"),
            ("customer", self.payer.customer.as_str()),
            ("payment_method", self.payer.card.as_str()),
            ("confirm", "true"),
            ("off_session", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
            ("metadata[order_id]", &self.order_id(n)),
        ];
        let made: serde_json::Value = harness::http_client()
            .post(format!("{}/v1/payment_intents", localstripe_url()))
            .bearer_auth(localstripe::TEST_KEY)
            .form(&form)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(made["status"], "requires_action", "{made}");
        made["id"].as_str().unwrap().to_owned()
    }

    async fn cancel(&self, payment: &str) {
        let cancelled: serde_json::Value = harness::http_client()
            .post(format!(
                "{}/v1/payment_intents/{payment}/cancel",
                localstripe_url()
            ))
            .bearer_auth(localstripe::TEST_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(cancelled["status"], "canceled", "{cancelled}");
    }

    async fn done(self) {
        localstripe::disarm_eventbridge(&self.destination).await;
    }
}

/// The outcome of the last line logged.
fn last_outcome(logs: &Captured) -> (String, serde_json::Value) {
    let (_, outcome, _, fields) = outcome_lines(logs).pop().expect("an outcome line");
    (outcome, fields)
}

mod awaiting;
mod batches;
mod provider;
