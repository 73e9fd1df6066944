//! The machine's part of "one success per order" (ARCHITECTURE.md, "The state
//! machine"): what a lookup of the order's payments means, by why it was made, and
//! the cancel of an open payment before the order may move to a new key.

use super::{Awaited, Machine, NoAnswer, Phase, Step, WriteKind};
use crate::contracts::payment::{Cancel, Lookup, PaymentError};
use crate::contracts::store::{ReleaseKind, StoreError, WriteOutcome};
use crate::domain::clock::Time;
use crate::policy::outcome::{Call, Outcome, ReconcileCause, RetryCause, Shared};
use std::time::Duration;

/// Why the machine looks the order's payments up, which decides what each answer
/// means (ARCHITECTURE.md, "The state machine": one success per order).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Looking {
    /// Before reusing an old key, or after a replayed 5xx: is the order paid?
    Reconcile,
    /// After a decline, before the next attempt's key: the declined payment (and any
    /// other open one) is cancelled first, so nobody can confirm it later.
    AfterDecline(Outcome),
    /// After `authentication_required`: has the customer confirmed it since?
    AfterAuthentication(Option<String>),
    /// After a replayed 5xx (this status): a payment may have appeared, or may still;
    /// whatever is not found, the key is kept.
    AfterServerError(u16),
    /// After an answer `processing`: has the payment settled since?
    InFlight,
    /// After a rejection for good: any payment the request left open is cancelled
    /// before the order moves to the next key.
    AfterRejection(Outcome),
}

/// How many open payments one attempt cancels before it gives up for now: an order
/// has one per attempt at most, and a later delivery goes on.
const MAX_CANCELS: u8 = 3;

/// How much earlier than the record's creation a lookup reads the customer's payments:
/// the record's clock (the function's) and the provider's may disagree by this much.
pub const LOOKUP_CLOCK_MARGIN: Duration = Duration::from_secs(10 * 60);

/// Where a lookup of an order's payments starts: the record's creation less
/// [`LOOKUP_CLOCK_MARGIN`] (every payment of the order was made after its first
/// reservation), or the epoch for a record that names no creation.
pub fn lookup_since(created: Option<Time>) -> Time {
    created.map_or(Time::from_ms(0), |created| created - LOOKUP_CLOCK_MARGIN)
}

impl Machine {
    /// A lookup's answer, read by why it was made: succeeded → complete with it (the
    /// order is paid, whoever confirmed it); in flight → release, keep the key; open →
    /// cancel it first, or wait for the customer; none → the next attempt's key (after
    /// a decline: the decline's release), or, after `authentication_required`, the DLQ
    /// until a person settles it.
    pub(super) fn on_looked(
        &mut self,
        why: Looking,
        answer: Result<Lookup, NoAnswer<PaymentError>>,
    ) -> Step {
        let attempt = Some(self.lease.attempt);
        let found = match answer {
            Ok(found) => found,
            // After a rejection, a lookup refused for good (the same unknown customer):
            // no payment of the order can exist.
            Err(NoAnswer::Failed(PaymentError::Rejected { .. }))
                if matches!(why, Looking::AfterRejection(_)) =>
            {
                return self.nothing_open(why);
            }
            Err(NoAnswer::NoTime) => {
                return Step::Done(Outcome::Deadline {
                    before: Call::Lookup,
                    attempt,
                });
            }
            Err(NoAnswer::TimedOut) => {
                let outcome = Outcome::retryable(RetryCause::LookupTimedOut, attempt);
                return self.release(ReleaseKind::KeepKey, outcome);
            }
            Err(NoAnswer::Failed(e)) => {
                let outcome = Outcome::retryable(RetryCause::Lookup(Shared::new(e)), attempt);
                return self.release(ReleaseKind::KeepKey, outcome);
            }
        };
        match found {
            Lookup::Succeeded(receipt) => {
                let success = Outcome::Reconciled {
                    receipt: receipt.id.clone(),
                    charge: receipt.charge.clone(),
                    attempt: self.lease.attempt,
                };
                self.complete(receipt, success)
            }
            // A live payment may still succeed: a new key now could charge twice. It
            // settles by itself, in days for a bank debit: the record awaits it.
            Lookup::Pending { payment_id, .. } if self.rules.pending_is_live => {
                self.await_payment(payment_id, Awaited::Processing)
            }
            Lookup::Open {
                payment_id,
                awaits_customer,
                ..
            } if self.rules.close_open_attempts => self.on_open(why, payment_id, awaits_customer),
            Lookup::NotFound | Lookup::Pending { .. } | Lookup::Open { .. } => {
                self.nothing_open(why)
            }
        }
    }

    /// An open payment: the customer may still confirm one that awaits them; any
    /// other is cancelled before the order moves on.
    fn on_open(&mut self, why: Looking, payment_id: String, awaits_customer: bool) -> Step {
        match why {
            Looking::AfterAuthentication(_) => self.await_customer(Some(payment_id)),
            _ if awaits_customer => self.await_customer(Some(payment_id)),
            // The indeterminate answer's payment came back declined: it stays the
            // key's, settled by the forgotten-key rule, never by a new key now.
            Looking::AfterServerError(status) => self.keep_key_after_server_error(status),
            // A payment that was in flight and failed (a bank debit returned): a
            // decline, its payment cancelled before the next key.
            Looking::InFlight => {
                self.phase = Phase::Cancelling(Looking::AfterDecline(self.failed_in_flight()));
                Step::Cancel { payment_id }
            }
            why => {
                self.phase = Phase::Cancelling(why);
                Step::Cancel { payment_id }
            }
        }
    }

