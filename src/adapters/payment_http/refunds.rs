//! Refunds over the same client: `POST /v1/refunds` on an order's PaymentIntent under
//! the refund's own idempotency key, with a form body that is a pure function of the
//! refund request (a replay is byte-identical), and the lookup of a refund among the
//! PaymentIntent's (`GET /v1/refunds?payment_intent=`, matched on
//! `metadata[refund_id]`, every page read).

use std::ops::ControlFlow;

use async_trait::async_trait;
use serde::Deserialize;

use super::answers::Listed;
use super::classify::{classify_failure, send_error, unexpected};
use super::{AUDIT_MAX_PAGES, HttpProvider, MAX_PAGES, Walk, read_json};
use crate::contracts::payment::{
    ListedRefund, Lookup, PaymentError, Receipt, RefundPath, RefundSeen,
};
use crate::domain::clock::Time;
use crate::domain::refund::RefundRequest;

/// The Refunds endpoint.
const REFUNDS: &str = "/v1/refunds";

/// A refund as Stripe answers it (docs.stripe.com/api/refunds/object).
#[derive(Deserialize)]
struct Refund {
    id: String,
    status: String,
    #[serde(default)]
    metadata: std::collections::HashMap<String, String>,
    #[serde(default)]
    failure_reason: Option<String>,
    #[serde(default)]
    payment_intent: Option<String>,
    #[serde(default)]
    amount: u64,
    #[serde(default)]
    created: i64,
}

impl Listed for Refund {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Refund {
    /// As the audit reads it.
    fn listed(mut self) -> ListedRefund {
        ListedRefund {
            refund_id: self.metadata.remove("refund_id"),
            order_id: self.metadata.remove("order_id"),
            payment_id: self.payment_intent.unwrap_or_default(),
            amount: self.amount,
            created: Time::from_secs(self.created),
            id: self.id,
            status: self.status,
        }
    }

    /// A listed refund that returned or may return money (a failed or cancelled one
    /// returned nothing): succeeded, or still in flight.
    fn found(self) -> Lookup {
        match self.status.as_str() {
            "succeeded" => Lookup::Succeeded(Receipt::new(self.id)),
            _ => Lookup::Pending {
                payment_id: self.id,
                status: self.status,
            },
        }
    }

    /// A created refund: a receipt once it succeeded; pending at the bank (or asking
    /// for an action, as a lookup reads it too), awaited; `failed` or `canceled` at
    /// once is for a person.
    fn settled(self) -> Result<Receipt, PaymentError> {
        match self.status.as_str() {
            "succeeded" => Ok(Receipt::new(self.id)),
            "pending" | "requires_action" => Err(PaymentError::Pending {
                payment_id: self.id,
                status: self.status,
            }),
            _ => Err(PaymentError::UnexpectedStatus {
                payment_id: self.id,
                status: self.status,
            }),
        }
    }
}

/// The form body of a refund: the PaymentIntent, the request's fields and its ids, in
/// a fixed order.
pub fn refund_form(request: &RefundRequest, payment_id: &str) -> Vec<(&'static str, String)> {
    let mut form = vec![("payment_intent", payment_id.to_owned())];
    if let Some(amount) = request.amount() {
        form.push(("amount", amount.to_string()));
    }
    if let Some(reason) = request.reason() {
        form.push(("reason", reason.as_str().to_owned()));
    }
    form.push(("metadata[refund_id]", request.id().to_owned()));
    form.push(("metadata[order_id]", request.order_id().to_owned()));
    form
}

#[async_trait]
impl RefundPath for HttpProvider {
    async fn refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
        idempotency_key: &str,
    ) -> Result<Receipt, PaymentError> {
        let response = self
            .client
            .post(self.url(REFUNDS))
            .header("Idempotency-Key", idempotency_key)
            .form(&refund_form(request, payment_id))
            .send()
            .await
            .map_err(send_error)?;
        let refund: Refund = read_json(response, "a 2xx answer without a refund").await?;
        refund.settled()
    }

    async fn find_refund(
        &self,
        request: &RefundRequest,
        payment_id: &str,
    ) -> Result<Lookup, PaymentError> {
        let filter = [("payment_intent", payment_id.to_owned())];
        let walk = self
            .walk(REFUNDS, &filter, MAX_PAGES, |page: Vec<Refund>| {
                let mine = page.into_iter().find(|refund| {
                    refund.metadata.get("refund_id").map(String::as_str) == Some(request.id())
                        && !matches!(refund.status.as_str(), "failed" | "canceled")
                });
                match mine {
                    Some(refund) => ControlFlow::Break(refund.found()),
                    None => ControlFlow::Continue(()),
                }
            })
            .await?;
        match walk {
            Walk::Stopped(found) => Ok(found),
            Walk::Read => Ok(Lookup::NotFound),
            // "Not found" must be certain: a new key after an incomplete search could
            // refund twice.
            Walk::Truncated => Err(unexpected(
                "more refunds of the payment than a lookup reads; settle by hand",
            )),
        }
    }

    async fn refunds_since(&self, since: Time) -> Result<Vec<ListedRefund>, PaymentError> {
        let filter = [("created[gte]", since.as_secs().to_string())];
        self.every_refund(&filter).await
    }

    async fn refunds_of_payment(
        &self,
        payment_id: &str,
    ) -> Result<Vec<ListedRefund>, PaymentError> {
        let filter = [("payment_intent", payment_id.to_owned())];
        self.every_refund(&filter).await
    }

    async fn refund_by_id(&self, id: &str) -> Result<Option<RefundSeen>, PaymentError> {
        // A receipt is whatever the table holds: one path segment, escaped.
        let url = self.object_url(REFUNDS, id, &[])?;
        let response = self.client.get(url).send().await.map_err(send_error)?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            // No such refund only when the provider says so (`resource_missing`).
            return match classify_failure(response).await {
                PaymentError::Rejected { .. } => Ok(None),
                other => Err(other),
            };
        }
        let mut refund: Refund = read_json(response, "a refund that is not a refund").await?;
        Ok(Some(RefundSeen {
            refund_id: refund.metadata.remove("refund_id"),
            order_id: refund.metadata.remove("order_id"),
            status: refund.status,
            failure_reason: refund.failure_reason,
        }))
    }
}

impl HttpProvider {
    /// Every refund `GET /v1/refunds?<filter>` lists, every page: an error, never a
    /// shorter list.
    async fn every_refund(
        &self,
        filter: &[(&'static str, String)],
    ) -> Result<Vec<ListedRefund>, PaymentError> {
        let mut refunds = Vec::new();
        let walk = self
            .walk(REFUNDS, filter, AUDIT_MAX_PAGES, |page: Vec<Refund>| {
                refunds.extend(page.into_iter().map(Refund::listed));
                ControlFlow::<()>::Continue(())
            })
            .await?;
        match walk {
            Walk::Read => Ok(refunds),
            Walk::Stopped(()) | Walk::Truncated => Err(unexpected(
                "more refunds than the audit reads; audit a shorter window",
            )),
        }
    }
}
