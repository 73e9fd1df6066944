//! The unit tests of `outcome.rs`.

use super::*;
use crate::policy::outcome_kind::Level;

#[test]
fn only_effects_and_duplicates_acknowledge_the_message() {
    let charged = Outcome::Charged {
        receipt: "c".into(),
        charge: None,
        attempt: 1,
    };
    let reconciled = Outcome::Reconciled {
        receipt: "c".into(),
        charge: None,
        attempt: 2,
    };
    for acked in [charged, reconciled, Outcome::Duplicate { receipt: None }] {
        assert!(acked.handling().is_ack(), "{acked:?}");
        assert_eq!(acked.kind().level(), Level::Info);
        assert_eq!(acked.reason(), None);
    }
    for failed in [
        Outcome::Conflict,
        Outcome::InProgress { until: None },
        Outcome::retryable(RetryCause::LookupTimedOut, None),
        Outcome::NeedsReconciliation {
            cause: ReconcileCause::UnknownState,
        },
        Outcome::DeclineLimit { declines: 3 },
        Outcome::Rejected {
            status: 404,
            code: None,
            attempt: 1,
        },
        Outcome::Deadline {
            before: Call::Charge,
            attempt: Some(1),
        },
    ] {
        assert!(!failed.handling().is_ack(), "{failed:?}");
        assert_ne!(failed.kind().level(), Level::Info, "{failed:?}");
        assert!(failed.reason().is_some(), "{failed:?}");
    }
}

#[test]
fn an_authentication_request_names_its_payment_and_is_acknowledged_for_the_table_holds_it() {
    let strong = Outcome::AuthenticationRequired {
        payment_id: "pi_1".into(),
        attempt: 1,
        wait_until: Time::from_secs(1),
    };
    assert_eq!(strong.name(), "authentication_required");
    assert_eq!(strong.handling(), Handling::Ack, "no DLQ, no redrive");
    assert_eq!(strong.details().payment, Some("pi_1"));
    let ended = Outcome::Settled {
        payment_id: "pi_1".into(),
        paid: false,
    };
    assert_eq!(ended.name(), "authentication_expired");
    let paid = Outcome::Settled {
        payment_id: "pi_1".into(),
        paid: true,
    };
    assert_eq!(
        (paid.name(), paid.details().receipt),
        ("reconciled", Some("pi_1"))
    );
}

#[test]
fn a_pending_charge_is_retried_to_settle_while_every_other_reconciliation_is_dead_lettered() {
    let pending = Outcome::NeedsReconciliation {
        cause: ReconcileCause::PendingAtProvider {
            payment_id: "pi_1".into(),
            status: "processing".into(),
        },
    };
    assert_eq!(pending.kind(), OutcomeKind::NeedsReconciliation);
    assert_eq!(pending.handling(), Handling::Retry(Wait::Settle));
    let by_hand = Outcome::NeedsReconciliation {
        cause: ReconcileCause::KeyReused {
            provider_key: "cobro#A#1".into(),
        },
    };
    assert_eq!(by_hand.handling(), Handling::DeadLetter);
    assert_eq!(by_hand.handling(), by_hand.kind().handling());
}

#[test]
fn a_wait_with_an_end_carries_it() {
    let at = Time::from_ms(42);
    assert_eq!(Outcome::InProgress { until: Some(at) }.until(), Some(at));
    let deferred = Outcome::Deferred {
        dependency: Dependency::Store,
        until: at,
    };
    assert_eq!(deferred.until(), Some(at));
    assert_eq!(deferred.handling(), Handling::Retry(Wait::BreakerProbe));
    assert_eq!(Outcome::Conflict.until(), None);
}

#[test]
fn a_failure_keeps_its_source_and_the_log_reads_the_whole_chain() {
    let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
    let outcome = Outcome::retryable(
        RetryCause::Store {
            call: Call::Complete,
            source: Shared::new(StoreError::backend("UpdateItem", "cobro#A-1", reset)),
        },
        Some(2),
    );
    let Outcome::FailedRetryable { cause, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    let source = std::error::Error::source(cause).expect("the store error is kept");
    assert!(source.downcast_ref::<Shared<StoreError>>().is_some());
    assert_eq!(
        outcome.reason().as_deref(),
        Some("complete: UpdateItem on cobro#A-1 failed: reset by peer")
    );
    assert_eq!(outcome.details().attempt, Some(2));
}

#[test]
fn a_rate_limit_or_a_lock_is_rate_limited_and_comes_back_soon_not_a_failure() {
    use crate::contracts::payment::{FailureKind, Limiter};
    for kind in [
        FailureKind::RateLimited(Limiter::EndpointRate),
        FailureKind::Lock,
    ] {
        for cause in [
            RetryCause::Charge(Shared::new(PaymentError::retryable(kind))),
            RetryCause::Lookup(Shared::new(PaymentError::retryable(kind))),
            RetryCause::Cancel(Shared::new(PaymentError::retryable(kind))),
        ] {
            let outcome = Outcome::retryable(cause, Some(1));
            assert_eq!(outcome.name(), "rate_limited", "{outcome:?}");
            assert_eq!(
                outcome.handling(),
                Handling::Retry(Wait::Backpressure),
                "{outcome:?}"
            );
        }
    }
    let outage = Outcome::retryable(
        RetryCause::Charge(Shared::new(PaymentError::retryable(FailureKind::Server(
            503,
        )))),
        Some(1),
    );
    assert_eq!(outage.name(), "failed_retryable");
    assert_eq!(outage.handling(), Handling::Retry(Wait::Backoff));
}

#[test]
fn who_must_act_decides_the_level() {
    let human = [
        Outcome::Conflict,
        Outcome::NeedsReconciliation {
            cause: ReconcileCause::LegacyItemNotDone,
        },
        Outcome::Rejected {
            status: 400,
            code: Some("parameter_invalid".into()),
            attempt: 1,
        },
    ];
    for outcome in human {
        assert_eq!(outcome.kind().level(), Level::Error, "{outcome:?}");
    }
    let later = Outcome::Declined {
        code: "card_declined".into(),
        decline_code: None,
        attempt: 1,
    };
    assert_eq!(later.kind().level(), Level::Warn);
    assert_eq!(later.details().decline_code, Some(""));
}
