//! `resolve`: a human settles a record that cannot settle itself (a DLQ'd
//! `needs_reconciliation`, a stuck lease, an order at its decline limit) by asking the
//! provider. Succeeded → `hecho` with that charge; pending → nothing changes (it may
//! still succeed); not found → `libre` with the next attempt, so a redrive charges
//! once under a new key. Every write goes through a lease, so it never races a
//! consumer.

use super::machine::Settings;
use super::{
    CompleteRequest, Estado, FenceOutcome, IdempotencyStore, Record, ReleaseKind, ReleaseRequest,
    ResolveLeaseRequest, StoreError,
};
use crate::order::Order;
use crate::payment::{Lookup, PaymentError, PaymentProvider};

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
    #[error(
        "the provider holds charge {charge_id} for this order in status `{status}`: it may \
         still succeed, so no new key is allowed; run resolve again once it is final"
    )]
    Pending { charge_id: String, status: String },
    #[error("store")]
    Store(#[from] StoreError),
    #[error("provider lookup")]
    Provider(#[source] PaymentError),
}

/// What a human confirmed before running `resolve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// A card-format record's order was checked at the provider by hand.
    pub card_format_checked: bool,
    /// The customer fixed their card: reset the order's decline count, so the next
    /// delivery may try the card again.
    pub retry_declined: bool,
}

/// Settles `order`'s record by asking the provider.
pub async fn resolve(
    store: &dyn IdempotencyStore,
    provider: &dyn PaymentProvider,
    settings: &Settings,
    order: &Order,
    confirmed: Confirmed,
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
    check(&record, &huella, now_ms, confirmed.card_format_checked)?;

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
    let release = |kind| ReleaseRequest {
        pk: &pk,
        titular: &titular,
        kind,
    };

    let found = match provider.find_charge(order).await {
        Ok(found) => found,
        Err(e) => {
            store.release(&release(ReleaseKind::KeepKey)).await?;
            return Err(ResolveError::Provider(e));
        }
    };
    match found {
        Lookup::Pending { charge_id, status } => {
            store.release(&release(ReleaseKind::KeepKey)).await?;
            Err(ResolveError::Pending { charge_id, status })
        }
        Lookup::Succeeded(receipt) => {
            let done = CompleteRequest {
                pk: &pk,
                titular: &titular,
                intento: attempt,
                recibo: &receipt.id,
                expira_s: settings.expira_s(now_ms),
            };
            match store.complete(&done).await? {
                FenceOutcome::Applied(_) => Ok(Resolution::Completed {
                    recibo: receipt.id,
                    attempt,
                }),
                FenceOutcome::Refused(_) => Err(ResolveError::Changed),
            }
        }
        Lookup::NotFound => match store
            .release(&release(ReleaseKind::NextKey {
                reset_declines: confirmed.retry_declined,
            }))
            .await?
        {
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
