//! The reach of the scheduled function (docs/performance.md, "The settler and the
//! audit"): how many waits one settler run settles, and how many orders a day the
//! audit's one run can hold, each measured on the real parts (the library's own
//! `Settler` and `audit` against moto and localstripe behind its layer) and scaled to
//! the template's function timeout, beside what a shop of one million orders a day
//! needs.
//!
//! Method. `waits` PaymentIntents of one customer are made in localstripe's store
//! (`requires_payment_method`, created now) and as many records await them in a fresh
//! table, each wait ending in a week: a settler run then fetches every one and leaves
//! it waiting, which is the whole of a run's work but the rare write. The run is timed
//! round the index; its rate, times what the function's timeout leaves a run, is the
//! waits one run reaches. The records are then made done (each with its PaymentIntent
//! as receipt) and the audit run over a window holding those payments: it lists them
//! (pages of 100) and reads each one's record by key, the per-order work of a day's
//! audit; its rate, times the function's timeout, is the orders one run can
//! hold. The measured rates are this machine's against local stand-ins; Stripe's own
//! read limit (100 a second in live mode) caps the settler's, and the figure says
//! which bound holds.

use charge_once::domain::OrderKey;
use std::time::{Duration, Instant};

use charge_once::adapters::payment_http::HttpProvider;
use charge_once::config::Secret;
use charge_once::contracts::payment::PaymentListing as _;
use charge_once::contracts::queue::Unreported;
use charge_once::contracts::schema;
use charge_once::contracts::store::IdempotencyStore as _;
use charge_once::domain::clock::{Time, wall_ms};
use charge_once::domain::{Fingerprint, Key, Record, State};
use charge_once::drivers::audit::{Window, audit};
use charge_once::drivers::settle::Settler;
use futures::StreamExt as _;
use harness::localstripe::{self, Card};
use harness::servers::{Backend, localstripe_url};
use serde_json::{Value, json};

/// The template's `AuditFunction` timeout: the one function runs the audit and the
/// settler.
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(900);
/// What a settler run leaves of it (`audit_lambda.rs`: the margin, and five calls of
/// the template's `PAYMENT_TIMEOUT` for the last record).
const SETTLE_RESERVE: Duration = Duration::from_secs(10 + 5 * 10);
/// The settler's schedule in the template: a run every 15 minutes.
const RUNS_A_DAY: f64 = 96.0;
/// Stripe's live-mode limit on all requests, per second: the settler's fetches cannot
/// go faster whatever the machine.
const STRIPE_READS_PER_S: f64 = 100.0;
/// The shop the figures are set beside: a million orders a day, 2 % of which await
/// their customer (the bill's assumed share, `BENCH_AWAITING_SHARE`) for the
/// template's default week.
const SHOP_ORDERS_A_DAY: f64 = 1_000_000.0;
const SHOP_AWAITING_SHARE: f64 = 0.02;
const SHOP_WAIT_DAYS: f64 = 7.0;

/// What the run measured.
pub struct Reach {
    pub waits: usize,
    pub settle_elapsed: Duration,
    pub settled_read: usize,
    pub audit_elapsed: Duration,
    pub audited: usize,
    /// The audit's two parts on their own: the provider's listing of the window's
    /// payments, and the table's reads of their records (32 at a time, as the audit).
    pub listing_elapsed: Duration,
    pub reads_elapsed: Duration,
}

