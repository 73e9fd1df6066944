//! Refunds as the library's second effect at a provider (`drivers/refund.rs`), on moto
//! and localstripe behind its layer: each order charged by charge-once's own record
//! path, then refunded through `effect::apply` under the refund's own key. A refund
//! delivered many times at once refunds once; a lost answer is found by its lookup
//! and recorded with the one refund; one above what remains is refused with its reason
//! and refunds nothing; one sent before its order's charge waits and refunds once the
//! order is charged; one of an order that ended unpaid is refused with its reason. A
//! refund the bank holds `pending` is awaited, and the scheduled settler completes it
//! or, when the bank fails it, ends it and reports it to the shop once. On this path
//! too, an open breaker stops every call and a spent budget every step.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use charge_once::adapters::payment_http::HttpProvider;
use charge_once::adapters::sqs::SqsReports;
use charge_once::config::Secret;
use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::order::Order;
use charge_once::domain::refund::{RefundReason, RefundRequest};
use charge_once::domain::{ForOrder, Identity, Key, OrderKey, State};
use charge_once::drivers::charge::{Charger, Settings};
use charge_once::drivers::refund::Refunds;
use charge_once::drivers::settle::{SettleRun, Settler};
use charge_once::policy::outcome::Outcome;
use harness::localstripe::{self, Card, Fault, Payer, TEST_KEY};
use harness::servers::{Backend, Table};
use idempotent_consumer::clock::{self, Time};
use idempotent_consumer::effect::{self, Traced};
use idempotent_consumer::executor::{Executor, Safeguards};
use idempotent_consumer::machine::{End, Shared};
use serde_json::Value;

/// Each provider call's bound: generous, so a loaded machine's slow answer is not read
/// as a lost one.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

struct Rig {
    table: Table,
    provider: Arc<HttpProvider>,
    settings: Settings,
    refunds: Refunds,
    observe: Traced<charge_once::drivers::refund::RefundFailure>,
}

async fn rig() -> Rig {
    let table = Backend::Moto.fresh_table().await;
    let provider = Arc::new(
        HttpProvider::new(
            harness::servers::localstripe_url(),
            &Secret::new(TEST_KEY.to_owned()),
            CALL_TIMEOUT,
            &harness::tls(),
        )
        .unwrap(),
    );
    let settings = harness::rig::settler_settings(
        clock::system(),
        Duration::from_secs(90 * 24 * 3600),
        CALL_TIMEOUT,
    );
    let refunds = Refunds::new(provider.clone(), table.store.clone(), settings.max_declines);
    Rig {
        table,
        provider,
        settings,
        refunds,
        observe: Traced::default(),
    }
}

fn deadline() -> Time {
    Time::from_ms(clock::wall_ms()) + Duration::from_secs(60)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

impl Rig {
    /// One delivery of `order` through charge-once's record path.
    async fn charge(&self, order: &Order) -> Outcome {
        Charger {
            store: self.table.store.as_ref(),
            provider: self.provider.as_ref(),
            settings: &self.settings,
        }
        .process(order, &Identity::for_order(order), deadline())
        .await
    }

    /// One delivery of `request` through the library's effect loop.
    async fn refund(
        &self,
        request: &RefundRequest,
    ) -> End<Shared<charge_once::drivers::refund::RefundFailure>> {
        let executor = Executor::new(
            Safeguards {
                clock: self.settings.clock.clone(),
                budget: self.settings.budget,
                breakers: self.settings.breakers.clone(),
            },
            &self.observe,
            deadline(),
        );
        apply_under(self, request, executor)
            .await
            .expect("the breakers are closed")
    }

    /// `request`'s record, which must exist.
    async fn record_of(&self, request: &RefundRequest) -> charge_once::domain::Record {
        let key = request.identity().key;
        self.table
            .store
            .get(&key)
            .await
            .unwrap()
            .expect("its record")
    }

    /// The PaymentIntent `order` was charged with, as its record holds it.
    async fn payment_of(&self, order: &Order) -> String {
        let record = self.table.store.get(&Key::for_order_id(order.id())).await;
        let record = record.unwrap().expect("the order's record");
        assert_eq!(record.state, State::Done, "{record:?}");
        record.receipt.expect("a receipt")
    }
}

/// A new payer's order of `amount`, charged through the record path.
async fn charged_order(rig: &Rig, amount: u64) -> Order {
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, amount);
    let outcome = rig.charge(&order).await;
    assert!(matches!(outcome, Outcome::Charged { .. }), "{outcome:?}");
    order
}

