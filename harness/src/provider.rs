//! An in-process payment provider that behaves like a real one: it stores the outcome
//! of every idempotency key and replays it, refuses a key reused with other
//! parameters, records every call, and can be told to fail in each way of ARCHITECTURE.md, "The state machine".

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use charge_once::contracts::payment::{
    Cancel, ChargePath, Confirmation, FailureKind, ListedPayment, Lookup, PaymentError,
    PaymentListing, Receipt,
};
use charge_once::domain::clock::Time;
use charge_once::domain::order::Order;

/// A scripted failure for the next charge call of one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 402: stores the decline under the key; nothing charged.
    Decline,
    /// Hangs without charging (the caller's timeout fires).
    Timeout,
    /// Charges, stores the success under the key, then hangs: the response is lost.
    ChargeThenTimeout,
    /// 500, not stored: a replay runs again.
    ServerError,
    /// 500 stored under the key: a replay returns it with `Idempotent-Replayed`.
    StoredServerError,
    /// 500 stored under the key, as `StoredServerError`, but the payment reached the
    /// card network: it appears (succeeded) when [`TestProvider::roll_forward`] says so,
    /// as Stripe rolls such payments forward after an incident. Until then no lookup
    /// sees it.
    StoredServerErrorThenPayment,
    /// Panics inside the call.
    Panic,
    /// 402 `authentication_required`: the payment stays open, awaiting the customer
    /// (`requires_action`), stored under the key.
    AuthenticationRequired,
}

/// One call as the provider saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub order_id: String,
    pub key: String,
    pub result: String,
}

#[derive(Clone, Debug)]
enum Stored {
    Charged { payment_id: String, params: String },
    Declined { params: String },
    AuthenticationRequired { params: String, payment_id: String },
    ServerError { params: String },
}

#[derive(Default)]
struct State {
    faults: HashMap<String, VecDeque<Fault>>,
    /// How long every lookup takes.
    lookup_delay: Duration,
    /// Charges the provider holds as `pending` (bank debits, some wallets):
    /// (order id, amount, charge id). They may still settle as succeeded.
    pending: Vec<(String, u64, String)>,
    by_key: HashMap<String, Stored>,
    /// Every charge actually made: (order id, amount, charge id).
    charges: Vec<(String, u64, String)>,
    /// Payments behind a stored 500 that will still appear: (order id, amount, id).
    rolling: Vec<(String, u64, String)>,
    /// Payments someone may still confirm: (order id, amount, id, status).
    open: Vec<(String, u64, String, &'static str)>,
    /// Open payments ever made: their ids never repeat.
    opened: usize,
    cancels: Vec<String>,
    /// The order each payment was made for, by its id (what a fetch by id reads).
    orders: HashMap<String, Order>,
    calls: Vec<Call>,
    lookups: Vec<String>,
}

#[derive(Default)]
pub struct TestProvider {
    state: Mutex<State>,
}

/// How long a hanging call hangs: far past any test's payment timeout, yet bounded.
const HANG: Duration = Duration::from_secs(30);

impl TestProvider {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues faults for the next charge calls of `order_id`, in order.
    pub fn script(&self, order_id: &str, faults: &[Fault]) {
        let mut state = self.state.lock().unwrap();
        state
            .faults
            .entry(order_id.to_owned())
            .or_default()
            .extend(faults);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn calls_for(&self, order_id: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.order_id == order_id)
            .collect()
    }

    pub fn keys_for(&self, order_id: &str) -> Vec<String> {
        self.calls_for(order_id)
            .into_iter()
            .map(|c| c.key)
            .collect()
    }

    /// Charge ids actually created for `order_id`.
    pub fn charges_for(&self, order_id: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .charges
            .iter()
            .filter(|(o, _, _)| o == order_id)
            .map(|(_, _, id)| id.clone())
            .collect()
    }

    pub fn charge_count(&self) -> usize {
        self.state.lock().unwrap().charges.len()
    }

    pub fn lookups(&self) -> Vec<String> {
        self.state.lock().unwrap().lookups.clone()
    }

