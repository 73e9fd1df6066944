//! # charge-once
//!
//! An AWS Lambda SQS consumer that charges each order **exactly once in effect**,
//! although SQS and SNS deliver at least once: an idempotent consumer backed by a
//! DynamoDB table of conditional writes, fenced leases and end-to-end provider
//! idempotency keys. How it works, and why each rule exists: `ARCHITECTURE.md`.
//!
//! ## Layout
//!
//! The folders are the layers, each importing only those below it:
//!
//! | module | owns |
//! | --- | --- |
//! | [`domain`] | the words every layer shares: time, the order, its key, fingerprint and record |
//! | [`contracts`] | the ports: the idempotency table (and its stored format), the payment provider, the queue |
//! | [`policy`] | every decision, pure: outcomes, the table's write specification, the state machines, the deadline budget, retries and breakers, the batch's plan, the audit's findings |
//! | [`drivers`] | run the policy through the contracts: one record, the batch, `resolve`, the audit |
//! | [`adapters`] | I/O only: DynamoDB, SQLite, the HTTP provider and the simulator, SQS, TLS, EMF |
//! | [`config`], [`wiring`], [`telemetry`] | cold start: every setting validated once; the clients and parts both entry points build; logs and metric units |
//! | [`audit_lambda`] | the scheduled audit's entry in Lambda, beside `main.rs`'s consumer loop |
//! | [`crash_points`] | named steps where the pinned-crash test kills the process (feature `crash-points` only) |
//!
//! The binary (`main.rs`, `cli.rs`) parses its arguments and calls [`wiring`].

pub mod adapters;
pub mod audit_lambda;
pub mod config;
pub mod contracts;
pub mod crash_points;
pub mod domain;
pub mod drivers;
pub mod policy;
pub mod telemetry;
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
