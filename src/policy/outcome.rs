//! How one record ends in the state machine: what happened, and why (a typed cause
//! that keeps its source error). Its name, level and handling are its kind's, declared
//! in `policy/outcome_kind.rs`; what only the batch decides (invalid, unstarted, skipped) is the
//! batch's.

use std::fmt;

use crate::contracts::payment::PaymentError;
use crate::contracts::schema;
use crate::contracts::store::StoreError;
use crate::domain::State;
use crate::domain::clock::Time;
use crate::policy::outcome_kind::{Handling, Level, OutcomeKind, Wait};
use crate::policy::retry::breaker::Dependency;

/// The end of one record. Only the first three acknowledge the message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Charged {
        receipt: String,
        /// The charge the payment made (`latest_charge`), for the log line.
        charge: Option<String>,
        attempt: u32,
    },
    /// Found at the provider by reconciliation and completed with that payment.
    Reconciled {
        receipt: String,
        charge: Option<String>,
        attempt: u32,
    },
    Duplicate {
        receipt: Option<String>,
    },
    /// Same order id, other payload: never charged.
    Conflict,
    /// Another delivery holds a live lease on this order, until then (`None`: not
    /// known).
    InProgress {
        until: Option<Time>,
    },
    Declined {
        code: String,
        decline_code: Option<String>,
        attempt: u32,
    },
    /// The order already has `max_declines` declines: not sent to the provider.
    DeclineLimit {
        declines: u32,
    },
    /// The provider refused the request for good (400, 404); the key is kept.
    Rejected {
        status: u16,
        code: Option<String>,
        attempt: u32,
    },
    /// Transient or unknown: the retry is safe (same key, or reconciled first).
    FailedRetryable {
        cause: RetryCause,
        attempt: Option<u32>,
    },
    /// The next call could not end before the invocation deadline, so it was not
    /// started; the lease ends at the deadline and the retry goes on from there.
    Deadline {
        /// The call that was not started.
        before: Call,
        attempt: Option<u32>,
    },
    /// Cannot be settled automatically.
    NeedsReconciliation {
        cause: ReconcileCause,
    },
    /// The customer's bank asks for authentication: only the customer, back on the
    /// shop's page, can confirm payment `payment_id`. Nothing was charged; the record
    /// awaits them (`Awaiting`, until `wait_until`) and names that payment, so no other
    /// is made while it may succeed; its events or the settler complete the order.
    AuthenticationRequired {
        payment_id: String,
        attempt: u32,
        wait_until: Time,
    },
    /// The provider holds the order's payment `processing` (a bank debit settles in
    /// days): the record awaits it as it awaits a customer, naming it, and its event or
    /// the settler completes or ends it.
    PaymentProcessing {
        payment_id: String,
        attempt: u32,
        wait_until: Time,
    },
    /// A delivery of an order that awaits its customer: nothing to do, no call made.
    AwaitingCustomer {
        payment_id: Option<String>,
    },
    /// An awaited payment settled, from its event: `paid` → the order is `Done` with it
    /// (`reconciled`); otherwise the wait ended without a payment
    /// (`authentication_expired`), and a later message for the order is a new attempt.
    Settled {
        payment_id: String,
        paid: bool,
    },
    /// A provider event that changes nothing here (another order's, a payment the
    /// record does not name, one already settled): acknowledged, and logged.
    EventIgnored {
        payment_id: String,
        why: &'static str,
    },
    /// The provider says a payment of an order the table does not know succeeded
    /// (its record swept, or never made here): acknowledged, logged at warn, counted.
    PaymentUnrecorded {
        payment_id: String,
    },
    /// The dependency's breaker is open in this execution environment: no write and no
    /// call were made; the record comes back with the backoff.
    Deferred {
        dependency: Dependency,
        /// When the breaker lets a probe through (or its probe's deadline).
        until: Time,
    },
}

/// A call of the state machine, as outcomes and logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Reserve,
    Read,
    NextAttempt,
    Charge,
    Lookup,
    Cancel,
    Complete,
    Await,
    Settle,
}

