//! # charge-once
//!
//! An AWS Lambda SQS consumer that charges each order **exactly once in effect**,
//! although SQS and SNS deliver at least once: an idempotent consumer backed by a
//! DynamoDB table of conditional writes, fenced leases and end-to-end provider
//! idempotency keys. How it works, and why each rule exists: `ARCHITECTURE.md`.
//!
//! ## Layout
//!
//! | module | owns |
//! | --- | --- |
//! | [`clock`] | "now": the clock type and the wall clock |
//! | [`deadline`] | the invocation's time: every margin before the deadline, one budget |
//! | [`config`] | every setting, typed and validated once at cold start |
//! | [`order`] | message parsing (raw / SNS / EventBridge), validation, fingerprint |
//! | [`idempotency`] | the policy: key, record, store contract, the table's write specification, the rules, the state machine and its driver, `resolve` (no AWS types) |
//! | [`retry`] | what happens to a record not acknowledged: its delay by cause, the DLQ at once, the breakers (no I/O) |
//! | [`queue`] | the queue contract (visibility, dead letters) and its SQS adapter |
//! | [`store`] | store adapters: DynamoDB (production), SQLite (local runs) |
//! | [`payment`] | the provider contract (charge path, listing), the Stripe-compatible HTTP client, the API key, the local simulator |
//! | [`batch`] | SQS batch → grouped, concurrent, settled (DLQ or delay), partial batch response |
//! | [`audit`] | the table held against the provider's charges: findings, the reads behind them, the scheduled audit in Lambda |
//! | [`wiring`] | the clients and parts both entry points build at start |
//! | [`sqlite_file`] | the SQLite file of local runs, shared by the local store and the simulator |
//! | [`tls`] | the TLS settings of both HTTPS clients (compiled-in roots and `AWS_CA_BUNDLE`) |
//! | [`sdk_http`] | the AWS SDK's HTTP client (reqwest on those TLS settings) |
//! | [`telemetry`] | logs; the metric names and their units |
//! | [`emf`] | metrics as EMF, one document per invocation (also concurrent ones) |
//! | [`crash_points`] | named steps where the pinned-crash test kills the process (feature `crash-points` only) |
//!
//! The binary (`main.rs`, `cli.rs`) parses its arguments and calls [`wiring`].

pub mod audit;
pub mod batch;
pub mod clock;
pub mod config;
pub mod crash_points;
pub mod deadline;
pub mod emf;
pub mod idempotency;
pub mod order;
pub mod outcomes;
pub mod payment;
pub mod queue;
pub mod retry;
pub mod sdk_http;
pub mod sqlite_file;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod wiring;

/// A boxed source error of an adapter, kept whole (never stringified).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error and all its sources on one line, `outer: inner: root`, for log fields.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some SDK errors repeat their source's text; say each thing once.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