impl Reach {
    pub async fn run(waits: usize) -> Self {
        let table = Backend::Moto.fresh_table().await;
        let payer = localstripe::payer(Card::Visa).await;
        let now = Time::from_ms(wall_ms());
        localstripe::seed_payment_intents(&payer.customer, waits, now.as_secs()).await;
        let intents = localstripe::payment_intents_of(&payer.customer).await;
        assert_eq!(intents.len(), waits, "every seeded PaymentIntent listed");
        let week = Duration::from_secs(7 * 24 * 3600);
        for intent in &intents {
            let order_id = intent["metadata"]["order_id"].as_str().expect("its order");
            let record = Record {
                fingerprint: Some(Fingerprint::new("bench")),
                attempt: Some(1),
                created: Some(now),
                awaited: Some(intent["id"].as_str().expect("its id").to_owned()),
                wait_until: Some(Time::from_secs((now + week).as_secs())),
                expires: Some(Time::from_secs((now + week * 20).as_secs())),
                ..Record::new(Key::for_order_id(order_id), State::Awaiting)
            };
            table.put_item(schema::attributes(&record)).await;
        }
        let provider = HttpProvider::new(
            localstripe_url(),
            &Secret::new(localstripe::TEST_KEY.to_owned()),
            Duration::from_secs(10),
            &harness::tls(),
        )
        .expect("the provider");
        let settings = harness::rig::settler_settings(
            charge_once::domain::clock::system(),
            week * 20,
            Duration::from_secs(10),
        );
        let settler = Settler {
            store: table.store.as_ref(),
            provider: &provider,
            refunds: None,
            reports: &Unreported,
            settings: &settings,
            // The scheduled function's own timeout (the template's `AuditFunction`).
            time: Duration::from_secs(900),
            limit: 100,
            per_run: usize::MAX,
        };
        let started = Instant::now();
        let run = settler.run().await.expect("the settler's run");
        let settle_elapsed = started.elapsed();
        assert_eq!(
            (run.read, run.waiting, run.unread),
            (waits, waits, false),
            "every wait fetched and left waiting: {run:?}"
        );
        // A day's orders are done: the audit reads each one's record by key.
        for intent in &intents {
            let order_id = intent["metadata"]["order_id"].as_str().expect("its order");
            let record = Record {
                fingerprint: Some(Fingerprint::new("bench")),
                created: Some(now),
                receipt: Some(intent["id"].as_str().expect("its id").to_owned()),
                expires: Some(Time::from_secs((now + week * 20).as_secs())),
                ..Record::new(Key::for_order_id(order_id), State::Done)
            };
            table.put_item(schema::attributes(&record)).await;
        }
        let window = Window {
            now: Time::from_ms(wall_ms()),
            since: now - Duration::from_secs(3600),
            stuck_after: Duration::from_secs(3600),
        };
        let started = Instant::now();
        let report = audit(table.store.as_ref(), &provider, None, window)
            .await
            .expect("the audit's run");
        let audit_elapsed = started.elapsed();
        let audited = report.payments;
        assert!(audited >= waits, "the audit read {audited} of {waits}");
        let started = Instant::now();
        let listed = provider
            .payments_since(now - Duration::from_secs(3600))
            .await;
        let listing_elapsed = started.elapsed();
        assert!(listed.expect("the listing").len() >= waits);
        let started = Instant::now();
        let reads = intents.iter().map(|intent| {
            let key = Key::for_order_id(intent["metadata"]["order_id"].as_str().unwrap());
            let store = table.store.clone();
            async move { store.get(&key).await.expect("a read") }
        });
        let read: Vec<_> = futures::stream::iter(reads)
            .buffer_unordered(32)
            .collect()
            .await;
        let reads_elapsed = started.elapsed();
        assert!(read.iter().all(Option::is_some));
        Self {
            waits,
            settle_elapsed,
            settled_read: run.read,
            audit_elapsed,
            audited,
            listing_elapsed,
            reads_elapsed,
        }
    }

    fn settle_rate(&self) -> f64 {
        self.settled_read as f64 / self.settle_elapsed.as_secs_f64()
    }

    fn audit_rate(&self) -> f64 {
        self.audited as f64 / self.audit_elapsed.as_secs_f64()
    }

    /// Waits one run reaches: the measured rate, or Stripe's read limit if lower, for
    /// what the function's timeout leaves a run.
    fn waits_per_run(&self) -> f64 {
        self.settle_rate().min(STRIPE_READS_PER_S)
            * (FUNCTION_TIMEOUT - SETTLE_RESERVE).as_secs_f64()
    }

    /// Orders a day the audit's one daily run can hold.
    fn audit_orders_a_day(&self) -> f64 {
        self.audit_rate() * FUNCTION_TIMEOUT.as_secs_f64()
    }

