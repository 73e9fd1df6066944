//! charge-once's words for the library machine's: how a payment's failure classifies
//! (the one reading of `PaymentError` the machine sees), a lookup and a receipt in, and
//! each of the machine's ends out as the record's [`Outcome`], with the names, texts
//! and log lines charge-once has always given them (`policy/outcome.rs`).

use idempotent_consumer::machine::{
    self as library, Awaited, Class, Classify, End, Found, Ignored, Refusal, Retry, Unproven,
    Unresolved,
};

use super::steps::{Input, NoAnswer, Step};
use crate::contracts::payment::{AUTHENTICATION_REQUIRED, Lookup, PaymentError, Receipt};
use crate::policy::outcome::{Call, Outcome, ReconcileCause, RetryCause, Shared};

/// A payment's failure as the machine reads it: what it means for the key.
impl Classify for PaymentError {
    fn class(&self) -> Class {
        match self {
            // The decline leaves its PaymentIntent open (`requires_payment_method`).
            Self::Declined { payment_id, .. } => Class::Refused {
                open: payment_id.clone(),
            },
            Self::AuthenticationRequired { payment_id } => Class::AwaitsSomeone {
                reference: payment_id.clone(),
            },
            Self::UnexpectedStatus { payment_id, status } => Class::Unexpected {
                reference: payment_id.clone(),
                status: status.clone(),
            },
            Self::KeyReused => Class::KeyReused,
            Self::Rejected { .. } => Class::RefusedForGood,
            Self::Pending { payment_id, status } => Class::InFlight {
                reference: payment_id.clone(),
                status: status.clone(),
            },
            Self::ReplayedServerError { status } => Class::ReplayedServerError { status: *status },
            Self::Retryable { .. } => Class::Unknown,
        }
    }
}

/// The driver's answer, in the machine's words.
pub(super) fn input(input: Input) -> library::Input<Shared<PaymentError>> {
    match input {
        Input::Written(answer) => library::Input::Written(answer),
        Input::Charged(answer) => library::Input::Performed(answer.map(receipt).map_err(shared)),
        Input::Looked(answer) => library::Input::Looked(answer.map(found).map_err(shared)),
        Input::Cancelled(answer) => library::Input::Cancelled(answer.map_err(shared)),
    }
}

/// A call's missing answer, its failure shared as the machines keep it.
pub fn shared(no_answer: NoAnswer<PaymentError>) -> NoAnswer<Shared<PaymentError>> {
    no_answer.map_failure(Shared::new)
}

/// A receipt of a charge, in the machines' words.
pub fn receipt(receipt: Receipt) -> library::Receipt {
    library::Receipt {
        id: receipt.id,
        detail: receipt.charge,
    }
}

/// A lookup of the order's payments, in the machines' words.
pub fn found(lookup: Lookup) -> Found {
    match lookup {
        Lookup::Succeeded(paid) => Found::Done(receipt(paid)),
        Lookup::Pending { payment_id, status } => Found::InFlight {
            reference: payment_id,
            status,
        },
        Lookup::Open {
            payment_id,
            status,
            awaits_customer,
        } => Found::Open {
            reference: payment_id,
            status,
            awaits_someone: awaits_customer,
        },
        Lookup::NotFound => Found::Nothing,
    }
}

/// The machine's step, in the driver's words.
pub(super) fn step(step: library::Step<Shared<PaymentError>>) -> Step {
    match step {
        library::Step::Write(kind) => Step::Write(kind),
        library::Step::Perform { key } => Step::Charge { key },
        library::Step::Lookup => Step::Lookup,
        library::Step::Cancel { reference } => Step::Cancel {
            payment_id: reference,
        },
        library::Step::Done(end) => Step::Done(outcome_of(end)),
    }
}

/// A machine's end (the record's, a settlement's) as the record's outcome.
pub fn outcome_of(end: End<Shared<PaymentError>>) -> Outcome {
    match end {
        End::Done {
            receipt,
            attempt,
            found: false,
        } => Outcome::Charged {
            receipt: receipt.id,
            charge: receipt.detail,
            attempt,
        },
        End::Done {
            receipt,
            attempt,
            found: true,
        } => Outcome::Reconciled {
            receipt: receipt.id,
            charge: receipt.detail,
            attempt,
        },
        End::Duplicate { receipt } => Outcome::Duplicate { receipt },
        End::Conflict => Outcome::Conflict,
        End::InProgress { until } => Outcome::InProgress { until },
        End::Refused { refusal, attempt } => declined(refusal, attempt),
        End::RefusalLimit { refusals } => Outcome::DeclineLimit { declines: refusals },
        End::RefusedForGood { failure, attempt } => {
            let (status, code) = match &*failure.0 {
                PaymentError::Rejected { status, code } => (*status, code.clone()),
                // Only a rejection classifies as refused for good.
                _ => (0, None),
            };
            Outcome::Rejected {
                status,
                code,
                attempt,
            }
        }
        End::Retry { cause, attempt } => Outcome::FailedRetryable {
            cause: retry(cause),
            attempt,
        },
        End::Deadline { before, attempt } => Outcome::Deadline {
            before: call(before),
            attempt,
        },
        End::Unresolved { cause } => Outcome::NeedsReconciliation {
            cause: unresolved(cause),
        },
        End::Awaiting {
            reference: payment_id,
            attempt,
            wait_until,
            awaited: Awaited::Someone,
        } => Outcome::AuthenticationRequired {
            payment_id,
            attempt,
            wait_until,
        },
        End::Awaiting {
            reference: payment_id,
            attempt,
            wait_until,
            awaited: Awaited::Processing,
        } => Outcome::PaymentProcessing {
            payment_id,
            attempt,
            wait_until,
        },
        End::AlreadyAwaiting { reference } => Outcome::AwaitingCustomer {
            payment_id: reference,
        },
        End::Settled { reference, done } => Outcome::Settled {
            payment_id: reference,
            paid: done,
        },
        End::Ignored { reference, why } => Outcome::EventIgnored {
            payment_id: reference,
            why: ignored(why),
        },
        End::Unrecorded { reference } => Outcome::PaymentUnrecorded {
            payment_id: reference,
        },
    }
}

