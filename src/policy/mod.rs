//! The policy: every decision, pure (no I/O, no AWS types, no clock or randomness of
//! its own; ARCHITECTURE.md, "The state machine" and "Retries").
//!
//! | module | owns |
//! | --- | --- |
//! | [`outcome_kind`] | every way a record ends, declared once: name, level, handling |
//! | [`outcome`] | how the state machine ends a record: typed causes |
//! | [`table`] | the write specification: each write's condition and effect, how a refused reservation is judged |
//! | [`rules`] | the safety rules, each switchable for a mutant of the model |
//! | [`lease`] | the lease core the two machines share: whose record, which attempt, the complete and release writes |
//! | [`machine`] | the state machine of one record: the library's, with a payment as its effect |
//! | [`resolve`] | the state machine of `resolve`: the library's, with a payment's words |
//! | [`settle`] | how an awaited payment settles: the library's settlement, with a payment's words |
//! | [`pacing`] | the pace of provider calls (the library's, `idempotent_consumer::pacing`) |
//! | [`deadline`] | the invocation's time, one budget (the library's, `idempotent_consumer::deadline`) |
//! | [`retry`] | a failed record's delay by cause, the DLQ at once, the breakers |
//! | [`batch`] | the batch's plan: entries, groups, skips, dispositions, the response |
//! | [`audit`] | the audit's findings |

pub mod audit;
pub mod batch;
pub use idempotent_consumer::deadline;
/// The lease core: the library's (`idempotent_consumer::lease`).
pub use idempotent_consumer::lease;
pub mod machine;
pub mod outcome;
pub mod outcome_kind;
pub use idempotent_consumer::pacing;
pub mod resolve;
pub mod retry;
/// The safety rules: the library's (`idempotent_consumer::rules`).
pub use idempotent_consumer::rules;
pub mod settle;
/// The write specification: the library's (`idempotent_consumer::table`).
pub use idempotent_consumer::table;