fn order_of(payer: &Payer, amount: u64) -> Order {
    Order::new(&unique("ord"), amount, "eur", &payer.customer, &payer.card).unwrap()
}

fn request(order: &Order, amount: Option<u64>) -> RefundRequest {
    RefundRequest::new(
        &unique("ref"),
        order.id(),
        amount,
        Some(RefundReason::RequestedByCustomer),
    )
    .unwrap()
}

/// The refunds of `request` at the provider (`metadata[refund_id]`).
fn of_request<'a>(refunds: &'a [Value], request: &RefundRequest) -> Vec<&'a Value> {
    refunds
        .iter()
        .filter(|r| r["metadata"]["refund_id"] == request.id())
        .collect()
}

#[tokio::test]
async fn a_refund_delivered_many_times_at_once_refunds_its_order_once() {
    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let request = request(&order, Some(400));
    let ends = futures::future::join_all((0..6).map(|_| rig.refund(&request))).await;
    let done = ends
        .iter()
        .filter(|e| matches!(e, End::Done { found: false, .. }))
        .count();
    assert_eq!(done, 1, "one delivery refunds: {ends:?}");
    assert!(
        ends.iter().all(|e| matches!(
            e,
            End::Done { .. } | End::InProgress { .. } | End::Duplicate { .. }
        )),
        "{ends:?}"
    );
    let again = rig.refund(&request).await;
    assert!(matches!(again, End::Duplicate { .. }), "{again:?}");

    let payment = rig.payment_of(&order).await;
    let refunds = localstripe::refunds_of(&payment).await;
    assert_eq!(refunds.len(), 1, "{refunds:?}");
    assert_eq!(refunds[0]["amount"], 400);
    assert_eq!(refunds[0]["reason"], "requested_by_customer");
    assert_eq!(refunds[0]["metadata"]["order_id"], order.id());
    let record = rig.record_of(&request).await;
    assert_eq!(record.state, State::Done);
    assert_eq!(record.receipt.as_deref(), refunds[0]["id"].as_str());

    // The operator's view of it: `inspect --refund`, which calls no provider.
    let mut inspect = std::process::Command::new(env!("CARGO_BIN_EXE_charge-once"));
    inspect.args(["inspect", "--refund", request.id()]);
    harness::servers::cli_on_moto_and_localstripe(&mut inspect, &rig.table.name, "sk_test_inspect");
    let out = inspect.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        shown["record"]["pk"],
        format!("reembolso#{}", request.id()),
        "{shown}"
    );
    assert_eq!(
        shown["record"]["recibo"].as_str(),
        refunds[0]["id"].as_str(),
        "{shown}"
    );
}

#[tokio::test]
async fn a_refund_whose_answer_was_lost_is_found_by_its_lookup_and_recorded_with_the_one_refund() {
    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let request = request(&order, None);
    // The refund is made, but its answer is a 500 stored under the key: the replay
    // under the same key gets it again, and only the lookup can say what happened.
    let key = format!("{}#1", request.identity().key.as_str());
    localstripe::arm_fault(
        &key,
        Fault::ServerErrorRollsForward {
            after: Duration::ZERO,
        },
    )
    .await;
    let end = rig.refund(&request).await;
    let End::Done {
        receipt,
        found: true,
        attempt: 1,
    } = end
    else {
        panic!("found by the lookup: {end:?}");
    };
    let refunds = localstripe::refunds_of(&rig.payment_of(&order).await).await;
    let mine = of_request(&refunds, &request);
    assert_eq!(mine.len(), 1, "one refund: {refunds:?}");
    assert_eq!(mine[0]["id"].as_str(), Some(receipt.id.as_str()));
    assert_eq!(mine[0]["amount"], 1000, "the rest of the order");
    let again = rig.refund(&request).await;
    assert!(matches!(again, End::Duplicate { .. }), "{again:?}");
}

