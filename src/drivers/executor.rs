//! charge-once's side of the one executor (`idempotent_consumer::executor`): how the
//! executor reads a Stripe answer ([`ProviderFailure`] for [`PaymentError`]), how the
//! payment calls are named in traces and metrics and what a record's steps leave
//! behind (warnings, metrics, crash points: [`Payments`]), and the executor of a unit
//! of work built from the consumer's [`Settings`]. Every call of every path (a record,
//! a provider event, the settler, `resolve`) is made through it.

use std::time::Duration;

use tracing::{Span, warn};

use idempotent_consumer::effect::{EffectCall, Witness};
pub use idempotent_consumer::executor::Closed;
use idempotent_consumer::executor::{
    NoAnswer, Observe, ProviderFailure, Safeguards, Throttle, Wait,
};
use idempotent_consumer::machine::{Receipt, WriteKind};

use crate::contracts::payment::{FailureKind, Limiter, PaymentError};
use crate::contracts::store::{StoreError, WriteOutcome};
use crate::domain::clock::Time;
use crate::drivers::charge::Settings;
use crate::drivers::metrics::{CHARGE_RETRIED, TAKEOVER};
use crate::drivers::spans::{self, ProviderCall};
use crate::{crash_points, error_chain};

/// The executor of charge-once's calls.
pub type Executor<'s> = idempotent_consumer::executor::Executor<'s, Payments>;

/// The executor of one unit of work under `settings`, before `deadline`.
pub fn executor(settings: &Settings, deadline: Time) -> Executor<'static> {
    Executor::new(
        Safeguards {
            clock: settings.clock.clone(),
            budget: settings.budget,
            breakers: settings.breakers.clone(),
        },
        &Payments,
        deadline,
    )
}

/// How charge-once names its provider calls in traces (`drivers/spans.rs`) and its
/// provider calls' latency histogram.
pub struct Payments;

impl Observe for Payments {
    type Call = ProviderCall;
    type Failure = PaymentError;
    const PROVIDER_LATENCY: &'static str = crate::drivers::metrics::PAYMENT_LATENCY;

    fn call_span(&self, call: ProviderCall, retry: bool) -> Span {
        spans::provider_call(call, retry)
    }

    fn answered(&self, span: &Span, failure: Option<&NoAnswer<PaymentError>>) {
        spans::provider_answered(span, failure);
    }

    fn wait_span(&self, wait: Wait, planned: Duration) -> Span {
        spans::wait(wait, planned)
    }
}

/// A record's steps: its store calls' spans (named as DynamoDB operations), the
/// takeover metric, the warnings of a lost fence and a replayed server error, and the
/// crash points after a reservation, a charge and a completion.
impl Witness for Payments {
    const REPLAYED: &'static str = CHARGE_RETRIED;

    fn write_span(&self, kind: WriteKind) -> Span {
        spans::store_call(kind)
    }

    fn written(
        &self,
        span: &Span,
        kind: WriteKind,
        answer: &Result<WriteOutcome, NoAnswer<StoreError>>,
        started_at: Time,
    ) {
        spans::store_answered(span, answer);
        observe_write(kind, answer, started_at);
    }

    fn performed(&self, answer: &Result<Receipt, NoAnswer<PaymentError>>, attempt: u32) {
        match answer {
            Err(NoAnswer::Failed(PaymentError::ReplayedServerError { status })) => warn!(
                status,
                attempt, "provider replayed a server error; reconciling"
            ),
            Ok(_) => crash_points::reached("after-charge"),
            Err(_) => {}
        }
    }
}

/// The library's names of an effect's calls, as charge-once's traces name them.
impl From<EffectCall> for ProviderCall {
    fn from(call: EffectCall) -> Self {
        match call {
            EffectCall::Perform => Self::Charge,
            EffectCall::LookUp => Self::Lookup,
            EffectCall::Cancel => Self::Cancel,
        }
    }
}

/// Metrics, warnings and crash points on a write's answer; what the answer means is
/// the machine's to decide.
fn observe_write(
    kind: WriteKind,
    answer: &Result<WriteOutcome, NoAnswer<StoreError>>,
    started_at: Time,
) {
    match (kind, answer) {
        (WriteKind::Reserve, Ok(WriteOutcome::Applied(record))) => {
            if record.created.is_some_and(|created| created < started_at) {
                // A retry reserved a record left `Free` or with an expired lease.
                metrics::counter!(TAKEOVER).increment(1);
            }
            crash_points::reached("after-reserve");
        }
        (WriteKind::Complete, Ok(WriteOutcome::Applied(_))) => {
            crash_points::reached("after-complete");
        }
        (WriteKind::Release(_), Ok(WriteOutcome::Refused(_))) => {
            warn!("release refused: the lease is no longer ours");
        }
        (WriteKind::Release(_), Err(NoAnswer::NoTime)) => {
            warn!("release not started: too close to the deadline, where the lease ends");
        }
        (WriteKind::Release(_), Err(NoAnswer::TimedOut)) => {
            warn!("release timed out; the lease ends at its deadline");
        }
        (WriteKind::Release(_), Err(NoAnswer::Failed(e))) => {
            warn!(error = %error_chain(e), "release failed; the lease ends at its deadline");
        }
        _ => {}
    }
}

impl ProviderFailure for PaymentError {
    fn is_down(&self) -> bool {
        provider_is_down(self)
    }

    fn throttle(&self) -> Option<Throttle> {
        self.throttle().map(|throttle| match throttle {
            crate::contracts::payment::Throttle::RateLimited(_) => Throttle::RateLimited,
            crate::contracts::payment::Throttle::Lock => Throttle::Lock,
        })
    }

    fn advised_not_to_retry(&self) -> bool {
        self.advised_not_to_retry()
    }

    fn refuses_the_key(&self) -> bool {
        self.refuses_the_key()
    }

    /// A call not sent because this environment's pace had no slot for it before the
    /// deadline: backpressure, as a rate limit is, and nothing reached the provider.
    fn not_sent() -> Self {
        PaymentError::Retryable {
            kind: FailureKind::RateLimited(Limiter::Unnamed),
            source: Some(
                "not sent: the pace of provider calls had no slot before the deadline".into(),
            ),
            should_retry: Some(false),
        }
    }
}

/// A provider failure that says the provider is down, not an answer about this charge
/// (a decline, a rejection, a reused key, a 409 on a key in use) nor backpressure (a
/// rate limit or a lock: paced, never a failure).
pub fn provider_is_down(error: &PaymentError) -> bool {
    matches!(
        error,
        PaymentError::Retryable {
            kind: FailureKind::Timeout
                | FailureKind::Connection
                | FailureKind::Server(_)
                | FailureKind::BadResponse
                | FailureKind::NoEndpoint,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limit_or_a_lock_is_backpressure_and_never_says_the_provider_is_down() {
        for kind in [
            FailureKind::RateLimited(Limiter::EndpointRate),
            FailureKind::RateLimited(Limiter::Unnamed),
            FailureKind::Lock,
        ] {
            let error = PaymentError::retryable(kind);
            assert!(!provider_is_down(&error), "{kind:?}");
            assert!(ProviderFailure::throttle(&error).is_some(), "{kind:?}");
        }
        let not_sent = <PaymentError as ProviderFailure>::not_sent();
        assert!(!provider_is_down(&not_sent));
        assert_eq!(
            ProviderFailure::throttle(&not_sent),
            Some(Throttle::RateLimited)
        );
        assert!(ProviderFailure::advised_not_to_retry(&not_sent));
        assert!(provider_is_down(&PaymentError::retryable(
            FailureKind::Server(503)
        )));
    }
}