    /// The invariant of the product: no order was charged twice, counting a payment
    /// behind a stored 500 that will still appear.
    pub fn assert_no_order_charged_twice(&self) {
        let state = self.state.lock().unwrap();
        let mut per_order: HashMap<&str, usize> = HashMap::new();
        for (order, _, _) in state.charges.iter().chain(&state.rolling) {
            *per_order.entry(order).or_default() += 1;
        }
        let twice: Vec<_> = per_order.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "orders charged more than once: {twice:?}");
    }

    fn record(&self, order: &Order, key: &str, result: &str) {
        self.state.lock().unwrap().calls.push(Call {
            order_id: order.id().to_owned(),
            key: key.to_owned(),
            result: result.to_owned(),
        });
    }
}

fn params(order: &Order) -> String {
    format!(
        "{}|{}|{}|{}|{}",
        order.id(),
        order.amount(),
        order.currency(),
        order.customer(),
        order.payment_method()
    )
}

fn declined() -> PaymentError {
    PaymentError::Declined {
        code: "card_declined".to_owned(),
        decline_code: Some("generic_decline".to_owned()),
        payment_id: None,
    }
}

#[async_trait]
impl ChargePath for TestProvider {
    async fn charge(&self, order: &Order, key: &str) -> Result<Receipt, PaymentError> {
        let params = params(order);
        let (fault, replay) = {
            let mut state = self.state.lock().unwrap();
            let replay = state.by_key.get(key).cloned();
            let fault = match replay {
                // A replay returns the stored outcome; scripted faults wait.
                Some(_) => None,
                None => state
                    .faults
                    .get_mut(order.id())
                    .and_then(VecDeque::pop_front),
            };
            (fault, replay)
        };
        if let Some(stored) = replay {
            let (stored_params, result) = match &stored {
                Stored::Charged { payment_id, params } => (params, Ok(Receipt::new(payment_id))),
                Stored::Declined { params } => (params, Err(declined())),
                Stored::AuthenticationRequired { params, payment_id } => (
                    params,
                    Err(PaymentError::AuthenticationRequired {
                        payment_id: Some(payment_id.clone()),
                    }),
                ),
                Stored::ServerError { params } => (
                    params,
                    Err(PaymentError::ReplayedServerError { status: 500 }),
                ),
            };
            if *stored_params != params {
                self.record(order, key, "key_reused");
                return Err(PaymentError::KeyReused);
            }
            self.record(order, key, &format!("replayed:{}", describe(&result)));
            return result;
        }
        match fault {
            Some(Fault::Decline) => {
                self.open_payment(order, "requires_payment_method");
                self.state
                    .lock()
                    .unwrap()
                    .by_key
                    .insert(key.to_owned(), Stored::Declined { params });
                self.record(order, key, "declined");
                Err(declined())
            }
            Some(Fault::AuthenticationRequired) => {
                let payment_id = self.open_payment(order, "requires_action");
                self.state.lock().unwrap().by_key.insert(
                    key.to_owned(),
                    Stored::AuthenticationRequired {
                        params,
                        payment_id: payment_id.clone(),
                    },
                );
                self.record(order, key, "authentication_required");
                Err(PaymentError::AuthenticationRequired {
                    payment_id: Some(payment_id),
                })
            }
            Some(Fault::Timeout) => {
                self.record(order, key, "timeout");
                tokio::time::sleep(HANG).await;
                Err(PaymentError::retryable(FailureKind::Timeout))
            }
            Some(Fault::ServerError) => {
                self.record(order, key, "server_error");
                Err(PaymentError::retryable(FailureKind::Server(500)))
            }
            Some(Fault::StoredServerError) => {
                self.state
                    .lock()
                    .unwrap()
                    .by_key
                    .insert(key.to_owned(), Stored::ServerError { params });
                self.record(order, key, "server_error_stored");
                Err(PaymentError::retryable(FailureKind::Server(500)))
            }
            Some(Fault::StoredServerErrorThenPayment) => {
                let mut state = self.state.lock().unwrap();
                state
                    .by_key
                    .insert(key.to_owned(), Stored::ServerError { params });
                let id = format!("ch_rolled_{}", state.rolling.len() + 1);
                state.orders.insert(id.clone(), order.clone());
                state
                    .rolling
                    .push((order.id().to_owned(), order.amount(), id));
                drop(state);
                self.record(order, key, "server_error_stored_payment_later");
                Err(PaymentError::retryable(FailureKind::Server(500)))
            }
            Some(Fault::Panic) => {
                self.record(order, key, "panic");
                panic!("test provider told to panic for {}", order.id());
            }
            Some(Fault::ChargeThenTimeout) => {
                self.make_charge(order, key, params);
                self.record(order, key, "charged_then_timeout");
                tokio::time::sleep(HANG).await;
                Err(PaymentError::retryable(FailureKind::Timeout))
            }
            None => {
                let id = self.make_charge(order, key, params);
                self.record(order, key, "charged");
                Ok(Receipt::new(id))
            }
        }
    }

