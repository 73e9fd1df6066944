//! Drives the settlement machine (`policy/settle.rs`): from a provider event in the
//! batch, and on a schedule from every awaiting record (the settler: every wait ends,
//! events or none; an order's payment, and a refund the bank holds `pending`); both
//! through the one executor (`drivers/executor.rs`: breakers,
//! pace, deadline rule, spans). The machine decides each step by the provider's
//! answer; this module only makes the calls, counts and logs them. One loop (`drive`) runs the steps
//! for both, so the sequence fetch, cancel, move the end, report, write exists once.

use crate::domain::OrderKey;
use std::time::Duration;

use serde_json::{Value, json};
use tracing::{error, info, warn};

use crate::contracts::payment::{Cancel, ChargePath, PaymentError, RefundPath, RefundSeen};
use crate::contracts::queue::{EndedWait, FailedRefund, QueueError, Reports};
use crate::contracts::store::{AwaitingCursor, IdempotencyStore, StoreError, Write, WriteOutcome};
use crate::domain::clock::Time;
use crate::domain::event::PaymentEvent;
use crate::domain::order::validate_id;
use crate::domain::refund::REFUND_PREFIX;
use crate::domain::{Key, ORDER_PREFIX, Record};
use crate::drivers::charge::{Charger, Settings, deferred};
use crate::drivers::executor::{Executor, executor};
use crate::drivers::metrics::PAYMENT_MISSING;
use crate::drivers::spans::{self, ProviderCall};
use crate::policy::machine::NoAnswer;
use crate::policy::outcome::{Outcome, RetryCause};
use crate::policy::outcome_kind::OutcomeKind;
use crate::policy::rules::Rules;
use crate::policy::settle::{
    self, Found, PaymentNow, SettleInput, SettleStep, Settlement, Trigger,
};

/// Steps one settlement can take: read, two fetches, a cancel, two writes, a report,
/// and the writes a changed record makes it judge again.
const MOST_STEPS: usize = 16;

/// Pages of the awaiting index one settler run reads at most (its time ends first).
const MOST_PAGES: usize = 100_000;

/// Runs `machine` from `step` to its outcome through `calls`.
async fn drive(mut machine: Settlement, mut step: SettleStep, calls: &Calls<'_, '_>) -> Outcome {
    for _ in 0..MOST_STEPS {
        step = match step {
            SettleStep::Done(outcome) => {
                if matches!(
                    &outcome,
                    Outcome::FailedRetryable {
                        cause: RetryCause::PaymentMissing { .. },
                        ..
                    }
                ) {
                    metrics::counter!(PAYMENT_MISSING).increment(1);
                }
                return outcome;
            }
            SettleStep::Read => {
                let answer = calls.read(machine.key()).await;
                machine.on(SettleInput::Read(answer))
            }
            SettleStep::Fetch => {
                let answer = calls.fetch(machine.payment_id()).await;
                machine.on(SettleInput::Fetched(answer))
            }
            SettleStep::Cancel => {
                let answer = calls.cancel(machine.payment_id()).await;
                machine.on(SettleInput::Cancelled(answer))
            }
            SettleStep::Report => {
                let answer = calls.report(machine.key(), machine.payment_id()).await;
                machine.on(SettleInput::Reported(answer))
            }
            SettleStep::Write => {
                let answer = match machine.write() {
                    Some(write) => calls.write(&write).await,
                    None => Err(NoAnswer::NoTime),
                };
                machine.on(SettleInput::Written(answer))
            }
        };
    }
    Outcome::InProgress { until: None }
}

