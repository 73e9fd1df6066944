//! The spans of a trace (ARCHITECTURE.md, "Traces"): what the record's span says
//! about its message (OpenTelemetry's messaging attributes, the link to the
//! producer's trace), and one span per store call, provider call and wait under it,
//! with the answer each got. They exist only while traces are exported (`traces.rs`
//! turns them on at cold start): otherwise every function here returns at once and
//! makes no span, so a run without traces pays nothing for them.
//!
//! No attribute carries the order's payload or a secret: the record is named by its
//! key (`cobro#<id>`) and message id, a call by its operation, its table or endpoint
//! (host only) and how it ended; the provider's error text is never read (it can echo
//! key fragments, ARCHITECTURE.md "Payment provider").

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanContext, Status, TraceContextExt as _};
use tracing::{Span, debug, info_span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::contracts::payment::{FailureKind, PaymentError};
use crate::contracts::store::{StoreError, WriteOutcome};
use crate::policy::machine::{NoAnswer, WriteKind};

/// The target of the call and wait spans: the log layer leaves them out, so a line
/// written during a call still names its record's span (`telemetry.rs`).
pub const CALL_TARGET: &str = "charge_once::spans";

/// What the call spans name, set once at cold start when traces are exported.
#[derive(Clone, Debug, Default)]
pub struct Names {
    /// The idempotency table.
    pub table: Option<String>,
    /// The provider's host (`PAYMENT_API_URL` without its scheme and path).
    pub endpoint: Option<String>,
}

static ENABLED: OnceLock<Names> = OnceLock::new();

/// Turns the spans on for the life of the process (traces are exported).
pub fn enable(names: Names) {
    let _ = ENABLED.set(names);
}

fn enabled() -> Option<&'static Names> {
    ENABLED.get()
}

/// What a record's span is told about its message when traces are on: the queue
/// (the last part of `eventSourceARN`), its name and kind as OpenTelemetry's
/// messaging conventions have them for a batch consumer, and a link to the
/// producer's trace: the `AWSTraceHeader` system attribute (X-Ray's format), or a
/// W3C `traceparent` message attribute. A header that does not parse is ignored with a
/// debug line: a trace never fails a record.
pub fn describe_record(span: &Span, record: &SqsMessage) {
    if enabled().is_none() || span.is_disabled() {
        return;
    }
    let queue = record
        .event_source_arn
        .as_deref()
        .and_then(|arn| arn.rsplit(':').next())
        .unwrap_or("");
    span.record("otel.name", format!("process {queue}").as_str());
    span.record("otel.kind", "consumer");
    span.set_attribute("messaging.system", "aws_sqs");
    span.set_attribute("messaging.operation.type", "process");
    span.set_attribute("messaging.operation.name", "process");
    span.set_attribute("messaging.destination.name", queue.to_owned());
    if let Some(id) = &record.message_id {
        span.set_attribute("messaging.message.id", id.clone());
    }
    if let Some(count) = record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse::<i64>().ok())
    {
        span.set_attribute("messaging.aws_sqs.receive_count", count);
    }
    if let Some(producer) = producer_context(record) {
        span.add_link(producer);
    }
}

/// The producer's span context: `AWSTraceHeader` first (what AWS services and the
/// X-Ray SDKs set), else a `traceparent` message attribute (W3C, what OpenTelemetry's
/// SQS instrumentations send).
fn producer_context(record: &SqsMessage) -> Option<SpanContext> {
    if let Some(header) = record.attributes.get("AWSTraceHeader") {
        let carrier = HashMap::from([("x-amzn-trace-id".to_owned(), header.clone())]);
        // Against an empty context: `extract` falls back to the current one (the
        // invocation's span) when the header does not parse.
        let context = opentelemetry_aws::trace::XrayPropagator::default()
            .extract_with_context(&opentelemetry::Context::new(), &carrier);
        let found = context.span().span_context().clone();
        if found.is_valid() {
            return Some(found);
        }
        debug!("AWSTraceHeader is not an X-Ray trace header; no link to the producer");
    }
    let traceparent = record
        .message_attributes
        .get("traceparent")
        .and_then(|a| a.string_value.as_deref())?;
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let context = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let found = context.span().span_context().clone();
    if found.is_valid() {
        Some(found)
    } else {
        debug!("the traceparent attribute is not a W3C trace context; no link to the producer");
        None
    }
}