#[tokio::test]
async fn a_refund_above_what_remains_is_refused_with_its_reason_and_refunds_nothing() {
    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let first = request(&order, Some(700));
    assert!(matches!(rig.refund(&first).await, End::Done { .. }));
    let over = request(&order, Some(400));
    let end = rig.refund(&over).await;
    let End::RefusedForGood { failure, .. } = &end else {
        panic!("refused: {end:?}");
    };
    let reason = charge_once::error_chain(failure);
    assert!(reason.contains("400"), "{reason}");
    let refunds = localstripe::refunds_of(&rig.payment_of(&order).await).await;
    assert_eq!(refunds.len(), 1, "only the first: {refunds:?}");
    assert!(of_request(&refunds, &over).is_empty());
}

#[tokio::test]
async fn a_refund_sent_before_its_orders_charge_waits_and_refunds_once_the_order_is_charged() {
    let rig = rig().await;
    let payer = localstripe::payer(Card::Visa).await;
    let order = order_of(&payer, 800);
    let request = request(&order, Some(300));
    let early = rig.refund(&request).await;
    assert!(matches!(early, End::Retry { .. }), "it waits: {early:?}");
    let sent = localstripe::requests_seen(Some("/v1/refunds")).await;
    assert!(
        sent.iter().all(|r| r
            .idempotency_key
            .as_deref()
            .is_none_or(|k| !k.starts_with(request.identity().key.as_str()))),
        "nothing sent before the charge: {sent:?}"
    );

    assert!(matches!(rig.charge(&order).await, Outcome::Charged { .. }));
    let end = rig.refund(&request).await;
    assert!(matches!(end, End::Done { found: false, .. }), "{end:?}");
    let refunds = localstripe::refunds_of(&rig.payment_of(&order).await).await;
    assert_eq!(of_request(&refunds, &request).len(), 1, "{refunds:?}");
}

#[tokio::test]
async fn a_refund_of_an_order_declined_until_its_limit_is_refused_with_its_reason() {
    let rig = rig().await;
    let payer = localstripe::payer(Card::DeclinesOnCharge).await;
    let order = order_of(&payer, 500);
    for _ in 0..rig.settings.max_declines {
        let outcome = rig.charge(&order).await;
        assert!(matches!(outcome, Outcome::Declined { .. }), "{outcome:?}");
    }
    let request = request(&order, None);
    let end = rig.refund(&request).await;
    let End::RefusedForGood { failure, .. } = &end else {
        panic!("refused: {end:?}");
    };
    let reason = charge_once::error_chain(failure);
    assert!(
        reason.contains("ended without payment") && reason.contains("declined 3 times"),
        "{reason}"
    );
}

/// A refund request's body as the refunds queue carries it.
fn body_of(request: &RefundRequest) -> String {
    let mut body = serde_json::json!({"id": request.id(), "order_id": request.order_id()});
    if let Some(amount) = request.amount() {
        body["amount"] = amount.into();
    }
    if let Some(reason) = request.reason() {
        body["reason"] = reason.as_str().into();
    }
    body.to_string()
}

