//! What the commands outside Lambda read and print, the same from the product's binary
//! (`cli.rs`: DynamoDB and the HTTP provider) and the local member's (`local/`: SQLite
//! and the simulator): an SQS event from a file, a record under its table attribute
//! names, a resolution. One home, so both binaries answer in one format.

use std::path::Path;

use aws_lambda_events::event::sqs::SqsEvent;
use serde_json::{Value, json};

use crate::contracts::schema;
use crate::domain::Record;
use crate::policy::resolve::Resolution;

/// The event file of `invoke` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an SQS event")]
    NotAnEvent {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The SQS event in the file at `path` (the `events/` files are ones).
pub fn read_event(path: &Path) -> Result<SqsEvent, EventError> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| EventError::Read {
        path: shown(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| EventError::NotAnEvent {
        path: shown(),
        source,
    })
}

/// A record under its table attribute names (ARCHITECTURE.md, "The table").
pub fn record_json(r: &Record) -> Value {
    let attributes = schema::attributes(r).into_iter().map(|(name, value)| {
        let value = match value {
            schema::Value::S(s) => json!(s),
            schema::Value::N(n) => json!(n),
        };
        (name.to_owned(), value)
    });
    Value::Object(attributes.collect())
}

/// What `resolve` did to `order_id`'s record, as its one line on stdout.
pub fn resolution_json(order_id: &str, done: &Resolution) -> Value {
    match done {
        Resolution::Completed { receipt, attempt } => {
            json!({"order_id": order_id, "resolution": "completed", "receipt": receipt, "attempt": attempt})
        }
        Resolution::Released { next_attempt } => {
            json!({"order_id": order_id, "resolution": "released", "next_attempt": next_attempt})
        }
        Resolution::AlreadyDone { receipt } => {
            json!({"order_id": order_id, "resolution": "already_done", "receipt": receipt})
        }
    }
}

/// Says on stderr that the table holds no record of `order_id`, when it does not
/// (`inspect`: a mistyped id, or a record past its retention); the exit status, 1 then.
pub fn unknown_order(order_id: &str, unknown: bool) -> i32 {
    if unknown {
        eprintln!("no record of order {order_id} in the table");
    }
    i32::from(unknown)
}
