//! The model checker of ARCHITECTURE.md, "The proof" (`make model`, `make model MUTANT=<name>`).
//!
//! It explores, breadth first, every interleaving of a few consumer invocations that
//! run the product's own state machine (`charge_once::policy::machine::Machine`: the
//! library's, `idempotent_consumer::machine`, with a payment as its effect) against
//! models of the other parts:
//!
//! * the table: one linearisable item, written only through the table's own
//!   condition and effect functions (`holds`, `apply`), which the contract suite
//!   checks the DynamoDB and SQLite adapters against;
//! * the provider: keeps each key's first outcome for `key_lifetime` and replays it,
//!   refuses a key reused with another payload, charges, declines (a card declined
//!   under one key may succeed under a later one), charges and loses the answer,
//!   stores a 5xx (whose payment may still appear, succeeded, within
//!   `PROVIDER_KEY_TTL` less one invocation of its send, as Stripe rolls such payments
//!   forward after an incident, and never after), creates a `pending` charge that settles later as succeeded or
//!   failed (the record awaits it, as it awaits a customer), and forgets keys; a declined payment stays open, and someone (the shop's
//!   on-session page, a person in the Dashboard) may confirm it later, until it is
//!   cancelled; a payment may need the customer's authentication: the record then
//!   awaits its customer (`espera`) and the message is acknowledged, and the customer
//!   may confirm the payment at any time until it is cancelled, after the wait's end
//!   too;
//! * the settling of a payment (`policy/settle.rs`, the product's own settlement
//!   machine, run step by step against these models): an adversary who may put any
//!   event on the queue (any type, naming any payment, any number of times: Stripe's
//!   own, or a forgery by anyone allowed to send to the queue), and a consumer that
//!   settles it by fetching the payment; the scheduled settler, which may run at any
//!   time, fetches the awaiting record's payment and settles; once the clock passes
//!   the wait's end it cancels the payment first (its own step: a customer may
//!   confirm in between; a refused cancel: it fetches again). A fetch may answer 404
//!   (a wrong key: every fetch of that run), and a report of an ended wait may fail;
//! * SQS: two copies of one order and one message with the same id and another
//!   payload; receives counted, the DLQ after `max_receive`, one redrive; a message
//!   no retry can fix (`Handling::DeadLetter`) is sent to the DLQ by the consumer and
//!   then acknowledged, and the send may fail or its acknowledgement be lost;
//! * time: a clock that moves in ticks, so leases end, keys age and records pass
//!   `expires`; TTL removes items past `expires`;
//! * faults: a crash at any step, an SDK retry of a write that was applied, a write
//!   applied with its answer lost, a store error, a provider timeout; writes may be
//!   applied after their sender's lease ended (the zombie fencing exists for). A
//!   provider call is never started after the deadline (the driver's rule).
//!
//! Properties: at most one successful charge per order; an acknowledged message
//! means the record is `Done` with a successful charge, or a copy of the message is
//! in the DLQ, or the record awaits its customer (`espera`, which the settler always
//! can settle); a `Done` record never changes; an awaiting record ends only by the
//! payment it names (`Done` once that succeeded, `Failed` once it is cancelled);
//! no record is `hecho` with a payment that is not succeeded at the provider; a payment
//! that succeeded is never acknowledged as nothing while its record is not done with
//! it; every message ends acknowledged or in the DLQ and every wait ends; and,
//! so the model is not vacuous, a takeover after a crash, reconciliation finding a
//! charge and finding none, a decline followed by success under a later key, a
//! declined payment confirmed by someone else and completed, a payment that needed
//! the customer's authentication confirmed by them and completed, an order awaiting
//! its customer, a wait settled from the payment's event and one by the settler, a
//! wait past its end cancelled and ended, a confirmation after the wait's end that
//! refuses the settler's cancel, a refused conflicting payload, a corrected copy
//! charged once the order ended without a payment, and that
//! payload dead-lettered on its first delivery are each reached.
//!
//! Each mutant switches one rule of ARCHITECTURE.md, "The table" and "The state machine" off (or breaks one assumption) and
//! must yield a counterexample, printed as the shortest trace.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench-like tool: fail loudly

use charge_once::domain::{ForOrder, OrderKey};
use std::fmt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use charge_once::domain::clock::Time;

use charge_once::contracts::payment::{Cancel, FailureKind, Lookup, PaymentError, Receipt};
use charge_once::contracts::store::Write;
use charge_once::contracts::store::{StoreError, WriteOutcome};
use charge_once::domain::order::Order;
use charge_once::domain::{Identity, Owner, Record, State as RecordState};
use charge_once::policy::machine::{Input, Machine, NoAnswer, Start, Step};
use charge_once::policy::outcome::Outcome;
use charge_once::policy::outcome_kind::Handling;
use charge_once::policy::rules::Rules;
use charge_once::policy::settle::{
    Found, PaymentNow, SettleInput, SettleStep, Settlement, Trigger,
};
use charge_once::policy::table::{apply, holds};
use stateright::{Checker, HasDiscoveries, Model, Property};

// The search clones and drops millions of small states; glibc's allocator was a quarter
// of the run (perf), and two checker threads contended on its arena locks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One tick of the model clock, in ms.
const TICK_MS: i64 = 60_000;

/// The bounds and assumptions of one run. Times are in ticks.
#[derive(Clone, Copy, Debug)]
struct Params {
    rules: Rules,
    /// How long an invocation (and so its lease) lasts.
    lease: u8,
    /// Keys first sent longer ago are reconciled (`PROVIDER_KEY_TTL`).
    key_ttl: u8,
    /// The provider forgets a key this long after it first saw it.
    key_lifetime: u8,
    /// `expires` = write time + this (`IDEMPOTENCY_RETENTION`).
    retention: u8,
    /// How long an order awaits its customer (`AUTHENTICATION_WAIT`): shorter than the
    /// retention, and a wait that starts while messages circulate ends by the horizon.
    wait: u8,
    /// TTL removes an item this long after `expires` at the earliest; `None`: never
    /// within the run ("TTL deletes days late").
    sweep_lag: Option<u8>,
    /// Messages are delivered and redriven only until this tick (queue + DLQ
    /// retention, redrive included).
    circulation: u8,
    /// The clock stops here.
    horizon: u8,
    /// Receives before a message moves to the DLQ; also `MAX_DECLINES`.
    max_receive: u8,
    max_concurrent: usize,
    /// The messages in the queue at the start.
    msgs: &'static [Payload],
    /// The batch acknowledges a dead letter before its send succeeded (a mutant).
    ack_before_dead_letter: bool,
    /// The driver sends the charge without the key the machine names (a mutant): the
    /// provider can replay nothing.
    drop_provider_key: bool,
    /// Budgets of nondeterministic faults, crashes and redrives in one run, and of
    /// open payments someone else confirms.
    confirms: u8,
    faults: u8,
    crashes: u8,
    redrives: u8,
    /// Breadth-first search depth (steps); 0 = exhaustive.
    depth: usize,
}

impl Params {
    fn default_run() -> Self {
        Self {
            rules: Rules::ALL,
            lease: 1,
            key_ttl: 1,
            key_lifetime: 3,
            retention: 5,
            wait: 2,
            sweep_lag: Some(0),
            circulation: 4,
            horizon: 6,
            max_receive: 2,
            max_concurrent: 2,
            // Two copies of the order (SNS fan-out) and the same id with another amount.
            msgs: &[Payload::Order, Payload::Order, Payload::Other],
            ack_before_dead_letter: false,
            drop_provider_key: false,
            confirms: 1,
            faults: 2,
            crashes: 1,
            redrives: 1,
            depth: 14,
        }
    }
}

