//! The machine's part of "one success per fact": what a lookup of the fact's effects
//! means, by why it was made, and the cancel of an open attempt before the fact may
//! move to a new key.

use std::time::Duration;

use super::{
    Awaited, Call, Cancel, Class, Classify, End, Found, Machine, NoAnswer, Phase, Refusal, Retry,
    Step, Unresolved, WriteKind,
};
use crate::clock::Time;
use crate::store::{ReleaseKind, StoreError, WriteOutcome};

/// Why the machine looks the fact's effects up, which decides what each answer means.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Looking<F> {
    /// Before reusing an old key, or after a replayed 5xx: is the fact done?
    Reconcile,
    /// After a refusal, before the next attempt's key: the refused attempt (and any
    /// other open one) is cancelled first, so nobody can confirm it later.
    AfterRefusal(End<F>),
    /// After a request for someone's confirmation: have they confirmed it since?
    AfterConfirmationRequest(Option<String>),
    /// After a replayed 5xx (this status): an effect may have appeared, or may still;
    /// whatever is not found, the key is kept.
    AfterServerError(u16),
    /// After an answer "in flight": has the effect settled since?
    InFlight,
    /// After a refusal for good: any attempt the request left open is cancelled
    /// before the fact moves to the next key.
    AfterRefusalForGood(End<F>),
}

/// How many open attempts one delivery cancels before it gives up for now: a fact has
/// one per attempt at most, and a later delivery goes on.
const MAX_CANCELS: u8 = 3;

/// How much earlier than the record's creation a lookup reads the provider's objects:
/// the record's clock (the function's) and the provider's may disagree by this much.
pub const LOOKUP_CLOCK_MARGIN: Duration = Duration::from_secs(10 * 60);

/// Where a lookup of a fact's effects starts: the record's creation less
/// [`LOOKUP_CLOCK_MARGIN`] (every effect of the fact was attempted after its first
/// reservation), or the epoch for a record that names no creation.
pub fn lookup_since(created: Option<Time>) -> Time {
    created.map_or(Time::from_ms(0), |created| created - LOOKUP_CLOCK_MARGIN)
}

impl<F: Classify + Clone> Machine<F> {
    /// A lookup's answer, read by why it was made: done → complete with it (whoever
    /// confirmed it); in flight → await it, the key kept; open → cancel it first, or
    /// wait for whoever must confirm it; nothing → the next attempt's key (after a
    /// refusal: the refusal's release), or, after a request for confirmation, a person.
    pub(super) fn on_looked(
        &mut self,
        why: Looking<F>,
        answer: Result<Found, NoAnswer<F>>,
    ) -> Step<F> {
        let attempt = Some(self.lease.attempt);
        let found = match answer {
            Ok(found) => found,
            // After a refusal for good, a lookup refused for good (the same unknown
            // party): no effect of the fact can exist.
            Err(NoAnswer::Failed(failure))
                if failure.class() == Class::RefusedForGood
                    && matches!(why, Looking::AfterRefusalForGood(_)) =>
            {
                return self.nothing_open(why);
            }
            Err(NoAnswer::NoTime) => {
                return Step::Done(End::Deadline {
                    before: Call::Lookup,
                    attempt,
                });
            }
            Err(NoAnswer::TimedOut) => {
                let end = End::retry(Retry::LookupTimedOut, attempt);
                return self.release(ReleaseKind::KeepKey, end);
            }
            Err(NoAnswer::Failed(failure)) => {
                let end = End::retry(Retry::Lookup(failure), attempt);
                return self.release(ReleaseKind::KeepKey, end);
            }
        };
        match found {
            Found::Done(receipt) => {
                let success = End::Done {
                    receipt: receipt.clone(),
                    attempt: self.lease.attempt,
                    found: true,
                };
                self.complete(receipt, success)
            }
            // A live effect may still happen: a new key now could apply it twice. It
            // settles by itself, in days for a transfer that clears late: the record awaits it.
            Found::InFlight { reference, .. } if self.rules.pending_is_live => {
                self.await_reference(reference, Awaited::Processing)
            }
            Found::Open {
                reference,
                awaits_someone,
                ..
            } if self.rules.close_open_attempts => self.on_open(why, reference, awaits_someone),
            Found::Nothing | Found::InFlight { .. } | Found::Open { .. } => self.nothing_open(why),
        }
    }

    /// An open attempt: someone may still confirm one that awaits them; any other is
    /// cancelled before the fact moves on.
    fn on_open(&mut self, why: Looking<F>, reference: String, awaits_someone: bool) -> Step<F> {
        match why {
            Looking::AfterConfirmationRequest(_) => self.await_someone(Some(reference)),
            _ if awaits_someone => self.await_someone(Some(reference)),
            // The indeterminate answer's attempt came back refused: it stays the key's,
            // settled by the forgotten-key rule, never by a new key now.
            Looking::AfterServerError(status) => self.keep_key_after_server_error(status),
            // An effect that was in flight and failed (a transfer that bounced): a
            // refusal, its attempt cancelled before the next key.
            Looking::InFlight => {
                self.phase = Phase::Cancelling(Looking::AfterRefusal(self.failed_in_flight()));
                Step::Cancel { reference }
            }
            why => {
                self.phase = Phase::Cancelling(why);
                Step::Cancel { reference }
            }
        }
    }

