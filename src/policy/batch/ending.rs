//! How one record of a batch ends: the state machine's outcome, or what the batch
//! decided without running it; its kind (`policy/outcome_kind.rs`), why, and what retrying it
//! can do.

use std::borrow::Cow;
use std::time::Duration;

use crate::domain::clock::Time;
use crate::domain::order::OrderError;
use crate::policy::outcome::Outcome;
use crate::policy::outcome_kind::{Handling, Level, OutcomeKind};

/// A record that is not an order: it fails on its own, with no I/O.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRecord {
    #[error("record has no body")]
    NoBody,
    #[error(transparent)]
    Order(#[from] OrderError),
}

/// Why a record was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// An earlier record of the same order failed in this batch.
    SameOrder,
    /// An earlier record of this FIFO batch failed.
    Fifo,
    /// An earlier record of the same FIFO message group failed.
    FifoGroup,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Self::SameOrder => "an earlier record of the same order failed in this batch",
            Self::Fifo => "an earlier record of this FIFO batch failed",
            Self::FifoGroup => "an earlier record of this FIFO message group failed",
        }
    }
}

/// How one record of a batch ends.
#[derive(Debug)]
pub enum RecordOutcome {
    Processed(Outcome),
    /// Not an order; the entry keeps why (`plan::Entry::order`).
    Invalid,
    /// Not started: too little time was left before the invocation deadline.
    Unstarted {
        time_left: Duration,
    },
    /// Not started, behind the failure of the record at index `behind`.
    Skipped {
        why: Skip,
        behind: usize,
    },
    /// The record's processing panicked; the lease ends at the invocation deadline.
    Panicked,
    /// No outcome was recorded for the record: a bug, and failing it loses nothing.
    NoOutcome,
}

impl RecordOutcome {
    /// Its kind, which declares its name, level and handling.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Processed(outcome) => outcome.kind(),
            Self::Invalid => OutcomeKind::Invalid,
            Self::Unstarted { .. } => OutcomeKind::Unstarted,
            Self::Skipped { .. } => OutcomeKind::Skipped,
            Self::Panicked | Self::NoOutcome => OutcomeKind::FailedRetryable,
        }
    }

    /// Who must act: its kind's level, or the state machine's outcome's own.
    pub fn level(&self) -> Level {
        match self {
            Self::Processed(outcome) => outcome.level(),
            _ => self.kind().level(),
        }
    }

    /// What becomes of the message: the state machine's outcome's handling, or its
    /// kind's; a skipped record waits as long as the failure ahead of it
    /// (`plan::dispose`).
    pub fn handling(&self) -> Handling {
        match self {
            Self::Processed(outcome) => outcome.handling(),
            _ => self.kind().handling(),
        }
    }

    /// When the wait its handling names ends, when it has one.
    pub fn until(&self) -> Option<Time> {
        match self {
            Self::Processed(outcome) => outcome.until(),
            _ => None,
        }
    }

    /// Why it failed, for the log line and the dead letter; `None` for an invalid
    /// record, whose entry says why.
    pub fn reason(&self) -> Option<Cow<'static, str>> {
        match self {
            Self::Processed(outcome) => outcome.reason(),
            Self::Invalid => None,
            Self::Unstarted { .. } => Some(Cow::Borrowed(
                "too little time left before the invocation deadline",
            )),
            Self::Skipped { why, .. } => Some(Cow::Borrowed(why.as_str())),
            Self::Panicked => Some(Cow::Borrowed(
                "panicked while processing; the lease ends at the invocation deadline",
            )),
            Self::NoOutcome => Some(Cow::Borrowed(
                "internal: no outcome was recorded for this record; retried",
            )),
        }
    }
}