    async fn find_payment(&self, order: &Order, _since: Time) -> Result<Lookup, PaymentError> {
        let delay = {
            let mut state = self.state.lock().unwrap();
            state.lookups.push(order.id().to_owned());
            state.lookup_delay
        };
        tokio::time::sleep(delay).await;
        let state = self.state.lock().unwrap();
        let mine =
            |(o, amount, _): &&(String, u64, String)| o == order.id() && *amount == order.amount();
        if let Some((_, _, id)) = state.charges.iter().find(mine) {
            return Ok(Lookup::Succeeded(Receipt::new(id)));
        }
        if let Some((_, _, id)) = state.pending.iter().find(mine) {
            return Ok(Lookup::Pending {
                payment_id: id.clone(),
                status: "pending".to_owned(),
            });
        }
        let open = state
            .open
            .iter()
            .find(|(o, amount, _, _)| o == order.id() && *amount == order.amount());
        Ok(match open {
            Some((_, _, id, status)) => Lookup::Open {
                payment_id: id.clone(),
                status: (*status).to_owned(),
                awaits_customer: *status == charge_once::contracts::payment::AWAITS_CUSTOMER,
            },
            None => Lookup::NotFound,
        })
    }

    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError> {
        let mut state = self.state.lock().unwrap();
        state.cancels.push(payment_id.to_owned());
        let before = state.open.len();
        state.open.retain(|(_, _, id, _)| id != payment_id);
        Ok(if state.open.len() < before {
            Cancel::Cancelled
        } else {
            Cancel::NotCancellable
        })
    }

    /// The payment as a fetch by id finds it: succeeded, open (its status),
    /// processing, cancelled, or unknown (a payment behind a stored 500 included: no
    /// read sees it until it rolls forward).
    async fn payment_by_id(&self, id: &str) -> Result<Option<ListedPayment>, PaymentError> {
        let state = self.state.lock().unwrap();
        let Some(order) = state.orders.get(id) else {
            return Ok(None);
        };
        let status = if state.charges.iter().any(|(_, _, c)| c == id) {
            "succeeded"
        } else if let Some((_, _, _, status)) = state.open.iter().find(|(_, _, o, _)| o == id) {
            status
        } else if state.pending.iter().any(|(_, _, p)| p == id) {
            "processing"
        } else if state.cancels.iter().any(|c| c == id) {
            "canceled"
        } else {
            return Ok(None);
        };
        Ok(Some(ListedPayment {
            id: id.to_owned(),
            order_id: Some(order.id().to_owned()),
            amount: order.amount(),
            currency: order.currency().to_lowercase(),
            customer: Some(order.customer().to_owned()),
            payment_method: Some(order.payment_method().to_owned()),
            status: status.to_owned(),
            created: Time::from_ms(0),
        }))
    }
}

#[async_trait]
impl PaymentListing for TestProvider {
    /// Not served: the audit is tested on the simulator and stripe-stateful-mock,
    /// which keep what it reads (currency, customer, creation time).
    async fn payments_since(&self, _: Time) -> Result<Vec<ListedPayment>, PaymentError> {
        panic!("TestProvider does not serve the audit: use the simulator or stripe-stateful-mock")
    }

    async fn confirmed_since(&self, _: Time) -> Result<Vec<Confirmation>, PaymentError> {
        panic!("TestProvider does not serve the audit: use the simulator or stripe-stateful-mock")
    }
}

