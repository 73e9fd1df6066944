//! # charge-once
//!
//! An AWS Lambda SQS consumer that charges each order **exactly once in effect**,
//! although SQS and SNS deliver at least once: an idempotent consumer backed by a
//! DynamoDB table of conditional writes, fenced leases and end-to-end provider
//! idempotency keys. How it works, and why each rule exists: `ARCHITECTURE.md`.
//!
//! ## Layout
//!
//! The folders are the layers, each importing only those below it. Each starts where
//! the one below ends: [`domain`] owns words and no behaviour beyond their rules;
//! [`contracts`] owns the ports, data and traits only; [`policy`] starts at the first
//! decision and ends before any I/O; [`drivers`] starts where a decision meets a call
//! and ends at the contract's trait; [`adapters`] start behind a trait and do I/O only.
//!
//! | module | owns |
//! | --- | --- |
//! | [`domain`] | the words every layer shares: time, the order, its key, fingerprint and record |
//! | [`contracts`] | the ports: the idempotency table (and its stored format), the payment provider, the queue |
//! | [`policy`] | every decision, pure: outcomes, the table's write specification, the state machines, the deadline budget, retries and breakers, the batch's plan, the audit's findings |
//! | [`drivers`] | run the policy through the contracts: one record, the batch, `resolve`, the audit |
//! | [`adapters`] | I/O only, what runs in Lambda: DynamoDB, the HTTP provider and its key, SQS, TLS, EMF |
//! | [`config`], [`wiring`], [`telemetry`] | cold start: every setting validated once; the clients and parts both entry points build; logs and metric units |
//! | [`commands`] | what the commands outside Lambda read and print, the same from both binaries |
//! | [`audit_lambda`] | the scheduled audit's entry in Lambda, beside `main.rs`'s consumer loop |
//! | [`crash_points`] | named steps where the pinned-crash test kills the process (feature `crash-points` only) |
//!
//! The binary (`main.rs`, `cli.rs`) parses its arguments and calls [`wiring`]: the
//! Lambda function, and outside Lambda the operator's commands on the real parts
//! (DynamoDB, the HTTP provider). It is all that ships.
//!
//! `local/` is a workspace member beside this crate, never linked into it: the
//! simulator, the SQLite store and the file they share, the refusals that keep them
//! local, and its own binary (`charge-once-local`) that runs `invoke`, `inspect`,
//! `resolve` and `audit` on an SQLite file with the simulator through this library.

pub mod adapters;
pub mod audit_lambda;
pub mod commands;
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