#[tokio::test]
async fn the_refund_function_refunds_a_batch_once_and_dead_letters_what_no_retry_fixes() {
    use harness::event_source::Queues;
    use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};

    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let refund = request(&order, Some(300));
    let over = request(&order, Some(900));
    let sns_copy = serde_json::json!({"Type": "Notification", "Message": body_of(&refund)});
    let bodies = [
        body_of(&refund),
        sns_copy.to_string(),
        body_of(&over),
        r#"{"id": "ref-x", "order_id": "ord-x", "amount": 12.5}"#.to_owned(),
    ];
    let event = harness::rig::batch_of(&bodies);
    let ids: Vec<String> = event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();

    let queues = Queues::create(Duration::from_secs(30), 5).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("refund.log");
    let runtime = RuntimeApi::start().await;
    let endpoints = Endpoints {
        dynamodb: Backend::Moto.url().to_owned(),
        payment: harness::servers::localstripe_url().to_owned(),
        table: rig.table.name.clone(),
        sqs: Backend::Moto.url().to_owned(),
        dead_letter_queue: queues.dlq_url.clone(),
    };
    let mut process = ConsumerProcess::launch(
        env!("CARGO_BIN_EXE_charge-once").as_ref(),
        &runtime,
        &endpoints,
        Launch {
            env: vec![("CHARGE_ONCE_FUNCTION", "refund".to_owned())],
            ..Launch::logging_to(log.clone())
        },
    );
    let reply = runtime
        .invoke(
            serde_json::to_string(&event).unwrap(),
            Duration::from_secs(30),
        )
        .await;
    process.stop();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let Reply::Response(response) = reply else {
        panic!("{reply:?}: {logged}");
    };
    let response: Value = serde_json::from_slice(&response).unwrap();
    assert_eq!(
        response["batchItemFailures"],
        serde_json::json!([]),
        "every record ends: {response}\n{logged}"
    );

    let payment = rig.payment_of(&order).await;
    let refunds = localstripe::refunds_of(&payment).await;
    assert_eq!(of_request(&refunds, &refund).len(), 1, "{refunds:?}");
    assert!(of_request(&refunds, &over).is_empty(), "{refunds:?}");
    assert_eq!(refunds.len(), 1, "{refunds:?}");

    let dead = queues
        .client
        .receive_message()
        .queue_url(&queues.dlq_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let mut notes: Vec<(String, Value)> = dead
        .messages()
        .iter()
        .map(|m| {
            let note = m.message_attributes().unwrap()
                [charge_once::contracts::queue::NOTE_ATTRIBUTE]
                .string_value()
                .unwrap();
            (
                m.body().unwrap().to_owned(),
                serde_json::from_str(note).unwrap(),
            )
        })
        .collect();
    notes.sort_by_key(|(_, note)| note["message_id"].as_str().unwrap().to_owned());
    assert_eq!(notes.len(), 2, "{notes:?}\n{logged}");
    let note_of = |id: &str| {
        notes
            .iter()
            .find(|(_, note)| note["message_id"] == id)
            .unwrap_or_else(|| panic!("no dead letter for {id}: {notes:?}"))
    };
    let (body, note) = note_of(&ids[2]);
    assert_eq!(body, &bodies[2], "the message as it came");
    assert_eq!(note["outcome"], "refused", "{note}");
    assert!(note["reason"].as_str().unwrap().contains("400"), "{note}");
    let (_, note) = note_of(&ids[3]);
    assert_eq!(note["outcome"], "invalid", "{note}");
    assert!(
        note["reason"].as_str().unwrap().contains("field `amount`"),
        "{note}"
    );
}

/// A refund of `order` the bank holds `pending`: its request, and the refund.
async fn pending_refund(rig: &Rig, order: &Order) -> (RefundRequest, String) {
    let request = request(order, Some(250));
    localstripe::pend_refund(&format!("{}#1", request.identity().key.as_str())).await;
    let end = rig.refund(&request).await;
    assert!(matches!(end, End::Awaiting { .. }), "awaited: {end:?}");
    let record = rig.record_of(&request).await;
    assert_eq!(record.state, State::Awaiting, "{record:?}");
    let refund = record.awaited.clone().expect("it names its refund");
    assert!(refund.starts_with("re_"), "{record:?}");
    (request, refund)
}

/// The scheduled settler over the run's table, reporting to `reports`.
async fn settle(rig: &Rig, reports: &dyn charge_once::contracts::queue::Reports) -> SettleRun {
    Settler {
        store: rig.table.store.as_ref(),
        provider: rig.provider.as_ref(),
        refunds: Some(rig.provider.as_ref()),
        reports,
        settings: &rig.settings,
        // Room for a record's longest settlement at CALL_TIMEOUT a call.
        time: Duration::from_secs(300),
        limit: 100,
        per_run: usize::MAX,
    }
    .run()
    .await
    .unwrap()
}

/// A report queue on moto: its queues, its URL, and the reports sent to it.
async fn report_queue() -> (harness::event_source::Queues, String, SqsReports) {
    let queues = harness::event_source::Queues::create(Duration::from_secs(30), 5).await;
    let url = queues.create_report_queue().await;
    let reports = SqsReports::new(queues.client.clone(), &url);
    (queues, url, reports)
}

