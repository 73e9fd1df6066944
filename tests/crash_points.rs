//! Crashes pinned to named steps of the real binary: the process (Lambda mode, under
//! the Runtime API emulator, on moto and localstripe) is SIGKILLed exactly
//! after the reserve, after the charge request reached the provider, after the charge
//! answered, and after `complete`; the message is then redelivered to a fresh process
//! and must settle with exactly one PaymentIntent, succeeded.
//!
//! Needs the `crash-points` feature (`make test` builds every test with it:
//! `cargo test --features charge-once/crash-points`); no shipped build has it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use charge_once::domain::OrderKey;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use charge_once::contracts::store::IdempotencyStore;
use charge_once::domain::{Key, State};
use harness::localstripe::{self, Card};
use harness::rig::single_event_with_body;
use harness::runtime_api::{Endpoints, Reply, RuntimeApi, lambda_environment};
use harness::servers::Backend;

/// The first invocation's deadline: its lease ends there, and SQS redelivers later.
const FIRST_INVOCATION: Duration = Duration::from_secs(5);

/// The real binary on `runtime`, stopping at `crash_at` if given; returns the process
/// and a channel that receives the crash point's line.
fn spawn(
    runtime: &RuntimeApi,
    endpoints: &Endpoints,
    crash_at: Option<&str>,
) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_charge-once"));
    lambda_environment(&mut command, &runtime.addr, endpoints)
        .env("DEADLINE_MARGIN", "1500ms")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(point) = crash_at {
        command.env("CHARGE_ONCE_CRASH_AT", point);
    }
    let mut child = command.spawn().expect("spawn charge-once");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("crash-point ") {
                let _ = tx.send(line);
            }
        }
    });
    (child, rx)
}

async fn killed_at_then_redelivered_charges_once(point: &'static str) {
    let table = Backend::Moto.fresh_table().await;
    let payer = localstripe::payer(Card::Visa).await;
    let customer = payer.customer.clone();
    let order_id = format!("ord-{}", uuid::Uuid::new_v4().simple());
    let body = serde_json::json!({
        "id": order_id, "amount": 4100, "currency": "EUR", "customer": customer,
        "payment_method": payer.card
    })
    .to_string();
    let event = serde_json::to_string(&single_event_with_body(&body)).unwrap();
    let endpoints = Endpoints::without_queue(
        Backend::Moto.url().to_owned(),
        harness::servers::localstripe_url().to_owned(),
        table.name.clone(),
    );
    let runtime = RuntimeApi::start().await;

    let (mut doomed, marker) = spawn(&runtime, &endpoints, Some(point));
    let kill = async {
        let line =
            tokio::task::spawn_blocking(move || marker.recv_timeout(Duration::from_secs(20)))
                .await
                .unwrap();
        doomed.kill().unwrap(); // SIGKILL
        doomed.wait().unwrap();
        line
    };
    let (reply, line) = tokio::join!(runtime.invoke(event.clone(), FIRST_INVOCATION), kill);
    assert_eq!(
        line.as_deref(),
        Ok(format!("crash-point {point}").as_str()),
        "the process never reached {point}"
    );
    assert!(matches!(reply, Reply::Timeout), "{point}: {reply:?}");
    let charged_before = localstripe::succeeded_of(&customer).await.len();
    let expected_before = usize::from(point != "after-reserve");
    assert_eq!(
        charged_before, expected_before,
        "{point}: charges when killed"
    );

    // The visibility timeout passed (and the dead invocation's lease with it): SQS
    // delivers the same message to a fresh process.
    let (mut fresh, _) = spawn(&runtime, &endpoints, None);
    let reply = runtime.invoke(event, Duration::from_secs(10)).await;
    fresh.kill().unwrap();
    fresh.wait().unwrap();
    let Reply::Response(bytes) = reply else {
        panic!("{point}: the redelivery got no response: {reply:?}");
    };
    let response: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        response["batchItemFailures"],
        serde_json::json!([]),
        "{point}: the redelivery settles"
    );
    let charges = localstripe::succeeded_of(&customer).await;
    assert_eq!(charges.len(), 1, "{point}: one charge for the order");
    assert_eq!(
        localstripe::payment_intents_of(&customer).await.len(),
        1,
        "{point}: one PaymentIntent for the order"
    );
    let record = table
        .store
        .get(&Key::for_order_id(&order_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, State::Done, "{point}");
    assert_eq!(
        record.receipt.as_deref(),
        Some(charges[0].as_str()),
        "{point}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_reserve_the_redelivery_takes_over_and_charges_once() {
    killed_at_then_redelivered_charges_once("after-reserve").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_charge_request_reached_the_provider_the_redelivery_replays_the_key() {
    killed_at_then_redelivered_charges_once("charge-sent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_charge_answered_the_redelivery_replays_the_key() {
    killed_at_then_redelivered_charges_once("after-charge").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_complete_the_redelivery_is_a_duplicate() {
    killed_at_then_redelivered_charges_once("after-complete").await;
}