/// The mutants of `make model MUTANT=<name>`: one rule off, or one assumption broken.
const MUTANTS: &[(&str, &str)] = &[
    (
        "unfenced-release",
        "complete and release without the owner fence",
    ),
    (
        "bump-key-on-timeout",
        "a new provider key after an uncertain failure",
    ),
    (
        "hecho-expires",
        "a `hecho` item past `expira` counts as absent (retention shorter than circulation, TTL late)",
    ),
    ("no-provider-key", "the charge carries no idempotency key"),
    ("pending-is-absent", "a pending charge counts as not found"),
    (
        "reconcile-never",
        "an old key is reused without reconciling",
    ),
    (
        "records-outlive-messages",
        "assumption broken: retention shorter than a message's circulation",
    ),
    (
        "key-ttl-within-lifetime",
        "assumption broken: PROVIDER_KEY_TTL + one invocation not below the key lifetime",
    ),
    (
        "ack-before-dead-letter",
        "a poison message is acknowledged before its send to the DLQ succeeded",
    ),
    (
        "open-payments-left-open",
        "a declined payment is left open when the order moves to a new key",
    ),
    (
        "new-key-after-server-error",
        "a replayed 5xx is reconciled at once and the order moves to a new key",
    ),
    (
        "reserve-while-awaiting",
        "a delivery reserves an order that awaits its customer",
    ),
    (
        "settle-any-payment",
        "a wait is settled by the event of a payment the record does not name",
    ),
    (
        "expire-without-cancel",
        "a wait ends while its payment may still succeed (past its end uncancelled, or on a failed attempt)",
    ),
    (
        "trust-the-event",
        "an event's body is believed: its type settles the wait without asking the provider",
    ),
    (
        "missing-ends-the-wait",
        "a payment the provider does not know (404) ends the wait",
    ),
    (
        "ignore-unrecorded-success",
        "a success the record does not await is acknowledged as nothing",
    ),
    (
        "correct-while-open",
        "a corrected copy takes the record while a payment of the order may still succeed",
    ),
];

