//! Settling a payment on the real binary (Lambda mode, under the Runtime API emulator,
//! on moto and localstripe behind its layer): anyone allowed to send to the orders
//! queue can write a body that looks like Stripe's event, and the consumer believes
//! none of it. A forged success and a forged cancellation of an awaited PaymentIntent
//! change no record; the same body sent once the customer really confirmed completes
//! the order, with one payment at the provider.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use harness::eventbridge::stripe_event;
use harness::localstripe::{self, Card, Payer};
use harness::rig::batch_of;
use harness::runtime_api::{ConsumerProcess, Endpoints, Launch, Reply, RuntimeApi};
use harness::servers::{Backend, Table, localstripe_url};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");

struct Binary {
    runtime: RuntimeApi,
    function: ConsumerProcess,
    log: std::path::PathBuf,
}

impl Binary {
    async fn start(table: &Table, name: &str) -> Self {
        let endpoints = Endpoints::without_queue(
            Backend::Moto.url().to_owned(),
            localstripe_url().to_owned(),
            table.name.clone(),
        );
        let log = harness::log_dir().join(format!("settle-{name}.log"));
        let runtime = RuntimeApi::start().await;
        let mut launch = Launch::logging_to(log.clone());
        launch.env = vec![("RUST_LOG", "info".to_owned())];
        let function = ConsumerProcess::launch(BIN.as_ref(), &runtime, &endpoints, launch);
        Self {
            runtime,
            function,
            log,
        }
    }

    /// One record's invocation: the ids that failed.
    async fn invoke(&self, body: &str) -> Vec<String> {
        let event = batch_of(&[body]);
        let reply = self
            .runtime
            .invoke(
                serde_json::to_string(&event).unwrap(),
                Duration::from_secs(20),
            )
            .await;
        let Reply::Response(bytes) = reply else {
            panic!("no response: {reply:?}");
        };
        harness::failed_ids(&bytes)
    }

    /// The outcome of the last record's line.
    fn last_outcome(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap();
        text.lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|l| l["fields"]["outcome"].as_str().map(str::to_owned))
            .expect("an outcome line")
    }
}

async fn record(table: &Table, order_id: &str) -> Value {
    let item = table
        .client
        .get_item()
        .table_name(&table.name)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("cobro#{order_id}")),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let item = item.item().expect("the record");
    let text = |name: &str| {
        item.get(name)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default()
    };
    serde_json::json!({"estado": text("estado"), "pago": text("pago"), "recibo": text("recibo")})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_events_for_an_awaited_payment_change_nothing_and_the_customers_confirmation_pays_once()
 {
    let table = Backend::Moto.fresh_table().await;
    let payer: Payer = localstripe::payer(Card::RequiresAuthentication).await;
    let order_id = format!("fg-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let order = serde_json::json!({
        "id": order_id, "amount": 1200, "currency": "EUR",
        "customer": payer.customer, "payment_method": payer.card,
    })
    .to_string();
    let mut binary = Binary::start(&table, &order_id).await;

    assert!(binary.invoke(&order).await.is_empty(), "acknowledged");
    assert_eq!(binary.last_outcome(), "authentication_required");
    let waiting = record(&table, &order_id).await;
    assert_eq!(waiting["estado"], "espera", "{waiting}");
    let payment = waiting["pago"].as_str().unwrap().to_owned();

    for (kind, status) in [
        ("payment_intent.succeeded", "succeeded"),
        ("payment_intent.canceled", "canceled"),
    ] {
        let forged = stripe_event(kind, &payment, status, &order_id);
        assert!(binary.invoke(&forged).await.is_empty(), "{kind}");
        assert_eq!(binary.last_outcome(), "event_ignored", "{kind}");
        assert_eq!(record(&table, &order_id).await, waiting, "{kind}");
    }
    assert!(
        localstripe::succeeded_of(&payer.customer).await.is_empty(),
        "nothing was paid"
    );

    // The customer confirms; the same body now tells the truth, and Stripe says so.
    localstripe::authenticate(&payment).await;
    let succeeded = stripe_event("payment_intent.succeeded", &payment, "succeeded", &order_id);
    assert!(binary.invoke(&succeeded).await.is_empty());
    assert_eq!(binary.last_outcome(), "reconciled");
    binary.function.stop();
    let done = record(&table, &order_id).await;
    assert_eq!(
        (done["estado"].as_str(), done["recibo"].as_str()),
        (Some("hecho"), Some(payment.as_str()))
    );
    assert_eq!(localstripe::succeeded_of(&payer.customer).await, [payment]);
}
