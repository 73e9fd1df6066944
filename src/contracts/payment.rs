//! The payment provider contracts, each named by what its reader uses: the charge
//! path ([`ChargePath`]: charge an order under an idempotency key, look a payment up
//! for reconciliation; read by the record's driver and `resolve`), the listing
//! ([`PaymentListing`]: read by the audit), and the refund path ([`RefundPath`]:
//! refund a payment under a key, look a refund up, list refunds; read by the refund
//! effect, the settler and the audit). [`PaymentProvider`] is the first two, as the
//! wiring builds it (ARCHITECTURE.md, "The state machine").
//!
//! [`crate::adapters::payment_http::HttpProvider`] is the production implementation;
//! [`crate::adapters::api_key`] reads its key. The local member (`local/`) implements
//! them with its simulator, for runs without a provider.

use async_trait::async_trait;

use crate::BoxError;
use crate::domain::clock::Time;
use crate::domain::order::Order;
use crate::domain::refund::RefundRequest;

/// What the provider returns for a successful payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The payment's id (a PaymentIntent, `pi_…`), stored as the record's receipt.
    pub id: String,
    /// The charge it made (`latest_charge`, `ch_…`), for the log line only.
    pub charge: Option<String>,
}

impl Receipt {
    /// A receipt for payment `id`, its charge not known.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            charge: None,
        }
    }
}

/// What a lookup of an order's payments found (ARCHITECTURE.md, "The state
/// machine"). A payment counts when its `metadata[order_id]`, amount and currency
/// match and it is not `canceled`. A succeeded one wins, then one in flight, then an
/// open one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A `succeeded` payment: the order is paid; complete with it.
    Succeeded(Receipt),
    /// A payment in flight (`processing`, `requires_capture`, or a status not known):
    /// it may yet succeed by itself, so no new key may be sent. It settles, then a
    /// later delivery (or `resolve`) completes or moves on.
    Pending { payment_id: String, status: String },
    /// A payment someone may still confirm (`requires_payment_method` after a
    /// decline, `requires_confirmation`, `requires_action` while the customer is asked
    /// to authenticate): it can succeed later, so no new key while it is open. It is
    /// cancelled first, or waited for when it awaits the customer.
    Open {
        payment_id: String,
        status: String,
        /// The customer is asked to authenticate it: `requires_action`, or
        /// `requires_payment_method` after an off-session `authentication_required`
        /// (Stripe's `last_payment_error`). Only they can confirm it; it is never
        /// cancelled by the machine.
        awaits_customer: bool,
    },
    /// No live payment: a new key cannot charge twice.
    NotFound,
}

/// What a cancel of an open payment did: the library machine's (`Cancelled`, or
/// `NotCancellable`: it succeeded, is processing, or was cancelled; look again).
pub use idempotent_consumer::machine::Cancel;

/// The status `requires_action` of an open payment: the customer is asked to
/// authenticate, and only they can confirm it.
pub const AWAITS_CUSTOMER: &str = "requires_action";

/// A PaymentIntent's `status`, read from the provider's text in this one place; every
/// decision about a payment (the charge's answer, a lookup, settling, the audit) starts
/// from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Succeeded,
    Canceled,
    /// In flight: a bank debit or some wallets; it settles by itself.
    Processing,
    /// A confirmation failed; the customer may still confirm it.
    RequiresPaymentMethod,
    RequiresConfirmation,
    /// [`AWAITS_CUSTOMER`]: the customer is asked to authenticate it.
    RequiresAction,
    /// Authorised, not captured: in flight for this consumer (it never captures).
    RequiresCapture,
    /// A status this client does not know, or none.
    Unknown,
}

impl Status {
    pub fn read(status: Option<&str>) -> Self {
        match status {
            Some("succeeded") => Self::Succeeded,
            Some("canceled") => Self::Canceled,
            Some("processing") => Self::Processing,
            Some("requires_payment_method") => Self::RequiresPaymentMethod,
            Some("requires_confirmation") => Self::RequiresConfirmation,
            Some(AWAITS_CUSTOMER) => Self::RequiresAction,
            Some("requires_capture") => Self::RequiresCapture,
            _ => Self::Unknown,
        }
    }
}
/// The error code (`code`, or a decline's `decline_code`) of a payment the customer's
/// bank wants authenticated.
pub const AUTHENTICATION_REQUIRED: &str = "authentication_required";

