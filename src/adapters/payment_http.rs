//! The production provider: a Stripe-compatible HTTP client (`reqwest`; TLS from `tls.rs`).
//!
//! `charge` is `POST /v1/charges` with an `Idempotency-Key` and a form body that is a
//! pure function of the order's fingerprinted fields, so a replay is byte-identical
//! and the provider answers with the original outcome. `find_charge` lists the
//! customer's charges for reconciliation. Responses are classified per ARCHITECTURE.md, "The state machine".
//!
//! The API key is sent as a sensitive header and never appears in errors, logs or
//! `Debug` output; the provider's error text is never carried into our errors (an
//! auth error echoes fragments of the key), only its status, type and code.

use std::ops::ControlFlow;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Client, Response, StatusCode};
use serde::Deserialize;

use crate::config::Secret;
use crate::contracts::payment::{
    ChargeListing, ChargePath, FailureKind, ListedCharge, Lookup, PaymentError, Receipt,
};
use crate::domain::clock::Time;
use crate::domain::order::Order;

/// Page size of a charge listing, and how many pages reconciliation reads at most.
const PAGE_SIZE: usize = 100;
const MAX_PAGES: usize = 20;
/// How many pages the audit reads at most (a million charges in its window).
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
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Reads `GET /v1/charges?<filter>` page after page (at most `max_pages`), handing
    /// each page to `visit` until it breaks.
    async fn walk_charges<T>(
        &self,
        filter: (&'static str, String),
        max_pages: usize,
        mut visit: impl FnMut(Vec<Charge>) -> ControlFlow<T>,
    ) -> Result<Walk<T>, PaymentError> {
        let mut starting_after: Option<String> = None;
        for _ in 0..max_pages {
            let mut query = vec![filter.clone(), ("limit", PAGE_SIZE.to_string())];
            if let Some(after) = &starting_after {
                query.push(("starting_after", after.clone()));
            }
            let request = self.client.get(self.url("/v1/charges")).query(&query);
            let page: ChargeList =
                send_json(request, "a charge listing that is not a list").await?;
            let next = match page.data.last() {
                Some(last) if page.has_more => Some(last.id.clone()),
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

/// How a walk through the charge listing ended.
enum Walk<T> {
    /// The visitor found what it wanted.
    Stopped(T),
    /// Every page was read.
    Read,
    /// More pages than the walk may read: what was read is not the whole answer.
    Truncated,
}

/// The form body of a charge: only fingerprinted fields, in a fixed order.
pub fn charge_form(order: &Order) -> [(&'static str, String); 5] {
    [
        ("amount", order.amount().to_string()),
        ("currency", order.currency().to_ascii_lowercase()),
        ("customer", order.customer().to_owned()),
        ("description", format!("order {}", order.id())),
        ("metadata[order_id]", order.id().to_owned()),
    ]
}

#[derive(Deserialize)]
struct Charge {
    id: String,
    #[serde(default)]
    amount: Option<u64>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    metadata: Option<std::collections::HashMap<String, String>>,
    #[serde(default)]
    customer: Option<String>,
    /// Seconds since the epoch.
    #[serde(default)]
    created: Option<i64>,
}

impl Charge {
    fn listed(self) -> ListedCharge {
        ListedCharge {
            order_id: self.metadata.and_then(|mut m| m.remove("order_id")),
            amount: self.amount.unwrap_or(0),
            currency: self.currency.unwrap_or_default(),
            customer: self.customer,
            status: self.status.unwrap_or_else(|| "unknown".to_owned()),
            created: Time::from_secs(self.created.unwrap_or(0)),
            id: self.id,
        }
    }

    fn is_for(&self, order: &Order) -> bool {
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

/// The order's charge on one page: a succeeded one wins; otherwise any status but
/// `failed` (pending bank debits, `processing`, an unknown new status) is live.
fn pick(charges: &[Charge], order: &Order) -> Lookup {
    let mine = || charges.iter().filter(|c| c.is_for(order));
    if let Some(paid) = mine().find(|c| c.status.as_deref() == Some("succeeded")) {
        return Lookup::Succeeded(Receipt {
            id: paid.id.clone(),
        });
    }
    match mine().find(|c| c.status.as_deref() != Some("failed")) {
        Some(live) => Lookup::Pending {
            charge_id: live.id.clone(),
            status: live.status.clone().unwrap_or_else(|| "unknown".to_owned()),
        },
        None => Lookup::NotFound,
    }
}

#[derive(Deserialize)]
struct ChargeList {
    data: Vec<Charge>,
    #[serde(default)]
    has_more: bool,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    error: ErrorDetail,
}

/// Only the machine-readable parts of a provider error; never its `message`.
#[derive(Deserialize, Default)]
struct ErrorDetail {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
}

fn send_error(e: reqwest::Error) -> PaymentError {
    let kind = if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Connection
    };
    PaymentError::Retryable {
        kind,
        // reqwest's error names the URL (no secret in it), never the headers.
        source: Some(Box::new(e.without_url())),
    }
}

fn unexpected(what: &'static str) -> PaymentError {
    PaymentError::Retryable {
        kind: FailureKind::BadResponse,
        source: Some(Box::new(UnexpectedResponse(what))),
    }
}

/// Classifies a non-2xx answer (ARCHITECTURE.md, "The state machine"). Only a 402 moves to the next attempt.
async fn classify_failure(response: Response) -> PaymentError {
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // The body of an auth error echoes parts of the key: never read it.
        return PaymentError::retryable(FailureKind::Unauthorized);
    }
    let body: ErrorBody = match response.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(_) => ErrorBody::default(),
    };
    let detail = body.error;
    match status.as_u16() {
        402 => PaymentError::Declined {
            code: detail.code.unwrap_or_else(|| "card_declined".to_owned()),
            decline_code: detail.decline_code,
        },
        400 if detail.kind.as_deref() == Some("idempotency_error") => PaymentError::KeyReused,
        // Permanent: the same request is refused again. Its code says why (never its
        // message, which may quote the request).
        400 => PaymentError::Rejected {
            status: 400,
            code: detail.code,
        },
        // A 404 is the order's only when the provider names a missing object of it
        // (`resource_missing`: no such customer). Any other 404 means the address
        // reached no endpoint: every order would fail alike, so it is a setting to fix,
        // retried, never blamed on the order.
        404 if detail.code.as_deref() == Some("resource_missing") => PaymentError::Rejected {
            status: 404,
            code: detail.code,
        },
        404 => PaymentError::retryable(FailureKind::NoEndpoint),
        409 => PaymentError::retryable(FailureKind::Conflict),
        429 => PaymentError::retryable(FailureKind::RateLimited),
        s @ 500..=599 if replayed => PaymentError::ReplayedServerError { status: s },
        s @ 500..=599 => PaymentError::retryable(FailureKind::Server(s)),
        s @ 300..=399 => PaymentError::retryable(FailureKind::Redirect(s)),
        s => PaymentError::retryable(FailureKind::Client(s)),
    }
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
            .post(self.url("/v1/charges"))
            .header("Idempotency-Key", idempotency_key)
            .form(&charge_form(order));
        let response = request.send().await.map_err(send_error)?;
        // The provider has the request and answered; nothing of it is read yet.
        crate::crash_points::reached("charge-sent");
        let charge: Charge =
            read_json(response, "a 2xx charge response without a charge id").await?;
        match charge.status.as_deref() {
            // Stripe answers a failed card charge with 402; a 2xx "failed" is the same.
            Some("failed") => Err(PaymentError::Declined {
                code: "card_declined".to_owned(),
                decline_code: None,
            }),
            // Only a final success is a receipt: a pending charge (bank debits, some
            // wallets) may still fail, and an acknowledged order must be paid. A charge
            // without a status is unknown, as the lookup and the audit read it: when in
            // doubt, the record fails (the key is kept, and the retry reconciles).
            Some("succeeded") => Ok(Receipt { id: charge.id }),
            status => Err(PaymentError::Pending {
                charge_id: charge.id,
                status: status.unwrap_or("unknown").to_owned(),
            }),
        }
    }

    async fn find_charge(&self, order: &Order) -> Result<Lookup, PaymentError> {
        let mut pending = None;
        let filter = ("customer", order.customer().to_owned());
        let walk = self
            .walk_charges(filter, MAX_PAGES, |page| match pick(&page, order) {
                found @ Lookup::Succeeded(_) => ControlFlow::Break(found),
                // A later page may still hold a succeeded charge: keep reading.
                live @ Lookup::Pending { .. } => {
                    pending = pending.take().or(Some(live));
                    ControlFlow::Continue(())
                }
                Lookup::NotFound => ControlFlow::Continue(()),
            })
            .await?;
        match walk {
            Walk::Stopped(found) => Ok(found),
            Walk::Read => Ok(pending.unwrap_or(Lookup::NotFound)),
            // "Not found" must be certain: a new key after an incomplete search could
            // charge twice.
            Walk::Truncated => Err(unexpected(
                "more charges than reconciliation reads; settle by hand",
            )),
        }
    }
}

#[async_trait]
impl ChargeListing for HttpProvider {
    async fn charges_since(&self, since: Time) -> Result<Vec<ListedCharge>, PaymentError> {
        let mut charges = Vec::new();
        let filter = ("created[gte]", since.as_secs().to_string());
        let walk = self
            .walk_charges(filter, AUDIT_MAX_PAGES, |page| {
                // Filtered here too: a provider that ignores `created[gte]` lists more.
                // A charge without a creation time is kept: an audit never drops one.
                charges.extend(
                    page.into_iter()
                        .filter(|c| c.created.is_none_or(|s| s >= since.as_secs()))
                        .map(Charge::listed),
                );
                ControlFlow::<()>::Continue(())
            })
            .await?;
        match walk {
            Walk::Read | Walk::Stopped(()) => Ok(charges),
            Walk::Truncated => Err(unexpected(
                "more charges than the audit reads; narrow --since",
            )),
        }
    }

    async fn charge_by_id(&self, id: &str) -> Result<Option<ListedCharge>, PaymentError> {
        let mut url = reqwest::Url::parse(&self.url("/v1/charges"))
            .map_err(|_| unexpected("PAYMENT_API_URL is not a base URL"))?;
        // A receipt is whatever the table holds: one path segment, escaped.
        url.path_segments_mut()
            .map_err(|_| unexpected("PAYMENT_API_URL is not a base URL"))?
            .push(id);
        let response = self.client.get(url).send().await.map_err(send_error)?;
        if response.status() == StatusCode::NOT_FOUND {
            // No such charge only when the provider says so; any other 404 is an
            // address that reaches no endpoint, and "none" would be a false finding.
            return match classify_failure(response).await {
                PaymentError::Rejected { .. } => Ok(None),
                other => Err(other),
            };
        }
        let charge: Charge = read_json(response, "a charge that is not a charge").await?;
        Ok(Some(charge.listed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charge_body_depends_only_on_fingerprinted_fields() {
        let a = Order::parse(
            r#"{"id":"o-1","amount":5000,"currency":"eur","customer":"cus_1","ts":1}"#,
        )
        .unwrap();
        let b = Order::parse(
            r#"{"id":"o-1","amount":5000,"currency":"EUR","customer":"cus_1","ts":2}"#,
        )
        .unwrap();
        assert_eq!(charge_form(&a), charge_form(&b));
        assert_eq!(charge_form(&a)[1], ("currency", "eur".to_owned()));
        assert_eq!(charge_form(&a)[4], ("metadata[order_id]", "o-1".to_owned()));
    }

    fn charge(id: &str, status: &str, amount: u64, currency: &str, order_id: &str) -> Charge {
        Charge {
            id: id.to_owned(),
            amount: Some(amount),
            currency: Some(currency.to_owned()),
            status: Some(status.to_owned()),
            metadata: Some([("order_id".to_owned(), order_id.to_owned())].into()),
            customer: Some("cus_1".to_owned()),
            created: Some(1_700_000_000),
        }
    }

    #[test]
    fn a_pending_charge_of_the_order_is_live_and_a_failed_one_is_not() {
        let order = Order::new("o-1", 5000, "EUR", "cus_1").unwrap();
        let failed = charge("ch_f", "failed", 5000, "eur", "o-1");
        let pending = charge("py_p", "pending", 5000, "eur", "o-1");
        let paid = charge("ch_s", "succeeded", 5000, "eur", "o-1");
        assert_eq!(pick(&[failed], &order), Lookup::NotFound);
        let failed = charge("ch_f", "failed", 5000, "eur", "o-1");
        assert_eq!(
            pick(&[failed, pending], &order),
            Lookup::Pending {
                charge_id: "py_p".into(),
                status: "pending".into()
            }
        );
        let pending = charge("py_p", "pending", 5000, "eur", "o-1");
        assert_eq!(
            pick(&[pending, paid], &order),
            Lookup::Succeeded(Receipt { id: "ch_s".into() })
        );
        // Another order, amount or currency is not this order's charge.
        for other in [
            charge("x", "succeeded", 5000, "eur", "o-2"),
            charge("x", "succeeded", 5001, "eur", "o-1"),
            charge("x", "succeeded", 5000, "usd", "o-1"),
        ] {
            assert_eq!(pick(&[other], &order), Lookup::NotFound);
        }
    }

    #[test]
    fn debug_output_hides_the_api_key() {
        let key = Secret::new("sk_test_hideme12345".to_owned());
        let provider = HttpProvider::new(
            "http://127.0.0.1:1",
            &key,
            Duration::from_secs(1),
            &crate::adapters::tls::Tls::new(None).unwrap(),
        )
        .unwrap();
        assert!(!format!("{provider:?}").contains("hideme"));
    }
}