#[tokio::test]
async fn a_refund_the_bank_fails_after_pending_is_reported_once_and_its_record_ends() {
    let rig = rig().await;
    let (queues, report_queue, reports) = report_queue().await;
    let order = charged_order(&rig, 1000).await;
    let (request, refund) = pending_refund(&rig, &order).await;

    // Pending at the bank: nothing ends, a copy of the request is acknowledged.
    let first = settle(&rig, &reports).await;
    assert_eq!(
        (first.waiting, first.ended, first.failed),
        (1, 0, 0),
        "{first:?}"
    );
    let copy = rig.refund(&request).await;
    assert!(matches!(copy, End::AlreadyAwaiting { .. }), "{copy:?}");

    localstripe::settle_refund(&refund, Err("lost_or_stolen_card")).await;
    let second = settle(&rig, &reports).await;
    assert_eq!((second.ended, second.failed), (1, 0), "{second:?}");
    let again = settle(&rig, &reports).await;
    assert_eq!(again.read, 0, "nothing awaits any more: {again:?}");

    let reported = queues.drain_reports(&report_queue).await;
    assert_eq!(reported.len(), 1, "once: {reported:?}");
    assert_eq!(reported[0]["outcome"], "refund_failed");
    assert_eq!(reported[0]["refund_id"], request.id());
    assert_eq!(reported[0]["order_id"], order.id());
    assert_eq!(reported[0]["refund"], refund.as_str());
    assert_eq!(reported[0]["reason"], "lost_or_stolen_card");
    let record = rig.record_of(&request).await;
    assert_eq!(record.state, State::Failed, "{record:?}");

    // The failed refund returned nothing: the request sent again is a new attempt,
    // and the customer is refunded once in all.
    let again = rig.refund(&request).await;
    assert!(matches!(again, End::Done { attempt: 2, .. }), "{again:?}");
    let refunds = localstripe::refunds_of(&rig.payment_of(&order).await).await;
    let statuses: Vec<&str> = of_request(&refunds, &request)
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == "succeeded").count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.len(),
        2,
        "the failed one and the one made: {statuses:?}"
    );
}

#[tokio::test]
async fn a_pending_refund_the_bank_makes_completes_its_record_with_no_report() {
    let rig = rig().await;
    let (queues, report_queue, reports) = report_queue().await;
    let order = charged_order(&rig, 1000).await;
    let (request, refund) = pending_refund(&rig, &order).await;
    localstripe::settle_refund(&refund, Ok(())).await;
    let run = settle(&rig, &reports).await;
    assert_eq!((run.completed, run.failed), (1, 0), "{run:?}");
    let record = rig.record_of(&request).await;
    assert_eq!(record.state, State::Done, "{record:?}");
    assert_eq!(record.receipt.as_deref(), Some(refund.as_str()));
    assert!(queues.drain_reports(&report_queue).await.is_empty());
    let copy = rig.refund(&request).await;
    assert!(matches!(copy, End::Duplicate { .. }), "{copy:?}");
}

/// One delivery of `request` under `executor`'s safeguards.
async fn apply_under(
    rig: &Rig,
    request: &RefundRequest,
    executor: Executor<'_, Traced<charge_once::drivers::refund::RefundFailure>>,
) -> Result<
    End<Shared<charge_once::drivers::refund::RefundFailure>>,
    idempotent_consumer::executor::Closed,
> {
    effect::apply(
        &rig.refunds,
        rig.table.store.as_ref(),
        &executor,
        &rig.settings.policy(),
        request,
        &request.identity(),
    )
    .await
}

/// `request`'s record, and the refund requests sent under its keys.
async fn what_was_done(rig: &Rig, request: &RefundRequest) -> (Option<String>, usize) {
    let key = request.identity().key;
    let record = rig.table.store.get(&key).await.unwrap();
    let sent = localstripe::requests_seen(Some("/v1/refunds")).await;
    let sent = sent
        .iter()
        .filter(|r| {
            r.idempotency_key
                .as_deref()
                .is_some_and(|k| k.starts_with(key.as_str()))
        })
        .count();
    (record.map(|r| format!("{r:?}")), sent)
}

#[tokio::test]
async fn on_the_refund_path_an_open_breaker_stops_every_call_and_a_spent_budget_every_step() {
    use idempotent_consumer::breaker::{Breakers, Dependency};

    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let request = request(&order, Some(100));

    // The provider's breaker open (one failure is its threshold here).
    let breakers = Arc::new(Breakers::new(
        1,
        Duration::from_secs(30),
        Duration::from_secs(900),
    ));
    breakers.provider.failure(Time::from_ms(clock::wall_ms()));
    let open = Safeguards {
        clock: rig.settings.clock.clone(),
        budget: rig.settings.budget,
        breakers,
    };
    let closed = apply_under(
        &rig,
        &request,
        Executor::new(open, &rig.observe, deadline()),
    )
    .await;
    assert!(
        matches!(&closed, Err(c) if c.dependency == Dependency::Provider),
        "{closed:?}"
    );
    assert_eq!(
        what_was_done(&rig, &request).await,
        (None, 0),
        "nothing written or asked"
    );

    // The invocation's time spent: no step starts.
    let spent = Safeguards {
        clock: rig.settings.clock.clone(),
        budget: rig.settings.budget,
        breakers: rig.settings.breakers.clone(),
    };
    let now = Time::from_ms(clock::wall_ms());
    let end = apply_under(&rig, &request, Executor::new(spent, &rig.observe, now)).await;
    assert!(matches!(end, Ok(End::Deadline { .. })), "{end:?}");
    assert_eq!(
        what_was_done(&rig, &request).await,
        (None, 0),
        "nothing written or asked"
    );
}

