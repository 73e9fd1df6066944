//! Every way a record can end, declared once: its name (the log line's `outcome` and
//! the metric counted under it), its log level (who must act), and what becomes of
//! the message (acknowledged, dead-lettered, or retried after a delay of which class).
//! The state machine's [`crate::policy::outcome::Outcome`] and the batch's own endings
//! map onto these kinds; every derived answer (`is_ack`, the level, the name, the
//! delay's class) reads this table, and one function (`Outcome::handling`) overrides it
//! where a cause differs from its kind. The dashboard in `template.yaml`,
//! ARCHITECTURE.md's table of outcomes and the metrics listed in docs/operate.md are
//! checked against it (`tests/template/rules.rs`; the docs by the tests below).

use Handling::{Ack, DeadLetter, Retry};
use Level::{Error, Info, Warn};
use Wait::{Backoff, Backpressure, Behind, BreakerProbe, LeaseEnd, Refusal};

/// Who must act, what becomes of the message, and the class of a retry's delay: the
/// library's (`idempotent_consumer::retry`).
pub use idempotent_consumer::retry::{Handling, Level, Wait};

/// One declared ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declaration {
    pub kind: OutcomeKind,
    /// The log line's `outcome` and the name of the metric that counts it.
    pub name: &'static str,
    pub level: Level,
    pub handling: Handling,
}

/// Declares the kinds and their table together, so that each kind stands in the table
/// once, at its own place.
macro_rules! declare {
    ($($kind:ident => $name:literal, $level:ident, $handling:expr;)*) => {
        /// The kinds of ending, in the order of [`DECLARED`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum OutcomeKind {
            $($kind,)*
        }

        /// Every kind with its name, level and handling.
        pub const DECLARED: &[Declaration] = &[$(Declaration {
            kind: OutcomeKind::$kind,
            name: $name,
            level: $level,
            handling: $handling,
        },)*];
    };
}

// The declaration. A cause refines it in one place each, `policy/outcome.rs`:
// `needs_reconciliation` goes to the DLQ, except a payment the provider still holds
// `pending` (it settles by itself, so it is retried after the retry cap:
// `Outcome::handling`, the one override); `failed_retryable` is an error, not a
// warning, when a setting is wrong (`Outcome::level`); a `failed_retryable` refused for
// the provider's rate or on a locked customer is `rate_limited` (`Outcome::kind`):
// backpressure, back in seconds. A decline at the order's limit is `decline_limit`,
// not `declined`: the one is retried, the other dead-lettered.
declare! {
    Charged => "charged", Info, Ack;
    Reconciled => "reconciled", Info, Ack;
    Duplicate => "duplicate", Info, Ack;
    Conflict => "conflict", Error, DeadLetter;
    InProgress => "in_progress", Warn, Retry(LeaseEnd);
    Declined => "declined", Warn, Retry(Refusal);
    DeclineLimit => "decline_limit", Warn, DeadLetter;
    Rejected => "rejected", Error, DeadLetter;
    FailedRetryable => "failed_retryable", Warn, Retry(Backoff);
    RateLimited => "rate_limited", Warn, Retry(Backpressure);
    Deadline => "deadline", Warn, Retry(Backoff);
    Deferred => "deferred", Warn, Retry(BreakerProbe);
    NeedsReconciliation => "needs_reconciliation", Error, DeadLetter;
    AuthenticationRequired => "authentication_required", Info, Ack;
    PaymentProcessing => "payment_processing", Info, Ack;
    AwaitingCustomer => "awaiting_customer", Info, Ack;
    AuthenticationExpired => "authentication_expired", Info, Ack;
    EventIgnored => "event_ignored", Info, Ack;
    PaymentUnrecorded => "payment_unrecorded", Warn, Ack;
    Invalid => "invalid", Warn, DeadLetter;
    Unstarted => "unstarted", Warn, Retry(Backoff);
    Skipped => "skipped", Info, Retry(Behind);
}

impl OutcomeKind {
    /// This kind's declaration.
    pub fn declared(self) -> &'static Declaration {
        &DECLARED[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.declared().name
    }

    pub fn level(self) -> Level {
        self.declared().level
    }

    pub fn handling(self) -> Handling {
        self.declared().handling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_stands_at_its_own_place_under_a_name_of_its_own() {
        for (i, declared) in DECLARED.iter().enumerate() {
            assert_eq!(declared.kind as usize, i, "{declared:?}");
            assert_eq!(declared.kind.declared(), declared);
        }
        let mut names: Vec<&str> = DECLARED.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DECLARED.len(), "two kinds share a name");
    }

    #[test]
    fn only_acknowledged_kinds_log_at_info_but_a_skip_which_waits_for_another() {
        for declared in DECLARED.iter() {
            let quiet = declared.level == Info;
            // Money taken for an order the table does not know: nothing to retry, but
            // someone should look (a warning, counted).
            let warned_ack = declared.kind == OutcomeKind::PaymentUnrecorded;
            let expected =
                (declared.handling.is_ack() && !warned_ack) || declared.handling == Retry(Behind);
            assert_eq!(quiet, expected, "{declared:?}");
        }
    }

    #[test]
    fn a_decline_at_the_limit_is_not_read_as_a_decline() {
        assert_ne!(
            OutcomeKind::Declined.name(),
            OutcomeKind::DeclineLimit.name()
        );
        assert_eq!(OutcomeKind::Declined.handling(), Retry(Refusal));
        assert_eq!(OutcomeKind::DeclineLimit.handling(), DeadLetter);
    }

    /// The names a page lists between `start` and the next `end`, backticked; line
    /// breaks read as spaces.
    fn listed(text: &str, start: &str, end: &str) -> Vec<String> {
        let text = text.replace('\n', " ");
        let from = text.find(start).expect(start) + start.len();
        let to = from + text[from..].find(end).expect(end);
        text[from..to]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    fn declared_names() -> Vec<String> {
        let mut names: Vec<String> = DECLARED.iter().map(|d| d.name.to_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn the_operators_metrics_list_every_declared_outcome_and_no_other() {
        let page = include_str!("../../docs/operate.md");
        let mut listed = listed(page, "a count per outcome (", ")");
        listed.sort();
        assert_eq!(listed, declared_names());
    }

    #[test]
    fn the_architectures_table_of_outcomes_has_rows_for_exactly_the_declared_outcomes() {
        let page = include_str!("../../ARCHITECTURE.md");
        let table = "| outcome (log `outcome`) | message | table | provider key next time |";
        let from = page.find(table).expect("the table of outcomes") + table.len();
        let mut named: Vec<String> = page[from..]
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .filter_map(|row| {
                row.strip_prefix("| `")?
                    .split('`')
                    .next()
                    .map(str::to_owned)
            })
            .collect();
        named.sort();
        named.dedup();
        assert_eq!(named, declared_names());
    }
}
