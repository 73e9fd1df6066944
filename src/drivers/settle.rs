//! Settles orders that await their customer (ARCHITECTURE.md, "An order that awaits
//! its customer"): from a provider event in the batch (no provider call: a success or
//! a cancellation is final), and on a schedule, from the payment each awaiting record
//! names, looked up by id (the settler: every wait ends, events or none). What each
//! answer means is `policy/settle.rs`'s; this module only makes the calls, bounded,
//! and reports an ended wait to the shop before the record says it ended (a report
//! may repeat, never go missing).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tracing::{Instrument, info, warn};

use crate::contracts::payment::{Cancel, PaymentError, PaymentProvider};
use crate::contracts::queue::{EndedWait, QueueError, Reports};
use crate::contracts::store::{
    IdempotencyStore, SettleRequest, Settled, StoreError, Write, WriteOutcome,
};
use crate::domain::clock::Time;
use crate::domain::event::PaymentEvent;
use crate::domain::{Key, Record, State};
use crate::drivers::charge::Charger;
use crate::drivers::spans;
use crate::policy::deadline::CallKind;
use crate::policy::machine::NoAnswer;
use crate::policy::outcome::{Call, Outcome, RetryCause, Shared};
use crate::policy::outcome_kind::OutcomeKind;
use crate::policy::rules::Rules;
use crate::policy::settle::{self, Decision, PaymentNow};

/// What an event's type says of its payment, the status it carries otherwise.
pub fn payment_now(event: &PaymentEvent) -> PaymentNow {
    match event.kind.as_str() {
        "payment_intent.succeeded" => PaymentNow::Succeeded,
        "payment_intent.canceled" => PaymentNow::Canceled,
        "payment_intent.payment_failed" => PaymentNow::AttemptFailed,
        _ => PaymentNow::of_status(&event.status),
    }
}

impl Charger<'_> {
    /// A provider event about `key`'s order, settled by the conditional write the
    /// record's named payment allows. The record is read first: the rule routes every
    /// PaymentIntent event of the account, and most name an order that awaits nothing
    /// (a read costs a fifth of a refused write). A cancellation moves the wait's end
    /// to now, is reported, then written.
    pub async fn settle_event(
        &self,
        event: &PaymentEvent,
        key: &Key,
        reports: &dyn Reports,
        deadline: Time,
    ) -> Outcome {
        let now = self.settings.now();
        let found = payment_now(event);
        let paid = Settled::Paid {
            expires: self.settings.expires(now),
        };
        let settled = match settle::on_event(found, paid, Rules::ALL) {
            Decision::Settle(settled) => settled,
            Decision::Cancel | Decision::Wait => {
                return Outcome::EventIgnored {
                    payment_id: event.payment_id.clone(),
                    why: "not final: the customer may still confirm the payment, and the wait \
                          goes on",
                };
            }
        };
        let succeeded = found == PaymentNow::Succeeded;
        let read = self.store_call(deadline, self.store.get(key));
        let record = match read
            .instrument(spans::store_operation("get", "GetItem"))
            .await
        {
            Ok(record) => record,
            Err(no_answer) => return store_failed(no_answer),
        };
        if !awaits(record.as_ref(), &event.payment_id) {
            return settle::refused(record.as_ref(), &event.payment_id, succeeded, now);
        }
        if settled == Settled::Ended {
            let ends_later = record
                .as_ref()
                .and_then(|r| r.wait_until)
                .is_some_and(|end| end.as_secs() > now.as_secs());
            if ends_later {
                let ending = Settled::Ending { at: now };
                match self
                    .settle_write(key, &event.payment_id, ending, deadline)
                    .await
                {
                    Ok(WriteOutcome::Applied(_)) => {}
                    Ok(WriteOutcome::Refused(old)) => {
                        return settle::refused(old.as_ref(), &event.payment_id, false, now);
                    }
                    Err(no_answer) => return store_failed(no_answer),
                }
            }
            let Some(timeout) =
                self.settings
                    .budget
                    .call_timeout(CallKind::Queue, self.settings.now(), deadline)
            else {
                return Outcome::Deadline {
                    before: Call::Settle,
                    attempt: None,
                };
            };
            let sent = tokio::time::timeout(timeout, report(reports, key, &event.payment_id, now))
                .await
                .unwrap_or(Err(QueueError::TimedOut));
            if let Err(e) = sent {
                return Outcome::retryable(RetryCause::Report(Shared::new(e)), None);
            }
        }
        match self
            .settle_write(key, &event.payment_id, settled, deadline)
            .await
        {
            Ok(WriteOutcome::Applied(_)) => Outcome::Settled {
                payment_id: event.payment_id.clone(),
                paid: settled != Settled::Ended,
            },
            Ok(WriteOutcome::Refused(old)) => settle::refused(
                old.as_ref(),
                &event.payment_id,
                succeeded,
                self.settings.now(),
            ),
            Err(no_answer) => store_failed(no_answer),
        }
    }

    /// One `Settle` write in its span, bounded by the deadline rule.
    async fn settle_write(
        &self,
        key: &Key,
        payment_id: &str,
        settled: Settled,
        deadline: Time,
    ) -> Result<WriteOutcome, NoAnswer<StoreError>> {
        let write = Write::Settle(SettleRequest {
            pk: key,
            payment_id,
            settled,
        });
        let span = spans::store_operation("settle", "UpdateItem");
        let answer = self
            .store_call(deadline, self.store.write(&write))
            .instrument(span.clone())
            .await;
        spans::store_answered(&span, &answer);
        answer
    }
}