/// How a record ended, on its span: the outcome's name, and an error status when the
/// record was not acknowledged or its outcome is an error.
pub fn record_ended(span: &Span, outcome: &'static str, failed: bool) {
    if enabled().is_none() {
        return;
    }
    span.set_attribute("charge_once.outcome", outcome);
    if failed {
        span.set_status(Status::error(outcome));
    }
}

/// The log line's join with the trace: the record span's trace id and span id (hex),
/// when traces are on.
pub fn ids(span: &Span) -> Option<(String, String)> {
    enabled()?;
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

/// The span of one store write (`operation`: the machine's write).
pub fn store_call(kind: WriteKind) -> Span {
    store_operation(write_name(kind), "UpdateItem")
}

/// The span of one store call by its name (`settle`, `get`) and DynamoDB operation:
/// the calls that settle a payment event, outside the machine.
pub fn store_operation(operation: &'static str, db_operation: &'static str) -> Span {
    let Some(names) = enabled() else {
        return Span::none();
    };
    let span = info_span!(
        target: CALL_TARGET,
        "store",
        "otel.name" = format!("store {operation}"),
        "otel.kind" = "client",
    );
    span.set_attribute("charge_once.operation", operation);
    span.set_attribute("db.system.name", "aws.dynamodb");
    span.set_attribute("db.operation.name", db_operation);
    if let Some(table) = &names.table {
        span.set_attribute("db.collection.name", table.clone());
    }
    span
}

/// How a store write went, on its span.
pub fn store_answered(span: &Span, answer: &Result<WriteOutcome, NoAnswer<StoreError>>) {
    if span.is_none() {
        return;
    }
    let outcome = match answer {
        Ok(WriteOutcome::Applied(_)) => "applied",
        // A condition that did not hold is an answer, not an error of the store.
        Ok(WriteOutcome::Refused(_)) => "refused",
        Err(NoAnswer::NoTime) => "not_started",
        Err(NoAnswer::TimedOut) => "timed_out",
        Err(NoAnswer::Failed(StoreError::Backend { .. })) => "store_error",
        Err(NoAnswer::Failed(_)) => "malformed",
    };
    span.set_attribute("charge_once.outcome", outcome);
    if answer.is_err() {
        span.set_status(Status::error(outcome));
    }
}

/// The provider's operations, as their spans name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderCall {
    Charge,
    Lookup,
    Cancel,
    /// One payment by id (settling a payment: `policy/settle.rs`).
    Fetch,
}

impl ProviderCall {
    fn name(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Lookup => "lookup",
            Self::Cancel => "cancel",
            Self::Fetch => "fetch",
        }
    }

    /// The request (`adapters/payment_http/`), as a template: no id in it.
    fn request(self) -> (&'static str, &'static str) {
        match self {
            Self::Charge => ("POST", "/v1/payment_intents"),
            Self::Lookup => ("GET", "/v1/payment_intents"),
            Self::Cancel => ("POST", "/v1/payment_intents/{id}/cancel"),
            Self::Fetch => ("GET", "/v1/payment_intents/{id}"),
        }
    }
}

/// The span of one provider call; `retry`: the same request sent again within the
/// invocation (after a rate limit, a lock, or a transient failure).
pub fn provider_call(call: ProviderCall, retry: bool) -> Span {
    let Some(names) = enabled() else {
        return Span::none();
    };
    let (method, path) = call.request();
    let span = info_span!(
        target: CALL_TARGET,
        "provider",
        "otel.name" = format!("provider {}", call.name()),
        "otel.kind" = "client",
    );
    span.set_attribute("charge_once.operation", call.name());
    span.set_attribute("http.request.method", method);
    span.set_attribute("url.template", path);
    if let Some(endpoint) = &names.endpoint {
        span.set_attribute("server.address", endpoint.clone());
    }
    span.set_attribute("charge_once.retry", retry);
    span
}

