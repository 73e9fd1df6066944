//! The adapters: I/O only, each implementing a contract or serving the wiring. Only
//! what runs in Lambda: the local member (`local/`) has its own SQLite store and
//! simulator.
//!
//! | module | owns |
//! | --- | --- |
//! | [`dynamodb`] | the production store |
//! | [`payment_http`], [`api_key`] | the Stripe-compatible HTTP client and its key |
//! | [`sqs`] | the queue calls |
//! | [`tls`], [`sdk_http`] | the TLS settings of both HTTPS clients; the AWS SDK's HTTP client |
//! | [`emf`] | metrics as EMF, one document per invocation (the library's) |

pub mod api_key;
/// The production store: the library's (`idempotent_consumer::dynamodb`).
pub use idempotent_consumer::dynamodb;
/// EMF: the library's (`idempotent_consumer::emf`).
pub use idempotent_consumer::emf;
pub mod payment_http;
pub mod sdk_http;
pub mod sqs;
pub mod tls;