/// A charge as the provider lists it (for the audit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedPayment {
    pub id: String,
    /// `metadata[order_id]`; `None` for a payment that is not an order's.
    pub order_id: Option<String>,
    pub amount: u64,
    /// As the provider writes it (Stripe: lower case).
    pub currency: String,
    pub customer: Option<String>,
    /// The payment method it was made with (part of the order's fingerprint).
    pub payment_method: Option<String>,
    /// `succeeded`, `processing`, `requires_payment_method`, `canceled`, ...
    pub status: String,
    pub created: Time,
}

impl ListedPayment {
    pub fn succeeded(&self) -> bool {
        Status::read(Some(&self.status)) == Status::Succeeded
    }
}

/// Why a provider call did not produce a receipt. The variant decides what happens to
/// the provider key (ARCHITECTURE.md, "The state machine"): only `Declined` moves to
/// the next attempt, once the declined payment is cancelled.
#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    /// 402: the provider stored a decline under this key; nothing was charged. The
    /// declined payment stays open (`requires_payment_method`) until cancelled.
    #[error("declined ({code}{})", decline_code.as_deref().map(|d| format!(", {d}")).unwrap_or_default())]
    Declined {
        code: String,
        decline_code: Option<String>,
        /// The PaymentIntent the decline left open (Stripe names it in
        /// `error.payment_intent`): the one to cancel before the next key.
        payment_id: Option<String>,
    },
    /// The customer's bank asks for authentication (strong customer authentication):
    /// a 402 `authentication_required`, or a payment left `requires_action`. Only the
    /// customer, back on the shop's page, can confirm this payment; nothing was
    /// charged yet, and no other payment may be made while it is open.
    #[error("the customer must authenticate payment {}", payment_id.as_deref().unwrap_or("(id not given)"))]
    AuthenticationRequired { payment_id: Option<String> },
    /// A 2xx payment in a status this client does not settle by itself
    /// (`requires_capture`, `requires_confirmation`, `canceled`, …): a person looks.
    #[error("the provider answered with payment {payment_id} in status `{status}`")]
    UnexpectedStatus { payment_id: String, status: String },
    /// The provider refused the key because it was used with other parameters.
    #[error("idempotency key reused with other parameters")]
    KeyReused,
    /// A permanent refusal (400 other than a reused key; a 404 naming a missing
    /// object, `resource_missing`): the same request will be refused again until
    /// someone fixes the order or the provider's data. Nothing was charged; the key is
    /// kept.
    #[error("provider rejected the request (status {status}{})", code.as_deref().map(|c| format!(", {c}")).unwrap_or_default())]
    Rejected { status: u16, code: Option<String> },
    /// The provider answered with a payment that is not final (`pending`, …): it may
    /// still succeed or fail. Not a receipt: the key is kept and a human settles it.
    #[error("the provider holds the payment in status `{status}`, not final")]
    Pending { payment_id: String, status: String },
    /// The provider replayed a stored 5xx for this key: the original outcome is
    /// unknown, so the payment must be looked up before anything else is sent.
    #[error("provider replayed a stored server error (status {status})")]
    ReplayedServerError { status: u16 },
    /// Anything else: timeout, connection error, 5xx, 409, 429, 401, other 4xx. The
    /// outcome is unknown or transient; the next attempt replays the same key.
    #[error("{kind}")]
    Retryable {
        kind: FailureKind,
        #[source]
        source: Option<BoxError>,
        /// The provider's own advice (Stripe's `Stripe-Should-Retry` header), obeyed
        /// before the status: `Some(false)` is never retried within the invocation.
        should_retry: Option<bool>,
    },
}