impl TestProvider {
    fn make_charge(&self, order: &Order, key: &str, params: String) -> String {
        let mut state = self.state.lock().unwrap();
        let id = format!("ch_{}", state.charges.len() + 1);
        state
            .charges
            .push((order.id().to_owned(), order.amount(), id.clone()));
        state.orders.insert(id.clone(), order.clone());
        state.by_key.insert(
            key.to_owned(),
            Stored::Charged {
                payment_id: id.clone(),
                params,
            },
        );
        id
    }

    /// A payment of `order` someone may still confirm; its id.
    fn open_payment(&self, order: &Order, status: &'static str) -> String {
        let mut state = self.state.lock().unwrap();
        state.opened += 1;
        let id = format!("pi_open_{}", state.opened);
        state
            .open
            .push((order.id().to_owned(), order.amount(), id.clone(), status));
        state.orders.insert(id.clone(), order.clone());
        id
    }

    /// Someone (the customer on the shop's page, a person in the Dashboard) confirms
    /// the open payment `payment_id`: it succeeds, a charge of its order. `false` when
    /// it is not open (cancelled, or never).
    pub fn confirm(&self, payment_id: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let Some(at) = state.open.iter().position(|(_, _, id, _)| id == payment_id) else {
            return false;
        };
        let (order_id, amount, id, _) = state.open.remove(at);
        state.charges.push((order_id, amount, id));
        true
    }

    /// The payments someone may still confirm, for `order_id`.
    pub fn open_for(&self, order_id: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .open
            .iter()
            .filter(|(o, ..)| o == order_id)
            .map(|(_, _, id, _)| id.clone())
            .collect()
    }

    /// Every cancel asked for, in order.
    pub fn cancels(&self) -> Vec<String> {
        self.state.lock().unwrap().cancels.clone()
    }

    /// Every later lookup takes `delay` (bounded by the caller's timeout).
    pub fn delay_lookups(&self, delay: Duration) {
        self.state.lock().unwrap().lookup_delay = delay;
    }

    /// The provider holds a `pending` charge for this order (made outside this
    /// consumer's view, e.g. under a key it has since forgotten).
    pub fn add_pending_charge(&self, order_id: &str, amount: u64) -> String {
        let mut state = self.state.lock().unwrap();
        let id = format!("py_pending_{}", state.pending.len() + 1);
        state
            .pending
            .push((order_id.to_owned(), amount, id.clone()));
        id
    }

    /// The provider holds a `processing` payment of `order` (a bank debit), made
    /// outside this consumer's view; its id. [`Self::settle_processing`] settles it.
    pub fn add_processing_payment(&self, order: &Order) -> String {
        let mut state = self.state.lock().unwrap();
        let id = format!("py_processing_{}", state.pending.len() + 1);
        state
            .pending
            .push((order.id().to_owned(), order.amount(), id.clone()));
        state.orders.insert(id.clone(), order.clone());
        id
    }

    /// The processing payment `id` settles: succeeded (a charge of its order), or
    /// failed (open again, `requires_payment_method`, as Stripe leaves a returned
    /// debit). `false` when it is not processing.
    pub fn settle_processing(&self, id: &str, succeeded: bool) -> bool {
        let mut state = self.state.lock().unwrap();
        let Some(at) = state.pending.iter().position(|(_, _, p)| p == id) else {
            return false;
        };
        let (order_id, amount, id) = state.pending.remove(at);
        if succeeded {
            state.charges.push((order_id, amount, id));
        } else {
            state
                .open
                .push((order_id, amount, id, "requires_payment_method"));
        }
        true
    }

    /// The payments of `order_id` behind a stored 500 appear, succeeded.
    pub fn roll_forward(&self, order_id: &str) {
        let mut state = self.state.lock().unwrap();
        let (rolled, kept) = std::mem::take(&mut state.rolling)
            .into_iter()
            .partition(|(o, _, _)| o == order_id);
        state.rolling = kept;
        state.charges.extend::<Vec<_>>(rolled);
    }

    /// Forgets every stored key, as a real provider does after its key TTL.
    pub fn forget_keys(&self) {
        self.state.lock().unwrap().by_key.clear();
    }
}

fn describe(result: &Result<Receipt, PaymentError>) -> String {
    match result {
        Ok(r) => format!("charged {}", r.id),
        Err(e) => e.to_string(),
    }
}