    /// Nothing open at the provider: the fact may move on.
    fn nothing_open(&mut self, why: Looking<F>) -> Step<F> {
        match why {
            Looking::Reconcile => {
                self.phase = Phase::MovingKey;
                Step::Write(WriteKind::NextAttempt)
            }
            Looking::AfterRefusal(refused) => self.release(ReleaseKind::Refused, refused),
            Looking::AfterRefusalForGood(rejected) => self.release(
                ReleaseKind::NextKey {
                    reset_refusals: false,
                },
                rejected,
            ),
            Looking::AfterConfirmationRequest(reference) => self.await_someone(reference),
            Looking::AfterServerError(status) => self.keep_key_after_server_error(status),
            // Its attempt is gone (cancelled): nothing under this key can happen.
            Looking::InFlight => {
                let refused = self.failed_in_flight();
                self.release(ReleaseKind::Refused, refused)
            }
        }
    }

    /// An effect that was in flight and failed (a transfer that bounced): a refusal of
    /// this attempt.
    fn failed_in_flight(&self) -> End<F> {
        End::Refused {
            refusal: Refusal::FailedInFlight,
            attempt: self.lease.attempt,
        }
    }

    /// Nothing found yet after a replayed 5xx: the key is kept and the record retried
    /// with the backoff; each delivery replays the key and looks again.
    fn keep_key_after_server_error(&mut self, status: u16) -> Step<F> {
        let end = End::retry(
            Retry::ServerErrorUnsettled { status },
            Some(self.lease.attempt),
        );
        self.release(ReleaseKind::KeepKey, end)
    }

    /// Someone must confirm `reference`: the record awaits them and names it (no other
    /// attempt is made while it may happen; its event or a settler completes the
    /// fact), and the message is acknowledged. An attempt nobody names cannot be
    /// awaited: the key is kept and a person finds it.
    pub(super) fn await_someone(&mut self, reference: Option<String>) -> Step<F> {
        let Some(reference) = reference else {
            let end = End::Unresolved {
                cause: Unresolved::AwaitsWithoutReference,
            };
            return self.release(ReleaseKind::KeepKey, end);
        };
        self.await_reference(reference, Awaited::Someone)
    }

    /// The record awaits `reference` (the `Await` write), for someone or while the
    /// provider processes it.
    fn await_reference(&mut self, reference: String, why: Awaited) -> Step<F> {
        self.awaited = Some((reference, why));
        self.phase = Phase::Awaiting;
        Step::Write(WriteKind::Await)
    }

    /// The record awaits: acknowledged. A lost fence means another delivery took the
    /// record over (it asks the provider again, same key); a failed write keeps the
    /// key and retries, as any store failure.
    pub(super) fn on_awaiting(
        &mut self,
        answer: Result<WriteOutcome, NoAnswer<StoreError>>,
    ) -> Step<F> {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(WriteOutcome::Applied(_)) => {
                let (reference, awaited) = self.awaited.clone().unwrap_or_default();
                Step::Done(End::Awaiting {
                    reference,
                    attempt: self.lease.attempt,
                    wait_until: self.wait_until(),
                    awaited,
                })
            }
            Ok(WriteOutcome::Refused(_)) => {
                Step::Done(End::retry(Retry::LeaseLostBeforeAwaiting, attempt))
            }
            Err(failed @ NoAnswer::Failed(_)) => {
                let end = super::store_no_answer(Call::Await, failed, attempt);
                self.release(ReleaseKind::KeepKey, end)
            }
            Err(no_answer) => Step::Done(super::store_no_answer(Call::Await, no_answer, attempt)),
        }
    }

    /// A cancel's answer: look again (it may have been done meanwhile); bounded.
    pub(super) fn on_cancelled(
        &mut self,
        why: Looking<F>,
        answer: Result<Cancel, NoAnswer<F>>,
    ) -> Step<F> {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(Cancel::Cancelled | Cancel::NotCancellable) if self.cancels + 1 < MAX_CANCELS => {
                self.cancels += 1;
                self.phase = Phase::Looking(why);
                Step::Lookup
            }
            Ok(_) => self.release(
                ReleaseKind::KeepKey,
                End::retry(Retry::OpenAttemptsLeft(MAX_CANCELS), attempt),
            ),
            Err(NoAnswer::NoTime) => Step::Done(End::Deadline {
                before: Call::Cancel,
                attempt,
            }),
            Err(NoAnswer::TimedOut) => self.release(
                ReleaseKind::KeepKey,
                End::retry(Retry::CancelTimedOut, attempt),
            ),
            Err(NoAnswer::Failed(failure)) => self.release(
                ReleaseKind::KeepKey,
                End::retry(Retry::Cancel(failure), attempt),
            ),
        }
    }
}