/// The classes of retryable failure, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    Timeout,
    Connection,
    Server(u16),
    /// A 429 from one of the provider's rate limiters (`code: rate_limit`, or any 429
    /// with `Stripe-Rate-Limited-Reason`): the account sends too fast. Backpressure:
    /// nothing was stored under the key (the limiter runs first), and it says nothing
    /// about the provider being down.
    RateLimited(Limiter),
    /// A 429 `lock_timeout`: another request held the object (the customer) too long.
    /// Contention, not load: retried after a short pause.
    Lock,
    Conflict,
    /// A 401: the provider does not know the key (revoked, mistyped, another mode).
    Unauthorized,
    /// A 403: a restricted key without the permission this request needs, named when
    /// the provider's message names a known one (`rak_…`). A setting to fix, never the
    /// order's fault: the key is kept and no new attempt follows.
    Forbidden(Option<&'static str>),
    Client(u16),
    /// A 3xx. The client follows no redirect: a charge sent again to another address
    /// (307/308 keep the method and body) is a charge nobody configured.
    Redirect(u16),
    /// A 2xx (or error) body we cannot read.
    BadResponse,
    /// Stripe's `three_d_secure_authentication_upstream_error` (2026-10-28.endive): a
    /// 3-D Secure partner's error kept Stripe from completing the request. The
    /// provider's trouble, never the card's: retried with the key, never a decline.
    AuthenticationUpstream,
    /// A 404 that is not the provider's `resource_missing`: the address reached no
    /// endpoint of the provider, so every order would fail the same way. A setting to
    /// fix (PAYMENT_API_URL), never the order's fault.
    NoEndpoint,
}

/// Which of the provider's limiters refused a request, as `Stripe-Rate-Limited-Reason`
/// names it (docs.stripe.com/rate-limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limiter {
    GlobalRate,
    GlobalConcurrency,
    EndpointRate,
    EndpointConcurrency,
    ResourceSpecific,
    /// A 429 `rate_limit` without the header, or a value not known here.
    Unnamed,
}

impl Limiter {
    /// The header's value (`Unnamed`: `rate_limit`).
    pub fn name(self) -> &'static str {
        match self {
            Self::GlobalRate => "global-rate",
            Self::GlobalConcurrency => "global-concurrency",
            Self::EndpointRate => "endpoint-rate",
            Self::EndpointConcurrency => "endpoint-concurrency",
            Self::ResourceSpecific => "resource-specific",
            Self::Unnamed => "rate_limit",
        }
    }

    /// The limiter a `Stripe-Rate-Limited-Reason` value names.
    pub fn from_header(value: &str) -> Self {
        [
            Self::GlobalRate,
            Self::GlobalConcurrency,
            Self::EndpointRate,
            Self::EndpointConcurrency,
            Self::ResourceSpecific,
        ]
        .into_iter()
        .find(|l| l.name().eq_ignore_ascii_case(value.trim()))
        .unwrap_or(Self::Unnamed)
    }
}

/// A refusal that is backpressure, not a failure (ARCHITECTURE.md, "The payment
/// provider"): paced, never counted by the breaker, the key kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Throttle {
    RateLimited(Limiter),
    Lock,
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => f.write_str("provider timed out"),
            Self::Connection => f.write_str("provider connection failed"),
            Self::Server(s) => write!(f, "provider server error (status {s})"),
            Self::RateLimited(limiter) => {
                write!(f, "provider rate limited (status 429, {})", limiter.name())
            }
            Self::Lock => f.write_str("provider lock timeout on the customer (status 429)"),
            Self::Conflict => f.write_str("provider conflict (status 409)"),
            Self::Unauthorized => f.write_str(
                "provider refused the API key (status 401): check the secret's key and its mode",
            ),
            Self::Forbidden(Some(permission)) => write!(
                f,
                "provider refused the API key (status 403): the restricted key lacks the permission {permission}"
            ),
            Self::Forbidden(None) => f.write_str(
                "provider refused the API key (status 403): the restricted key lacks a permission this request needs",
            ),
            Self::Client(s) => write!(f, "provider refused the request (status {s})"),
            Self::Redirect(s) => write!(
                f,
                "provider answered with a redirect (status {s}), which is not followed: check PAYMENT_API_URL"
            ),
            Self::BadResponse => f.write_str("provider response could not be read"),
            Self::AuthenticationUpstream => f.write_str(
                "provider's 3-D Secure partner failed (three_d_secure_authentication_upstream_error)",
            ),
            Self::NoEndpoint => f.write_str(
                "provider answered 404 without naming a missing object: no such endpoint, check PAYMENT_API_URL",
            ),
        }
    }
}

