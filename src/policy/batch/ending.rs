//! How one record of a batch ends: the state machine's outcome, or what the batch
//! decided without running it (the library's `RecordOutcome`); its kind
//! (`policy/outcome_kind.rs`: its name and level, who must act), why, and what
//! retrying it can do.

use std::borrow::Cow;

use idempotent_consumer::batch::{self as library, Ending};

use crate::domain::clock::Time;
use crate::domain::order::OrderError;
use crate::policy::outcome::Outcome;
use crate::policy::outcome_kind::{Handling, Level, OutcomeKind};

/// A record that is not an order (no body, or an invalid one): it fails on its own,
/// with no I/O.
pub type InvalidRecord = library::Invalid<OrderError>;

/// How one record of a batch ends.
pub type RecordOutcome = library::RecordOutcome<Outcome>;

/// The state machine's outcome, as the batch reads it.
impl Ending for Outcome {
    fn handling(&self) -> Handling {
        Outcome::handling(self)
    }

    fn until(&self) -> Option<Time> {
        Outcome::until(self)
    }

    fn reason(&self) -> Option<Cow<'static, str>> {
        Outcome::reason(self)
    }
}

/// A batch ending's declared kind (its name in the log line and the metrics) and level.
pub trait Declared {
    /// Its kind, which declares its name, level and handling.
    fn kind(&self) -> OutcomeKind;
    /// Who must act: its kind's level, or the state machine's outcome's own.
    fn level(&self) -> Level;
}

impl Declared for RecordOutcome {
    fn kind(&self) -> OutcomeKind {
        match self {
            Self::Processed(outcome) => outcome.kind(),
            Self::Invalid => OutcomeKind::Invalid,
            Self::Unstarted { .. } => OutcomeKind::Unstarted,
            Self::Skipped { .. } => OutcomeKind::Skipped,
            Self::Panicked | Self::NoOutcome => OutcomeKind::FailedRetryable,
        }
    }

    fn level(&self) -> Level {
        match self {
            Self::Processed(outcome) => outcome.level(),
            _ => self.kind().level(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_consumer::batch::Skip;
    use std::time::Duration;

    #[test]
    fn the_batchs_own_endings_are_handled_as_their_declared_kinds_say() {
        for ending in [
            RecordOutcome::Invalid,
            RecordOutcome::Unstarted {
                time_left: Duration::ZERO,
            },
            RecordOutcome::Skipped {
                why: Skip::SameFact,
                behind: 0,
            },
            RecordOutcome::Panicked,
            RecordOutcome::NoOutcome,
        ] {
            assert_eq!(ending.handling(), ending.kind().handling(), "{ending:?}");
        }
    }
}
