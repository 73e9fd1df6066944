//! What the machine does after a charge that did not succeed: a decline (its open
//! payment cancelled before the next key), a request for the customer's
//! authentication (awaited), a failure for good, and one whose outcome is unknown
//! (reconciled before any new key).

use super::*;

impl Machine {
    pub(super) fn after_failed_charge(&mut self, e: PaymentError) -> Step {
        let attempt = self.lease.attempt;
        match e {
            PaymentError::Declined {
                code,
                decline_code,
                payment_id,
            } => self.after_decline(
                Outcome::Declined {
                    code,
                    decline_code,
                    attempt,
                },
                payment_id,
            ),
            PaymentError::AuthenticationRequired { payment_id } => {
                self.after_authentication_request(payment_id)
            }
            PaymentError::UnexpectedStatus { payment_id, status } => self.release(
                ReleaseKind::KeepKey,
                Outcome::NeedsReconciliation {
                    cause: ReconcileCause::UnexpectedStatus { payment_id, status },
                },
            ),
            // Refused for good: any payment the request left open is cancelled, then
            // the order moves to the next key, so the redrive after the fix, or a
            // corrected copy, is a new attempt (a replay of this key would be refused
            // again).
            PaymentError::Rejected { status, code } => {
                let rejected = Outcome::Rejected {
                    status,
                    code,
                    attempt,
                };
                self.phase = Phase::Looking(Looking::AfterRejection(rejected));
                Step::Lookup
            }
            PaymentError::Pending { payment_id, status } if self.rules.pending_is_live => self
                .release(
                    ReleaseKind::KeepKey,
                    Outcome::NeedsReconciliation {
                        cause: ReconcileCause::PendingAnswer { payment_id, status },
                    },
                ),
            PaymentError::KeyReused => self.release(
                ReleaseKind::KeepKey,
                Outcome::NeedsReconciliation {
                    cause: ReconcileCause::KeyReused {
                        provider_key: self.lease.provider_key(),
                    },
                },
            ),
            other => self.after_uncertain_charge(RetryCause::Charge(Shared::new(other))),
        }
    }

    /// The declined payment stays open: someone could still confirm it, so it is
    /// cancelled before the next attempt's key may make another: the one the decline
    /// names at once, then a lookup finds any other.
    pub(super) fn after_decline(&mut self, declined: Outcome, payment_id: Option<String>) -> Step {
        if !self.rules.close_open_attempts {
            return self.release(ReleaseKind::Refused, declined);
        }
        match payment_id {
            Some(payment_id) => {
                self.phase = Phase::Cancelling(Looking::AfterDecline(declined));
                Step::Cancel { payment_id }
            }
            None => {
                self.phase = Phase::Looking(Looking::AfterDecline(declined));
                Step::Lookup
            }
        }
    }

    /// Only the customer can confirm the payment now. A replay answers as the first
    /// time, even once the customer has confirmed it: what it is now is the
    /// provider's current word, so look it up.
    pub(super) fn after_authentication_request(&mut self, payment_id: Option<String>) -> Step {
        if !self.rules.close_open_attempts {
            // The mutant: as a decline, on to a new key and a new payment.
            let declined = Outcome::Declined {
                code: "authentication_required".to_owned(),
                decline_code: None,
                attempt: self.lease.attempt,
            };
            return self.release(ReleaseKind::Refused, declined);
        }
        self.phase = Phase::Looking(Looking::AfterAuthentication(payment_id));
        Step::Lookup
    }

    /// Uncertain: the provider may hold a payment under this key, so the next attempt
    /// must replay it.
    pub(super) fn after_uncertain_charge(&mut self, cause: RetryCause) -> Step {
        let kind = if self.rules.keep_key_when_uncertain {
            ReleaseKind::KeepKey
        } else {
            ReleaseKind::NextKey {
                reset_refusals: false,
            }
        };
        self.release(kind, Outcome::retryable(cause, Some(self.lease.attempt)))
    }
}
