//! How an order that awaits its customer settles (ARCHITECTURE.md, "An order that
//! awaits its customer"), pure: what a provider event about a payment means for the
//! record it names, what the scheduled settler does with the payment it finds by id,
//! and how a refused settle is read. The consumer (`drivers/settle.rs`, events in the
//! batch), the settler (the same module, on a schedule) and the model checker
//! (`examples/model.rs`) all decide here; the write itself is the table's `Settle`
//! (`policy/table.rs`), conditioned on the payment the record names.

use crate::contracts::store::Settled;
use crate::domain::clock::Time;
use crate::domain::{Record, State};
use crate::policy::outcome::{Outcome, ReconcileCause};
use crate::policy::rules::Rules;

/// What became of a payment, as an event or a lookup by id tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaymentNow {
    /// `succeeded`: final; the order is paid with it.
    Succeeded,
    /// `canceled`: final; it can never succeed.
    Canceled,
    /// A confirmation attempt failed (`payment_intent.payment_failed`, or
    /// `requires_payment_method`): the customer may still confirm it, with this card
    /// or another, until it is cancelled.
    AttemptFailed,
    /// Still waiting for the customer (`requires_action`, `requires_confirmation`…).
    Open,
    /// `processing`: it settles by itself, either way.
    Processing,
    /// The provider has no such payment: nothing under it can succeed.
    Missing,
}

impl PaymentNow {
    /// A PaymentIntent's `status` as the provider states it.
    pub fn of_status(status: &str) -> Self {
        match status {
            "succeeded" => Self::Succeeded,
            "canceled" => Self::Canceled,
            "processing" => Self::Processing,
            "requires_payment_method" => Self::AttemptFailed,
            _ => Self::Open,
        }
    }
}

/// What to do about an awaited payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Write `Settle` with this ending.
    Settle(Settled),
    /// Cancel the payment first (its wait is over); then look again.
    Cancel,
    /// Nothing yet: the wait goes on.
    Wait,
}

/// What the settler does with an awaiting record whose payment it found `now`:
/// succeeded → done; cancelled or gone → ended; past the end of the wait → cancel it
/// first (only a payment that can no longer succeed ends a wait); otherwise wait.
pub fn on_lookup(
    found: PaymentNow,
    wait_until: Time,
    now: Time,
    paid: Settled,
    rules: Rules,
) -> Decision {
    match found {
        PaymentNow::Succeeded => Decision::Settle(paid),
        PaymentNow::Canceled | PaymentNow::Missing => Decision::Settle(Settled::Ended),
        PaymentNow::Processing => Decision::Wait,
        PaymentNow::Open | PaymentNow::AttemptFailed if now.as_secs() >= wait_until.as_secs() => {
            if rules.wait_ends_only_when_cancelled {
                Decision::Cancel
            } else {
                // The mutant: the wait ends with its payment still open.
                Decision::Settle(Settled::Ended)
            }
        }
        PaymentNow::AttemptFailed if !rules.wait_ends_only_when_cancelled => {
            // The mutant: a failed attempt ends the wait.
            Decision::Settle(Settled::Ended)
        }
        PaymentNow::Open | PaymentNow::AttemptFailed => Decision::Wait,
    }
}

/// What a provider event about an awaited payment means: success and cancellation
/// are final and settle the record; a failed attempt is not (the customer may still
/// confirm it, and Stripe sends one for the very answer that starts the wait), so the
/// wait goes on and the settler ends it by cancelling.
pub fn on_event(now: PaymentNow, paid: Settled, rules: Rules) -> Decision {
    match now {
        PaymentNow::Succeeded => Decision::Settle(paid),
        PaymentNow::Canceled => Decision::Settle(Settled::Ended),
        PaymentNow::AttemptFailed if !rules.wait_ends_only_when_cancelled => {
            Decision::Settle(Settled::Ended)
        }
        _ => Decision::Wait,
    }
}