impl PaymentError {
    pub fn retryable(kind: FailureKind) -> Self {
        Self::Retryable {
            kind,
            source: None,
            should_retry: None,
        }
    }

    /// Whether the provider advised against retrying now (`Stripe-Should-Retry:
    /// false`): the record still fails with a safe retry, but not within this
    /// invocation.
    pub fn advised_not_to_retry(&self) -> bool {
        matches!(
            self,
            Self::Retryable {
                should_retry: Some(false),
                ..
            }
        )
    }

    /// A rate limit or a lock: backpressure, not a failure of the provider.
    pub fn throttle(&self) -> Option<Throttle> {
        match self {
            Self::Retryable {
                kind: FailureKind::RateLimited(limiter),
                ..
            } => Some(Throttle::RateLimited(*limiter)),
            Self::Retryable {
                kind: FailureKind::Lock,
                ..
            } => Some(Throttle::Lock),
            _ => None,
        }
    }

    /// The answer blames a setting (no endpoint at PAYMENT_API_URL, a key the provider
    /// refuses or one without a permission), not the order: retried, counted by the
    /// provider's breaker, logged at error level.
    pub fn is_setting_fault(&self) -> bool {
        matches!(
            self,
            Self::Retryable {
                kind: FailureKind::NoEndpoint
                    | FailureKind::Unauthorized
                    | FailureKind::Forbidden(_),
                ..
            }
        )
    }

    /// The provider refused the key itself (401) or its permissions (403).
    pub fn refuses_the_key(&self) -> bool {
        matches!(
            self,
            Self::Retryable {
                kind: FailureKind::Unauthorized | FailureKind::Forbidden(_),
                ..
            }
        )
    }
}

/// The charge path: charge under a key, and look an order's charge up.
#[async_trait]
pub trait ChargePath: Send + Sync {
    /// Charges `order` under `idempotency_key`. The request must be a pure function of
    /// the order's fingerprinted fields, so a replay is byte-identical.
    async fn charge(&self, order: &Order, idempotency_key: &str) -> Result<Receipt, PaymentError>;

    /// Looks up the order's live payment among the customer's payments created at or
    /// after `since` (the record's creation less a margin for clocks: the lookup reads
    /// the order's own time, never the customer's whole history): same
    /// `metadata[order_id]`, amount and currency, not cancelled. "Not found" must be
    /// certain (every page read).
    async fn find_payment(&self, order: &Order, since: Time) -> Result<Lookup, PaymentError>;

    /// Cancels the open payment `payment_id`, so that nobody can confirm it any more
    /// (ARCHITECTURE.md, "One success per order").
    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError>;

    /// The payment `id` as the provider holds it, `None` when the provider has no such
    /// payment (which, since it never deletes one, means a wrong setting): what settling
    /// a payment reads (`policy/settle.rs`), and the audit.
    async fn payment_by_id(&self, id: &str) -> Result<Option<ListedPayment>, PaymentError>;
}