/// What a settlement settles at the provider: an order's payment, or a refund.
#[derive(Clone, Copy)]
enum Object<'a> {
    Payment(&'a dyn ChargePath),
    Refund(&'a dyn RefundPath),
}

/// A settlement's calls, through the one executor (`drivers/executor.rs`): on the
/// event path and the settler alike, each bounded by the deadline rule, told to its
/// breaker, paced (provider calls) and in its span.
struct Calls<'a, 'e> {
    executor: &'a Executor<'e>,
    store: &'a dyn IdempotencyStore,
    object: Object<'a>,
    reports: &'a dyn Reports,
    /// The refund fetched last: its order and why the bank refused it, for its report.
    refund: std::sync::Mutex<Option<RefundSeen>>,
}

impl<'a, 'e> Calls<'a, 'e> {
    fn new(
        executor: &'a Executor<'e>,
        store: &'a dyn IdempotencyStore,
        object: Object<'a>,
        reports: &'a dyn Reports,
    ) -> Self {
        Self {
            executor,
            store,
            object,
            reports,
            refund: std::sync::Mutex::new(None),
        }
    }

    async fn read(&self, key: &Key) -> Result<Option<Record>, NoAnswer<StoreError>> {
        let span = spans::store_operation("get", "GetItem");
        self.executor.store(&span, self.store.get(key)).await
    }

    async fn fetch(&self, reference: &str) -> Result<Option<Found>, NoAnswer<PaymentError>> {
        match self.object {
            Object::Payment(provider) => {
                let found = self
                    .executor
                    .provider(ProviderCall::Fetch, false, || {
                        provider.payment_by_id(reference)
                    })
                    .await?;
                Ok(found.as_ref().map(Found::of))
            }
            Object::Refund(provider) => {
                let seen = self
                    .executor
                    .provider(ProviderCall::Fetch, false, || {
                        provider.refund_by_id(reference)
                    })
                    .await?;
                let found = seen.as_ref().map(Found::of_refund);
                if let Ok(mut last) = self.refund.lock() {
                    *last = seen;
                }
                Ok(found)
            }
        }
    }

    async fn cancel(&self, reference: &str) -> Result<Cancel, NoAnswer<PaymentError>> {
        match self.object {
            Object::Payment(provider) => {
                self.executor
                    .provider(ProviderCall::Cancel, false, || provider.cancel(reference))
                    .await
            }
            // A refund the bank holds is never cancelled here: it settles by itself.
            Object::Refund(_) => Ok(Cancel::NotCancellable),
        }
    }

    async fn write(&self, write: &Write<'_>) -> Result<WriteOutcome, NoAnswer<StoreError>> {
        let span = spans::store_operation(write.operation(), "UpdateItem");
        let answer = self.executor.store(&span, self.store.write(write)).await;
        spans::store_answered(&span, &answer);
        answer
    }

    async fn report(&self, key: &Key, reference: &str) -> Result<(), NoAnswer<QueueError>> {
        let now = self.executor.now();
        match self.object {
            Object::Payment(_) => {
                self.executor
                    .queue(report(self.reports, key, reference, now))
                    .await
            }
            Object::Refund(_) => {
                let seen = self.refund.lock().ok().and_then(|last| last.clone());
                let seen = seen.unwrap_or_else(|| RefundSeen {
                    status: String::new(),
                    refund_id: None,
                    order_id: None,
                    failure_reason: None,
                });
                let failed = FailedRefund {
                    refund_id: key.id(),
                    order_id: seen.order_id.as_deref(),
                    outcome: REFUND_FAILED,
                    refund: reference,
                    reason: seen.failure_reason.as_deref(),
                    ended_at_ms: now.as_ms(),
                };
                self.executor
                    .queue(self.reports.refund_failed(&failed))
                    .await
            }
        }
    }
}

/// The outcome a failed refund is reported with.
pub const REFUND_FAILED: &str = "refund_failed";

impl Charger<'_> {
    /// A provider event about `key`'s order (`None`: a thin event, which names only its
    /// payment: the order is the one the provider's answer names): a hint. The
    /// settlement machine reads the record, fetches the payment the event names, and
    /// settles by the provider's answer; the event's body is never believed. Under the
    /// breakers, as a record is.
    pub async fn settle_event(
        &self,
        event: &PaymentEvent,
        key: Option<&Key>,
        reports: &dyn Reports,
        deadline: Time,
    ) -> Outcome {
        let now = self.settings.now();
        let trigger = Trigger::Event {
            payment_id: event.payment_id.clone(),
            claimed: PaymentNow::claimed(&event.kind, &event.status),
        };
        let executor = executor(self.settings, deadline);
        let calls = Calls::new(
            &executor,
            self.store,
            Object::Payment(self.provider),
            reports,
        );
        let work = async {
            let (key, found) = match key {
                Some(key) => (key.clone(), None),
                None => match calls.fetch(&event.payment_id).await {
                    Ok(Some(found)) => {
                        let order = found
                            .fact_id
                            .as_deref()
                            .filter(|id| validate_id(id).is_ok());
                        match order {
                            Some(order_id) => (Key::for_order_id(order_id), Some(found)),
                            None => {
                                return Outcome::EventIgnored {
                                    payment_id: event.payment_id.clone(),
                                    why: "the provider says the payment is not an order's",
                                };
                            }
                        }
                    }
                    Ok(None) => return settle::missing(&event.payment_id),
                    Err(no_answer) => return settle::fetch_failed(no_answer),
                },
            };
            let (mut machine, step) =
                Settlement::new(key, trigger, now, self.settings.expires(now), Rules::ALL);
            if let Some(found) = found {
                machine.prefetched(found);
            }
            drive(machine, step, &calls).await
        };
        executor.admitted(work).await.unwrap_or_else(deferred)
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

/// What the settler leaves of its run's time for its answer, besides the longest one
/// record can take.
const SETTLE_MARGIN: Duration = Duration::from_secs(10);
/// The provider calls one record's settlement makes at most (a fetch, a cancel, a
/// second fetch), with its report and its write: what a record may take.
const SETTLE_CALLS_PER_RECORD: u32 = 5;

/// What the scheduled settler needs.
pub struct Settler<'a> {
    pub store: &'a dyn IdempotencyStore,
    pub provider: &'a dyn ChargePath,
    /// The refunds a bank holds `pending` are settled too when given (the stack runs
    /// the refund function); without, their records are left as they are.
    pub refunds: Option<&'a dyn RefundPath>,
    pub reports: &'a dyn Reports,
    /// The consumer's settings: the clock (a wait's end is read against it), the
    /// retention of a record it completes, the deadline budget, and this environment's
    /// breakers and pace, so that a run over many waits never bursts past the
    /// provider's rate limit nor calls a provider that is down.
    pub settings: &'a Settings,
    /// How long a run may take: the invocation's time left (in Lambda, less the
    /// traces' flush reserve).
    pub time: Duration,
    /// Awaiting records read per page of the index.
    pub limit: usize,
    /// Records one run settles at most (its time ends it too): what bounds a run's
    /// provider calls; the next run goes on from where it stopped.
    pub per_run: usize,
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
    /// Records whose payment the provider does not have: a setting is wrong.
    pub missing: usize,
    /// The run ran out of time before it went round the whole index: the next run goes
    /// on from where it stopped.
    pub unread: bool,
}

impl SettleRun {
    /// The run's summary line: `done` only when the run went round the whole index
    /// and settled every record it read, or left it waiting by the provider's answer.
    pub fn summary(&self) -> Value {
        let complete = self.failed == 0 && self.missing == 0 && !self.unread;
        json!({
            "settle": if complete { "done" } else { "incomplete" },
            "read": self.read,
            "completed": self.completed,
            "ended": self.ended,
            "waiting": self.waiting,
            "failed": self.failed,
            "missing": self.missing,
            "unread": self.unread,
        })
    }
}

impl Settler<'_> {
    /// Reads the awaiting records (the index, never a scan), page by page from where
    /// the last run stopped, round the whole index once, and settles each by the
    /// provider's answer for its payment; it keeps where it stopped. Reading the index
    /// fails the run; one record's failure is counted, logged, and left for the next
    /// run.
    pub async fn run(&self) -> Result<SettleRun, StoreError> {
        let far = Time::from_secs(i64::MAX / 1000);
        let deadline = self.settings.now() + self.time;
        // No record starts unless the longest one could end before the answer's margin.
        let record_time =
            self.settings.budget.provider_timeout * SETTLE_CALLS_PER_RECORD + SETTLE_MARGIN;
        let started_at = self.store.settle_cursor().await?;
        let mut cursor = started_at.clone();
        let mut wrapped = started_at.is_none();
        let mut run = SettleRun::default();
        // Bounded: every page but the last holds a record, each record is read at most
        // once a run, and the run stops at its time.
        'pages: for _page in 0..MOST_PAGES {
            let page = self
                .store
                .awaiting(cursor.as_ref(), far, self.limit.max(1))
                .await?;
            if page.is_empty() {
                if wrapped {
                    cursor = None;
                    break;
                }
                // The end of the index: on from its start, up to where the run began.
                wrapped = true;
                cursor = None;
                continue;
            }
            for record in page {
                let place = AwaitingCursor::of(&record);
                if wrapped && started_at.is_some() && !up_to(place.as_ref(), started_at.as_ref()) {
                    // Round the whole index: the next run starts where this one began.
                    cursor = started_at.clone();
                    break 'pages;
                }
                let left = self.settings.now().until(deadline);
                if left < record_time || run.read >= self.per_run {
                    run.unread = true;
                    break 'pages;
                }
                // The table may hold other consumers' facts under their own prefixes:
                // only an order's wait is its PaymentIntent's, a refund's its refund's.
                let object = match record.pk.prefix() {
                    ORDER_PREFIX => Some(Object::Payment(self.provider)),
                    REFUND_PREFIX => self.refunds.map(Object::Refund),
                    _ => None,
                };
                if let Some(object) = object {
                    self.settle(&mut run, record, object, deadline).await;
                }
                cursor = place;
            }
        }
        self.store.save_settle_cursor(cursor.as_ref()).await?;
        Ok(run)
    }

    async fn settle(
        &self,
        run: &mut SettleRun,
        record: Record,
        object: Object<'_>,
        deadline: Time,
    ) {
        run.read += 1;
        let key = record.pk.clone();
        let payment = record.awaited.clone().unwrap_or_default();
        let now = self.settings.now();
        let (machine, step) = Settlement::new(
            key.clone(),
            Trigger::Due(Box::new(record)),
            now,
            self.settings.expires(now),
            Rules::ALL,
        );
        let executor = executor(self.settings, deadline);
        let calls = Calls::new(&executor, self.store, object, self.reports);
        let outcome = executor
            .admitted(drive(machine, step, &calls))
            .await
            .unwrap_or_else(deferred);
        self.tell(run, &key, &payment, &outcome);
    }

    /// Counts and logs how one record's settlement ended.
    fn tell(&self, run: &mut SettleRun, key: &Key, payment: &str, outcome: &Outcome) {
        let reason = outcome.reason().unwrap_or_default();
        match outcome {
            Outcome::Settled { paid, .. } => {
                if *paid {
                    run.completed += 1;
                } else {
                    run.ended += 1;
                }
                metrics::counter!(outcome.name()).increment(1);
                info!(
                    outcome = outcome.name(),
                    key = key.as_str(),
                    payment,
                    "awaiting record settled"
                );
            }
            Outcome::EventIgnored { .. } => run.waiting += 1,
            Outcome::FailedRetryable {
                cause: RetryCause::PaymentMissing { .. },
                ..
            } => {
                run.missing += 1;
                error!(
                    outcome = outcome.name(),
                    key = key.as_str(),
                    payment,
                    reason = %reason,
                    "the provider does not have the payment or refund an awaiting record names; nothing ended"
                );
            }
            Outcome::NeedsReconciliation { .. } => {
                run.failed += 1;
                metrics::counter!(outcome.name()).increment(1);
                error!(
                    outcome = outcome.name(),
                    key = key.as_str(),
                    payment,
                    reason = %reason,
                    "settling an awaiting record needs a person"
                );
            }
            _ => {
                run.failed += 1;
                warn!(
                    outcome = outcome.name(),
                    key = key.as_str(),
                    payment,
                    reason = %reason,
                    "settling an awaiting record failed; the next run tries again"
                );
            }
        }
    }
}

/// Whether a run that went round from `start` has not yet passed it: `place`'s wait
/// ends no later than `start`'s. Records whose waits end in the same second may come
/// in any order in the index, so those are all read again (settling is idempotent)
/// rather than any skipped.
fn up_to(place: Option<&AwaitingCursor>, start: Option<&AwaitingCursor>) -> bool {
    match (place, start) {
        (Some(place), Some(start)) => place.wait_until.as_secs() <= start.wait_until.as_secs(),
        _ => false,
    }
}
