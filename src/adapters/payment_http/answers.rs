//! The provider's answers as the pinned `Stripe-Version` shapes them: a
//! PaymentIntent and what its status means, the best payment of an order in a
//! listing, and the machine-readable parts of an error.

use serde::Deserialize;

use crate::contracts::payment::{
    AUTHENTICATION_REQUIRED, Confirmation, ListedPayment, Lookup, PaymentError, Receipt, Status,
};
use crate::domain::clock::Time;
use crate::domain::order::Order;

/// A PaymentIntent as the pinned version shapes it; only what is read.
#[derive(Deserialize)]
pub(super) struct Intent {
    pub(super) id: String,
    #[serde(default)]
    pub(super) amount: Option<u64>,
    #[serde(default)]
    pub(super) currency: Option<String>,
    #[serde(default)]
    pub(super) status: Option<String>,
    #[serde(default)]
    pub(super) metadata: Option<std::collections::HashMap<String, String>>,
    #[serde(default)]
    pub(super) customer: Option<String>,
    #[serde(default)]
    pub(super) payment_method: Option<String>,
    /// The charge it made: an id, or the Charge itself when expanded (some servers
    /// answer with the object).
    #[serde(default)]
    pub(super) latest_charge: Option<serde_json::Value>,
    /// Seconds since the epoch.
    #[serde(default)]
    pub(super) created: Option<i64>,
    /// Why its last attempt failed: `authentication_required` leaves an off-session
    /// payment `requires_payment_method`, awaiting the customer.
    #[serde(default)]
    pub(super) last_payment_error: Option<LastError>,
}

/// The machine-readable parts of a PaymentIntent's last error (never its `message`).
#[derive(Deserialize)]
pub(super) struct LastError {
    #[serde(default)]
    pub(super) code: Option<String>,
    /// The issuer's reason when `code` is the generic `card_declined`: an off-session
    /// charge whose bank wants authentication says so here, as the charge's 402 does.
    #[serde(default)]
    pub(super) decline_code: Option<String>,
    /// What kind of payment method failed (`card`, `sepa_debit`, …): the pinned version
    /// names it beside the error, so a lookup can say so without expanding the
    /// PaymentMethod.
    #[serde(default)]
    pub(super) payment_method_type: Option<String>,
}

/// How an answer's status reads (ARCHITECTURE.md, "The payment provider").
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Standing {
    Succeeded,
    /// In flight; settles by itself (`processing`, `requires_capture`, unknown).
    InFlight,
    /// Someone may still confirm it.
    Open,
    Canceled,
}

pub(super) fn standing(status: Option<&str>) -> Standing {
    match Status::read(status) {
        Status::Succeeded => Standing::Succeeded,
        Status::RequiresPaymentMethod | Status::RequiresConfirmation | Status::RequiresAction => {
            Standing::Open
        }
        Status::Canceled => Standing::Canceled,
        Status::Processing | Status::RequiresCapture | Status::Unknown => Standing::InFlight,
    }
}

impl Intent {
    /// The customer is asked to authenticate it: only they can confirm it now.
    /// Read as the charge path reads a 402: `code` or `decline_code`.
    pub(super) fn awaits_customer(&self) -> bool {
        Status::read(self.status.as_deref()) == Status::RequiresAction
            || self.last_payment_error.as_ref().is_some_and(|e| {
                e.code.as_deref() == Some(AUTHENTICATION_REQUIRED)
                    || e.decline_code.as_deref() == Some(AUTHENTICATION_REQUIRED)
            })
    }

    pub(super) fn status(&self) -> String {
        self.status.clone().unwrap_or_else(|| "unknown".to_owned())
    }

    pub(super) fn latest_charge(&self) -> Option<String> {
        match &self.latest_charge {
            Some(serde_json::Value::String(id)) => Some(id.clone()),
            Some(serde_json::Value::Object(charge)) => charge
                .get("id")
                .and_then(|id| id.as_str())
                .map(str::to_owned),
            _ => None,
        }
    }

    pub(super) fn receipt(&self) -> Receipt {
        Receipt {
            id: self.id.clone(),
            charge: self.latest_charge(),
        }
    }

    pub(super) fn listed(self) -> ListedPayment {
        ListedPayment {
            order_id: self.metadata.and_then(|mut m| m.remove("order_id")),
            amount: self.amount.unwrap_or(0),
            currency: self.currency.unwrap_or_default(),
            customer: self.customer,
            payment_method: self.payment_method,
            status: self.status.unwrap_or_else(|| "unknown".to_owned()),
            created: Time::from_secs(self.created.unwrap_or(0)),
            id: self.id,
        }
    }

    pub(super) fn is_for(&self, order: &Order) -> bool {
        self.amount == Some(order.amount())
            && self
                .currency
                .as_deref()
                .is_some_and(|c| c.eq_ignore_ascii_case(order.currency()))
            && self
                .metadata
                .as_ref()
                .and_then(|m| m.get("order_id"))
                .is_some_and(|id| id == order.id())
    }
}