/// The refund path: refund a PaymentIntent under a key, and look a refund up.
#[async_trait]
pub trait RefundPath: Send + Sync {
    /// Refunds `request` of the PaymentIntent `payment_id` under `idempotency_key`.
    /// The request is a pure function of the refund's fingerprinted fields and the
    /// payment, so a replay is byte-identical. A refund the bank has not settled is
    /// [`PaymentError::Pending`] with the refund's id.
    async fn refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
        idempotency_key: &str,
    ) -> Result<Receipt, PaymentError>;

    /// The refund of `request` among the PaymentIntent's refunds (its
    /// `metadata[refund_id]`), every page read: succeeded, pending, or none (a refund
    /// that failed or was cancelled returned nothing, and a new key cannot refund
    /// twice).
    async fn find_refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
    ) -> Result<Lookup, PaymentError>;

    /// The refund `id` as the provider holds it, `None` when it has no such refund:
    /// what settling a pending refund reads.
    async fn refund_by_id(&self, id: &str) -> Result<Option<RefundSeen>, PaymentError>;

    /// Every refund created at or after `since`, every page read (the audit). An error,
    /// never a shorter list, when not everything could be read.
    async fn refunds_since(&self, since: Time) -> Result<Vec<ListedRefund>, PaymentError>;

    /// Every refund of the PaymentIntent `payment_id`, whenever made, every page read
    /// (the audit holds their sum against the payment).
    async fn refunds_of_payment(&self, payment_id: &str)
    -> Result<Vec<ListedRefund>, PaymentError>;
}

/// A refund as the audit reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRefund {
    pub id: String,
    /// `metadata[refund_id]`; `None` for a refund this consumer did not make.
    pub refund_id: Option<String>,
    /// `metadata[order_id]`.
    pub order_id: Option<String>,
    /// The PaymentIntent it returns money of.
    pub payment_id: String,
    pub amount: u64,
    /// `succeeded`, `pending`, `failed`, `canceled`, `requires_action`.
    pub status: String,
    pub created: Time,
}

impl ListedRefund {
    /// Whether it took money back from its payment, or may still: neither failed nor
    /// cancelled.
    pub fn takes(&self) -> bool {
        !matches!(self.status.as_str(), "failed" | "canceled")
    }
}

/// A refund as settling reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundSeen {
    /// `succeeded`, `pending`, `failed`, `canceled`, `requires_action`.
    pub status: String,
    /// `metadata[refund_id]`: the request this consumer made it for.
    pub refund_id: Option<String>,
    /// `metadata[order_id]`.
    pub order_id: Option<String>,
    /// Why the bank refused it (`failed`), in Stripe's words.
    pub failure_reason: Option<String>,
}

/// The whole provider, serving both readers (the HTTP client and the local simulator do):
/// what the wiring builds once and hands to each side as the trait it uses.
pub trait PaymentProvider: ChargePath + PaymentListing {}

impl<T: ChargePath + PaymentListing> PaymentProvider for T {}

/// The listing the audit reads: the provider's payments as they are listed (and, by
/// id, through the charge path's [`ChargePath::payment_by_id`]).
#[async_trait]
pub trait PaymentListing: ChargePath {
    /// Every charge created at or after `since`, every page read. An error, never a
    /// shorter list, when not everything could be read.
    async fn payments_since(&self, since: Time) -> Result<Vec<ListedPayment>, PaymentError>;

    /// Every payment that succeeded at or after `since`, whenever it was created: a
    /// PaymentIntent created before the window and confirmed in it (a customer who
    /// authenticates late) is in no listing by creation. Stripe: the
    /// `payment_intent.succeeded` events of the window (kept 30 days), every page read.
    /// An error, never a shorter list, when not everything could be read.
    async fn confirmed_since(&self, since: Time) -> Result<Vec<Confirmation>, PaymentError>;
}

/// A payment that succeeded, and when (Stripe: the `payment_intent.succeeded` event's
/// `created`, its `data.object` the PaymentIntent as it was then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirmation {
    pub at: Time,
    pub payment: ListedPayment,
}

/// What an off-session charge on a saved card says of itself to the card networks
/// (`payment_method_options[card][stored_credential_usage]`, declared from
/// 2026-10-28.endive): a merchant-initiated charge, `unscheduled` unless the shop's
/// orders are `recurring` (a subscription) or `installment`s of one purchase
/// (`STORED_CREDENTIAL_USAGE`). Part of the charge's body, so of what a key was first
/// sent with: changing it strands the keys in flight as a version move does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoredCredentialUsage {
    #[default]
    Unscheduled,
    Recurring,
    Installment,
}

impl StoredCredentialUsage {
    /// The value Stripe takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unscheduled => "unscheduled",
            Self::Recurring => "recurring",
            Self::Installment => "installment",
        }
    }
}
