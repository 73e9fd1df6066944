//! What happens to a record that is not acknowledged (ARCHITECTURE.md, "Retries"): the
//! library's retry policy (`idempotent_consumer::retry`: the delay before SQS hands it
//! out again, chosen by why it failed, or the dead-letter queue at once when no retry
//! can fix it), and the breakers ([`breaker`]) that stop an execution environment from
//! calling a dependency that is down (the library's too).

pub use idempotent_consumer::breaker;
pub use idempotent_consumer::retry::{
    Backoff, Disposition, Jitter, MAX_VISIBILITY, MIN_DELAY, dispose, longest_delay, whole_seconds,
};
