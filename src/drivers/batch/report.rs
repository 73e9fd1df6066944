//! What the batch tells about each record once it is settled: its one log line, in the
//! record's span, at the level its kind declares; its metrics (the count under its
//! kind's name, `dead_lettered`); and a dead letter's note. Rendering and counting
//! live here together, apart from the plan and the I/O.

use std::time::Duration;

use aws_lambda_events::event::sqs::SqsMessage;
use tracing::{field, info_span};

use crate::drivers::metrics::{DEAD_LETTERED, count_outcome};
use crate::drivers::spans;
use crate::policy::batch::ending::{Declared, RecordOutcome};
use crate::policy::batch::plan::Entry;
use crate::policy::outcome::Details;
use crate::policy::outcome_kind::Level;

/// The record's span, from its run to its line: every line about it carries these
/// fields. With traces on it is also the record's span in the trace (`otel.*`,
/// recorded only then, and the attributes of `drivers/spans.rs`).
pub fn span(entry: &Entry<'_>, record: &SqsMessage) -> tracing::Span {
    let span = info_span!(
        "record",
        message_id = entry.message_id,
        key = entry.key(),
        receive_count = entry.receive_count,
        trace_id = entry.trace_id,
        "otel.name" = field::Empty,
        "otel.kind" = field::Empty,
    );
    spans::describe_record(&span, record);
    span
}

/// The `charge-once` attribute of a dead letter: why it is there, as JSON, and the
/// payment a person or the customer must act on when there is one
/// (`authentication_required`: the PaymentIntent the customer must confirm).
pub fn note(entry: &Entry<'_>) -> String {
    let mut note = serde_json::json!({
        "outcome": entry.outcome.kind().name(),
        "reason": entry.reason().as_deref().unwrap_or(""),
        "message_id": entry.message_id,
        "receive_count": entry.receive_count,
    });
    if let RecordOutcome::Processed(processed) = &entry.outcome
        && let Some(payment) = processed.details().payment
    {
        note["payment"] = payment.into();
    }
    note.to_string()
}

/// Counts the record's metrics and writes its one line in the record's `span`, with
/// what the batch made of it (`retry_in_s`, `dead_lettered`). The line has no message:
/// its `outcome`, with `dead_lettered` and `retry_in_s`, says how the record ended,
/// and every byte of it is paid for at every record. With traces on it also carries
/// the span's ids (`otel_trace_id`, `otel_span_id`), so the line and the trace join.
pub fn report(entry: &Entry<'_>, span: &tracing::Span) {
    let kind = entry.outcome.kind();
    count_outcome(kind);
    if entry.dead_lettered == Some(true) {
        metrics::counter!(DEAD_LETTERED).increment(1);
    }
    let level = entry.outcome.level();
    spans::record_ended(
        span,
        kind.name(),
        !entry.acknowledged() || level == Level::Error,
    );
    let ids = spans::ids(span);
    let (otel_trace_id, otel_span_id) = match &ids {
        Some((trace, span)) => (Some(trace.as_str()), Some(span.as_str())),
        None => (None, None),
    };
    let _entered = span.enter();
    let d = match &entry.outcome {
        RecordOutcome::Processed(processed) => processed.details(),
        _ => Details::default(),
    };
    let time_left_ms = match entry.outcome {
        RecordOutcome::Unstarted { time_left } => Some(millis(time_left)),
        _ => None,
    };
    let reason = entry.reason();
    let queue_error = entry.queue_error.as_ref().map(|e| crate::error_chain(e));
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                outcome = kind.name(),
                receipt = d.receipt,
                charge = d.charge,
                payment = d.payment,
                code = d.code,
                decline_code = d.decline_code,
                status = d.status,
                declines = d.declines,
                before = d.before,
                attempt = d.attempt,
                time_left_ms,
                latency_ms = millis(entry.latency),
                retry_in_s = entry.retry_in_s(),
                dead_lettered = entry.dead_lettered,
                queue_error,
                reason = reason.as_deref(),
                otel_trace_id,
                otel_span_id,
            )
        };
    }
    match level {
        Level::Info => line!(info),
        Level::Warn => line!(warn),
        Level::Error => line!(error),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
