//! `resolve`: a human settles a record that cannot settle itself (a DLQ'd
//! `needs_reconciliation`, a stuck lease) by asking the provider. Found → `hecho` with
//! that charge; not found → `libre` with the next attempt, so a redrive charges once
//! under a new key. Every write goes through a lease, so it never races a consumer.

use super::machine::Settings;
use super::{
    CompleteRequest, Estado, FenceOutcome, IdempotencyStore, Record, ReleaseRequest,
    ResolveLeaseRequest, StoreError,
};
use crate::order::Order;
use crate::payment::{PaymentError, PaymentProvider};

/// What `resolve` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The provider has the charge: the record is now `hecho` with it.
    Completed { recibo: String, attempt: u32 },
    /// The provider has no charge: the record is `libre` with the next attempt.
    Released { next_attempt: u32 },
    /// Already `hecho`: nothing to do.
    AlreadyDone { recibo: Option<String> },
}

/// Why `resolve` did nothing (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no record for this order: nothing to resolve")]
    NoRecord,
    #[error("a live lease is held until {until_ms} ms epoch: wait for it to end")]
    LiveLease { until_ms: i64 },
    #[error("the order given does not match the recorded fingerprint (a conflicting payload?)")]
    FingerprintMismatch,
    #[error(
        "the record was written by the card's consumer, which gave the provider no key, so \
         its charge cannot be found by order id: check the provider by hand, then pass \
         --card-format-checked"
    )]
    CardFormat,
    #[error("the record changed while resolving; run resolve again")]
    Changed,
    #[error("store")]
    Store(#[from] StoreError),
    #[error("provider lookup")]
    Provider(#[source] PaymentError),
}

/// Settles `order`'s record by asking the provider. `card_format_checked`: a human
/// confirmed at the provider that a card-format record's order was not charged (or
/// the lookup will find it).
pub async fn resolve(
    store: &dyn IdempotencyStore,
    provider: &dyn PaymentProvider,
    settings: &Settings,
    order: &Order,
    card_format_checked: bool,
) -> Result<Resolution, ResolveError> {
    let pk = order.key();
    let huella = order.fingerprint();
    let now_ms = settings.now_ms();
    let record = store.get(&pk).await?.ok_or(ResolveError::NoRecord)?;
    if record.estado == Estado::Hecho {
        return Ok(Resolution::AlreadyDone {
            recibo: record.recibo,
        });
    }
    check(&record, &huella, now_ms, card_format_checked)?;

    let titular = format!("resolve-{}", uuid::Uuid::new_v4());
    let lease_until_ms = now_ms.saturating_add(
        i64::try_from((settings.payment_timeout * 3).as_millis()).unwrap_or(i64::MAX),
    );
    let lease = ResolveLeaseRequest {
        pk: &pk,
        huella: &huella,
        titular: &titular,
        now_ms,
        lease_until_ms,
    };
    let leased = match store.lease_for_resolve(&lease).await? {
        FenceOutcome::Applied(record) => record,
        FenceOutcome::Refused(_) => return Err(ResolveError::Changed),
    };
    let attempt = leased.attempt();
    let release = |next_attempt| ReleaseRequest {
        pk: &pk,
        titular: &titular,
        next_attempt,
    };

    let found = match provider.find_charge(order).await {
        Ok(found) => found,
        Err(e) => {
            store.release(&release(false)).await?;
            return Err(ResolveError::Provider(e));
        }
    };
    match found {
        Some(receipt) => {
            let retention_s = i64::try_from(settings.retention.as_secs()).unwrap_or(i64::MAX);
            let done = CompleteRequest {
                pk: &pk,
                titular: &titular,
                intento: attempt,
                recibo: &receipt.id,
                expira_s: now_ms.div_euclid(1000).saturating_add(retention_s),
            };
            match store.complete(&done).await? {
                FenceOutcome::Applied(_) => Ok(Resolution::Completed {
                    recibo: receipt.id,
                    attempt,
                }),
                FenceOutcome::Refused(_) => Err(ResolveError::Changed),
            }
        }
        None => match store.release(&release(true)).await? {
            FenceOutcome::Applied(record) => Ok(Resolution::Released {
                next_attempt: record.attempt(),
            }),
            FenceOutcome::Refused(_) => Err(ResolveError::Changed),
        },
    }
}

/// Refuses what a human must look at first.
fn check(
    record: &Record,
    huella: &str,
    now_ms: i64,
    card_format_checked: bool,
) -> Result<(), ResolveError> {
    if record.huella.as_deref().is_some_and(|h| h != huella) {
        return Err(ResolveError::FingerprintMismatch);
    }
    if record.is_card_format() && !card_format_checked {
        return Err(ResolveError::CardFormat);
    }
    match (&record.estado, record.en_curso_hasta_ms) {
        (Estado::EnCurso, Some(until_ms)) if until_ms >= now_ms => {
            Err(ResolveError::LiveLease { until_ms })
        }
        _ => Ok(()),
    }
}
