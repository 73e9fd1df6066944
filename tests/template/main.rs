//! Checks `template.yaml` for what linters miss and what silently breaks the
//! guarantees: visibility timeout, partial batch responses, TTL, least privilege,
//! queue retentions, the retry path against them, the batch-size bound, the DLQ's
//! arrival alarm, the ended waits' age alarm, the version and alias, Stripe's events
//! and the awaiting index, the refund function and its parts, and one architecture
//! from build to deploy.
//! Each rule is also shown failing on a template broken on purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod audit;
mod awaiting;
mod build;
mod fanout;
mod operate;
mod refunds;
mod retry_path;
mod role;
mod rules;
mod traces;
mod values;
