//! `resolve`'s rules for any effect: the provider's certain answer moves the record
//! (done → completed, nothing → the next key), anything else keeps the key; an open
//! attempt is cancelled first; a record that awaits or is leased is never touched.
//! charge-once's `policy/resolve/tests.rs` runs the same machine with its own effect.

use super::*;
use crate::machine::Receipt;
use crate::record::Fingerprint;

type Step = ResolveStep<&'static str>;

const NOW: Time = Time::from_ms(1_800_000_000_000);

fn identity() -> Identity {
    Identity {
        key: Key::new("transfer#", "t-1"),
        fingerprint: Fingerprint::new("f"),
    }
}

fn record(state: State) -> Record {
    Record {
        fingerprint: Some(Fingerprint::new("f")),
        attempt: Some(2),
        ..Record::new(identity().key, state)
    }
}

fn resolver(confirmed: Confirmed) -> Resolver<&'static str> {
    let until = NOW + std::time::Duration::from_secs(60);
    let (resolver, step) = Resolver::new(identity(), Owner::new("me"), NOW, until, NOW, confirmed);
    assert!(matches!(step, ResolveStep::Read));
    resolver
}

fn leased(resolver: &mut Resolver<&'static str>, state: State) {
    let step = resolver.on(ResolveInput::Read(Ok(Some(record(state.clone())))));
    assert!(
        matches!(step, ResolveStep::Write(ResolveWrite::Lease)),
        "{step:?}"
    );
    let step = resolver.on(ResolveInput::Written(Ok(WriteOutcome::Applied(record(
        state,
    )))));
    assert!(matches!(step, ResolveStep::Lookup), "{step:?}");
}

fn applied(state: State) -> ResolveInput<&'static str> {
    ResolveInput::Written(Ok(WriteOutcome::Applied(record(state))))
}

#[test]
fn nothing_found_releases_the_record_to_the_next_key_and_resets_refusals_when_confirmed() {
    let mut r = resolver(Confirmed {
        reset_refusals: true,
        ..Confirmed::default()
    });
    leased(&mut r, State::Free);
    let step: Step = r.on(ResolveInput::Looked(Ok(Found::Nothing)));
    assert!(matches!(
        step,
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::NextKey {
            reset_refusals: true
        }))
    ));
    let step = r.on(applied(State::Free));
    assert!(matches!(
        step,
        ResolveStep::Done(Ok(Resolution::Released { next_attempt: 2 }))
    ));
}

#[test]
fn an_effect_found_done_completes_the_record_with_it() {
    let mut r = resolver(Confirmed::default());
    leased(&mut r, State::Free);
    let done = Receipt {
        id: "tr_9".to_owned(),
        detail: None,
    };
    let step = r.on(ResolveInput::Looked(Ok(Found::Done(done))));
    assert!(matches!(step, ResolveStep::Write(ResolveWrite::Complete)));
    assert!(matches!(r.write(ResolveWrite::Complete), Write::Complete(c) if c.receipt == "tr_9"));
    let step = r.on(applied(State::Done));
    assert!(matches!(
        step,
        ResolveStep::Done(Ok(Resolution::Completed { .. }))
    ));
}

#[test]
fn an_open_attempt_is_cancelled_and_one_still_open_keeps_the_key() {
    let mut r = resolver(Confirmed::default());
    leased(&mut r, State::Free);
    let open = || Found::Open {
        reference: "tr_open".to_owned(),
        status: "open".to_owned(),
        awaits_someone: false,
    };
    let step = r.on(ResolveInput::Looked(Ok(open())));
    assert!(matches!(step, ResolveStep::Cancel { ref reference } if reference == "tr_open"));
    let step = r.on(ResolveInput::Cancelled(Ok(Cancel::Cancelled)));
    assert!(matches!(step, ResolveStep::Lookup));
    let step = r.on(ResolveInput::Looked(Ok(open())));
    assert!(matches!(
        step,
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
    ));
    let step = r.on(applied(State::Free));
    assert!(matches!(
        step,
        ResolveStep::Done(Err(Stopped::StillOpen { .. }))
    ));
}

#[test]
fn a_failed_lookup_keeps_the_key_and_refuses() {
    let mut r = resolver(Confirmed::default());
    leased(&mut r, State::Free);
    let step = r.on(ResolveInput::Looked(Err("provider down")));
    assert!(matches!(
        step,
        ResolveStep::Write(ResolveWrite::Release(ReleaseKind::KeepKey))
    ));
    let step = r.on(applied(State::Free));
    assert!(matches!(
        step,
        ResolveStep::Done(Err(Stopped::Provider("provider down")))
    ));
}

#[test]
fn a_record_that_awaits_or_is_leased_is_never_touched() {
    let mut r = resolver(Confirmed::default());
    let awaiting = Record {
        awaited: Some("tr_1".to_owned()),
        ..record(State::Awaiting)
    };
    let step = r.on(ResolveInput::Read(Ok(Some(awaiting))));
    assert!(matches!(
        step,
        ResolveStep::Done(Err(Stopped::Awaiting { .. }))
    ));

    let mut r = resolver(Confirmed::default());
    let live = Record {
        lease_until: Some(NOW + std::time::Duration::from_secs(5)),
        ..record(State::InProgress)
    };
    let step = r.on(ResolveInput::Read(Ok(Some(live))));
    assert!(matches!(
        step,
        ResolveStep::Done(Err(Stopped::LiveLease { .. }))
    ));
}

#[test]
fn an_uncertain_record_is_never_touched() {
    let mut r = resolver(Confirmed::default());
    let step = r.on(ResolveInput::Read(Ok(Some(record(State::Uncertain)))));
    assert!(matches!(step, ResolveStep::Done(Err(Stopped::Uncertain))));
}
