//! Refunds beside the charges: the refund function (the same binary, on its own queue
//! and DLQ, through the same fault proxies and kills) refunds requests for the run's
//! orders, each sent twice (raw and in an SNS envelope). Some are sent before any
//! order is, so that their order cannot be charged yet when they first come:
//! they wait and are refunded once it is. Some orders get two requests that together
//! ask for more than the order: one is refunded, the other refused. Some declined
//! orders get one: refused, the order ended unpaid. Then the figures, from Stripe's
//! refunds (matched by `metadata[refund_id]`): every request refunded once or refused
//! with its reason, none twice, no order refunded above its charge.

use super::*;

/// What the run asks of the refund function.
#[derive(Default)]
pub(super) struct RefundPlan {
    /// Refund id → (order id, amount asked: `None` for the rest of the order).
    pub requests: BTreeMap<String, (String, Option<u64>)>,
    /// Sent before any order: their order is not charged when they first come.
    pub early: BTreeSet<String>,
    /// Two requests of one order that together ask for more than it: one is refused.
    pub pairs: Vec<(String, String)>,
    /// Requests of declined orders: refused, the order ended unpaid.
    pub unpaid: BTreeSet<String>,
    /// The bodies sent first, and after the orders drained (each request twice).
    pub early_messages: Vec<String>,
    pub late_messages: Vec<String>,
}

fn amount_of(body: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(body).unwrap()["amount"]
        .as_u64()
        .unwrap()
}

impl RefundPlan {
    /// Refunds for about a third of the orders that must be charged, and for the first
    /// three declined ones.
    pub(super) fn of(plan: &Plan) -> Self {
        let mut refunds = Self::default();
        for (n, (order, body)) in plan.must_charge.iter().enumerate() {
            let amount = amount_of(body);
            match n % 6 {
                0 => {
                    refunds.add(order, Some(amount / 2), n % 12 == 0);
                }
                2 => {
                    refunds.add(order, None, n % 4 == 0);
                }
                4 => {
                    // 60 % twice: together above the order.
                    let first = refunds.add(order, Some(amount * 6 / 10), n % 5 == 0);
                    let second = refunds.add(order, Some(amount * 6 / 10), false);
                    refunds.pairs.push((first, second));
                }
                _ => {}
            }
        }
        for order in plan.declined.iter().take(3) {
            let id = refunds.add(order, None, false);
            refunds.unpaid.insert(id);
        }
        refunds
    }

    /// A request for `order`, sent early or late; its id.
    fn add(&mut self, order: &str, amount: Option<u64>, early: bool) -> String {
        let id = format!("ref-{}", uuid::Uuid::new_v4().simple());
        let mut body = serde_json::json!({"id": id, "order_id": order,
            "reason": "requested_by_customer"});
        if let Some(amount) = amount {
            body["amount"] = amount.into();
        }
        let body = body.to_string();
        let copies = [
            body.clone(),
            serde_json::json!({"Type": "Notification", "Message": body}).to_string(),
        ];
        if early {
            self.early.insert(id.clone());
            self.early_messages.extend(copies);
        } else {
            self.late_messages.extend(copies);
        }
        self.requests.insert(id.clone(), (order.to_owned(), amount));
        id
    }
}

/// What the refund function did.
pub(super) struct RefundRun {
    pub plan: RefundPlan,
    /// Refund id → Stripe's refunds made for it (amount, id).
    pub made: BTreeMap<String, Vec<(u64, String)>>,
    /// Order id → (charged, refunded in all).
    pub totals: BTreeMap<String, (u64, u64)>,
    pub dlq: Vec<DlqMessage>,
    pub stats: Arc<EsmStats>,
    pub kills: u64,
}

/// Stripe's refunds of the run's orders, by refund id, and each order's totals.
pub(super) async fn refunds_made(
    charges: &BTreeMap<String, Vec<(u64, String)>>,
    plan: &RefundPlan,
) -> (
    BTreeMap<String, Vec<(u64, String)>>,
    BTreeMap<String, (u64, u64)>,
) {
    let orders: BTreeSet<&String> = plan.requests.values().map(|(order, _)| order).collect();
    let mut made: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut totals = BTreeMap::new();
    for order in orders {
        for (charged, payment) in charges.get(order).into_iter().flatten() {
            let mut refunded = 0;
            for refund in localstripe::refunds_of(payment).await {
                let amount = refund["amount"].as_u64().unwrap();
                refunded += amount;
                let id = refund["metadata"]["refund_id"].as_str().unwrap_or_default();
                made.entry(id.to_owned())
                    .or_default()
                    .push((amount, refund["id"].as_str().unwrap().to_owned()));
            }
            totals.insert(payment.clone(), (*charged, refunded));
        }
    }
    (made, totals)
}

impl RefundRun {
    fn refunded(&self) -> usize {
        self.made.values().filter(|m| m.len() == 1).count()
    }

    fn double(&self) -> usize {
        self.made.values().filter(|m| m.len() > 1).count()
    }

    fn refused(&self) -> BTreeSet<String> {
        self.dlq
            .iter()
            .filter_map(|m| {
                let body: serde_json::Value = serde_json::from_str(&m.body).ok()?;
                let body = match body["Message"].as_str() {
                    Some(inner) => serde_json::from_str(inner).ok()?,
                    None => body,
                };
                body["id"].as_str().map(str::to_owned)
            })
            .collect()
    }