impl Call {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::Read => "read",
            Self::Cancel => "cancel",
            Self::NextAttempt => "next attempt",
            Self::Charge => "charge",
            Self::Lookup => "reconciliation lookup",
            Self::Complete => "complete",
            Self::Await => "await",
            Self::Settle => "settle",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a record failed with a safe retry. The source error is kept whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RetryCause {
    #[error("{0}: the store timed out")]
    StoreTimedOut(Call),
    #[error("{call}")]
    Store {
        call: Call,
        #[source]
        source: Shared<StoreError>,
    },
    #[error("reconciliation lookup timed out")]
    LookupTimedOut,
    #[error("reconciliation lookup")]
    Lookup(#[source] Shared<PaymentError>),
    /// The charge timed out: its outcome is unknown.
    #[error("charge: provider timed out")]
    ChargeTimedOut,
    /// The charge failed with its outcome unknown or transient.
    #[error("charge")]
    Charge(#[source] Shared<PaymentError>),
    #[error("lease lost before moving to the next attempt")]
    LeaseLostBeforeNextAttempt,
    /// The shop's report of an ended wait could not be sent: the record is left
    /// awaiting, so the retry reports it again.
    #[error("reporting the ended wait to the shop")]
    Report(#[source] Shared<crate::contracts::queue::QueueError>),
    #[error("lease lost before the record could await the customer; the next delivery asks again")]
    LeaseLostBeforeAwaiting,
    /// The provider replayed a stored 5xx and no payment of the order is found yet: its
    /// outcome is indeterminate (a payment may still appear), so the key is kept.
    #[error(
        "charge: provider replayed a stored server error (status {status}) and no payment \
         is found yet; the key is kept until the payment appears or the key is forgotten"
    )]
    ServerErrorUnsettled { status: u16 },
    /// The provider has no payment the record names. It never deletes one, so a
    /// setting is wrong; nothing ends, and the retry asks again once it is fixed.
    #[error(
        "the provider has no payment {payment_id}, which the record names: it never deletes \
         one, so the API key is of the other mode (test or live) or of another account, or \
         PAYMENT_API_URL is wrong; nothing ended"
    )]
    PaymentMissing { payment_id: String },
    #[error("cancelling an open payment timed out")]
    CancelTimedOut,
    #[error("cancelling an open payment")]
    Cancel(#[source] Shared<PaymentError>),
    #[error("the order still has an open payment after cancelling {0}; retried later")]
    OpenPaymentsLeft(u8),
    /// A bug: the machine got an answer its phase does not expect.
    #[error("internal: answer {answer} does not fit phase {phase}")]
    OutOfPhase {
        phase: &'static str,
        answer: &'static str,
    },
}

/// The table's reasons a refused reservation needs a person, as this consumer's.
impl From<idempotent_consumer::table::Unsettled> for ReconcileCause {
    fn from(cause: idempotent_consumer::table::Unsettled) -> Self {
        use idempotent_consumer::table::Unsettled;
        match cause {
            Unsettled::LegacyItemNotDone => Self::LegacyItemNotDone,
            // charge-once never writes `Uncertain` (its provider keeps every key): a
            // state it does not write.
            Unsettled::UnknownState | Unsettled::UncertainOutcome => Self::UnknownState,
        }
    }
}

impl ReconcileCause {
    /// The provider holds a payment that may still succeed.
    pub fn is_pending(&self) -> bool {
        matches!(
            self,
            Self::PendingAtProvider { .. } | Self::PendingAnswer { .. }
        )
    }
}

impl RetryCause {
    /// The provider refused the call for its rate or on a locked customer (or this
    /// environment's pace did not send it in time): backpressure, not a failure.
    pub fn is_throttled(&self) -> bool {
        match self {
            Self::Charge(e) | Self::Lookup(e) | Self::Cancel(e) => e.0.throttle().is_some(),
            _ => false,
        }
    }

    /// The provider's answer says a setting is wrong (PAYMENT_API_URL reaches no
    /// endpoint), not that this charge failed.
    pub fn is_setting_fault(&self) -> bool {
        match self {
            Self::Charge(e) | Self::Lookup(e) => e.0.is_setting_fault(),
            Self::PaymentMissing { .. } => true,
            _ => false,
        }
    }
}

/// Why a record cannot be settled automatically: a human looks at the provider first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ReconcileCause {
    #[error(
        "item written by the legacy consumer is not `{done}`: it gave the provider no \
         idempotency key, so it is never taken over",
        done = schema::state::DONE
    )]
    LegacyItemNotDone,
    #[error("item has an unknown `{state}`", state = schema::attr::STATE)]
    UnknownState,
    /// A reconciliation lookup found a payment that may still succeed.
    #[error(
        "the provider holds payment {payment_id} for this order in status `{status}`; no new \
         key is sent while it may succeed: settle it with `resolve` once it is final"
    )]
    PendingAtProvider { payment_id: String, status: String },
    /// The charge itself answered with a payment that is not final.
    #[error(
        "the provider answered with charge {payment_id} in status `{status}`, not final: \
         settle it with `resolve` once it is"
    )]
    PendingAnswer { payment_id: String, status: String },
    #[error("provider says key {provider_key} was used with other parameters")]
    KeyReused { provider_key: String },
    /// The payment answered in a status this consumer does not settle by itself.
    #[error(
        "the provider answered with payment {payment_id} in status `{status}`: settle it at \
         the provider, then with `resolve`"
    )]
    UnexpectedStatus { payment_id: String, status: String },
    /// The bank asked for authentication but neither its answer nor a lookup names the
    /// payment the customer is asked to confirm: the record cannot await it.
    #[error(
        "the customer's bank asks for authentication but no payment of the order is named \
         or found: find it at the provider, then settle the order with `resolve`"
    )]
    AuthenticationWithoutPayment,
    /// A payment of the order succeeded though the order was already paid with another:
    /// charged twice (an open payment confirmed late).
    #[error(
        "payment {payment_id} of this order succeeded, but the order was already paid with \
         {receipt}: charged twice; refund one at the provider"
    )]
    LateConfirmation { payment_id: String, receipt: String },
    /// A payment of the order succeeded that the record does not await and that
    /// cannot be recorded as the order's: a person looks before anything moves.
    #[error(
        "payment {payment_id} of this order succeeded, but {why}: check it at the provider, \
         then refund it or settle the order with `resolve`"
    )]
    UnprovenPayment {
        payment_id: String,
        why: &'static str,
    },
    /// Charged, but the record no longer belongs to this attempt.
    #[error(
        "charged {receipt} under attempt {attempt} but the record moved on ({})",
        schema::stored_fields(state.as_ref(), *record_attempt, record_receipt.as_deref())
    )]
    RecordMovedOn {
        receipt: String,
        attempt: u32,
        state: Option<State>,
        record_attempt: Option<u32>,
        record_receipt: Option<String>,
    },
}

