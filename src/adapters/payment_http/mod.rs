//! The production provider: Stripe's PaymentIntents API over HTTP (`reqwest`; TLS from
//! `tls.rs`), off-session, every request under one pinned `Stripe-Version`.
//!
//! `charge` is `POST /v1/payment_intents` with `confirm=true`, `off_session=true`, an
//! `Idempotency-Key` and a form body that is a pure function of the order's
//! fingerprinted fields and the stored-credential setting, so a replay is byte-identical and the provider answers with
//! the original outcome. `find_payment` lists the customer's PaymentIntents created since
//! the record was (`GET /v1/payment_intents?customer=&created[gte]=`, never Search,
//! which lags) for reconciliation, so earlier orders never lengthen the walk;
//! `cancel` closes an open one. The audit lists the PaymentIntents created in its
//! window (`created[gte]`) and those that succeeded in it, whenever created (the
//! `payment_intent.succeeded` events, `GET /v1/events?type=&created[gte]=`, each
//! one's `data.object`), every page, and looks receipts up by id. Refunds
//! (`refunds.rs`) go through the same client. Answers are
//! classified per ARCHITECTURE.md, "The payment provider".
//!
//! The API key is sent as a sensitive header and never appears in errors, logs or
//! `Debug` output; the provider's error text is never carried into our errors (an
//! auth error echoes fragments of the key), only its status, type and code.

use std::ops::ControlFlow;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Client, Response, StatusCode};

mod answers;
mod classify;
mod refunds;

use answers::{Event, Intent, Listed, Page, better, pick, settle};
use classify::{classify_failure, send_error, unexpected};

use crate::config::Secret;
use crate::contracts::payment::{
    Cancel, ChargePath, Confirmation, ListedPayment, Lookup, PaymentError, PaymentListing, Receipt,
};
use crate::domain::clock::Time;
use crate::domain::order::Order;

pub use crate::contracts::payment::StoredCredentialUsage;
pub use refunds::refund_form;

/// The API version every request is made under, whatever the account's default: an
/// account upgrade in the Dashboard must not reshape the answers under a running
/// function. The answers are read as this version shapes them (the fixtures of the
/// tests below are taken from its API reference). Part of what a stored key was
/// first sent with: moving it while keys are in flight makes their replays
/// `idempotency_error` (docs/deploy.md, "Payment provider").
pub const STRIPE_VERSION: &str = "2026-10-28.endive";
/// The error code 2026-10-28.endive added for a 3-D Secure partner's failure.
const THREE_D_SECURE_UPSTREAM_ERROR: &str = "three_d_secure_authentication_upstream_error";
/// The PaymentIntents endpoint.
const PAYMENT_INTENTS: &str = "/v1/payment_intents";
/// The Events endpoint (Stripe lists the last 30 days).
const EVENTS: &str = "/v1/events";
/// The event of a payment that succeeded.
const SUCCEEDED_EVENT: &str = "payment_intent.succeeded";