/// Why an event changes nothing, as the log line says it.
fn ignored(why: Ignored) -> &'static str {
    match why {
        Ignored::AlreadyDone => "the order is already done with this payment",
        Ignored::AnotherFacts => "the provider says the payment is not this order's",
        Ignored::AnswerMissing => "the provider's answer is missing",
        Ignored::NotAwaited => "the order does not await this payment",
        Ignored::NotFinal => "not final: the payment may still succeed, and the order waits for it",
    }
}

/// A refusal is a decline: the provider's (its codes), a debit in flight that failed
/// (`payment_failed`), or, for the mutant only, a request for authentication.
fn declined(refusal: Refusal<Shared<PaymentError>>, attempt: u32) -> Outcome {
    let (code, decline_code) = match refusal {
        Refusal::Failure(failure) => match &*failure.0 {
            PaymentError::Declined {
                code, decline_code, ..
            } => (code.clone(), decline_code.clone()),
            // Only a decline classifies as refused.
            other => (other.to_string(), None),
        },
        Refusal::FailedInFlight => ("payment_failed".to_owned(), None),
        Refusal::AwaitsSomeone => (AUTHENTICATION_REQUIRED.to_owned(), None),
    };
    Outcome::Declined {
        code,
        decline_code,
        attempt,
    }
}

fn call(call: library::Call) -> Call {
    match call {
        library::Call::Reserve => Call::Reserve,
        library::Call::NextAttempt => Call::NextAttempt,
        library::Call::Perform => Call::Charge,
        library::Call::Lookup => Call::Lookup,
        library::Call::Cancel => Call::Cancel,
        library::Call::Complete => Call::Complete,
        library::Call::Await => Call::Await,
        library::Call::Settle => Call::Settle,
    }
}

fn retry(cause: Retry<Shared<PaymentError>>) -> RetryCause {
    match cause {
        Retry::StoreTimedOut(c) => RetryCause::StoreTimedOut(call(c)),
        Retry::Store { call: c, source } => RetryCause::Store {
            call: call(c),
            source,
        },
        Retry::LookupTimedOut => RetryCause::LookupTimedOut,
        Retry::Lookup(e) => RetryCause::Lookup(e),
        Retry::EffectTimedOut => RetryCause::ChargeTimedOut,
        Retry::Effect(e) => RetryCause::Charge(e),
        Retry::LeaseLostBeforeNextAttempt => RetryCause::LeaseLostBeforeNextAttempt,
        Retry::LeaseLostBeforeAwaiting => RetryCause::LeaseLostBeforeAwaiting,
        Retry::ServerErrorUnsettled { status } => RetryCause::ServerErrorUnsettled { status },
        Retry::CancelTimedOut => RetryCause::CancelTimedOut,
        Retry::Cancel(e) => RetryCause::Cancel(e),
        Retry::OpenAttemptsLeft(n) => RetryCause::OpenPaymentsLeft(n),
        Retry::Missing { reference } => RetryCause::PaymentMissing {
            payment_id: reference,
        },
        Retry::Report(e) => RetryCause::Report(e),
        Retry::OutOfPhase { phase, answer } => RetryCause::OutOfPhase { phase, answer },
    }
}

fn unresolved(cause: Unresolved) -> ReconcileCause {
    match cause {
        Unresolved::Table(cause) => cause.into(),
        Unresolved::Unexpected { reference, status } => ReconcileCause::UnexpectedStatus {
            payment_id: reference,
            status,
        },
        Unresolved::InFlightAnswer { reference, status } => ReconcileCause::PendingAnswer {
            payment_id: reference,
            status,
        },
        Unresolved::KeyReused { provider_key } => ReconcileCause::KeyReused { provider_key },
        Unresolved::Unproven { reference, why } => ReconcileCause::UnprovenPayment {
            payment_id: reference,
            why: match why {
                Unproven::AwaitsAnother => {
                    "the order awaits another payment, which may succeed too"
                }
                Unproven::OtherFields => {
                    "its amount, currency, customer or payment method differ from the recorded \
                     order's"
                }
            },
        },
        Unresolved::LateConfirmation { reference, receipt } => ReconcileCause::LateConfirmation {
            payment_id: reference,
            receipt,
        },
        Unresolved::AwaitsWithoutReference => ReconcileCause::AuthenticationWithoutPayment,
        Unresolved::RecordMovedOn {
            receipt,
            attempt,
            state,
            record_attempt,
            record_receipt,
        } => ReconcileCause::RecordMovedOn {
            receipt,
            attempt,
            state,
            record_attempt,
            record_receipt,
        },
    }
}
