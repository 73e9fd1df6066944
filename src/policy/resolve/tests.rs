//! The unit tests of `resolve.rs`.

use super::*;
use crate::contracts::payment::Receipt;
use crate::contracts::store::ReleaseKind;
use crate::domain::{Fingerprint, State};

fn record(state: State, until: Option<i64>) -> Record {
    let until = until.map(Time::from_ms);
    let order = order();
    Record {
        pk: Key::for_order(&order),
        state,
        created: Some(Time::from_ms(1)),
        expires: Some(Time::from_secs(10_000)),
        receipt: None,
        fingerprint: Some(Fingerprint::for_order(&order)),
        owner: until.map(|_| Owner::new("someone")),
        lease_until: until,
        attempt: Some(2),
        sent: Some(Time::from_ms(1)),
        refusals: Some(3),
        awaited: None,
        wait_until: None,
        done_fingerprint: None,
    }
}

fn order() -> Order {
    Order::new("ord-r", 900, "EUR", "cus_r", "pm_card_visa").unwrap()
}

fn start(confirmed: Confirmed) -> Resolver {
    let (resolver, step) = Resolver::new(
        &order(),
        Owner::new("resolve-t"),
        Time::from_ms(100),
        Time::from_ms(200),
        Time::from_secs(5),
        confirmed,
    );
    assert!(matches!(step, ResolveStep::Read));
    resolver
}

fn leased(resolver: &mut Resolver) {
    let step = resolver.on(ResolveInput::Read(Ok(Some(record(State::Free, None)))));
    assert!(matches!(step, ResolveStep::Write(ResolveWrite::Lease)));
    let applied = WriteOutcome::Applied(record(State::InProgress, Some(200)));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(applied))),
        ResolveStep::Lookup
    ));
}

#[test]
fn a_live_lease_is_refused_before_any_write() {
    let mut resolver = start(Confirmed::default());
    let live = record(State::InProgress, Some(150));
    assert!(matches!(
        resolver.on(ResolveInput::Read(Ok(Some(live)))),
        ResolveStep::Done(Err(ResolveError::LiveLease { until })) if until == Time::from_ms(150)
    ));
}

#[test]
fn an_order_that_awaits_its_payment_is_refused_before_any_write_naming_it() {
    let mut resolver = start(Confirmed::default());
    let waiting = Record {
        awaited: Some("pi_wait".into()),
        wait_until: Some(Time::from_secs(5_000)),
        ..record(State::Awaiting, None)
    };
    let step = resolver.on(ResolveInput::Read(Ok(Some(waiting))));
    let ResolveStep::Done(Err(refused)) = step else {
        panic!("{step:?}")
    };
    assert!(
        matches!(&refused, ResolveError::Awaiting { payment_id, .. } if payment_id == "pi_wait"),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("does not touch it"),
        "{refused}"
    );
}

#[test]
fn a_succeeded_charge_completes_under_the_leased_attempt() {
    let mut resolver = start(Confirmed::default());
    leased(&mut resolver);
    let found = Lookup::Succeeded(Receipt::new("ch_r"));
    assert!(matches!(
        resolver.on(ResolveInput::Looked(Ok(found))),
        ResolveStep::Write(ResolveWrite::Complete)
    ));
    match resolver.write(ResolveWrite::Complete) {
        Write::Complete(req) => assert_eq!((req.attempt, req.receipt), (2, "ch_r")),
        other => panic!("{other:?}"),
    }
    let done = WriteOutcome::Applied(record(State::Done, None));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(done))),
        ResolveStep::Done(Ok(Resolution::Completed { attempt: 2, .. }))
    ));
}

#[test]
fn a_pending_charge_keeps_the_key_and_is_refused() {
    let mut resolver = start(Confirmed::default());
    leased(&mut resolver);
    let pending = Lookup::Pending {
        payment_id: "py_1".into(),
        status: "pending".into(),
    };
    assert!(matches!(
        resolver.on(ResolveInput::Looked(Ok(pending))),
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
    ));
    let released = WriteOutcome::Applied(record(State::Free, None));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(released))),
        ResolveStep::Done(Err(ResolveError::Pending { .. }))
    ));
}

#[test]
fn not_found_moves_to_the_next_key_resetting_declines_only_when_asked() {
    for retry_declined in [false, true] {
        let mut resolver = start(Confirmed {
            retry_declined,
            ..Confirmed::default()
        });
        leased(&mut resolver);
        assert!(matches!(
            resolver.on(ResolveInput::Looked(Ok(Lookup::NotFound))),
            ResolveStep::Write(ResolveWrite::Release(ReleaseKind::NextKey { reset_refusals: r }))
                if r == retry_declined
        ));
    }
}

