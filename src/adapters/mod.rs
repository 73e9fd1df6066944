//! The adapters: I/O only, each implementing a contract or serving the wiring.
//!
//! | module | owns |
//! | --- | --- |
//! | [`dynamodb`] | the production store |
//! | [`sqlite`], [`sqlite_file`] | the embedded store of local runs, and the file it shares with the simulator |
//! | [`payment_http`], [`api_key`] | the Stripe-compatible HTTP client and its key |
//! | [`simulated`] | the local provider and its ledger |
//! | [`sqs`] | the queue calls |
//! | [`tls`], [`sdk_http`] | the TLS settings of both HTTPS clients; the AWS SDK's HTTP client |
//! | [`emf`] | metrics as EMF, one document per invocation |

pub mod api_key;
pub mod dynamodb;
pub mod emf;
pub mod payment_http;
pub mod sdk_http;
pub mod simulated;
pub mod sqlite;
pub mod sqlite_file;
pub mod sqs;
pub mod tls;