    /// Nothing open at the provider: the order may move on.
    fn nothing_open(&mut self, why: Looking) -> Step {
        match why {
            Looking::Reconcile => {
                self.phase = Phase::MovingKey;
                Step::Write(WriteKind::NextAttempt)
            }
            Looking::AfterDecline(declined) => self.release(ReleaseKind::Refused, declined),
            Looking::AfterRejection(rejected) => self.release(
                ReleaseKind::NextKey {
                    reset_refusals: false,
                },
                rejected,
            ),
            Looking::AfterAuthentication(payment_id) => self.await_customer(payment_id),
            Looking::AfterServerError(status) => self.keep_key_after_server_error(status),
            // Its payment is gone (cancelled): nothing under this key can succeed.
            Looking::InFlight => {
                let declined = self.failed_in_flight();
                self.release(ReleaseKind::Refused, declined)
            }
        }
    }

    /// A payment that was in flight and failed (a bank debit returned): a decline of
    /// this attempt.
    fn failed_in_flight(&self) -> Outcome {
        Outcome::Declined {
            code: "payment_failed".to_owned(),
            decline_code: None,
            attempt: self.lease.attempt,
        }
    }

    /// Nothing found yet after a replayed 5xx: the key is kept and the record retried
    /// with the backoff; each delivery replays the key and looks again.
    fn keep_key_after_server_error(&mut self, status: u16) -> Step {
        let outcome = Outcome::retryable(
            RetryCause::ServerErrorUnsettled { status },
            Some(self.lease.attempt),
        );
        self.release(ReleaseKind::KeepKey, outcome)
    }

    /// The customer must authenticate `payment_id`: the record awaits them and names
    /// it (no other payment is made while it may succeed; its event or the settler
    /// completes the order), and the message is acknowledged. A payment nobody names
    /// cannot be awaited: the key is kept and a person finds it.
    fn await_customer(&mut self, payment_id: Option<String>) -> Step {
        let Some(payment_id) = payment_id else {
            let outcome = Outcome::NeedsReconciliation {
                cause: ReconcileCause::AuthenticationWithoutPayment,
            };
            return self.release(ReleaseKind::KeepKey, outcome);
        };
        self.await_payment(payment_id, Awaited::Customer)
    }

    /// The record awaits `payment_id` (the `Await` write), for its customer or while
    /// the provider processes it.
    fn await_payment(&mut self, payment_id: String, why: Awaited) -> Step {
        self.awaited = Some((payment_id, why));
        self.phase = Phase::Awaiting;
        Step::Write(WriteKind::Await)
    }

    /// The record awaits its customer: acknowledged. A lost fence means another
    /// delivery took the record over (it asks the provider again, same key); a failed
    /// write keeps the key and retries, as any store failure.
    pub(super) fn on_awaiting(
        &mut self,
        answer: Result<WriteOutcome, NoAnswer<StoreError>>,
    ) -> Step {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(WriteOutcome::Applied(_)) => {
                let (payment_id, why) = self.awaited.clone().unwrap_or_default();
                let (attempt, wait_until) = (self.lease.attempt, self.wait_until());
                Step::Done(match why {
                    Awaited::Customer => Outcome::AuthenticationRequired {
                        payment_id,
                        attempt,
                        wait_until,
                    },
                    Awaited::Processing => Outcome::PaymentProcessing {
                        payment_id,
                        attempt,
                        wait_until,
                    },
                })
            }
            Ok(WriteOutcome::Refused(_)) => Step::Done(Outcome::retryable(
                RetryCause::LeaseLostBeforeAwaiting,
                attempt,
            )),
            Err(failed @ NoAnswer::Failed(_)) => {
                let outcome = super::store_no_answer(Call::Await, failed, attempt);
                self.release(ReleaseKind::KeepKey, outcome)
            }
            Err(no_answer) => Step::Done(super::store_no_answer(Call::Await, no_answer, attempt)),
        }
    }

    /// A cancel's answer: look again (it may have succeeded meanwhile); bounded.
    pub(super) fn on_cancelled(
        &mut self,
        why: Looking,
        answer: Result<Cancel, NoAnswer<PaymentError>>,
    ) -> Step {
        let attempt = Some(self.lease.attempt);
        match answer {
            Ok(Cancel::Cancelled | Cancel::NotCancellable) if self.cancels + 1 < MAX_CANCELS => {
                self.cancels += 1;
                self.phase = Phase::Looking(why);
                Step::Lookup
            }
            Ok(_) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::OpenPaymentsLeft(MAX_CANCELS), attempt),
            ),
            Err(NoAnswer::NoTime) => Step::Done(Outcome::Deadline {
                before: Call::Cancel,
                attempt,
            }),
            Err(NoAnswer::TimedOut) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::CancelTimedOut, attempt),
            ),
            Err(NoAnswer::Failed(e)) => self.release(
                ReleaseKind::KeepKey,
                Outcome::retryable(RetryCause::Cancel(Shared::new(e)), attempt),
            ),
        }
    }
}