/// How a settle the table refused reads, by the record that refused it (`now` to
/// tell a live lease): the order is being charged (come back when the lease ends: its
/// record is about to await this payment), already done with this payment (a repeated
/// event), paid with another while this one succeeded too (charged twice: a person
/// refunds one), or not this payment's at all.
pub fn refused(record: Option<&Record>, payment_id: &str, succeeded: bool, now: Time) -> Outcome {
    let ignored = |why| Outcome::EventIgnored {
        payment_id: payment_id.to_owned(),
        why,
    };
    let Some(record) = record else {
        return ignored("no record of the order the payment names");
    };
    match &record.state {
        State::Done if record.receipt.as_deref() == Some(payment_id) => {
            ignored("the order is already done with this payment")
        }
        State::Done if succeeded => Outcome::NeedsReconciliation {
            cause: ReconcileCause::LateConfirmation {
                payment_id: payment_id.to_owned(),
                receipt: record.receipt.clone().unwrap_or_default(),
            },
        },
        State::InProgress if record.lease_until.is_some_and(|until| until >= now) => {
            Outcome::InProgress {
                until: record.lease_until,
            }
        }
        State::Awaiting => ignored("the order awaits another payment"),
        _ => ignored("the order does not await this payment"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Key;

    const NOW: Time = Time::from_ms(1_800_000_000_000);
    const PAID: Settled = Settled::Paid {
        expires: Time::from_secs(1_900_000_000),
    };

    #[test]
    fn a_status_reads_as_what_it_means_for_the_wait() {
        let cases = [
            ("succeeded", PaymentNow::Succeeded),
            ("canceled", PaymentNow::Canceled),
            ("processing", PaymentNow::Processing),
            ("requires_payment_method", PaymentNow::AttemptFailed),
            ("requires_action", PaymentNow::Open),
            ("requires_confirmation", PaymentNow::Open),
        ];
        for (status, now) in cases {
            assert_eq!(PaymentNow::of_status(status), now, "{status}");
        }
    }

    #[test]
    fn the_settler_completes_ends_cancels_or_waits_by_what_it_finds_and_the_clock() {
        let before = NOW + std::time::Duration::from_secs(60);
        let past = NOW - std::time::Duration::from_secs(1);
        let cases = [
            (PaymentNow::Succeeded, before, Decision::Settle(PAID)),
            (PaymentNow::Succeeded, past, Decision::Settle(PAID)),
            (
                PaymentNow::Canceled,
                before,
                Decision::Settle(Settled::Ended),
            ),
            (
                PaymentNow::Missing,
                before,
                Decision::Settle(Settled::Ended),
            ),
            (PaymentNow::Processing, past, Decision::Wait),
            (PaymentNow::Open, before, Decision::Wait),
            (PaymentNow::AttemptFailed, before, Decision::Wait),
            (PaymentNow::Open, past, Decision::Cancel),
            (PaymentNow::AttemptFailed, past, Decision::Cancel),
        ];
        for (found, wait_until, decision) in cases {
            assert_eq!(
                on_lookup(found, wait_until, NOW, PAID, Rules::ALL),
                decision,
                "{found:?} with the wait ending at {wait_until:?}"
            );
        }
    }

    #[test]
    fn only_a_final_event_settles_a_wait_and_a_failed_attempt_leaves_it_to_the_customer() {
        let cases = [
            (PaymentNow::Succeeded, Decision::Settle(PAID)),
            (PaymentNow::Canceled, Decision::Settle(Settled::Ended)),
            (PaymentNow::AttemptFailed, Decision::Wait),
            (PaymentNow::Open, Decision::Wait),
            (PaymentNow::Processing, Decision::Wait),
        ];
        for (now, decision) in cases {
            assert_eq!(on_event(now, PAID, Rules::ALL), decision, "{now:?}");
        }
    }

    /// The rules with one switched off, as a model mutant runs them.
    fn without(switch_off: impl FnOnce(&mut Rules)) -> Rules {
        let mut rules = Rules::ALL;
        switch_off(&mut rules);
        rules
    }

    fn awaiting(payment: &str) -> Record {
        Record {
            fingerprint: Some(crate::domain::Fingerprint::new("h")),
            expires: Some(NOW - std::time::Duration::from_secs(1)),
            payment: Some(payment.to_owned()),
            wait_until: Some(Time::from_secs(NOW.as_secs() + 3600)),
            ..Record::new(Key::for_order_id("o-1"), State::Awaiting)
        }
    }

    #[test]
    fn no_delivery_reserves_an_awaiting_order_even_past_its_retention_unless_the_rule_is_off() {
        use crate::contracts::store::{ReserveRequest, Write};
        use crate::domain::{Fingerprint, Owner};
        use crate::policy::table::holds;
        let (pk, fingerprint, owner) = (
            Key::for_order_id("o-1"),
            Fingerprint::new("h"),
            Owner::new("me"),
        );
        let reserve = Write::Reserve(ReserveRequest {
            pk: &pk,
            fingerprint: &fingerprint,
            owner: &owner,
            now: NOW,
            lease_until: NOW + std::time::Duration::from_secs(60),
            expires: NOW + std::time::Duration::from_secs(3600),
            max_declines: 3,
        });
        let record = awaiting("pi_1");
        assert!(!holds(&reserve, Some(&record), Rules::ALL));
        let mutant = without(|r| r.awaiting_holds_the_order = false);
        assert!(holds(&reserve, Some(&record), mutant));
    }

    #[test]
    fn only_the_payment_an_awaiting_record_names_settles_it_unless_the_rule_is_off() {
        use crate::contracts::store::{SettleRequest, Write};
        use crate::policy::table::holds;
        let pk = Key::for_order_id("o-1");
        let settle = |payment_id| {
            Write::Settle(SettleRequest {
                pk: &pk,
                payment_id,
                settled: Settled::Ended,
            })
        };
        let record = awaiting("pi_2");
        assert!(holds(&settle("pi_2"), Some(&record), Rules::ALL));
        // An older attempt's payment (cancelled before the next key) is not the wait's.
        assert!(!holds(&settle("pi_1"), Some(&record), Rules::ALL));
        let mutant = without(|r| r.settle_names_its_payment = false);
        assert!(holds(&settle("pi_1"), Some(&record), mutant));
    }

    #[test]
    fn a_wait_ends_only_once_its_payment_is_cancelled_unless_the_rule_is_off() {
        let past = NOW - std::time::Duration::from_secs(1);
        let before = NOW + std::time::Duration::from_secs(60);
        let mutant = without(|r| r.wait_ends_only_when_cancelled = false);
        for found in [PaymentNow::Open, PaymentNow::AttemptFailed] {
            assert_eq!(
                on_lookup(found, past, NOW, PAID, Rules::ALL),
                Decision::Cancel
            );
            assert_eq!(
                on_lookup(found, past, NOW, PAID, mutant),
                Decision::Settle(Settled::Ended),
                "{found:?}"
            );
        }
        assert_eq!(
            on_lookup(PaymentNow::AttemptFailed, before, NOW, PAID, mutant),
            Decision::Settle(Settled::Ended)
        );
        assert_eq!(
            on_event(PaymentNow::AttemptFailed, PAID, Rules::ALL),
            Decision::Wait
        );
        assert_eq!(
            on_event(PaymentNow::AttemptFailed, PAID, mutant),
            Decision::Settle(Settled::Ended)
        );
    }

    fn record(state: State, receipt: Option<&str>, lease_until: Option<Time>) -> Record {
        Record {
            receipt: receipt.map(str::to_owned),
            lease_until,
            ..Record::new(Key::for_order_id("o-1"), state)
        }
    }

    #[test]
    fn a_refused_settle_is_read_by_the_record_that_refused_it() {
        let live = Some(NOW + std::time::Duration::from_secs(30));
        let ended = Some(NOW - std::time::Duration::from_secs(30));
        let name = |o: Outcome| o.name();
        assert_eq!(name(refused(None, "pi_1", true, NOW)), "event_ignored");
        let done = record(State::Done, Some("pi_1"), None);
        assert_eq!(
            name(refused(Some(&done), "pi_1", true, NOW)),
            "event_ignored"
        );
        let other = record(State::Done, Some("pi_0"), None);
        assert_eq!(
            refused(Some(&other), "pi_1", true, NOW),
            Outcome::NeedsReconciliation {
                cause: ReconcileCause::LateConfirmation {
                    payment_id: "pi_1".into(),
                    receipt: "pi_0".into()
                }
            }
        );
        assert_eq!(
            name(refused(Some(&other), "pi_1", false, NOW)),
            "event_ignored"
        );
        let charging = record(State::InProgress, None, live);
        assert_eq!(
            name(refused(Some(&charging), "pi_1", true, NOW)),
            "in_progress"
        );
        let crashed = record(State::InProgress, None, ended);
        assert_eq!(
            name(refused(Some(&crashed), "pi_1", true, NOW)),
            "event_ignored"
        );
        let waiting = record(State::Awaiting, None, None);
        assert_eq!(
            name(refused(Some(&waiting), "pi_1", true, NOW)),
            "event_ignored"
        );
    }
}
