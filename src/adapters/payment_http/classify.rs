//! How an answer that is not a 2xx reads (ARCHITECTURE.md, "The payment provider"):
//! the status, Stripe's error body and its headers (`Stripe-Should-Retry`,
//! `Stripe-Rate-Limited-Reason`, `Idempotent-Replayed`) become one [`PaymentError`];
//! and a request that got no answer at all.

use reqwest::{Response, StatusCode};

use super::answers::ErrorBody;
use super::{THREE_D_SECURE_UPSTREAM_ERROR, UnexpectedResponse};
use crate::contracts::payment::{AUTHENTICATION_REQUIRED, FailureKind, Limiter, PaymentError};

pub(super) fn send_error(e: reqwest::Error) -> PaymentError {
    let kind = if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Connection
    };
    PaymentError::Retryable {
        kind,
        // reqwest's error names the URL (no secret in it), never the headers.
        source: Some(Box::new(e.without_url())),
        should_retry: None,
    }
}

pub(super) fn unexpected(what: &'static str) -> PaymentError {
    PaymentError::Retryable {
        kind: FailureKind::BadResponse,
        source: Some(Box::new(UnexpectedResponse(what))),
        should_retry: None,
    }
}

/// Classifies a non-2xx answer (ARCHITECTURE.md, "The payment provider"). Only a
/// decline moves to the next attempt; `Stripe-Should-Retry` is kept with a retryable
/// failure, and obeyed before the status.
pub(super) async fn classify_failure(response: Response) -> PaymentError {
    let should_retry = header_flag(&response, "stripe-should-retry");
    let limiter = response
        .headers()
        .get("stripe-rate-limited-reason")
        .and_then(|v| v.to_str().ok())
        .map(Limiter::from_header);
    let mut failure = classify_body(response, limiter).await;
    if let PaymentError::Retryable {
        should_retry: advice,
        ..
    } = &mut failure
    {
        *advice = should_retry;
    }
    failure
}

/// The restricted-key permissions a charge-once key may need (docs/deploy.md, "Keys"):
/// the one a 403's message names, when it is one of these.
pub(super) const PERMISSIONS: [&str; 8] = [
    "rak_payment_intent_write",
    "rak_refund_write",
    "rak_refund_read",
    "rak_payment_intent_read",
    "rak_event_read",
    "rak_charge_read",
    "rak_customer_read",
    "rak_payment_method_read",
];

/// The known permission `message` names (`… Having the 'rak_event_read' permission
/// would allow this request to continue.`).
pub(super) fn permission_named(message: &str) -> Option<&'static str> {
    PERMISSIONS
        .into_iter()
        .find(|p| message.contains(&format!("'{p}'")))
}

/// A `true`/`false` header, when sent.
pub(super) fn header_flag(response: &Response, name: &str) -> Option<bool> {
    let value = response.headers().get(name)?.as_bytes();
    if value.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

/// `limiter`: the `Stripe-Rate-Limited-Reason` header, when sent.
pub(super) async fn classify_body(response: Response, limiter: Option<Limiter>) -> PaymentError {
    let status = response.status();
    let replayed = header_flag(&response, "idempotent-replayed") == Some(true);
    if status == StatusCode::UNAUTHORIZED {
        // The body of an auth error echoes parts of the key: never read it.
        return PaymentError::retryable(FailureKind::Unauthorized);
    }
    if status == StatusCode::FORBIDDEN {
        // Its message quotes part of the key too: only the permission it names is
        // taken from it, and only one this code knows by name.
        let permission = match response.bytes().await {
            Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|b| b["error"]["message"].as_str().and_then(permission_named)),
            Err(_) => None,
        };
        return PaymentError::retryable(FailureKind::Forbidden(permission));
    }
    let body: ErrorBody = match response.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(_) => ErrorBody::default(),
    };
    let detail = body.error;
    // The 3-D Secure partner's error is the provider's, whatever 4xx carries it; a 5xx
    // keeps its own meaning below (a stored one must be looked up).
    if status.is_client_error() && detail.code.as_deref() == Some(THREE_D_SECURE_UPSTREAM_ERROR) {
        return PaymentError::retryable(FailureKind::AuthenticationUpstream);
    }
    match status.as_u16() {
        // Only the customer, back on the shop's page, can complete this payment.
        402 if detail.code.as_deref() == Some(AUTHENTICATION_REQUIRED)
            || detail.decline_code.as_deref() == Some(AUTHENTICATION_REQUIRED) =>
        {
            PaymentError::AuthenticationRequired {
                payment_id: detail.payment_intent.map(|pi| pi.id),
            }
        }
        402 => PaymentError::Declined {
            code: detail.code.unwrap_or_else(|| "card_declined".to_owned()),
            decline_code: detail.decline_code,
            payment_id: detail.payment_intent.map(|pi| pi.id),
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
        // A limiter names itself in a header; a lock has none (Stripe's
        // docs.stripe.com/rate-limits): contention on one object, not load.
        429 => match (limiter, detail.code.as_deref()) {
            (Some(limiter), _) => PaymentError::retryable(FailureKind::RateLimited(limiter)),
            (None, Some("lock_timeout")) => PaymentError::retryable(FailureKind::Lock),
            (None, _) => PaymentError::retryable(FailureKind::RateLimited(Limiter::Unnamed)),
        },
        s @ 500..=599 if replayed => PaymentError::ReplayedServerError { status: s },
        s @ 500..=599 => PaymentError::retryable(FailureKind::Server(s)),
        s @ 300..=399 => PaymentError::retryable(FailureKind::Redirect(s)),
        s => PaymentError::retryable(FailureKind::Client(s)),
    }
}
