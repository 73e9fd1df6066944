//! # charge-once
//!
//! An AWS Lambda SQS consumer that charges each order **exactly once in effect**,
//! although SQS and SNS deliver at least once: an idempotent consumer backed by a
//! DynamoDB table of conditional writes, fenced leases and end-to-end provider
//! idempotency keys; and, as the same binary's refund function, refunds each refund
//! request once. How it works, and why each rule exists: `ARCHITECTURE.md`.
//!
//! Built on the library `idempotent_consumer` (the record, the table, the machines, the
//! effect loop and its consumer, the batch's plan, the clock, the deadline budget, the
//! breakers, the pace and the one executor every call goes through), re-exported where
//! the layers below name them.
//!
//! ## Layout
//!
//! The folders are the layers, from the bottom up; a module imports only from its own
//! layer and those below it, never from one above (`tests/layers.rs` reads the source
//! and fails on a `crate::<module>` that runs up):
//!
//! | layer | starts and ends | owns | imports from |
//! | --- | --- | --- | --- |
//! | 1 | [`domain`] | the words every layer shares: time (the library's), the order, its key, fingerprint and record, a refund request | nothing of the crate |
//! | 2 | [`contracts`] | the ports, data and traits only: the idempotency table (and its stored format), the payment provider (charges and refunds), the queue | `domain` |
//! | 3 | [`policy`] | every decision, pure (no I/O, no AWS types): outcomes, the table's write specification, the state machines and their lease, the deadline budget and the pace (the library's), retries and breakers, the batch's plan, the audit's findings | `domain`, `contracts` |
//! | 4 | [`config`], [`crash_points`] | every setting validated once at cold start; the named steps where the pinned-crash test kills the process (feature `crash-points` only) | the layers above, up to `policy` |
//! | 5 | [`drivers`] | run the policy through the contracts, every call through the one executor, and own the clock, tokens, metrics and log lines: one record (the library's effect loop with a payment as its effect), a refund (the library's second effect), the batch (and its edge to the event source's types), `resolve`, the settler, the audit | up to `config` |
//! | 6 | [`adapters`] | I/O only, implementing the contracts, and only what runs in Lambda: DynamoDB, the HTTP provider and its key, SQS, TLS, EMF | up to `drivers` (in practice `domain`, `contracts`, `config`, `crash_points`) |
//! | 7 | [`telemetry`], [`traces`], [`wiring`], [`commands`], [`audit_lambda`]; the binary's `main.rs`, `cli.rs` | the entry files: logs and metric units; the traces' settings, exporter and flushes (Lambda only, off by default); the clients and parts both entry points build; what the commands outside Lambda read and print (the same from the local member's binary, `local/`); the scheduled audit's entry in Lambda; the consumer loop and the command line | everything |
//!
//! The binary (`main.rs`, `cli.rs`) parses its arguments and calls [`wiring`]: the
//! Lambda function, and outside Lambda the operator's commands on the real parts
//! (DynamoDB, the HTTP provider). It is all that ships.
//!
//! `local/` is a workspace member beside this crate, never linked into it: the
//! simulator, the SQLite store and the file they share, the refusals that keep them
//! local, and its own binary (`charge-once-local`) that runs `invoke`, `refund`,
//! `inspect`, `resolve` and `audit` on an SQLite file with the simulator through this
//! library.

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
pub mod traces;
pub mod wiring;

/// A boxed source error of an adapter, kept whole, and an error with all its sources on
/// one line: the library's.
pub use idempotent_consumer::{BoxError, error_chain};