#[tokio::test]
async fn the_audit_finds_a_request_refunded_twice_and_a_refund_no_record_names() {
    use charge_once::drivers::audit::{self, Window};
    use charge_once::policy::audit::Kind;

    let rig = rig().await;
    let started = Time::from_ms(clock::wall_ms()) - Duration::from_secs(60);
    let order = charged_order(&rig, 1000).await;
    let request = request(&order, Some(300));
    assert!(matches!(rig.refund(&request).await, End::Done { .. }));
    let payment = rig.payment_of(&order).await;
    // Outside the consumer: a second refund for the same request, and one for a
    // request no record holds.
    for refund_id in [request.id(), "ref-ghost"] {
        let (status, made) = localstripe::refund_directly(&[
            ("payment_intent", &payment),
            ("amount", "100"),
            ("metadata[refund_id]", refund_id),
            ("metadata[order_id]", order.id()),
        ])
        .await;
        assert_eq!(status, 200, "{made}");
    }
    let window = Window {
        now: Time::from_ms(clock::wall_ms()),
        since: started,
        // Every refund is old enough to have been recorded.
        stuck_after: Duration::ZERO,
    };
    let report = audit::audit(
        rig.table.store.as_ref(),
        rig.provider.as_ref(),
        Some(rig.provider.as_ref()),
        window,
    )
    .await
    .unwrap();
    // Other tests refund at the same provider: this order's findings only.
    let mine: Vec<(Kind, String)> = report
        .findings
        .iter()
        .filter(|f| f.order_id == order.id())
        .map(|f| {
            (
                f.kind,
                f.evidence["refund_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        mine,
        [
            (Kind::DoubleRefund, request.id().to_owned()),
            (Kind::RefundNotRecorded, "ref-ghost".to_owned()),
        ],
        "{:?}",
        report.findings
    );
}

/// `charge-once resolve-refund <args>` on the rig's table and the layer: its one line.
fn resolve_refund(rig: &Rig, args: &[&str]) -> Value {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_charge-once"));
    command.arg("resolve-refund").args(args);
    harness::servers::cli_on_moto_and_localstripe(&mut command, &rig.table.name, TEST_KEY);
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn resolve_refund_moves_a_refund_stripe_never_made_to_its_next_key_and_then_leaves_it_done() {
    let rig = rig().await;
    let order = charged_order(&rig, 1000).await;
    let request = request(&order, Some(300));
    // A 500 stored under the key, and no refund made: the lookup finds nothing, but a
    // stored 500 may still roll forward, so the consumer keeps the key.
    let key = format!("{}#1", request.identity().key.as_str());
    localstripe::arm_fault(&key, Fault::ServerError).await;
    let end = rig.refund(&request).await;
    assert!(matches!(end, End::Retry { .. }), "{end:?}");
    let record = rig.record_of(&request).await;
    assert_eq!((record.state, record.attempt), (State::Free, Some(1)));

    // A person, sure of it, resolves: the provider has no refund of it.
    let args = [
        request.id(),
        "--order",
        order.id(),
        "--amount",
        "300",
        "--reason",
        "requested_by_customer",
    ];
    let resolved = resolve_refund(&rig, &args);
    assert_eq!(resolved["refund_id"], request.id(), "{resolved}");
    assert_eq!(resolved["resolution"], "released", "{resolved}");
    assert_eq!(resolved["next_attempt"], 2, "{resolved}");

    let end = rig.refund(&request).await;
    assert!(matches!(end, End::Done { attempt: 2, .. }), "{end:?}");
    let refunds = localstripe::refunds_of(&rig.payment_of(&order).await).await;
    assert_eq!(of_request(&refunds, &request).len(), 1, "{refunds:?}");
    let again = resolve_refund(&rig, &args);
    assert_eq!(again["resolution"], "already_done", "{again}");
}
