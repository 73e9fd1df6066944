//! The drivers: they run the policy's steps through the contracts, and own what the
//! policy must not touch (the clock, tokens, timeouts, breakers, metrics, log lines).
//!
//! | module | owns |
//! | --- | --- |
//! | [`executor`] | the one executor: every call of every path under the breakers, the deadline budget, the pace, spans and metrics |
//! | [`charge`] | one record's machine, and `resolve`'s, with the real store and provider |
//! | [`refund`] | a refund request as the library's effect: refunded once, on the PaymentIntent its order was charged with |
//! | [`batch`] | the SQS batch: runs the plan's groups, makes the queue calls, reports each record |
//! | [`audit`] | the audit's reads |
//! | [`settle`] | orders that await their customer: settled from events in the batch, and by the scheduled settler |
//! | [`metrics`] | the names of the metrics the drivers count |
//! | [`spans`] | the spans of a trace: the record's messaging attributes and its link to the producer, one span per store call, provider call and wait (only while traces are exported) |

pub mod audit;
pub mod batch;
pub mod charge;
pub mod executor;
pub mod metrics;
pub mod refund;
pub mod settle;
pub mod spans;