/// The order's payment on one page: a succeeded one wins, then one in flight, then an
/// open one; cancelled ones do not count.
pub(super) fn pick(intents: &[Intent], order: &Order) -> Lookup {
    let mine = |wanted: Standing| {
        intents
            .iter()
            .filter(|i| i.is_for(order))
            .find(move |i| standing(i.status.as_deref()) == wanted)
    };
    if let Some(paid) = mine(Standing::Succeeded) {
        return Lookup::Succeeded(paid.receipt());
    }
    if let Some(live) = mine(Standing::InFlight) {
        return Lookup::Pending {
            payment_id: live.id.clone(),
            status: live.status(),
        };
    }
    match mine(Standing::Open) {
        Some(open) => {
            if let Some(error) = &open.last_payment_error {
                // Why it is open, for whoever reads the lookup's log: the code and the
                // kind of method that failed, never the provider's message.
                tracing::debug!(
                    payment_id = %open.id,
                    code = error.code.as_deref().unwrap_or(""),
                    decline_code = error.decline_code.as_deref().unwrap_or(""),
                    payment_method_type = error.payment_method_type.as_deref().unwrap_or(""),
                    "the open payment's last attempt failed"
                );
            }
            Lookup::Open {
                payment_id: open.id.clone(),
                status: open.status(),
                awaits_customer: open.awaits_customer(),
            }
        }
        None => Lookup::NotFound,
    }
}

/// Where a lookup stands after some pages: the best answer so far (a succeeded one
/// ends the walk).
pub(super) fn better(so_far: Option<Lookup>, found: Lookup) -> Option<Lookup> {
    let rank = |l: &Lookup| match l {
        Lookup::Succeeded(_) => 3,
        Lookup::Pending { .. } => 2,
        Lookup::Open { .. } => 1,
        Lookup::NotFound => 0,
    };
    match so_far {
        Some(old) if rank(&old) >= rank(&found) => Some(old),
        _ if found == Lookup::NotFound => None,
        _ => Some(found),
    }
}

/// One page of a list endpoint: its objects, oldest or newest first as the
/// provider lists them, and whether another page follows.
#[derive(Deserialize)]
pub(super) struct Page<T> {
    pub(super) data: Vec<T>,
    #[serde(default)]
    pub(super) has_more: bool,
}

/// What a list is paged by: the id of its page's last object is the next page's
/// `starting_after`.
pub(super) trait Listed {
    fn id(&self) -> &str;
}

impl Listed for Intent {
    fn id(&self) -> &str {
        &self.id
    }
}

/// A `payment_intent.succeeded` event: when it happened and the PaymentIntent as it
/// was then (`data.object`).
#[derive(Deserialize)]
pub(super) struct Event {
    pub(super) id: String,
    #[serde(default, rename = "type")]
    pub(super) kind: Option<String>,
    /// Seconds since the epoch: when the payment succeeded.
    #[serde(default)]
    pub(super) created: Option<i64>,
    pub(super) data: EventData,
}

#[derive(Deserialize)]
pub(super) struct EventData {
    pub(super) object: Intent,
}

impl Listed for Event {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Event {
    /// The payment it names, succeeded then. The event's type says so whatever the
    /// object's snapshot holds, so the status is the event's.
    pub(super) fn confirmation(self) -> Confirmation {
        let mut payment = self.data.object.listed();
        payment.status = "succeeded".to_owned();
        Confirmation {
            at: Time::from_secs(self.created.unwrap_or(0)),
            payment,
        }
    }
}

#[derive(Deserialize, Default)]
pub(super) struct ErrorBody {
    #[serde(default)]
    pub(super) error: ErrorDetail,
}

/// Only the machine-readable parts of a provider error; never its `message`.
#[derive(Deserialize, Default)]
pub(super) struct ErrorDetail {
    #[serde(default, rename = "type")]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) code: Option<String>,
    #[serde(default)]
    pub(super) decline_code: Option<String>,
    /// The PaymentIntent a card error left behind (Stripe names it).
    #[serde(default)]
    pub(super) payment_intent: Option<IntentRef>,
}

#[derive(Deserialize)]
pub(super) struct IntentRef {
    pub(super) id: String,
}

/// A 2xx PaymentIntent as an outcome: only `succeeded` is a receipt.
pub(super) fn settle(intent: Intent) -> Result<Receipt, PaymentError> {
    let read = Status::read(intent.status.as_deref());
    if read == Status::Succeeded {
        return Ok(intent.receipt());
    }
    match (read, intent.status) {
        // The bank asks the customer to authenticate: an off-session confirm that
        // answers 2xx instead of Stripe's 402 `authentication_required`.
        (Status::RequiresAction, _) => Err(PaymentError::AuthenticationRequired {
            payment_id: Some(intent.id),
        }),
        // In flight (bank debits, some wallets), or no status at all: it may still
        // fail, and an acknowledged order must be paid. When in doubt, the record
        // fails, the key is kept, and the retry reconciles.
        (Status::Processing, status) | (Status::Unknown, status @ None) => {
            Err(PaymentError::Pending {
                payment_id: intent.id,
                status: status.unwrap_or_else(|| "unknown".to_owned()),
            })
        }
        // `requires_payment_method` with a 2xx is a decline answered as a payment.
        (Status::RequiresPaymentMethod, _) => Err(PaymentError::Declined {
            code: "card_declined".to_owned(),
            decline_code: None,
            payment_id: Some(intent.id),
        }),
        (_, status) => Err(PaymentError::UnexpectedStatus {
            status: status.unwrap_or_default(),
            payment_id: intent.id,
        }),
    }
}