    /// Orders a second of each of the audit's parts.
    fn listing_rate(&self) -> f64 {
        self.audited as f64 / self.listing_elapsed.as_secs_f64()
    }

    fn reads_rate(&self) -> f64 {
        self.waits as f64 / self.reads_elapsed.as_secs_f64()
    }

    /// The shop's open waits at any time, and the runs it takes to go round them.
    fn shop(&self) -> (f64, f64) {
        let open = SHOP_ORDERS_A_DAY * SHOP_AWAITING_SHARE * SHOP_WAIT_DAYS;
        (open, open / self.waits_per_run())
    }

    pub fn json(&self) -> Value {
        let (open, runs) = self.shop();
        json!({
            "waits": self.waits,
            "settle_s": self.settle_elapsed.as_secs_f64(),
            "settle_per_s": self.settle_rate(),
            "waits_per_run": self.waits_per_run(),
            "waits_per_day": self.waits_per_run() * RUNS_A_DAY,
            "audit_s": self.audit_elapsed.as_secs_f64(),
            "audit_orders_per_s": self.audit_rate(),
            "audit_orders_per_day": self.audit_orders_a_day(),
            "audit_listing_s": self.listing_elapsed.as_secs_f64(),
            "audit_listing_per_s": self.listing_rate(),
            "audit_reads_s": self.reads_elapsed.as_secs_f64(),
            "audit_reads_per_s": self.reads_rate(),
            "shop": {
                "orders_per_day": SHOP_ORDERS_A_DAY,
                "awaiting_share": SHOP_AWAITING_SHARE,
                "wait_days": SHOP_WAIT_DAYS,
                "open_waits": open,
                "runs_to_go_round": runs,
            },
        })
    }

    pub fn markdown(&self) -> String {
        let (open, runs) = self.shop();
        let bound = if self.settle_rate() > STRIPE_READS_PER_S {
            "Stripe's read limit"
        } else {
            "this machine's measured rate"
        };
        format!(
            "## The settler and the audit\n\n\
             {waits} waits in moto, their PaymentIntents in localstripe; the library's \
             `Settler` and `audit`, in this process.\n\n\
             | | measured | per second | one run ({timeout} s) | a day |\n\
             | --- | --- | --- | --- | --- |\n\
             | settler: waits fetched and judged | {waits} in {settle:.1} s | {srate:.0} | \
             {per_run:.0} (bound: {bound}) | {per_day:.0} ({runs_a_day:.0} runs) |\n\
             | audit: orders listed and read by key | {audited} in {audit:.1} s | {arate:.0} | \
             {aday:.0} | {aday:.0} (one run) |\n\
             | its listing alone (localstripe, pages of 100) | {audited} in {list:.1} s | {lrate:.0} | | |\n\
             | its reads alone (moto, 32 at a time) | {waits} in {reads:.1} s | {rrate:.0} | | |\n\n\
             A shop of {orders:.0} orders a day with {share:.0} % awaiting for {days:.0} days \
             holds {open:.0} open waits: the settler goes round them in {runs:.1} runs \
             ({hours:.1} h at one run every 15 minutes); the audit's one run holds \
             {ratio:.1}× its day.\n",
            waits = self.waits,
            timeout = FUNCTION_TIMEOUT.as_secs(),
            settle = self.settle_elapsed.as_secs_f64(),
            srate = self.settle_rate(),
            per_run = self.waits_per_run(),
            per_day = self.waits_per_run() * RUNS_A_DAY,
            runs_a_day = RUNS_A_DAY,
            audited = self.audited,
            audit = self.audit_elapsed.as_secs_f64(),
            arate = self.audit_rate(),
            aday = self.audit_orders_a_day(),
            orders = SHOP_ORDERS_A_DAY,
            share = SHOP_AWAITING_SHARE * 100.0,
            days = SHOP_WAIT_DAYS,
            hours = runs * 0.25,
            ratio = self.audit_orders_a_day() / SHOP_ORDERS_A_DAY,
            list = self.listing_elapsed.as_secs_f64(),
            lrate = self.listing_rate(),
            reads = self.reads_elapsed.as_secs_f64(),
            rrate = self.reads_rate(),
        )
    }
}