#[test]
fn a_lookup_that_failed_keeps_the_key_and_is_refused() {
    let mut resolver = start(Confirmed::default());
    leased(&mut resolver);
    let unreadable = Err(PaymentError::retryable(
        crate::contracts::payment::FailureKind::Connection,
    ));
    assert!(matches!(
        resolver.on(ResolveInput::Looked(unreadable)),
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
    ));
    let released = WriteOutcome::Applied(record(State::Free, None));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(released))),
        ResolveStep::Done(Err(ResolveError::Provider(_)))
    ));
}

#[test]
fn every_write_of_resolve_is_its_own_lease_fenced_on_its_owner() {
    let mut resolver = start(Confirmed::default());
    let owner = Owner::new("resolve-t");
    match resolver.write(ResolveWrite::Lease) {
        Write::LeaseForResolve(req) => {
            assert_eq!(req.owner, &owner);
            assert_eq!(req.fingerprint, &Fingerprint::for_order(&order()));
            assert_eq!(req.lease_until, Time::from_ms(200));
        }
        other => panic!("{other:?}"),
    }
    leased(&mut resolver);
    match resolver.write(ResolveWrite::Release(ReleaseKind::KeepKey)) {
        Write::Release(req) => {
            assert_eq!((req.owner, req.kind), (&owner, ReleaseKind::KeepKey))
        }
        other => panic!("{other:?}"),
    }
    match resolver.write(ResolveWrite::Complete) {
        Write::Complete(req) => assert_eq!((req.owner, req.attempt), (&owner, 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_complete_refused_because_the_record_moved_is_a_change_to_run_again() {
    let mut resolver = start(Confirmed::default());
    leased(&mut resolver);
    let found = Lookup::Succeeded(Receipt::new("ch_r"));
    resolver.on(ResolveInput::Looked(Ok(found)));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(WriteOutcome::Refused(None)))),
        ResolveStep::Done(Err(ResolveError::Changed))
    ));
}

#[test]
fn an_open_payment_is_cancelled_and_looked_up_again_and_still_open_keeps_the_key() {
    let mut resolver = start(Confirmed::default());
    leased(&mut resolver);
    let open = || Lookup::Open {
        payment_id: "pi_open".into(),
        status: "requires_payment_method".into(),
        awaits_customer: false,
    };
    assert!(matches!(
        resolver.on(ResolveInput::Looked(Ok(open()))),
        ResolveStep::Cancel { payment_id } if payment_id == "pi_open"
    ));
    assert!(matches!(
        resolver.on(ResolveInput::Cancelled(Ok(Cancel::Cancelled))),
        ResolveStep::Lookup
    ));
    assert!(matches!(
        resolver.on(ResolveInput::Looked(Ok(open()))),
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
    ));
    let released = WriteOutcome::Applied(record(State::Free, None));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(released))),
        ResolveStep::Done(Err(ResolveError::StillOpen { payment_id })) if payment_id == "pi_open"
    ));
}

#[test]
fn another_payload_or_an_unchecked_legacy_record_is_refused_before_any_lease() {
    // Another payload: a corrected order, taken only if the table's condition says
    // nothing of the recorded one can still succeed; refused otherwise.
    let mut resolver = start(Confirmed::default());
    let other = Record {
        fingerprint: Some(Fingerprint::new("another")),
        ..record(State::Free, None)
    };
    assert!(matches!(
        resolver.on(ResolveInput::Read(Ok(Some(other.clone())))),
        ResolveStep::Write(ResolveWrite::Correct)
    ));
    assert!(matches!(
        resolver.on(ResolveInput::Written(Ok(WriteOutcome::Refused(Some(
            other
        ))))),
        ResolveStep::Done(Err(ResolveError::FingerprintMismatch))
    ));
    let mut corrected = start(Confirmed::default());
    let done_other = Record {
        fingerprint: Some(Fingerprint::new("another")),
        ..record(State::Done, None)
    };
    assert!(matches!(
        corrected.on(ResolveInput::Read(Ok(Some(done_other)))),
        ResolveStep::Done(Ok(Resolution::AlreadyDone { .. }))
    ));
    let legacy = Record {
        fingerprint: None,
        ..record(State::InProgress, None)
    };
    let mut unchecked = start(Confirmed::default());
    assert!(matches!(
        unchecked.on(ResolveInput::Read(Ok(Some(legacy.clone())))),
        ResolveStep::Done(Err(ResolveError::LegacyFormat))
    ));
    let mut checked = start(Confirmed {
        legacy_format_checked: true,
        ..Confirmed::default()
    });
    assert!(matches!(
        checked.on(ResolveInput::Read(Ok(Some(legacy)))),
        ResolveStep::Write(ResolveWrite::Lease)
    ));
}