    /// Requests neither refunded nor refused.
    fn lost(&self) -> usize {
        let refused = self.refused();
        self.plan
            .requests
            .keys()
            .filter(|id| !self.made.contains_key(*id) && !refused.contains(*id))
            .count()
    }

    fn over_refunded(&self) -> usize {
        self.totals
            .values()
            .filter(|(charged, refunded)| refunded > charged)
            .count()
    }

    fn early_refunded(&self) -> usize {
        self.plan
            .early
            .iter()
            .filter(|id| self.made.get(*id).is_some_and(|m| m.len() == 1))
            .count()
    }

    pub(super) fn line(&self) -> String {
        format!(
            "refunds={} early={} refunded={} early_refunded={} refused={} double={} lost={} over_refunded={} refund_deliveries={} refund_kills={}",
            self.plan.requests.len(),
            self.plan.early.len(),
            self.refunded(),
            self.early_refunded(),
            self.refused().len(),
            self.double(),
            self.lost(),
            self.over_refunded(),
            self.stats.deliveries.load(Ordering::Relaxed),
            self.kills,
        )
    }

    /// Every request refunded once with what it asked, or refused with its reason:
    /// one of each pair, every declined order's; none twice, none lost, no order
    /// refunded above its charge, every early one refunded (or the refused one of its
    /// pair).
    pub(super) fn check(&self) {
        assert_eq!(
            (self.double(), self.lost(), self.over_refunded()),
            (0, 0, 0),
            "{}",
            self.line()
        );
        let refused = self.refused();
        for m in &self.dlq {
            assert_eq!(m.note_str("outcome"), Some("refused"), "{m:?}");
        }
        for (first, second) in &self.plan.pairs {
            let made = [first, second].map(|id| self.made.contains_key(id));
            assert_eq!(
                made.iter().filter(|m| **m).count(),
                1,
                "one of {first} and {second} refunded: {}",
                self.line()
            );
            assert!(refused.contains(first) != refused.contains(second));
        }
        for id in &self.plan.unpaid {
            assert!(!self.made.contains_key(id), "{id} of a declined order");
            let note = self
                .dlq
                .iter()
                .find(|m| m.body.contains(id.as_str()))
                .and_then(|m| m.note_str("reason"))
                .unwrap_or_else(|| panic!("{id} not refused"));
            assert!(note.contains("ended without payment"), "{note}");
        }
        let in_pairs: BTreeSet<&String> =
            self.plan.pairs.iter().flat_map(|(a, b)| [a, b]).collect();
        for (id, (_, asked)) in &self.plan.requests {
            if self.plan.unpaid.contains(id) || in_pairs.contains(id) {
                continue;
            }
            let made = self
                .made
                .get(id)
                .unwrap_or_else(|| panic!("{id} never refunded"));
            if let Some(asked) = asked {
                assert_eq!(made[0].0, *asked, "{id}");
            }
        }
    }
}

/// Each refund's own queue visibility: how long a refund whose order is not charged
/// yet waits before it comes again.
const REFUND_VISIBILITY: Duration = Duration::from_secs(3);
/// Receives before the refunds' redrive policy: 150 at 3 s outlast the orders' drain.
const REFUND_RECEIVES: u32 = 150;
/// The refund function's environments.
const REFUND_CONSUMERS: usize = 2;

/// The refund function at work during a run.
pub(super) struct Refunding {
    plan: RefundPlan,
    queues: Arc<Queues>,
    endpoints: Arc<Endpoints>,
    environments: Environments,
    kills: Arc<AtomicU64>,
}

impl Refunding {
    /// Starts the refund function on its own queue through the run's proxies
    /// (`proxies`: DynamoDB's, the provider's), and sends the early requests.
    pub(super) async fn start(
        scenario: &Scenario,
        run_id: &str,
        plan: &Plan,
        (dynamodb, payment): (String, String),
        table: &Table,
    ) -> Self {
        let plan = RefundPlan::of(plan);
        let queues = Arc::new(Queues::create(REFUND_VISIBILITY, REFUND_RECEIVES).await);
        let endpoints = Arc::new(queues.endpoints(dynamodb, payment, table.name.clone()));
        let env = [
            scenario.env.clone(),
            vec![("CHARGE_ONCE_FUNCTION", "refund".to_owned())],
        ]
        .concat();
        let environments = Environments::start(
            REFUND_CONSUMERS,
            env,
            &format!("{run_id}-refunds"),
            &queues,
            &endpoints,
        )
        .await;
        queues.send(&plan.early_messages).await;
        Self {
            plan,
            queues,
            endpoints,
            environments,
            kills: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Kills a refund process now and then, while `on`.
    pub(super) fn chaos(&self, on: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        self.environments
            .chaos(self.endpoints.clone(), on, self.kills.clone())
    }

    /// The requests sent once the orders drained.
    pub(super) async fn send_late(&self) {
        self.queues.send(&self.plan.late_messages).await;
    }

    /// Drains the refunds queue, stops the function, and reads what it did.
    pub(super) async fn finish(
        self,
        charges: &BTreeMap<String, Vec<(u64, String)>>,
        limit: Duration,
    ) -> RefundRun {
        assert!(
            drain(&self.queues, limit).await,
            "the refunds queue did not drain within {limit:?}"
        );
        let stats = self.environments.stop().await;
        let dlq = self.queues.drain_dlq().await;
        let (made, totals) = refunds_made(charges, &self.plan).await;
        RefundRun {
            plan: self.plan,
            made,
            totals,
            dlq,
            stats,
            kills: self.kills.load(Ordering::Relaxed),
        }
    }
}