fn mutant(name: &str) -> Option<Params> {
    let mut p = Params::default_run();
    match name {
        "unfenced-release" => {
            // Its shortest counterexample has 16 steps (a zombie's late release moves
            // the key, after cancelling its declined payment, while the new owner is
            // about to charge under it): depth 18, far beyond what the default bounds
            // can search. Two copies, no conflicting payload, crash or redrive find it
            // in seconds.
            p.rules.fenced = false;
            p.msgs = &[Payload::Order, Payload::Order];
            p.crashes = 0;
            p.redrives = 0;
            p.circulation = 3;
            p.horizon = 3;
            p.depth = 18;
        }
        "bump-key-on-timeout" => p.rules.keep_key_when_uncertain = false,
        "hecho-expires" => {
            p.rules.done_is_final = false;
            p.retention = 1;
            p.sweep_lag = None;
        }
        "no-provider-key" => p.drop_provider_key = true,
        "pending-is-absent" => p.rules.pending_is_live = false,
        "reconcile-never" => p.rules.reconcile_old_keys = false,
        "records-outlive-messages" => p.retention = 1,
        "key-ttl-within-lifetime" => p.key_ttl = 2,
        "open-payments-left-open" => {
            // A decline, a redelivery charging under the next key, and someone
            // confirming the first payment: no fault, crash or redrive needed.
            p.rules.close_open_attempts = false;
            p.msgs = &[Payload::Order];
            p.faults = 0;
            p.crashes = 0;
            p.redrives = 0;
        }
        "new-key-after-server-error" => {
            // A stored 5xx, its replay on the next delivery, the next key's payment,
            // and the first payment rolled forward: one copy, no crash or redrive.
            p.rules.keep_key_after_server_error = false;
            p.msgs = &[Payload::Order];
            p.faults = 1;
            p.crashes = 0;
            p.redrives = 0;
            p.confirms = 0;
        }
        "reserve-while-awaiting" => {
            // The wait, and a copy delivered while it lasts: no fault, crash or redrive.
            p.rules.awaiting_holds_the_fact = false;
            p.msgs = &[Payload::Order, Payload::Order];
            p.faults = 0;
            p.crashes = 0;
            p.redrives = 0;
        }
        "settle-any-payment" => {
            // A decline (its payment cancelled before the next key), the next key's
            // payment awaiting the customer, and the late event of the first one's
            // cancellation: one copy, no fault, crash or redrive.
            p.rules.settle_names_what_it_awaits = false;
            p.msgs = &[Payload::Order];
            p.faults = 0;
            p.crashes = 0;
            p.redrives = 0;
        }
        "expire-without-cancel" => {
            // The wait, its end passing, and a settler run that ends it with its
            // payment still open: one copy, no fault, crash or redrive.
            p.rules.wait_ends_only_when_cancelled = false;
            p.msgs = &[Payload::Order];
            p.faults = 0;
            p.crashes = 0;
            p.redrives = 0;
            p.depth = 10;
        }
        "trust-the-event" | "missing-ends-the-wait" | "ignore-unrecorded-success" => {
            // The wait (or a lost answer), and one event or settler run: one copy, no
            // crash or redrive.
            match name {
                "trust-the-event" => p.rules.event_is_a_hint = false,
                "missing-ends-the-wait" => p.rules.missing_is_a_fault = false,
                _ => p.rules.effect_found_is_recorded = false,
            }
            p.msgs = &[Payload::Order];
            p.crashes = 0;
            p.redrives = 0;
            p.depth = 10;
        }
        "correct-while-open" => {
            // A charge whose answer is lost (its key sent), and the corrected copy
            // taken under the next key: no crash or redrive.
            p.rules.correct_only_when_closed = false;
            p.msgs = &[Payload::Order, Payload::Other];
            p.crashes = 0;
            p.redrives = 0;
            p.confirms = 0;
            p.depth = 12;
        }
        "ack-before-dead-letter" => {
            // The conflicting payload is the poison message; nothing else is needed.
            p.ack_before_dead_letter = true;
            p.msgs = &[Payload::Order, Payload::Other];
            p.crashes = 0;
            p.redrives = 0;
        }
        _ => return None,
    }
    Some(p)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Payload {
    /// The order.
    Order,
    /// The same order id with another amount.
    Other,
}

impl Payload {
    fn order(self) -> Order {
        let amount = match self {
            Self::Order => 5000,
            Self::Other => 7000,
        };
        Order::new("o", amount, "EUR", "cus_1", "pm_1").unwrap()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum MsgState {
    Queued,
    InFlight,
    Acked(&'static str),
    Dlq(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Msg {
    payload: Payload,
    receives: u8,
    redriven: u8,
    state: MsgState,
    /// Copies the consumers sent to the DLQ (dead letters).
    copies: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Consumer {
    /// Its owner token, for traces.
    name: String,
    msg: usize,
    payload: Payload,
    deadline: u8,
    machine: Machine,
    step: Step,
    /// The machine ended with a poison outcome: the consumer is sending the message to
    /// the DLQ (the step is that `Done`).
    dead_lettering: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Status {
    Succeeded,
    Pending,
    Failed,
    /// Declined, and still confirmable by someone until cancelled.
    Open,
    /// Awaiting the customer's authentication: only they confirm it.
    AwaitsCustomer,
    /// Behind a stored 5xx: no lookup sees it, and it may still appear, succeeded.
    Limbo,
    Canceled,
}

/// What the provider stored under a key: the answer it replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stored {
    Charged(usize),
    /// Created `pending`: a replay answers with the pending charge.
    ChargedPending(usize),
    /// Declined: the payment stays open.
    Declined(usize),
    /// Authentication required: the payment awaits the customer.
    AuthRequired(usize),
    /// A 5xx; its payment is in limbo.
    ServerError(usize),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KeyEntry {
    key: String,
    payload: Payload,
    stored: Stored,
    created: u8,
}

/// The provider's events a payment made (bits), as Stripe sends them.
const SUCCEEDED: u8 = 1;
const CANCELED: u8 = 2;
/// `payment_intent.payment_failed`: a decline, or the answer asking for authentication.
const PAYMENT_FAILED: u8 = 4;

/// The ways a wait was settled (bits of `State::settled`), for the reachability checks.
const BY_EVENT: u8 = 1;
const BY_SETTLER: u8 = 2;
const EXPIRED: u8 = 4;
/// The settler's cancel refused: the customer confirmed after the wait's end.
const CONFIRMED_LATE: u8 = 8;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    table: Option<Record>,
    keys: Vec<KeyEntry>,
    charges: Vec<(Payload, Status)>,
    /// A settler run that found the awaited payment open past the wait's end and is
    /// about to cancel it: its settlement, waiting on the cancel.
    cancelling: Option<Box<Settlement>>,
    /// How waits were settled so far (bits).
    settled: u8,
    msgs: Vec<Msg>,
    consumers: Vec<Consumer>,
    confirms: u8,
    faults: u8,
    crashes: u8,
    redrives: u8,
    /// Set by a transition that broke a safety property (read by the properties).
    bad_ack: bool,
    done_changed: bool,
    /// An awaiting record left `espera` other than by the payment it names.
    wait_broken: bool,
    /// A record became `hecho` with a payment that is not succeeded at the provider.
    done_unpaid: bool,
    /// An event about a payment that succeeded was acknowledged as nothing while the
    /// record was not done with it.
    success_ignored: bool,
}

/// A settlement's own faults (the model's parts answer everything else).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SettleFault {
    None,
    /// A wrong key, mode or URL: every fetch answers 404.
    WrongKey,
    /// The report of an ended wait fails.
    ReportFails,
}

const SETTLE_FAULTS: [SettleFault; 3] = [
    SettleFault::None,
    SettleFault::WrongKey,
    SettleFault::ReportFails,
];

/// What the environment does with a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Env {
    /// As asked: a write is applied if its condition holds; a provider replays a
    /// known key; a new key charges successfully.
    Normal,
    // Writes.
    SdkRetry,
    AnswerLost,
    StoreError,
    // A charge under a new key.
    Decline,
    AuthRequired,
    ChargedAnswerLost,
    PendingAnswerLost,
    StoredServerError,
    // Any provider call.
    Timeout,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Deliver(usize),
    Step(usize, Env),
    Crash(usize),
    Tick,
    Sweep,
    Settle(usize, bool),
    Redrive(usize),
    /// Someone confirms the open payment `i`: it succeeds.
    Confirm(usize),
    /// The provider rolls the payment `i` behind a stored 5xx forward: it succeeds.
    RollForward(usize),
    /// An event naming payment `i` and claiming what one bit says (any payment, any
    /// claim, any number of times: Stripe's, or a forgery by anyone allowed to send to
    /// the queue) reaches a consumer.
    Event(usize, u8, SettleFault),
    /// The scheduled settler reads the awaiting record and fetches its payment.
    SettlerLooks(SettleFault),
    /// The settler cancels the awaited payment whose wait is over.
    SettlerCancels,
}

struct ChargeModel {
    p: Params,
    /// The key and fingerprint of each payload, computed once by the product's own
    /// functions: per delivery, SHA-256 and hex formatting at opt-level 0 took a third
    /// of the search's time.
    order: Identity,
    other: Identity,
    /// What each event (`SUCCEEDED`, `CANCELED`, `PAYMENT_FAILED`) claims of its
    /// payment, read once by the consumer's own function.
    event_now: [PaymentNow; 3],
}

/// The instant of a tick.
fn at(tick: u8) -> Time {
    Time::from_ms(i64::from(tick) * TICK_MS)
}

/// The length of some ticks.
fn span(ticks: u8) -> Duration {
    at(0).until(at(ticks))
}

fn now_s(tick: u8) -> i64 {
    at(tick).as_secs()
}

fn receipt_index(receipt: &str) -> Option<usize> {
    receipt.strip_prefix("ch").and_then(|i| i.parse().ok())
}

impl State {
    fn succeeded(&self) -> usize {
        self.charges
            .iter()
            .filter(|(_, s)| *s == Status::Succeeded)
            .count()
    }

    fn settled(&self) -> bool {
        self.consumers.is_empty()
            && self
                .msgs
                .iter()
                .all(|m| matches!(m.state, MsgState::Acked(_) | MsgState::Dlq(_)))
    }

    fn key_entry(&self, key: &str) -> Option<&KeyEntry> {
        self.keys.iter().find(|k| k.key == key)
    }

    /// The record awaits its customer.
    fn awaits(&self) -> bool {
        self.table
            .as_ref()
            .is_some_and(|r| r.state == RecordState::Awaiting)
    }

    /// A new payment, with the event its status makes.
    fn new_payment(&mut self, payload: Payload, status: Status) -> usize {
        self.charges.push((payload, status));
        let i = self.charges.len() - 1;
        self.set_status(i, status);
        i
    }

    /// Payment `i` is now `status` (its events are the adversary's to send: any
    /// payment, any claim).
    fn set_status(&mut self, i: usize, status: Status) {
        self.charges[i].1 = status;
    }
}

/// What a lookup of payment `i` by id finds (the provider's `status`).
fn payment_now(status: Status) -> PaymentNow {
    match status {
        Status::Succeeded => PaymentNow::of_status("succeeded"),
        Status::Canceled => PaymentNow::of_status("canceled"),
        Status::Pending => PaymentNow::of_status("processing"),
        Status::AwaitsCustomer => PaymentNow::of_status("requires_action"),
        Status::Open | Status::Failed | Status::Limbo => {
            PaymentNow::of_status("requires_payment_method")
        }
    }
}

/// What an event (one bit) says of its payment, read by the consumer's own function.
fn event_now(event: u8) -> PaymentNow {
    let (kind, status) = match event {
        SUCCEEDED => ("payment_intent.succeeded", "succeeded"),
        CANCELED => ("payment_intent.canceled", "canceled"),
        _ => ("payment_intent.payment_failed", "requires_payment_method"),
    };
    PaymentNow::claimed(kind, status)
}

impl ChargeModel {
    fn new(p: Params) -> Self {
        Self {
            p,
            order: Identity::for_order(&Payload::Order.order()),
            other: Identity::for_order(&Payload::Other.order()),
            event_now: [SUCCEEDED, CANCELED, PAYMENT_FAILED].map(event_now),
        }
    }

    fn identity(&self, payload: Payload) -> Identity {
        match payload {
            Payload::Order => self.order.clone(),
            Payload::Other => self.other.clone(),
        }
    }

    fn start_consumer(&self, s: &mut State, m: usize) {
        let msg = &mut s.msgs[m];
        msg.receives += 1;
        msg.state = MsgState::InFlight;
        let identity = self.identity(msg.payload);
        let p = &self.p;
        // Unique per delivery, as a fresh random token would be.
        let name = format!("m{m}r{}d{}", msg.receives, msg.redriven);
        let (machine, step) = Machine::new(Start {
            identity,
            owner: Owner::new(name.clone()),
            now: at(s.now),
            deadline: at(s.now + p.lease),
            expires: Time::from_secs(now_s(s.now) + now_s(p.retention)),
            max_declines: u32::from(p.max_receive),
            key_ttl: span(p.key_ttl),
            authentication_wait: span(p.wait),
            processing_wait: span(p.wait),
            rules: p.rules,
        });
        s.consumers.push(Consumer {
            name,
            msg: m,
            payload: msg.payload,
            deadline: s.now + p.lease,
            machine,
            step,
            dead_lettering: false,
        });
    }

    /// Applies a write to the table as the store would; returns the answer.
    fn write(
        &self,
        s: &mut State,
        write: &Write<'_>,
        env: Env,
    ) -> Result<WriteOutcome, NoAnswer<StoreError>> {
        let rules = self.p.rules;
        let attempt = |s: &mut State| -> WriteOutcome {
            if holds(write, s.table.as_ref(), rules) {
                let new = apply(write, s.table.as_ref());
                if let Some(old) = &s.table
                    && old.state == RecordState::Done
                    && (new.state != RecordState::Done || new.receipt != old.receipt)
                {
                    s.done_changed = true;
                }
                let unpaid = new.state == RecordState::Done
                    && !new
                        .receipt
                        .as_deref()
                        .and_then(receipt_index)
                        .and_then(|i| s.charges.get(i))
                        .is_some_and(|c| c.1 == Status::Succeeded);
                if unpaid {
                    s.done_unpaid = true;
                }
                if let Some(old) = &s.table
                    && old.state == RecordState::Awaiting
                    && !(new.state == RecordState::Awaiting && new.awaited == old.awaited)
                {
                    let named = old
                        .awaited
                        .as_deref()
                        .and_then(receipt_index)
                        .and_then(|i| s.charges.get(i))
                        .map(|c| c.1);
                    let by_its_payment = match new.state {
                        RecordState::Done => {
                            new.receipt == old.awaited && named == Some(Status::Succeeded)
                        }
                        RecordState::Failed => named == Some(Status::Canceled),
                        _ => false,
                    };
                    if !by_its_payment {
                        s.wait_broken = true;
                    }
                }
                s.table = Some(new.clone());
                WriteOutcome::Applied(new)
            } else {
                WriteOutcome::Refused(s.table.clone())
            }
        };
        match env {
            Env::Normal => Ok(attempt(s)),
            Env::SdkRetry => {
                // Applied, the answer lost, the SDK sends it again: the caller sees
                // the second answer.
                attempt(s);
                Ok(attempt(s))
            }
            Env::AnswerLost => {
                attempt(s);
                Err(NoAnswer::TimedOut)
            }
            _ => Err(NoAnswer::Failed(StoreError::backend(
                "model",
                "o",
                std::io::Error::other("store error"),
            ))),
        }
    }

    /// What the provider answers for payment `i` fetched by id (`None`: it has no such
    /// payment, as behind a stored 5xx: no read sees it).
    fn found(&self, s: &State, i: usize) -> Option<Found> {
        let (payload, status) = s.charges.get(i)?;
        if *status == Status::Limbo {
            return None;
        }
        Some(Found {
            status: payment_now(*status),
            fact_id: Some(self.order.key.order_id().to_owned()),
            fingerprint: Some(self.identity(*payload).fingerprint),
        })
    }

    /// Runs a settlement (`policy/settle.rs`) against the model's table and provider
    /// until it ends, or, with `stop_at_cancel`, until it asks to cancel (the settler's
    /// cancel is its own action, so a customer may confirm in between): then the
    /// settlement waiting on its cancel.
    fn settle(
        &self,
        s: &mut State,
        mut machine: Settlement,
        mut step: SettleStep,
        fault: SettleFault,
        stop_at_cancel: bool,
    ) -> Result<Outcome, Box<Settlement>> {
        for _ in 0..16 {
            let payment = receipt_index(machine.payment_id());
            step = match step {
                SettleStep::Done(outcome) => return Ok(outcome),
                SettleStep::Read => machine.on(SettleInput::Read(Ok(s.table.clone()))),
                SettleStep::Fetch => {
                    let found = match fault {
                        SettleFault::WrongKey => None,
                        _ => payment.and_then(|i| self.found(s, i)),
                    };
                    machine.on(SettleInput::Fetched(Ok(found)))
                }
                SettleStep::Cancel if stop_at_cancel => return Err(Box::new(machine)),
                SettleStep::Cancel => machine.on(SettleInput::Cancelled(Ok(cancel(s, payment)))),
                SettleStep::Report => machine.on(SettleInput::Reported(match fault {
                    SettleFault::ReportFails => Err(NoAnswer::Failed(
                        charge_once::contracts::queue::QueueError::TimedOut,
                    )),
                    _ => Ok(()),
                })),
                SettleStep::Write => {
                    let answer = match machine.write() {
                        Some(write) => self.write(s, &write, Env::Normal),
                        None => Err(NoAnswer::NoTime),
                    };
                    machine.on(SettleInput::Written(answer))
                }
            };
        }
        Ok(Outcome::InProgress { until: None })
    }

    /// `expires` of a record completed now.
    fn paid_until(&self, s: &State) -> Time {
        Time::from_secs(now_s(s.now) + now_s(self.p.retention))
    }

    /// An event naming payment `i` and claiming `event`, settled by the consumer.
    fn event(&self, s: &mut State, i: usize, event: u8, fault: SettleFault) {
        let claimed = self.event_now[match event {
            SUCCEEDED => 0,
            CANCELED => 1,
            _ => 2,
        }];
        let trigger = Trigger::Event {
            payment_id: format!("ch{i}"),
            claimed,
        };
        let (machine, step) = Settlement::new(
            self.order.key.clone(),
            trigger,
            at(s.now),
            self.paid_until(s),
            self.p.rules,
        );
        let Ok(outcome) = self.settle(s, machine, step, fault, false) else {
            return;
        };
        if matches!(outcome, Outcome::Settled { paid: true, .. }) {
            s.settled |= BY_EVENT;
        }
        // Money taken is never acknowledged as nothing while the record is not done
        // with it (a record the table lost entirely is counted, not settled).
        let paid = s.charges.get(i).is_some_and(|c| c.1 == Status::Succeeded);
        let done_with_it = s.table.as_ref().is_some_and(|r| {
            r.state == RecordState::Done && r.receipt.as_deref() == Some(format!("ch{i}").as_str())
        });
        if paid
            && s.table.is_some()
            && !done_with_it
            && outcome.handling().is_ack()
            && !matches!(outcome, Outcome::PaymentUnrecorded { .. })
        {
            s.success_ignored = true;
        }
    }

    /// A settler run over the awaiting record: to its end, or to its cancel.
    fn settler_looks(&self, s: &mut State, fault: SettleFault) {
        let Some(record) = s.table.clone().filter(|r| r.state == RecordState::Awaiting) else {
            return;
        };
        let (machine, step) = Settlement::new(
            self.order.key.clone(),
            Trigger::Due(Box::new(record)),
            at(s.now),
            self.paid_until(s),
            self.p.rules,
        );
        match self.settle(s, machine, step, fault, true) {
            Ok(Outcome::Settled { paid: true, .. }) => s.settled |= BY_SETTLER,
            Ok(_) => {}
            Err(waiting) => s.cancelling = Some(waiting),
        }
    }

    /// The settler's cancel of a payment whose wait is over, then the rest of its
    /// settlement; a refused cancel (it succeeded meanwhile) means look again.
    fn settler_cancels(&self, s: &mut State) -> Option<()> {
        let mut machine = s.cancelling.take()?;
        let answer = cancel(s, receipt_index(machine.payment_id()));
        let refused = answer == Cancel::NotCancellable;
        let step = machine.on(SettleInput::Cancelled(Ok(answer)));
        match self.settle(s, *machine, step, SettleFault::None, false) {
            Ok(Outcome::Settled { paid: true, .. }) if refused => {
                s.settled |= BY_SETTLER | CONFIRMED_LATE;
            }
            Ok(Outcome::Settled { paid: false, .. }) if !refused => s.settled |= EXPIRED,
            _ => {}
        }
        Some(())
    }

    /// One step of consumer `c` in environment `env`: the machine's answer to its last
    /// step; `None` when it has none to take.
    fn step(&self, s: &mut State, c: usize, env: Env) -> Option<()> {
        if !matches!(env, Env::Normal | Env::Decline | Env::AuthRequired) {
            s.faults -= 1;
        }
        let step = s.consumers[c].step.clone();
        let next = match step {
            Step::Write(kind) => {
                let mut machine = s.consumers[c].machine.clone();
                let answer = {
                    let write = machine.write(kind, at(s.now));
                    self.write(s, &write, env)
                };
                let next = machine.on(Input::Written(answer));
                s.consumers[c].machine = machine;
                next
            }
            Step::Charge { key } => {
                // The mutant's driver drops the key the machine asked to charge under.
                let key = (!self.p.drop_provider_key).then_some(key);
                let answer = self.charge(s, c, key, env);
                s.consumers[c].machine.on(Input::Charged(answer))
            }
            Step::Lookup => {
                let answer = self.lookup(s, c, env);
                s.consumers[c].machine.on(Input::Looked(answer))
            }
            Step::Cancel { payment_id } => {
                let answer = self.cancel(s, c, &payment_id, env);
                s.consumers[c].machine.on(Input::Cancelled(answer))
            }
            Step::Done(_) => return None,
        };
        match next {
            Step::Done(outcome) => self.finish(s, c, &outcome),
            next => s.consumers[c].step = next,
        }
        Some(())
    }

    fn charge(
        &self,
        s: &mut State,
        c: usize,
        key: Option<String>,
        env: Env,
    ) -> Result<Receipt, NoAnswer<PaymentError>> {
        let consumer = &s.consumers[c];
        if s.now > consumer.deadline {
            return Err(NoAnswer::NoTime);
        }
        if env == Env::Timeout {
            return Err(NoAnswer::TimedOut);
        }
        let payload = consumer.payload;
        if let Some(entry) = key.as_deref().and_then(|k| s.key_entry(k)) {
            return replay(entry, payload);
        }
        let store = |s: &mut State, stored: Stored| {
            if let Some(key) = &key {
                s.keys.push(KeyEntry {
                    key: key.clone(),
                    payload,
                    stored,
                    created: s.now,
                });
            }
        };
        let new_charge = |s: &mut State, status: Status| s.new_payment(payload, status);
        match env {
            Env::Decline => {
                let i = new_charge(s, Status::Open);
                store(s, Stored::Declined(i));
                Err(NoAnswer::Failed(declined(i)))
            }
            Env::AuthRequired => {
                let i = new_charge(s, Status::AwaitsCustomer);
                store(s, Stored::AuthRequired(i));
                Err(NoAnswer::Failed(authentication_required(i)))
            }
            Env::ChargedAnswerLost => {
                let i = new_charge(s, Status::Succeeded);
                store(s, Stored::Charged(i));
                Err(NoAnswer::TimedOut)
            }
            Env::PendingAnswerLost => {
                let i = new_charge(s, Status::Pending);
                store(s, Stored::ChargedPending(i));
                Err(NoAnswer::TimedOut)
            }
            Env::StoredServerError => {
                let i = new_charge(s, Status::Limbo);
                store(s, Stored::ServerError(i));
                Err(NoAnswer::Failed(PaymentError::retryable(
                    FailureKind::Server(500),
                )))
            }
            _ => {
                let i = new_charge(s, Status::Succeeded);
                store(s, Stored::Charged(i));
                Ok(Receipt::new(format!("ch{i}")))
            }
        }
    }

    fn lookup(&self, s: &State, c: usize, env: Env) -> Result<Lookup, NoAnswer<PaymentError>> {
        let consumer = &s.consumers[c];
        if s.now > consumer.deadline {
            return Err(NoAnswer::NoTime);
        }
        if env == Env::Timeout {
            return Err(NoAnswer::TimedOut);
        }
        let mine = |status| {
            s.charges
                .iter()
                .position(|(p, st)| *p == consumer.payload && *st == status)
        };
        let found = (
            mine(Status::Succeeded),
            mine(Status::Pending),
            mine(Status::Open).or(mine(Status::AwaitsCustomer)),
        );
        Ok(match found {
            (Some(i), _, _) => Lookup::Succeeded(Receipt::new(format!("ch{i}"))),
            (None, Some(i), _) => Lookup::Pending {
                payment_id: format!("ch{i}"),
                status: "pending".to_owned(),
            },
            (None, None, Some(i)) => Lookup::Open {
                payment_id: format!("ch{i}"),
                status: "requires_payment_method".to_owned(),
                awaits_customer: s.charges[i].1 == Status::AwaitsCustomer,
            },
            (None, None, None) => Lookup::NotFound,
        })
    }

    /// A cancel: an open payment becomes cancelled; any other is not cancellable.
    fn cancel(
        &self,
        s: &mut State,
        c: usize,
        payment_id: &str,
        env: Env,
    ) -> Result<Cancel, NoAnswer<PaymentError>> {
        if s.now > s.consumers[c].deadline {
            return Err(NoAnswer::NoTime);
        }
        if env == Env::Timeout {
            return Err(NoAnswer::TimedOut);
        }
        Ok(cancel(s, receipt_index(payment_id)))
    }

    /// A delivery ended: ack, back to the queue, or the DLQ; a poison outcome starts
    /// the dead letter's send (acknowledged first under the mutant).
    fn finish(&self, s: &mut State, c: usize, outcome: &Outcome) {
        if outcome.handling() == Handling::DeadLetter {
            let consumer = &mut s.consumers[c];
            consumer.dead_lettering = true;
            consumer.step = Step::Done(outcome.clone());
            if self.p.ack_before_dead_letter {
                s.msgs[consumer.msg].state = MsgState::Acked(outcome.name());
            }
            return;
        }
        let consumer = s.consumers.remove(c);
        if outcome.handling().is_ack() {
            let paid = s.table.as_ref().is_some_and(|r| {
                r.state == RecordState::Done
                    && r.receipt
                        .as_deref()
                        .and_then(receipt_index)
                        .is_some_and(|i| s.charges.get(i).is_some_and(|c| c.1 == Status::Succeeded))
            });
            // An awaiting record is settled by the settler, which can always run.
            if !paid && !s.awaits() {
                s.bad_ack = true;
            }
            s.msgs[consumer.msg].state = MsgState::Acked(outcome.name());
        } else {
            self.return_message(s, consumer.msg, outcome.name());
        }
    }

    /// The dead letter's send: `sent` or not, and then acknowledged or not. A message
    /// acknowledged with no copy in the DLQ and no charge is lost.
    fn dead_letter(&self, s: &mut State, c: usize, sent: bool, acked: bool) {
        let consumer = s.consumers.remove(c);
        let Step::Done(outcome) = &consumer.step else {
            return;
        };
        let m = consumer.msg;
        if sent {
            s.msgs[m].copies += 1;
        }
        let already_acked = matches!(s.msgs[m].state, MsgState::Acked(_));
        if already_acked || acked {
            if s.msgs[m].copies == 0 {
                s.bad_ack = true;
            }
            s.msgs[m].state = MsgState::Acked(outcome.name());
        } else {
            self.return_message(s, m, outcome.name());
        }
    }

    fn return_message(&self, s: &mut State, m: usize, reason: &'static str) {
        let msg = &mut s.msgs[m];
        // The conflicting payload is delivered once: its later receives add nothing.
        let limit = match msg.payload {
            Payload::Order => self.p.max_receive,
            Payload::Other => 1,
        };
        msg.state = if msg.receives >= limit {
            MsgState::Dlq(reason)
        } else {
            MsgState::Queued
        };
    }
}

/// The provider's cancel of payment `i`: an open one becomes cancelled; any other
/// (succeeded meanwhile, say) is not cancellable.
fn cancel(s: &mut State, i: Option<usize>) -> Cancel {
    match i.filter(|&i| {
        s.charges
            .get(i)
            .is_some_and(|c| matches!(c.1, Status::Open | Status::AwaitsCustomer))
    }) {
        Some(i) => {
            s.set_status(i, Status::Canceled);
            Cancel::Cancelled
        }
        None => Cancel::NotCancellable,
    }
}

fn authentication_required(i: usize) -> PaymentError {
    PaymentError::AuthenticationRequired {
        payment_id: Some(format!("ch{i}")),
    }
}

/// A decline, naming the payment it left open (as Stripe's `error.payment_intent`).
fn declined(i: usize) -> PaymentError {
    PaymentError::Declined {
        code: "card_declined".to_owned(),
        decline_code: None,
        payment_id: Some(format!("ch{i}")),
    }
}

impl Model for ChargeModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let msg = |payload| Msg {
            payload,
            receives: 0,
            redriven: 0,
            state: MsgState::Queued,
            copies: 0,
        };
        vec![State {
            now: 0,
            table: None,
            keys: Vec::new(),
            charges: Vec::new(),
            cancelling: None,
            settled: 0,
            msgs: self.p.msgs.iter().map(|p| msg(*p)).collect(),
            consumers: Vec::new(),
            confirms: self.p.confirms,
            faults: self.p.faults,
            crashes: self.p.crashes,
            redrives: self.p.redrives,
            bad_ack: false,
            done_changed: false,
            wait_broken: false,
            done_unpaid: false,
            success_ignored: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let p = &self.p;
        let circulating = s.now <= p.circulation;
        for (m, msg) in s.msgs.iter().enumerate() {
            if circulating && msg.state == MsgState::Queued && s.consumers.len() < p.max_concurrent
            {
                actions.push(Action::Deliver(m));
            }
            // A redrive brings back a message the redrive policy moved, or a dead
            // letter's copy of one that was acknowledged.
            let in_dlq = matches!(msg.state, MsgState::Dlq(_))
                || (msg.copies > 0 && matches!(msg.state, MsgState::Acked(_)));
            if circulating && s.redrives > 0 && in_dlq {
                actions.push(Action::Redrive(m));
            }
        }
        for (c, consumer) in s.consumers.iter().enumerate() {
            let envs = envs(s, consumer, !p.drop_provider_key);
            actions.extend(envs.into_iter().map(|env| Action::Step(c, env)));
            if s.crashes > 0 {
                actions.push(Action::Crash(c));
            }
        }
        // Time passes while messages circulate; past that only once all settled, and
        // past the horizon only up to the end of a wait that is still open (the
        // settler ends it then: every wait ends, whenever it began).
        let wait_open = s.settled()
            && s.table
                .as_ref()
                .filter(|r| r.state == RecordState::Awaiting)
                .and_then(|r| r.wait_until)
                .is_some_and(|end| end.as_secs() > now_s(s.now));
        if (s.now < p.horizon && (s.now < p.circulation || s.settled())) || wait_open {
            actions.push(Action::Tick);
        }
        if let (Some(lag), Some(r)) = (p.sweep_lag, &s.table)
            && r.expires
                .is_some_and(|e| e.as_secs() + now_s(lag) < now_s(s.now))
        {
            actions.push(Action::Sweep);
        }
        for (i, (_, status)) in s.charges.iter().enumerate() {
            if *status == Status::Pending {
                actions.push(Action::Settle(i, true));
                actions.push(Action::Settle(i, false));
            }
            if matches!(status, Status::Open | Status::AwaitsCustomer) && s.confirms > 0 {
                actions.push(Action::Confirm(i));
            }
            if *status == Status::Limbo {
                actions.push(Action::RollForward(i));
            }
        }
        // Events name any payment and claim anything, any number of times; each is
        // offered only where it changes the state (a step to the same state would
        // hide the end of a path, and the search clones a state for every step it
        // tries). An event for a record the table lost, or whose receipt is already
        // its payment, makes no call and changes nothing.
        if let Some(record) = &s.table {
            for i in 0..s.charges.len() {
                if record.receipt.as_deref() == Some(format!("ch{i}").as_str()) {
                    continue;
                }
                // The claim is read only by the rule that believes events
                // (`policy/settle.rs`): with it on, one claim stands for all three.
                let claims: &[u8] = if self.p.rules.event_is_a_hint {
                    &[SUCCEEDED]
                } else {
                    &[SUCCEEDED, CANCELED, PAYMENT_FAILED]
                };
                for &event in claims {
                    for fault in SETTLE_FAULTS {
                        let mut next = s.clone();
                        self.event(&mut next, i, event, fault);
                        if next != *s {
                            actions.push(Action::Event(i, event, fault));
                        }
                    }
                }
            }
        }
        if s.awaits() && s.cancelling.is_none() {
            for fault in SETTLE_FAULTS {
                let mut next = s.clone();
                self.settler_looks(&mut next, fault);
                if next != *s {
                    actions.push(Action::SettlerLooks(fault));
                }
            }
        }
        if s.cancelling.is_some() {
            actions.push(Action::SettlerCancels);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Deliver(m) => self.start_consumer(&mut s, m),
            Action::Redrive(m) => {
                s.redrives -= 1;
                let msg = &mut s.msgs[m];
                if !matches!(msg.state, MsgState::Dlq(_)) {
                    msg.copies -= 1;
                }
                msg.redriven += 1;
                msg.receives = 0;
                msg.state = MsgState::Queued;
            }
            Action::Crash(c) if s.consumers[c].dead_lettering => {
                s.crashes -= 1;
                self.dead_letter(&mut s, c, false, false);
            }
            Action::Crash(c) => {
                s.crashes -= 1;
                let consumer = s.consumers.remove(c);
                self.return_message(&mut s, consumer.msg, "crashed");
            }
            Action::Tick => {
                s.now += 1;
                let (now, lifetime) = (s.now, self.p.key_lifetime);
                // The assumption of the forgotten-key rule: a stored 5xx's payment
                // appears within the key TTL less one invocation of its send (the key's
                // age is counted from its reservation, up to one invocation earlier),
                // or never.
                let window = self.p.key_ttl.saturating_sub(self.p.lease);
                for k in &s.keys {
                    if let Stored::ServerError(i) = k.stored
                        && k.created + window < now
                        && s.charges[i].1 == Status::Limbo
                    {
                        s.charges[i].1 = Status::Failed;
                    }
                }
                s.keys.retain(|k| k.created + lifetime > now);
            }
            Action::Sweep => s.table = None,
            Action::Confirm(i) => {
                s.confirms -= 1;
                s.set_status(i, Status::Succeeded);
            }
            Action::RollForward(i) => s.set_status(i, Status::Succeeded),
            Action::Settle(i, ok) => {
                s.set_status(
                    i,
                    if ok {
                        Status::Succeeded
                    } else {
                        Status::Failed
                    },
                );
            }
            Action::Event(i, event, fault) => self.event(&mut s, i, event, fault),
            Action::SettlerLooks(fault) => self.settler_looks(&mut s, fault),
            Action::SettlerCancels => self.settler_cancels(&mut s)?,
            Action::Step(c, env) if s.consumers[c].dead_lettering => {
                if env != Env::Normal {
                    s.faults -= 1;
                }
                let sent = env != Env::StoreError;
                self.dead_letter(&mut s, c, sent, env == Env::Normal);
            }
            Action::Step(c, env) => self.step(&mut s, c, env)?,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one successful charge per order",
                |_: &ChargeModel, s: &State| s.succeeded() <= 1,
            ),
            Property::always(
                "an acknowledged message means `hecho` with a successful charge, a copy in the DLQ, or an `espera` record the settler settles",
                |_: &ChargeModel, s: &State| !s.bad_ack,
            ),
            Property::always(
                "a `hecho` record never changes",
                |_: &ChargeModel, s: &State| !s.done_changed,
            ),
            Property::always(
                "an `espera` record ends only by its payment: `hecho` once it succeeded, `fallido` once it is cancelled",
                |_: &ChargeModel, s: &State| !s.wait_broken,
            ),
            Property::always(
                "no record is `hecho` with a payment that is not succeeded at the provider",
                |_: &ChargeModel, s: &State| !s.done_unpaid,
            ),
            Property::always(
                "a payment that succeeded is never acknowledged as nothing while its record is not done with it",
                |_: &ChargeModel, s: &State| !s.success_ignored,
            ),
            Property::eventually(
                "every message ends acknowledged or in the DLQ, and every wait ends",
                |_: &ChargeModel, s: &State| s.settled() && !s.awaits(),
            ),
            Property::sometimes(
                "reached: a takeover after a crash",
                |m: &ChargeModel, s: &State| {
                    s.crashes < m.p.crashes
                        && s.table.as_ref().is_some_and(|r| {
                            r.state == RecordState::InProgress
                                && r.created
                                    .zip(r.lease_until)
                                    .is_some_and(|(created, hasta)| {
                                        created < hasta - span(m.p.lease)
                                    })
                        })
                },
            ),
            Property::sometimes(
                "reached: reconciliation finds the charge",
                |_: &ChargeModel, s: &State| {
                    s.msgs
                        .iter()
                        .any(|m| m.state == MsgState::Acked("reconciled"))
                },
            ),
            Property::sometimes(
                "reached: reconciliation finds none and moves to a new key",
                |_: &ChargeModel, s: &State| {
                    // A done record keeps no attempt: the key it was charged under is
                    // the provider's.
                    s.table
                        .as_ref()
                        .is_some_and(|r| r.state == RecordState::Done)
                        && s.keys.iter().any(|k| k.key.ends_with("#2"))
                        && !s
                            .keys
                            .iter()
                            .any(|k| matches!(k.stored, Stored::Declined(_)))
                },
            ),
            Property::sometimes(
                "reached: a decline, then success under a later key",
                |_: &ChargeModel, s: &State| {
                    let paid_under = |key: &str| {
                        s.keys
                            .iter()
                            .any(|k| k.key.ends_with(key) && matches!(k.stored, Stored::Charged(_)))
                    };
                    s.table
                        .as_ref()
                        .is_some_and(|r| r.state == RecordState::Done)
                        && s.keys
                            .iter()
                            .any(|k| matches!(k.stored, Stored::Declined(_)))
                        && paid_under("#2")
                },
            ),
            Property::sometimes(
                "reached: a declined payment confirmed by someone else, completed with it",
                |_: &ChargeModel, s: &State| {
                    s.confirms == 0
                        && s.table.as_ref().is_some_and(|r| {
                            r.state == RecordState::Done
                                && r.receipt
                                    .as_deref()
                                    .and_then(receipt_index)
                                    .is_some_and(|i| {
                                        s.charges.get(i).is_some_and(|c| c.1 == Status::Succeeded)
                                    })
                                && !s.keys.iter().any(|k| k.key.ends_with("#2"))
                                && s.keys
                                    .iter()
                                    .any(|k| matches!(k.stored, Stored::Declined(_)))
                        })
                },
            ),
            Property::sometimes(
                "reached: a payment that needed authentication, confirmed by the customer, completed",
                |_: &ChargeModel, s: &State| {
                    s.table.as_ref().is_some_and(|r| {
                        r.state == RecordState::Done
                            && r.receipt
                                .as_deref()
                                .and_then(receipt_index)
                                .is_some_and(|i| {
                                    s.keys.iter().any(
                                        |k| matches!(k.stored, Stored::AuthRequired(j) if j == i),
                                    )
                                })
                    })
                },
            ),
            Property::sometimes(
                "reached: an order awaiting its customer, its message acknowledged",
                |_: &ChargeModel, s: &State| {
                    s.awaits()
                        && s.msgs
                            .iter()
                            .any(|m| m.state == MsgState::Acked("authentication_required"))
                },
            ),
            Property::sometimes(
                "reached: a wait settled by its payment's event",
                |_: &ChargeModel, s: &State| s.settled & BY_EVENT != 0,
            ),
            Property::sometimes(
                "reached: a wait settled by the settler's lookup",
                |_: &ChargeModel, s: &State| s.settled & BY_SETTLER != 0,
            ),
            Property::sometimes(
                "reached: a wait past its end, its payment cancelled by the settler and the order ended",
                |_: &ChargeModel, s: &State| s.settled & EXPIRED != 0,
            ),
            Property::sometimes(
                "reached: a confirmation after the wait's end: the settler's cancel refused, the order completed",
                |_: &ChargeModel, s: &State| s.settled & CONFIRMED_LATE != 0,
            ),
            Property::sometimes(
                "reached: a stored 5xx's payment appeared later and completed the record under its key",
                |_: &ChargeModel, s: &State| {
                    s.table.as_ref().is_some_and(|r| {
                        r.state == RecordState::Done
                            && r.receipt
                                .as_deref()
                                .and_then(receipt_index)
                                .is_some_and(|i| {
                                    s.keys.iter().any(
                                        |k| matches!(k.stored, Stored::ServerError(j) if j == i),
                                    )
                                })
                    })
                },
            ),
            Property::sometimes(
                "reached: a conflicting payload refused",
                |_: &ChargeModel, s: &State| {
                    s.msgs.iter().any(|m| {
                        m.state == MsgState::Dlq("conflict")
                            || m.state == MsgState::Acked("conflict")
                    })
                },
            ),
            Property::sometimes(
                "reached: a corrected copy charged once the order ended without a payment",
                |m: &ChargeModel, s: &State| {
                    s.table.as_ref().is_some_and(|r| {
                        r.state == RecordState::Done
                            && r.fingerprint.as_ref() == Some(&m.other.fingerprint)
                    })
                },
            ),
            Property::sometimes(
                "reached: a poison message dead-lettered on its first delivery",
                |_: &ChargeModel, s: &State| {
                    s.msgs.iter().any(|m| {
                        m.copies > 0 && m.receives == 1 && matches!(m.state, MsgState::Acked(_))
                    })
                },
            ),
        ]
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = match &self.table {
            None => "absent".to_owned(),
            Some(r) => format!(
                "{} intento={} recibo={} titular={} hasta={} rechazos={}{}",
                charge_once::contracts::schema::state_value(&r.state),
                r.attempt.map_or("-".into(), |i| i.to_string()),
                r.receipt.as_deref().unwrap_or("-"),
                r.owner.as_deref().unwrap_or("-"),
                r.lease_until
                    .map_or("-".into(), |h| (h.as_ms() / TICK_MS).to_string()),
                r.refusals.map_or("-".into(), |n| n.to_string()),
                match (&r.awaited, r.wait_until) {
                    (Some(p), Some(w)) => {
                        format!(" pago={p} espera_hasta={}", w.as_ms() / TICK_MS)
                    }
                    _ => String::new(),
                },
            ),
        };
        let charges: Vec<String> = self
            .charges
            .iter()
            .enumerate()
            .map(|(i, (p, s))| format!("ch{i}:{p:?}:{s:?}"))
            .chain(
                self.cancelling
                    .as_ref()
                    .map(|m| format!("(settler cancels {})", m.payment_id())),
            )
            .collect();
        let msgs: Vec<String> = self
            .msgs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let copies = if m.copies > 0 {
                    format!("+{}inDLQ", m.copies)
                } else {
                    String::new()
                };
                format!("m{i}:{:?}{copies}", m.state)
            })
            .collect();
        write!(
            f,
            "t={} msgs[{}] table[{table}] charges[{}] keys[{}]",
            self.now,
            msgs.join(" "),
            charges.join(" "),
            self.keys
                .iter()
                .map(|k| k.key.trim_start_matches("cobro#o"))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }
}

fn parse_args() -> Result<(Option<String>, Params), String> {
    let mut mutant_name = None;
    let mut depth = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--mutant" => mutant_name = args.next().filter(|m| !m.is_empty()),
            "--depth" => {
                depth = Some(
                    args.next()
                        .and_then(|d| d.parse().ok())
                        .ok_or("--depth takes a number")?,
                );
            }
            "--list" => {
                for (name, what) in MUTANTS {
                    println!("{name:26} {what}");
                }
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --list)")),
        }
    }
    let mut params = match &mutant_name {
        None => Params::default_run(),
        Some(name) => mutant(name).ok_or_else(|| {
            format!(
                "no mutant {name:?}; the mutants: {}",
                MUTANTS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
    };
    if let Some(depth) = depth {
        params.depth = depth;
    }
    Ok((mutant_name, params))
}

/// The provider's stored answer to a key sent again: the same answer, or a refusal of
/// the key for another payload.
fn replay(entry: &KeyEntry, payload: Payload) -> Result<Receipt, NoAnswer<PaymentError>> {
    if entry.payload != payload {
        return Err(NoAnswer::Failed(PaymentError::KeyReused));
    }
    match entry.stored {
        Stored::Charged(i) => Ok(Receipt::new(format!("ch{i}"))),
        Stored::ChargedPending(i) => Err(NoAnswer::Failed(PaymentError::Pending {
            payment_id: format!("ch{i}"),
            status: "pending".to_owned(),
        })),
        Stored::Declined(i) => Err(NoAnswer::Failed(declined(i))),
        Stored::AuthRequired(i) => Err(NoAnswer::Failed(authentication_required(i))),
        Stored::ServerError(_) => Err(NoAnswer::Failed(PaymentError::ReplayedServerError {
            status: 500,
        })),
    }
}

/// The environments a consumer's next step may meet: the faults left, the deadline,
/// and whether its charge's key is known.
fn envs(s: &State, consumer: &Consumer, keyed: bool) -> Vec<Env> {
    let faulty = s.faults > 0;
    let live = s.now <= consumer.deadline;
    let mut envs = vec![Env::Normal];
    match &consumer.step {
        // The dead letter's send fails, or succeeds with its ack lost.
        Step::Done(_) if consumer.dead_lettering && faulty => {
            envs.extend([Env::StoreError, Env::AnswerLost]);
        }
        Step::Write(_) if faulty => {
            envs.extend([Env::SdkRetry, Env::AnswerLost, Env::StoreError]);
        }
        Step::Charge { key } if live => {
            let known = keyed && s.key_entry(key).is_some();
            if !known {
                envs.push(Env::Decline);
                if s.confirms > 0 {
                    envs.push(Env::AuthRequired);
                }
                if faulty {
                    envs.extend([
                        Env::ChargedAnswerLost,
                        Env::PendingAnswerLost,
                        Env::StoredServerError,
                    ]);
                }
            }
            if faulty {
                envs.push(Env::Timeout);
            }
        }
        Step::Lookup | Step::Cancel { .. } if live && faulty => envs.push(Env::Timeout),
        _ => {}
    }
    envs
}

fn main() -> ExitCode {
    let (mutant_name, params) = match parse_args() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("model: {e}");
            return ExitCode::from(2);
        }
    };
    match &mutant_name {
        None => println!("model: every rule on; {params:?}"),
        Some(name) => {
            let what = MUTANTS.iter().find(|(n, _)| n == name).map_or("", |m| m.1);
            println!("model: mutant {name}: {what}; {params:?}");
        }
    }
    let checker = check(
        ChargeModel::new(params),
        mutant_name.is_some(),
        params.depth,
    );
    let (safety_broken, vacuous) = verdicts(&checker);
    match (mutant_name.is_some(), safety_broken, vacuous) {
        (false, false, false) => {
            println!("model: every property holds and every behaviour is reached");
            ExitCode::SUCCESS
        }
        (false, _, _) => {
            println!("model: FAILED");
            ExitCode::FAILURE
        }
        (true, true, _) => {
            println!("model: the mutant broke the guarantee: the rule is needed");
            ExitCode::FAILURE
        }
        (true, false, _) => {
            println!("model: no counterexample for this mutant");
            ExitCode::SUCCESS
        }
    }
}

/// Runs the checker: breadth first, bounded at `depth` (0: exhaustive); a mutant's run
/// on one thread (the shortest trace) and only to its first counterexample.
fn check(model: ChargeModel, mutant: bool, depth: usize) -> impl Checker<ChargeModel> {
    let started = Instant::now();
    let threads = if mutant { 1 } else { 2 };
    let mut builder = model.checker().threads(threads);
    if depth > 0 {
        builder = builder.target_max_depth(depth);
    }
    if mutant {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "model: {} states ({} unique), depth {}{}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        if depth > 0 {
            " (bounded: every path up to this many steps; progress is judged on paths that end within it)"
        } else {
            " (exhaustive)"
        },
        started.elapsed().as_secs_f64()
    );
    checker
}

/// Prints each property's verdict (and a broken one's trace); whether a safety
/// property broke, and whether a behaviour was never reached.
fn verdicts(checker: &impl Checker<ChargeModel>) -> (bool, bool) {
    let mut safety_broken = false;
    let mut vacuous = false;
    for property in checker.model().properties() {
        let found = checker.discovery(property.name);
        let sometimes = property.name.starts_with("reached:");
        let verdict = match (&found, sometimes) {
            (None, false) => "holds",
            (Some(_), true) => "reached",
            (None, true) => {
                vacuous = true;
                "NOT REACHED"
            }
            (Some(_), false) => {
                safety_broken = true;
                "VIOLATED"
            }
        };
        println!("  {verdict:11} {}", property.name);
        if let (Some(path), false) = (found, sometimes) {
            print_trace(property.name, path);
        }
    }
    (safety_broken, vacuous)
}

fn print_trace(name: &str, path: stateright::Path<State, Action>) {
    let states = path.clone().into_states();
    let actions = path.into_actions();
    println!(
        "counterexample to \"{name}\" ({} steps, the shortest):",
        actions.len()
    );
    println!("    0. {}", states[0]);
    for (i, (action, state)) in actions.iter().zip(states.iter().skip(1)).enumerate() {
        // Consumers are numbered by their place in the list; name the one acting.
        let who = match action {
            Action::Step(c, _) | Action::Crash(c) => states[i]
                .consumers
                .get(*c)
                .map(|c| format!(" by {} ({:?})", c.name, c.step))
                .unwrap_or_default(),
            _ => String::new(),
        };
        println!("   {:>2}. {action:?}{who}\n       -> {state}", i + 1);
    }
}
