//! What the machine does after an effect that was not done: a refusal (its open
//! attempt cancelled before the next key), a request for someone's confirmation
//! (awaited), a refusal for good, and a failure whose outcome is unknown (looked up
//! before any new key).

use super::looking::Looking;
use super::{Class, Classify, End, Machine, Phase, Refusal, Retry, Step, Unknown, Unresolved};
use crate::store::ReleaseKind;
use crate::table::Unsettled;

impl<F: Classify + Clone> Machine<F> {
    pub(super) fn after_failure(&mut self, failure: F) -> Step<F> {
        let attempt = self.lease.attempt;
        let at_most_once = self.unknown == Unknown::AtMostOnce;
        match failure.class() {
            // At most once, with no lookup to see whether the refused attempt is
            // confirmed later: a new key could apply the effect twice.
            Class::Refused { open: Some(_) } | Class::Unexpected { .. } if at_most_once => {
                self.uncertain()
            }
            Class::Refused { open } => self.after_refusal(
                End::Refused {
                    refusal: Refusal::Failure(failure),
                    attempt,
                },
                open,
            ),
            Class::AwaitsSomeone { reference } => self.after_confirmation_request(reference),
            Class::Unexpected { reference, status } => self.release(
                ReleaseKind::KeepKey,
                End::Unresolved {
                    cause: Unresolved::Unexpected { reference, status },
                },
            ),
            // Refused for good: any attempt the request left open is cancelled, then
            // the fact moves to the next key, so the redrive after the fix, or a
            // corrected copy, is a new attempt (a replay of this key would be refused
            // again).
            Class::RefusedForGood => {
                let rejected = End::RefusedForGood { failure, attempt };
                if !self.looks_up() {
                    let next = ReleaseKind::NextKey {
                        reset_refusals: false,
                    };
                    return self.release(next, rejected);
                }
                self.phase = Phase::Looking(Looking::AfterRefusalForGood(rejected));
                Step::Lookup
            }
            Class::InFlight { reference, status }
                if self.rules.pending_is_live && self.looks_up() =>
            {
                self.release(
                    ReleaseKind::KeepKey,
                    End::Unresolved {
                        cause: Unresolved::InFlightAnswer { reference, status },
                    },
                )
            }
            Class::KeyReused => self.release(
                ReleaseKind::KeepKey,
                End::Unresolved {
                    cause: Unresolved::KeyReused {
                        provider_key: self.lease.provider_key(),
                    },
                },
            ),
            // Without a lookup, what is in flight or replayed is as unknown as a timeout.
            _ => self.after_uncertain(Retry::Effect(failure)),
        }
    }

    /// The refused attempt stays open: someone could still confirm it, so it is
    /// cancelled before the next attempt's key may make another: the one the refusal
    /// names at once, then a lookup finds any other.
    pub(super) fn after_refusal(&mut self, refused: End<F>, open: Option<String>) -> Step<F> {
        if !self.rules.close_open_attempts || !self.looks_up() {
            return self.release(ReleaseKind::Refused, refused);
        }
        match open {
            Some(reference) => {
                self.phase = Phase::Cancelling(Looking::AfterRefusal(refused));
                Step::Cancel { reference }
            }
            None => {
                self.phase = Phase::Looking(Looking::AfterRefusal(refused));
                Step::Lookup
            }
        }
    }

    /// Only someone else can confirm the attempt now. A replay answers as the first
    /// time, even once they have confirmed it: what it is now is the provider's current
    /// word, so look it up.
    pub(super) fn after_confirmation_request(&mut self, reference: Option<String>) -> Step<F> {
        if !self.rules.close_open_attempts {
            // The mutant: as a refusal, on to a new key and a new attempt.
            let refused = End::Refused {
                refusal: Refusal::AwaitsSomeone,
                attempt: self.lease.attempt,
            };
            return self.release(ReleaseKind::Refused, refused);
        }
        if !self.looks_up() {
            return self.await_someone(reference);
        }
        self.phase = Phase::Looking(Looking::AfterConfirmationRequest(reference));
        Step::Lookup
    }

    /// Uncertain: the provider may hold an effect under this key, so the next attempt
    /// must replay it; an effect without a key or a lookup goes the way it states.
    pub(super) fn after_uncertain(&mut self, cause: Retry<F>) -> Step<F> {
        let attempt = Some(self.lease.attempt);
        match self.unknown {
            Unknown::LookedUp => {}
            Unknown::AtLeastOnce => {
                let next = ReleaseKind::NextKey {
                    reset_refusals: false,
                };
                return self.release(next, End::retry(cause, attempt));
            }
            Unknown::AtMostOnce => return self.uncertain(),
        }
        let kind = if self.rules.keep_key_when_uncertain {
            ReleaseKind::KeepKey
        } else {
            ReleaseKind::NextKey {
                reset_refusals: false,
            }
        };
        self.release(kind, End::retry(cause, Some(self.lease.attempt)))
    }

    /// At most once, and what was done is not known: the record becomes `Uncertain`,
    /// final for every delivery, and the fact goes to a person.
    pub(super) fn uncertain(&mut self) -> Step<F> {
        let end = End::Unresolved {
            cause: Unresolved::Table(Unsettled::UncertainOutcome),
        };
        self.release(ReleaseKind::Uncertain, end)
    }
}
