#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! | module | owns |
//! | --- | --- |
//! | [`clock`] | one type for every instant, the clock type, the wall clock |
//! | [`deadline`] | every margin before the invocation deadline, in one budget |
//! | [`batch`] | the batch's plan: groups, chains, the skip rule, each record's disposition, the partial batch response |
//! | [`breaker`] | a breaker per dependency and execution environment |
//! | [`pacing`] | the pace of provider calls, adapted to the provider's rate limits |
//! | [`jitter`] | the jitter of pauses and retry delays |
//! | [`retry`] | a record not acknowledged: acknowledged, dead-lettered or retried, and the delay by its cause |
//! | [`executor`] | the one executor: every call under the safeguards above |
//! | [`emf`] | metrics: one CloudWatch embedded-metric-format document per invocation, also when invocations run at once |
//! | [`envelope`] | the body inside an SNS or EventBridge envelope |
//! | [`queue`], [`sqs`] | the queue calls of a batch: visibility changes (the backoff) and dead letters with their note |
//! | [`in_store`] | effects inside the store: the record and the effect in one transaction |
//! | [`record`] | the key, the fingerprint, the owner token, the record and its states |
//! | [`store`] | the store contract: each conditional write as one value, the reads |
//! | [`table`], [`rules`] | what each write requires and leaves; the safety rules, each switchable for a mutant |
//! | [`schema`] | the table's storage format (the pattern card's Spanish names), mapped once |
//! | [`lease`] | a holder's lease on a record: the fenced complete and release |
//! | [`machine`] | the state machine of one record, for any effect under a provider key |
//! | [`effect`] | an effect at a provider as a trait, the loop that applies a fact once through the executor, and its Lambda consumer |
//! | [`settle`] | the settlement of an awaited effect, by the provider's answer |
//! | [`resolve`] | a person settling a record by the provider's answer, under a lease |
//! | [`dynamodb`] | the store contract on DynamoDB |

// The Lambda runtime's future (`consumer::serve_batches`) is laid out here, deeper than
// the default limit of 128.
#![recursion_limit = "256"]
// Every public item says what it is: the crate is read through its documentation.
#![warn(missing_docs)]

pub mod batch;
pub mod breaker;
pub mod clock;
mod consumer;
pub mod deadline;
pub mod dynamodb;
pub mod effect;
pub mod emf;
pub mod envelope;
pub mod executor;
pub mod in_store;
pub mod jitter;
pub mod lease;
pub mod machine;
pub mod pacing;
pub mod queue;
pub mod record;
pub mod resolve;
pub mod retry;
pub mod rules;
pub mod schema;
pub mod settle;
pub mod sqs;
pub mod store;
pub mod table;

/// A boxed source error, kept whole (never stringified).
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
