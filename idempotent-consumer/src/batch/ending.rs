//! What the plan reads of a record and of how it ended: the valid record ([`Unit`]: its
//! key, its group, its chain), a run's ending ([`Ending`]), a record that is not a
//! valid fact ([`Invalid`]), and how each record of a batch ends ([`RecordOutcome`]),
//! the run's ending or what the batch decided without running it.

use std::borrow::Cow;
use std::time::Duration;

use crate::clock::Time;
use crate::record::Key;
use crate::retry::{Handling, Wait};

/// A valid record, as the plan groups it: the fact, or anything else the queue carries
/// about one (a provider's event).
pub trait Unit {
    /// What one fact is called in a record's reason ("an earlier record of the same
    /// fact failed in this batch").
    const NAME: &'static str = "fact";

    /// The key of the fact the record is about (`None`: it names none).
    fn key(&self) -> Option<&Key>;

    /// What copies run one after another by: the fact's key, or, for a record that
    /// names none, what stands for it (an event's object).
    fn group_key(&self) -> Option<&str> {
        self.key().map(Key::as_str)
    }

    /// What groups are chained by, one after another: what the provider locks while it
    /// applies the effect (an account), so that records sent at once do not refuse each
    /// other. `None`: the group runs on its own.
    fn chain_key(&self) -> Option<&str> {
        None
    }

    /// Whether this record's chain key stands for its group (the first such record's
    /// does; else the group's first record's).
    fn leads_chain(&self) -> bool {
        true
    }
}

/// How a run record ended, as the batch reads it.
pub trait Ending {
    /// What becomes of the message.
    fn handling(&self) -> Handling;
    /// When the wait its handling names ends, when it has one.
    fn until(&self) -> Option<Time>;
    /// Why it failed, for the log line and the dead letter.
    fn reason(&self) -> Option<Cow<'static, str>>;
}

/// A record that is not a valid fact: it fails on its own, with no I/O.
#[derive(Debug, thiserror::Error)]
pub enum Invalid<E: std::error::Error + 'static> {
    /// The message has no body.
    #[error("record has no body")]
    NoBody,
    /// The fact's parser refused the body.
    #[error(transparent)]
    Fact(#[from] E),
}

/// Why a record was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// An earlier record of the same fact failed in this batch.
    SameFact,
    /// An earlier record of this FIFO batch failed.
    Fifo,
    /// An earlier record of the same FIFO message group failed.
    FifoGroup,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Self::SameFact => "an earlier record of the same fact failed in this batch",
            Self::Fifo => "an earlier record of this FIFO batch failed",
            Self::FifoGroup => "an earlier record of this FIFO message group failed",
        }
    }
}

/// How one record of a batch ends: the run's ending, or what the batch decided
/// without running it.
#[derive(Debug)]
pub enum RecordOutcome<O> {
    /// Run: how the run ended.
    Processed(O),
    /// Not a valid fact; the entry keeps why ([`super::Entry::fact`]).
    Invalid,
    /// Not started: too little time was left before the invocation deadline.
    Unstarted {
        /// The time that was left.
        time_left: Duration,
    },
    /// Not started, behind the failure of the record at index `behind`.
    Skipped {
        /// Why it was skipped.
        why: Skip,
        /// The index of the failed record ahead of it.
        behind: usize,
    },
    /// The record's processing panicked; the lease ends at the invocation deadline.
    Panicked,
    /// No outcome was recorded for the record: a bug, and failing it loses nothing.
    NoOutcome,
}

impl<O: Ending> RecordOutcome<O> {
    /// What becomes of the message: the run's ending's handling, or the batch's own:
    /// an invalid record to the dead-letter queue at once; one not started, panicked
    /// or without an outcome retried with the backoff; a skipped one as long as the
    /// failure ahead of it ([`super::dispose`]).
    pub fn handling(&self) -> Handling {
        match self {
            Self::Processed(outcome) => outcome.handling(),
            Self::Invalid => Handling::DeadLetter,
            Self::Skipped { .. } => Handling::Retry(Wait::Behind),
            Self::Unstarted { .. } | Self::Panicked | Self::NoOutcome => {
                Handling::Retry(Wait::Backoff)
            }
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