/// How a provider call went, on its span: the outcome, the HTTP status when one
/// says it, whether the provider replayed a stored answer. Only the error's kind is
/// read, never its text.
pub fn provider_answered(span: &Span, failure: Option<&NoAnswer<PaymentError>>) {
    if span.is_none() {
        return;
    }
    let (outcome, status, replay) = match failure {
        None => ("ok", None, false),
        Some(NoAnswer::NoTime) => ("not_started", None, false),
        Some(NoAnswer::TimedOut) => ("timed_out", None, false),
        Some(NoAnswer::Failed(e)) => match e {
            PaymentError::Declined { .. } => ("declined", Some(402), false),
            PaymentError::AuthenticationRequired { .. } => ("authentication_required", None, false),
            PaymentError::UnexpectedStatus { .. } => ("unexpected_status", None, false),
            PaymentError::KeyReused => ("key_reused", Some(400), false),
            PaymentError::Rejected { status, .. } => ("rejected", Some(*status), false),
            PaymentError::Pending { .. } => ("pending", None, false),
            PaymentError::ReplayedServerError { status } => {
                ("replayed_server_error", Some(*status), true)
            }
            PaymentError::Retryable { kind, .. } => failure_of(*kind),
        },
    };
    span.set_attribute("charge_once.outcome", outcome);
    span.set_attribute("charge_once.replay", replay);
    if let Some(status) = status {
        span.set_attribute("http.response.status_code", i64::from(status));
    }
    if failure.is_some() {
        span.set_status(Status::error(outcome));
    }
}

fn failure_of(kind: FailureKind) -> (&'static str, Option<u16>, bool) {
    match kind {
        FailureKind::Timeout => ("timed_out", None, false),
        FailureKind::Connection => ("connection", None, false),
        FailureKind::Server(status) => ("server_error", Some(status), false),
        FailureKind::RateLimited(_) => ("rate_limited", Some(429), false),
        FailureKind::Lock => ("lock", Some(429), false),
        FailureKind::Conflict => ("conflict", Some(409), false),
        FailureKind::Unauthorized => ("unauthorized", Some(401), false),
        FailureKind::Forbidden(_) => ("forbidden", Some(403), false),
        FailureKind::Client(status) => ("client_error", Some(status), false),
        FailureKind::Redirect(status) => ("redirect", Some(status), false),
        FailureKind::BadResponse => ("bad_response", None, false),
        FailureKind::AuthenticationUpstream => ("authentication_upstream", None, false),
        FailureKind::NoEndpoint => ("no_endpoint", Some(404), false),
    }
}

/// The waits of a record, as their spans name them.
pub use idempotent_consumer::executor::Wait;

/// The span of one wait (`planned`: its first pause).
pub fn wait(kind: Wait, planned: Duration) -> Span {
    if enabled().is_none() {
        return Span::none();
    }
    let name = match kind {
        Wait::Pacing => "pacing",
        Wait::Lock => "lock",
        Wait::Retry => "retry",
    };
    let span = info_span!(
        target: CALL_TARGET,
        "wait",
        "otel.name" = format!("wait {name}"),
    );
    span.set_attribute("charge_once.wait", name);
    span.set_attribute(
        "charge_once.wait_ms",
        i64::try_from(planned.as_millis()).unwrap_or(i64::MAX),
    );
    span
}

/// A write's name on its span.
fn write_name(kind: WriteKind) -> &'static str {
    match kind {
        WriteKind::Reserve => "reserve",
        WriteKind::Complete => "complete",
        WriteKind::CompleteAttempt => "complete_attempt",
        WriteKind::Release(_) => "release",
        WriteKind::NextAttempt => "next_attempt",
        WriteKind::Await => "await",
        WriteKind::Correct => "correct",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(attributes: &[(&str, &str)], traceparent: Option<&str>) -> SqsMessage {
        let mut record = SqsMessage::default();
        for (name, value) in attributes {
            record.attributes.insert((*name).into(), (*value).into());
        }
        if let Some(value) = traceparent {
            let mut attribute = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
            attribute.string_value = Some(value.into());
            attribute.data_type = Some("String".into());
            record
                .message_attributes
                .insert("traceparent".into(), attribute);
        }
        record
    }

    #[test]
    fn the_producer_is_read_from_the_x_ray_header_then_from_a_w3c_traceparent() {
        let xray = record(
            &[(
                "AWSTraceHeader",
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
            )],
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let found = producer_context(&xray).unwrap();
        assert_eq!(
            found.trace_id().to_string(),
            "5759e988bd862e3fe1be46a994272793"
        );
        assert_eq!(found.span_id().to_string(), "53995c3f42cd8ad8");
        let w3c = record(
            &[],
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let found = producer_context(&w3c).unwrap();
        assert_eq!(
            found.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
    }

    #[test]
    fn a_malformed_header_gives_no_link_and_no_error() {
        let broken = record(&[("AWSTraceHeader", "Root=not-a-trace")], Some("00-zz"));
        assert_eq!(producer_context(&broken), None);
        assert_eq!(producer_context(&record(&[], None)), None);
    }
}
