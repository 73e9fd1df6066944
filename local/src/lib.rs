//! # charge-once-local
//!
//! Local runs of charge-once, never shipped: the parts that let the product's library
//! run on one machine with nothing but `cargo`, and the refusals that keep them there.
//! The Lambda crate links none of this; this crate links the Lambda crate's library
//! and implements its contracts.
//!
//! | module | owns |
//! | --- | --- |
//! | [`sqlite_file`] | the one SQLite file the store and the simulator share: opened once, created only by `invoke` |
//! | [`sqlite`] | the idempotency table in that file, with DynamoDB's contract and semantics |
//! | [`simulated`] | the simulator: a payment provider with Stripe's idempotency, refusals and test cards, its ledger in that file; the customer who confirms a payment, and the event Stripe then sends |
//! | [`wiring`] | the refusals that keep a local run away from real parts, and the store and simulator each command opens |
//!
//! The binary (`main.rs`, `cli.rs`, `charge-once-local`) parses its arguments and
//! calls [`wiring`]: `invoke`, `inspect`, `resolve`, `audit`, `confirm` and `settle` on
//! the `--db` file.

pub mod simulated;
pub mod sqlite;
pub mod sqlite_file;
pub mod wiring;
