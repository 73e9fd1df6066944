//! The test harness of charge-once, a dev-only crate compiled once for every test
//! binary and for `make bench`. One module per part:
//!
//! | module | part |
//! | --- | --- |
//! | [`audit`] | the audit's tamper-one-way-at-a-time scenario, the same on every pair of real parts |
//! | [`capacity`] | DynamoDB's item-size rules: item size, write and read units, storage |
//! | [`servers`] | moto (behind a one-lock wrapper), dynalite, stripe-stateful-mock, localstripe (behind its layer); a fresh table |
//! | [`clock`] | a clock the test moves by hand |
//! | [`rig`] | the real `Consumer` on a fresh table, with injectable store faults |
//! | [`provider`] | an in-process payment provider that behaves like a real one |
//! | [`stripe`] | stripe-stateful-mock's test key and customers, the layer's reference |
//! | [`localstripe`] | customers, test cards, PaymentIntents and authentication at localstripe |
//! | [`runtime_api`] | the Lambda Runtime API emulator and the real binary under it |
//! | [`proxy`] | fault and latency proxies |
//! | [`lease`] | leases taken outside the consumer under test (another invocation, one that died) |
//! | [`event_source`] | the SQS event source mapping emulator |
//! | [`eventbridge`] | Stripe's event destination on moto: the partner bus, the rule to the orders queue, the layer armed |
//! | [`producer`] | the system test's producers and the PaymentIntents to check against |
//! | [`logs`] | captured log lines |
//! | [`otlp`] | an OTLP/HTTP receiver of traces |
//! | [`docs`] | the shell commands the docs show, and a shell that runs them on moto |

#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness fails loudly by design

pub mod audit;
pub mod capacity;
pub mod clock;
pub mod docs;
pub mod event_source;
pub mod eventbridge;
pub mod lease;
pub mod localstripe;
pub mod logs;
pub mod otlp;
pub mod producer;
pub mod provider;
pub mod proxy;
pub mod rig;
pub mod runtime_api;
pub mod servers;
pub mod stripe;

use std::path::{Path, PathBuf};

/// The product's TLS settings without `AWS_CA_BUNDLE`: Mozilla's roots.
pub fn tls() -> charge_once::adapters::tls::Tls {
    charge_once::adapters::tls::Tls::new(None).unwrap()
}

/// The product's AWS SDK HTTP client, for the harness's own SDK clients.
pub fn sdk_http_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    charge_once::adapters::sdk_http::client(&tls())
}

/// An HTTP client for the harness's own calls (the mock, the proxies): plain HTTP on
/// loopback, with the product's TLS settings only because reqwest builds them anyway
/// (the product's reqwest has no default crypto provider: see `charge_once::adapters::tls`).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls().client_config())
        .build()
        .unwrap()
}

/// The failed message ids of an `SQSBatchResponse` (the whole of `invoke`'s stdout).
pub fn failed_ids(response: &[u8]) -> Vec<String> {
    let response: serde_json::Value =
        serde_json::from_slice(response).expect("stdout is only the response JSON");
    response["batchItemFailures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

/// The charge-once checkout (this crate lives in `harness/`).
pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Where the system test and the bench write their processes' logs.
pub fn log_dir() -> PathBuf {
    let dir = root().join("target/system-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