/// Whether `record` awaits `payment_id`.
fn awaits(record: Option<&Record>, payment_id: &str) -> bool {
    record.is_some_and(|r| r.state == State::Awaiting && r.payment.as_deref() == Some(payment_id))
}

fn store_failed(no_answer: NoAnswer<StoreError>) -> Outcome {
    match no_answer {
        NoAnswer::NoTime => Outcome::Deadline {
            before: Call::Settle,
            attempt: None,
        },
        NoAnswer::TimedOut => Outcome::retryable(RetryCause::StoreTimedOut(Call::Settle), None),
        NoAnswer::Failed(source) => Outcome::retryable(
            RetryCause::Store {
                call: Call::Settle,
                source: Shared::new(source),
            },
            None,
        ),
    }
}

/// Tells the shop that `key`'s order ended without a payment.
async fn report(
    reports: &dyn Reports,
    key: &Key,
    payment_id: &str,
    now: Time,
) -> Result<(), QueueError> {
    reports
        .ended(&EndedWait {
            order_id: key.order_id(),
            outcome: OutcomeKind::AuthenticationExpired.name(),
            payment_id,
            ended_at_ms: now.as_ms(),
        })
        .await
}

/// What the scheduled settler needs.
pub struct Settler<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub provider: &'a dyn PaymentProvider,
    pub reports: &'a dyn Reports,
    /// The clock: the wait's end is read against it.
    pub now: &'a (dyn Fn() -> Time + Send + Sync),
    /// `expires` of a record it completes.
    pub retention: Duration,
    /// Each store and provider call's timeout.
    pub call_timeout: Duration,
    /// Awaiting records read per run, soonest wait end first.
    pub limit: usize,
    /// When the run stops taking records (the function's own deadline, less margin).
    pub until: Instant,
}

/// What one settler run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettleRun {
    pub read: usize,
    pub completed: usize,
    pub ended: usize,
    pub waiting: usize,
    /// Records whose calls failed: they are read again next run.
    pub failed: usize,
}

impl SettleRun {
    /// The run's summary line.
    pub fn summary(&self) -> Value {
        json!({
            "settle": if self.failed == 0 { "done" } else { "incomplete" },
            "read": self.read,
            "completed": self.completed,
            "ended": self.ended,
            "waiting": self.waiting,
            "failed": self.failed,
        })
    }
}

