//! A refund record's CPU beside a charge's (`make bench BENCH_ONLY=refunds`): the same
//! release binary as the consumer (charges) and as the refund function
//! (`CHARGE_ONCE_FUNCTION=refund`: the library's consumer with a refund as its effect),
//! each in its own process under its own Runtime API, on one table on dynalite behind
//! the rig's 5 ms proxy, paying and refunding at a stub that answers after 50 ms. Each
//! round charges batches of fresh orders, then refunds each of them, the two processes
//! taking turns batch by batch; a record's CPU is its process's scheduled time over the
//! round's records. A warm-up round is not counted.
//!
//! It asserts that every order was charged and every refund made (no item failure); it
//! asserts nothing about speed.

use std::time::Duration;

use harness::runtime_api::RuntimeApi;
use harness::servers::Backend;
use serde_json::{Value, json};

use crate::rig::{Contender, Lane, Rig, event, event_of, payment_stub};
use crate::statistics::{fmt_spread, median, spread};

const STORE_MS: u64 = 5;
const PAYMENT_MS: u64 = 50;
const BATCH: usize = 10;

pub struct Refunds {
    rounds: usize,
    records: usize,
    /// CPU ms per record of each counted round.
    charge: Vec<f64>,
    refund: Vec<f64>,
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The refund requests of `orders`: half of each (the bench's orders are 1000).
fn refunds_of(orders: &[String]) -> String {
    let bodies: Vec<String> = orders
        .iter()
        .map(|order| {
            json!({"id": format!("ref-{order}"), "order_id": order, "amount": 500,
                   "reason": "requested_by_customer"})
            .to_string()
        })
        .collect();
    event_of(&bodies)
}

impl Refunds {
    pub async fn run(rounds: usize, records: usize) -> Self {
        let payment = payment_stub(Duration::from_millis(PAYMENT_MS)).await;
        let rig = Rig::new(Backend::Dynalite, Duration::from_millis(STORE_MS)).await;
        let log = |name: &str| harness::log_dir().join(format!("bench-refunds-{name}.log"));
        let charges = Lane::spawn_logged(
            Contender::ChargeOnce,
            Contender::ChargeOnce.command(),
            &rig,
            &payment,
            RuntimeApi::start().await,
            log("charges"),
        );
        let refunds = Lane::spawn_with_env(
            Contender::ChargeOnce,
            Contender::ChargeOnce.command(),
            &rig,
            &payment,
            RuntimeApi::start().await,
            log("refunds"),
            &[("CHARGE_ONCE_FUNCTION", "refund".to_owned())],
        );
        let batches = records.div_ceil(BATCH);
        let (mut charge, mut refund) = (Vec::new(), Vec::new());
        for round in 0..=rounds {
            let (mut charge_ms, mut refund_ms) = (0.0, 0.0);
            for b in 0..batches {
                let orders = ids(&format!("co-refunds-r{round}-b{b}"), BATCH);
                let before = charges.cpu();
                let (_, failures) = charges.invoke(event(&orders)).await;
                charge_ms += charges.cpu().since(&before);
                assert_eq!(failures, 0, "charges failed; see {}", charges.log.display());
                let before = refunds.cpu();
                let (_, failures) = refunds.invoke(refunds_of(&orders)).await;
                refund_ms += refunds.cpu().since(&before);
                assert_eq!(failures, 0, "refunds failed; see {}", refunds.log.display());
            }
            if round > 0 {
                let n = (batches * BATCH) as f64;
                charge.push(charge_ms / n);
                refund.push(refund_ms / n);
            }
        }
        Self {
            rounds,
            records,
            charge,
            refund,
        }
    }

    pub fn markdown(&self) -> String {
        let ratio = median(&self.refund) / median(&self.charge);
        format!(
            "## A refund beside a charge\n\n\
             The release binary as the consumer and as the refund function, each in its own \
             process: {} rounds of {} orders charged, then each refunded (half of it), after a \
             warm-up round; batch {BATCH}, store {STORE_MS} ms, payment and refund {PAYMENT_MS} ms. \
             CPU ms per record, median [range].\n\n\
             | record | CPU ms per record |\n| --- | --- |\n\
             | a charge (the consumer) | {} |\n\
             | a refund (the refund function) | {} |\n\n\
             A refund record costs {ratio:.2}× a charge's in this run: beside the reserve, the \
             provider call and the complete that both make, it reads its order's record \
             (`GetItem`), and it runs on the library's consumer (records one after another) \
             rather than charge-once's batch.\n",
            self.rounds,
            self.records,
            fmt_spread(&self.charge, 3),
            fmt_spread(&self.refund, 3),
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "rounds": self.rounds,
            "records": self.records,
            "batch": BATCH,
            "store_ms": STORE_MS,
            "payment_ms": PAYMENT_MS,
            "cpu_ms_per_record": {
                "charge": spread(&self.charge),
                "refund": spread(&self.refund),
            },
            "refund_to_charge": median(&self.refund) / median(&self.charge),
        })
    }
}