/// Page size of a listing, and how many pages reconciliation reads at most.
const PAGE_SIZE: usize = 100;
const MAX_PAGES: usize = 20;
/// How many pages the audit reads at most (a million payments in its window).
const AUDIT_MAX_PAGES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum HttpSetupError {
    #[error("PAYMENT_API_KEY is not a valid header value")]
    InvalidKey,
    #[error("building the HTTP client failed")]
    Client(#[source] reqwest::Error),
}

/// The provider answered something we cannot read; kept as a source error.
#[derive(Debug, thiserror::Error)]
#[error("unexpected provider response: {0}")]
pub struct UnexpectedResponse(&'static str);

/// A Stripe-compatible provider at `base_url`.
pub struct HttpProvider {
    client: Client,
    base_url: String,
    usage: StoredCredentialUsage,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .finish()
    }
}

impl HttpProvider {
    /// `timeout` bounds each call as a whole; connecting gets at most half of it.
    pub fn new(
        base_url: &str,
        api_key: &Secret,
        timeout: Duration,
        tls: &crate::adapters::tls::Tls,
    ) -> Result<Self, HttpSetupError> {
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", api_key.expose()))
            .map_err(|_| HttpSetupError::InvalidKey)?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, auth);
        headers.insert("Stripe-Version", HeaderValue::from_static(STRIPE_VERSION));
        let client = Client::builder()
            .tls_backend_preconfigured(tls.client_config())
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(timeout / 2)
            .user_agent(concat!("charge-once/", env!("CARGO_PKG_VERSION")))
            // A 3xx is answered as a retryable failure that keeps the key, never
            // followed: 307/308 would send the charge again to an address nobody
            // configured, 301-303 turn it into a GET.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(HttpSetupError::Client)?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            usage: StoredCredentialUsage::default(),
        })
    }

    /// The provider with another stored-credential kind for its charges.
    pub fn with_stored_credential_usage(self, usage: StoredCredentialUsage) -> Self {
        Self { usage, ..self }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `…/payment_intents/<id><rest>`, the id escaped as one path segment.
    fn intent_url(&self, id: &str, rest: &[&str]) -> Result<reqwest::Url, PaymentError> {
        self.object_url(PAYMENT_INTENTS, id, rest)
    }

    /// `<collection>/<id><rest>`, the id escaped as one path segment.
    fn object_url(
        &self,
        collection: &str,
        id: &str,
        rest: &[&str],
    ) -> Result<reqwest::Url, PaymentError> {
        let mut url = reqwest::Url::parse(&self.url(collection))
            .map_err(|_| unexpected("PAYMENT_API_URL is not a base URL"))?;
        url.path_segments_mut()
            .map_err(|_| unexpected("PAYMENT_API_URL is not a base URL"))?
            .push(id)
            .extend(rest);
        Ok(url)
    }

    /// Reads `GET /v1/payment_intents?<filter>` page after page (at most
    /// `max_pages`), handing each page to `visit` until it breaks.
    async fn walk_payments<T>(
        &self,
        filter: &[(&'static str, String)],
        max_pages: usize,
        visit: impl FnMut(Vec<Intent>) -> ControlFlow<T>,
    ) -> Result<Walk<T>, PaymentError> {
        self.walk(PAYMENT_INTENTS, filter, max_pages, visit).await
    }

    /// Reads `GET <path>?<filter>` page after page (at most `max_pages`, `PAGE_SIZE`
    /// a page, each after the last one's id), handing each page to `visit` until it
    /// breaks.
    async fn walk<O: Listed + serde::de::DeserializeOwned, T>(
        &self,
        path: &str,
        filter: &[(&'static str, String)],
        max_pages: usize,
        mut visit: impl FnMut(Vec<O>) -> ControlFlow<T>,
    ) -> Result<Walk<T>, PaymentError> {
        let mut starting_after: Option<String> = None;
        for _ in 0..max_pages {
            let mut query = filter.to_vec();
            query.push(("limit", PAGE_SIZE.to_string()));
            if let Some(after) = &starting_after {
                query.push(("starting_after", after.clone()));
            }
            let request = self.client.get(self.url(path)).query(&query);
            let page: Page<O> = send_json(request, "a listing that is not a list").await?;
            let next = match page.data.last() {
                Some(last) if page.has_more => Some(last.id().to_owned()),
                _ => None,
            };
            if let ControlFlow::Break(found) = visit(page.data) {
                return Ok(Walk::Stopped(found));
            }
            match next {
                Some(after) => starting_after = Some(after),
                None => return Ok(Walk::Read),
            }
        }
        Ok(Walk::Truncated)
    }
}

/// How a walk through the payment listing ended.
enum Walk<T> {
    /// The visitor found what it wanted.
    Stopped(T),
    /// Every page was read.
    Read,
    /// More pages than the walk may read: what was read is not the whole answer.
    Truncated,
}

/// The form body of a payment: only fingerprinted fields, the stored-credential
/// setting and constants, in a fixed order, so a replay under the same key is
/// byte-identical. An order without a payment
/// method is never sent (the state machine refuses it before any call).
///
/// `automatic_payment_methods` with `allow_redirects=never`: without
/// `payment_method_types` (which the pinned version no longer takes) a PaymentIntent
/// accepts the Dashboard's methods, some of which redirect, and Stripe refuses to
/// confirm it without a `return_url` unless redirects are excluded. Off-session, no
/// redirect could be followed anyway. `usage`: [`StoredCredentialUsage`].
pub fn charge_form(order: &Order, usage: StoredCredentialUsage) -> [(&'static str, String); 11] {
    [
        ("amount", order.amount().to_string()),
        ("currency", order.currency().to_ascii_lowercase()),
        ("customer", order.customer().to_owned()),
        ("payment_method", order.payment_method().to_owned()),
        ("confirm", "true".to_owned()),
        ("off_session", "true".to_owned()),
        ("automatic_payment_methods[enabled]", "true".to_owned()),
        (
            "automatic_payment_methods[allow_redirects]",
            "never".to_owned(),
        ),
        (
            "payment_method_options[card][stored_credential_usage]",
            usage.as_str().to_owned(),
        ),
        ("description", format!("order {}", order.id())),
        ("metadata[order_id]", order.id().to_owned()),
    ]
}

/// Sends `request`; a 2xx body is read as `T` (`what` names it if it cannot be), any
/// other status is classified.
async fn send_json<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    what: &'static str,
) -> Result<T, PaymentError> {
    read_json(request.send().await.map_err(send_error)?, what).await
}

async fn read_json<T: serde::de::DeserializeOwned>(
    response: Response,
    what: &'static str,
) -> Result<T, PaymentError> {
    if !response.status().is_success() {
        return Err(classify_failure(response).await);
    }
    response.json().await.map_err(|_| unexpected(what))
}

#[async_trait]
impl ChargePath for HttpProvider {
    async fn charge(&self, order: &Order, idempotency_key: &str) -> Result<Receipt, PaymentError> {
        let request = self
            .client
            .post(self.url(PAYMENT_INTENTS))
            .header("Idempotency-Key", idempotency_key)
            .form(&charge_form(order, self.usage));
        let response = request.send().await.map_err(send_error)?;
        // The provider has the request and answered; nothing of it is read yet.
        crate::crash_points::reached("charge-sent");
        let intent: Intent = read_json(response, "a 2xx answer without a PaymentIntent id").await?;
        settle(intent)
    }

    async fn find_payment(&self, order: &Order, since: Time) -> Result<Lookup, PaymentError> {
        let mut best = None;
        let filter = [
            ("customer", order.customer().to_owned()),
            ("created[gte]", since.as_secs().to_string()),
        ];
        let walk = self
            .walk_payments(&filter, MAX_PAGES, |page| match pick(&page, order) {
                found @ Lookup::Succeeded(_) => ControlFlow::Break(found),
                // A later page may still hold a succeeded payment: keep reading.
                other => {
                    best = better(best.take(), other);
                    ControlFlow::Continue(())
                }
            })
            .await?;
        match walk {
            Walk::Stopped(found) => Ok(found),
            Walk::Read => Ok(best.unwrap_or(Lookup::NotFound)),
            // "Not found" must be certain: a new key after an incomplete search could
            // charge twice.
            Walk::Truncated => Err(unexpected(
                "more PaymentIntents than reconciliation reads; settle by hand",
            )),
        }
    }

    async fn cancel(&self, payment_id: &str) -> Result<Cancel, PaymentError> {
        let url = self.intent_url(payment_id, &["cancel"])?;
        let response = self.client.post(url).send().await.map_err(send_error)?;
        if response.status().is_success() {
            return Ok(Cancel::Cancelled);
        }
        match classify_failure(response).await {
            // It is not in a cancellable state any more (it succeeded, is processing,
            // or was cancelled): the caller looks again.
            PaymentError::Rejected { status: 400, .. } => Ok(Cancel::NotCancellable),
            other => Err(other),
        }
    }

    async fn payment_by_id(&self, id: &str) -> Result<Option<ListedPayment>, PaymentError> {
        // A receipt is whatever the table holds: one path segment, escaped.
        let url = self.intent_url(id, &[])?;
        let response = self.client.get(url).send().await.map_err(send_error)?;
        if response.status() == StatusCode::NOT_FOUND {
            // No such charge only when the provider says so; any other 404 is an
            // address that reaches no endpoint, and "none" would be a false finding.
            return match classify_failure(response).await {
                PaymentError::Rejected { .. } => Ok(None),
                other => Err(other),
            };
        }
        let intent: Intent =
            read_json(response, "a PaymentIntent that is not a PaymentIntent").await?;
        Ok(Some(intent.listed()))
    }
}

#[async_trait]
impl PaymentListing for HttpProvider {
    async fn payments_since(&self, since: Time) -> Result<Vec<ListedPayment>, PaymentError> {
        let mut payments = Vec::new();
        let filter = [("created[gte]", since.as_secs().to_string())];
        let walk = self
            .walk_payments(&filter, AUDIT_MAX_PAGES, |page| {
                // Filtered here too: a provider that ignores `created[gte]` lists more.
                // A charge without a creation time is kept: an audit never drops one.
                payments.extend(
                    page.into_iter()
                        .filter(|c| c.created.is_none_or(|s| s >= since.as_secs()))
                        .map(Intent::listed),
                );
                ControlFlow::<()>::Continue(())
            })
            .await?;
        match walk {
            Walk::Read | Walk::Stopped(()) => Ok(payments),
            Walk::Truncated => Err(unexpected(
                "more PaymentIntents than the audit reads; narrow --since",
            )),
        }
    }

    async fn confirmed_since(&self, since: Time) -> Result<Vec<Confirmation>, PaymentError> {
        let mut confirmed = Vec::new();
        let filter = [
            ("type", SUCCEEDED_EVENT.to_owned()),
            ("created[gte]", since.as_secs().to_string()),
        ];
        let walk = self
            .walk(EVENTS, &filter, AUDIT_MAX_PAGES, |page: Vec<Event>| {
                // Filtered here too, as the PaymentIntents are: a provider that ignores
                // the filters lists more (an event without a time is kept).
                confirmed.extend(
                    page.into_iter()
                        .filter(|e| e.kind.as_deref().is_none_or(|k| k == SUCCEEDED_EVENT))
                        .filter(|e| e.created.is_none_or(|s| s >= since.as_secs()))
                        .map(Event::confirmation),
                );
                ControlFlow::<()>::Continue(())
            })
            .await?;
        match walk {
            Walk::Read | Walk::Stopped(()) => Ok(confirmed),
            Walk::Truncated => Err(unexpected(
                "more payment_intent.succeeded events than the audit reads; narrow --since",
            )),
        }
    }
}

#[cfg(test)]
mod tests;