/// Why a record could not be settled this run.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error("the store failed")]
    Store(#[from] StoreError),
    #[error("the provider failed")]
    Provider(#[from] PaymentError),
    #[error("reporting the ended wait failed")]
    Report(#[from] QueueError),
    #[error("a call timed out")]
    TimedOut,
}

/// How one awaiting record ended this run.
enum Settling {
    Completed,
    Ended,
    Waiting,
}

impl Settler<'_> {
    /// Reads the awaiting records (the index, never a scan) and settles each by its
    /// payment. Reading them fails the run; one record's failure is counted, logged,
    /// and left for the next run.
    pub async fn run(&self) -> Result<SettleRun, StoreError> {
        let far = Time::from_secs(i64::MAX / 1000);
        let records = self.store.awaiting(far, self.limit).await?;
        let mut run = SettleRun {
            read: records.len(),
            ..SettleRun::default()
        };
        for record in records {
            if Instant::now() >= self.until {
                run.waiting += 1;
                continue;
            }
            match self.settle(&record).await {
                Ok(Settling::Completed) => run.completed += 1,
                Ok(Settling::Ended) => run.ended += 1,
                Ok(Settling::Waiting) => run.waiting += 1,
                Err(e) => {
                    run.failed += 1;
                    warn!(
                        key = record.pk.as_str(),
                        error = %crate::error_chain(&e),
                        "settling an awaiting order failed; the next run tries again"
                    );
                }
            }
        }
        Ok(run)
    }

    async fn settle(&self, record: &Record) -> Result<Settling, SettleError> {
        let (Some(payment_id), Some(wait_until)) = (record.payment.as_deref(), record.wait_until)
        else {
            return Ok(Settling::Waiting);
        };
        let now = (self.now)();
        let found = self.look_up(payment_id).await?;
        let paid = Settled::Paid {
            expires: Time::from_secs((now + self.retention).as_secs()),
        };
        match settle::on_lookup(found, wait_until, now, paid, Rules::ALL) {
            Decision::Settle(settled) => self.write(record, payment_id, settled, now).await,
            Decision::Wait => Ok(Settling::Waiting),
            Decision::Cancel => match self.bounded(self.provider.cancel(payment_id)).await? {
                Cancel::Cancelled => self.write(record, payment_id, Settled::Ended, now).await,
                // Refused: it may have succeeded meanwhile; look again, once.
                Cancel::NotCancellable => match self.look_up(payment_id).await? {
                    PaymentNow::Succeeded => self.write(record, payment_id, paid, now).await,
                    PaymentNow::Canceled => {
                        self.write(record, payment_id, Settled::Ended, now).await
                    }
                    _ => Ok(Settling::Waiting),
                },
            },
        }
    }

    async fn look_up(&self, payment_id: &str) -> Result<PaymentNow, SettleError> {
        let found = self
            .bounded(self.provider.payment_by_id(payment_id))
            .await?;
        Ok(found.map_or(PaymentNow::Missing, |p| PaymentNow::of_status(&p.status)))
    }

    /// The settle write (an ended wait reported first), and its log line.
    async fn write(
        &self,
        record: &Record,
        payment_id: &str,
        settled: Settled,
        now: Time,
    ) -> Result<Settling, SettleError> {
        if settled == Settled::Ended {
            // Ended early (cancelled at the provider, or gone): the wait's end moves to
            // now first, so a copy of the order sent meanwhile is retried, not lost.
            if record
                .wait_until
                .is_some_and(|end| end.as_secs() > now.as_secs())
            {
                let ending = Write::Settle(SettleRequest {
                    pk: &record.pk,
                    payment_id,
                    settled: Settled::Ending { at: now },
                });
                if let WriteOutcome::Refused(_) = self.bounded(self.store.write(&ending)).await? {
                    return Ok(Settling::Waiting);
                }
            }
            self.bounded(report(self.reports, &record.pk, payment_id, now))
                .await?;
        }
        let write = Write::Settle(SettleRequest {
            pk: &record.pk,
            payment_id,
            settled,
        });
        let outcome = match self.bounded(self.store.write(&write)).await? {
            WriteOutcome::Applied(_) => Outcome::Settled {
                payment_id: payment_id.to_owned(),
                paid: settled != Settled::Ended,
            },
            WriteOutcome::Refused(old) => {
                settle::refused(old.as_ref(), payment_id, settled != Settled::Ended, now)
            }
        };
        metrics::counter!(outcome.name()).increment(1);
        info!(
            outcome = outcome.name(),
            key = record.pk.as_str(),
            payment = payment_id,
            "awaiting order settled"
        );
        Ok(match outcome {
            Outcome::Settled { paid: true, .. } => Settling::Completed,
            Outcome::Settled { paid: false, .. } => Settling::Ended,
            _ => Settling::Waiting,
        })
    }

    async fn bounded<T, E: Into<SettleError>>(
        &self,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, SettleError> {
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_elapsed| SettleError::TimedOut)?
            .map_err(Into::into)
    }
}