impl Outcome {
    /// Its kind, which declares its name, level and handling (`policy/outcome_kind.rs`).
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Charged { .. } => OutcomeKind::Charged,
            Self::Reconciled { .. } => OutcomeKind::Reconciled,
            Self::Duplicate { .. } => OutcomeKind::Duplicate,
            Self::Conflict => OutcomeKind::Conflict,
            Self::InProgress { .. } => OutcomeKind::InProgress,
            Self::Declined { .. } => OutcomeKind::Declined,
            Self::DeclineLimit { .. } => OutcomeKind::DeclineLimit,
            Self::Rejected { .. } => OutcomeKind::Rejected,
            // Backpressure is told apart from failures: it comes back in seconds.
            Self::FailedRetryable { cause, .. } if cause.is_throttled() => OutcomeKind::RateLimited,
            Self::FailedRetryable { .. } => OutcomeKind::FailedRetryable,
            Self::Deadline { .. } => OutcomeKind::Deadline,
            Self::Deferred { .. } => OutcomeKind::Deferred,
            Self::NeedsReconciliation { .. } => OutcomeKind::NeedsReconciliation,
            Self::AuthenticationRequired { .. } => OutcomeKind::AuthenticationRequired,
            Self::PaymentProcessing { .. } => OutcomeKind::PaymentProcessing,
            Self::AwaitingCustomer { .. } => OutcomeKind::AwaitingCustomer,
            Self::Settled { paid: true, .. } => OutcomeKind::Reconciled,
            Self::Settled { paid: false, .. } => OutcomeKind::AuthenticationExpired,
            Self::EventIgnored { .. } => OutcomeKind::EventIgnored,
            Self::PaymentUnrecorded { .. } => OutcomeKind::PaymentUnrecorded,
        }
    }

    /// Stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// What becomes of the message: its kind's declared handling (which says whether
    /// it is acknowledged, dead-lettered or retried, and the class of its delay), but
    /// for the one cause that differs from its kind: a payment the provider still holds
    /// `pending` is retried after the retry cap, though its kind goes to the DLQ
    /// otherwise, since it settles by itself.
    pub fn handling(&self) -> Handling {
        match self {
            Self::NeedsReconciliation { cause } if cause.is_pending() => {
                Handling::Retry(Wait::Settle)
            }
            _ => self.kind().handling(),
        }
    }

    /// When the wait its handling names ends, when it has one: the holder's lease, or
    /// the breaker's next probe.
    pub fn until(&self) -> Option<Time> {
        match self {
            Self::InProgress { until } => *until,
            Self::Deferred { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// Who must act: its kind's level, but a retry that no retry can help until
    /// someone fixes a setting (PAYMENT_API_URL reaches no endpoint) is an error.
    pub fn level(&self) -> Level {
        match self {
            Self::FailedRetryable { cause, .. } if cause.is_setting_fault() => Level::Error,
            _ => self.kind().level(),
        }
    }

    /// A failure with a safe retry (the machines' ends make these; the tests too).
    #[cfg(test)]
    pub(crate) fn retryable(cause: RetryCause, attempt: Option<u32>) -> Self {
        Self::FailedRetryable { cause, attempt }
    }
}

/// A source error shared by the clones of an outcome (the model checker clones and
/// hashes states): the library's.
pub use idempotent_consumer::machine::Shared;

mod log_line;
pub use log_line::Details;

#[cfg(test)]
mod tests;
