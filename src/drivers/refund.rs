//! A refund request as the library's effect at a provider
//! (`idempotent_consumer::effect::Effect`): refunded exactly once in effect under the
//! key the machine names, through Stripe's Refunds API on the PaymentIntent its order
//! was charged with, as the order's own record in the table says. A refund follows the
//! money: until its order is charged it waits (the delivery comes back, nothing is
//! sent), and for an order that ended without payment it is refused with its reason.
//! The order's record is read within the effect's call, so the executor's budget and
//! breakers bound that read as they bound the provider's.

use std::sync::Arc;

use async_trait::async_trait;
use idempotent_consumer::executor::{ProviderFailure, Throttle};
use idempotent_consumer::in_store::Invalid;
use idempotent_consumer::machine::{Cancel, Class, Classify, Found, Receipt};

use crate::contracts::payment::{FailureKind, Lookup, PaymentError, RefundPath};
use crate::contracts::store::{IdempotencyStore, StoreError};
use crate::domain::refund::RefundRequest;
use crate::domain::{Identity, Key, OrderKey, State};
use crate::drivers::charge::{Asks, Settings, resolve_fact};
use crate::error_chain;
use crate::policy::machine::{found, receipt};
use crate::policy::resolve::{Confirmed, Resolution, ResolveError};

/// Refunds, each once: the provider's refund path and the table that holds the
/// orders' records.
pub struct Refunds {
    provider: Arc<dyn RefundPath>,
    orders: Arc<dyn IdempotencyStore>,
    /// An order declined this many times has stopped being charged.
    max_declines: u32,
}

impl Refunds {
    pub fn new(
        provider: Arc<dyn RefundPath>,
        orders: Arc<dyn IdempotencyStore>,
        max_declines: u32,
    ) -> Self {
        Self {
            provider,
            orders,
            max_declines,
        }
    }

    /// The PaymentIntent the order was charged with, or why there is none to refund.
    async fn charged(&self, request: &RefundRequest) -> Result<String, RefundFailure> {
        let order_id = request.order_id().to_owned();
        let record = self
            .orders
            .get(&Key::for_order_id(&order_id))
            .await
            .map_err(|source| RefundFailure::Store {
                order_id: order_id.clone(),
                source,
            })?;
        // No record: not received yet, or past its retention (TTL deleted it; a refund
        // of such an order is made by hand).
        let Some(record) = record else {
            return Err(RefundFailure::NotCharged {
                order_id,
                state: "no record: not received yet, or past its retention".to_owned(),
            });
        };
        let declined = record.refusals.unwrap_or(0) >= self.max_declines;
        match (&record.state, record.receipt) {
            (State::Done, Some(payment_id)) => Ok(payment_id),
            // Ended unpaid as far as deliveries go; a new delivery of the order may still
            // charge it (a corrected payload, a reset of its declines): the dead letter
            // is redriven then.
            (State::Failed, _) => Err(RefundFailure::Unpaid {
                order_id,
                why: "its wait for the customer ended without payment".to_owned(),
            }),
            (State::Free, _) if declined => Err(RefundFailure::Unpaid {
                order_id,
                why: format!("declined {} times", record.refusals.unwrap_or(0)),
            }),
            // A record for a person (its charge may have happened) or in a state this
            // consumer does not know: the refund waits for them, never refused.
            (state, _) => Err(RefundFailure::NotCharged {
                order_id,
                state: format!("{state:?}"),
            }),
        }
    }
}

impl Refunds {
    /// Settles `request`'s record by asking the provider (`resolve` for a refund): the
    /// refund found completes it, none found (certain: while its order is not charged
    /// no refund can exist) moves it to the next attempt.
    pub async fn resolve(
        &self,
        settings: &Settings,
        request: &RefundRequest,
        confirmed: Confirmed,
    ) -> Result<Resolution, ResolveError> {
        let asks = RefundAsks {
            refunds: self,
            request,
        };
        resolve_fact(
            self.orders.as_ref(),
            &asks,
            settings,
            request.identity(),
            confirmed,
        )
        .await
    }
}

/// A refund, as `resolve` asks about it.
struct RefundAsks<'a> {
    refunds: &'a Refunds,
    request: &'a RefundRequest,
}

#[async_trait]
impl Asks for RefundAsks<'_> {
    async fn look_up(
        &self,
        _since: idempotent_consumer::clock::Time,
    ) -> Result<Lookup, PaymentError> {
        match self.refunds.charged(self.request).await {
            Ok(payment_id) => {
                self.refunds
                    .provider
                    .find_refund(self.request, &payment_id)
                    .await
            }
            // No charge, so no refund of it.
            Err(RefundFailure::NotCharged { .. } | RefundFailure::Unpaid { .. }) => {
                Ok(Lookup::NotFound)
            }
            Err(RefundFailure::Provider(e)) => Err(e),
            Err(e @ RefundFailure::Store { .. }) => Err(PaymentError::Retryable {
                kind: FailureKind::Connection,
                source: Some(Box::new(e)),
                should_retry: None,
            }),
        }
    }

    /// A refund leaves nothing open.
    async fn cancel(
        &self,
        _id: &str,
    ) -> Result<idempotent_consumer::machine::Cancel, PaymentError> {
        Ok(idempotent_consumer::machine::Cancel::NotCancellable)
    }
}

/// Why a refund gave no answer the machine can use.
#[derive(Debug, thiserror::Error)]
pub enum RefundFailure {
    #[error(transparent)]
    Provider(#[from] PaymentError),
    /// Its order is not charged yet: nothing was sent; the delivery comes back.
    #[error("order {order_id} is not charged yet ({state}): the refund waits for it")]
    NotCharged { order_id: String, state: String },
    /// Its order ended without payment: there is nothing to refund (until a new
    /// delivery of the order charges it).
    #[error("order {order_id} ended without payment ({why}): nothing to refund")]
    Unpaid { order_id: String, why: String },
    #[error("reading order {order_id}'s record failed")]
    Store {
        order_id: String,
        #[source]
        source: StoreError,
    },
}

impl Classify for RefundFailure {
    fn class(&self) -> Class {
        match self {
            Self::Provider(e) => e.class(),
            // Nothing was sent, and the lookup finds nothing while the order is not
            // charged (no refund can exist without its charge): the key is kept.
            Self::NotCharged { .. } | Self::Store { .. } => Class::Unknown,
            Self::Unpaid { .. } => Class::RefusedForGood,
        }
    }
}

impl ProviderFailure for RefundFailure {
    fn is_down(&self) -> bool {
        match self {
            Self::Provider(e) => e.is_down(),
            _ => false,
        }
    }

    fn throttle(&self) -> Option<Throttle> {
        match self {
            Self::Provider(e) => ProviderFailure::throttle(e),
            _ => None,
        }
    }

    fn advised_not_to_retry(&self) -> bool {
        match self {
            Self::Provider(e) => e.advised_not_to_retry(),
            _ => true,
        }
    }

    fn refuses_the_key(&self) -> bool {
        match self {
            Self::Provider(e) => e.refuses_the_key(),
            _ => false,
        }
    }

    fn not_sent() -> Self {
        Self::Provider(PaymentError::not_sent())
    }
}

#[async_trait]
impl idempotent_consumer::effect::Effect for Refunds {
    type Fact = RefundRequest;
    type Failure = RefundFailure;

    fn parse(&self, body: &str) -> Result<RefundRequest, Invalid> {
        RefundRequest::parse(body).map_err(|e| Invalid(error_chain(&e)))
    }

    fn identity(&self, request: &RefundRequest) -> Identity {
        request.identity()
    }

    async fn perform(&self, request: &RefundRequest, key: &str) -> Result<Receipt, RefundFailure> {
        let payment_id = self.charged(request).await?;
        Ok(receipt(
            self.provider.refund(request, &payment_id, key).await?,
        ))
    }

    async fn look_up(
        &self,
        request: &RefundRequest,
        _since: idempotent_consumer::clock::Time,
    ) -> Result<Found, RefundFailure> {
        match self.charged(request).await {
            Ok(payment_id) => Ok(found(
                self.provider.find_refund(request, &payment_id).await?,
            )),
            // No charge, so no refund of it.
            Err(RefundFailure::NotCharged { .. } | RefundFailure::Unpaid { .. }) => {
                Ok(Found::Nothing)
            }
            Err(e) => Err(e),
        }
    }

    /// A refund leaves nothing open that a new key could make a second of.
    async fn cancel(&self, _reference: &str) -> Result<Cancel, RefundFailure> {
        Ok(Cancel::NotCancellable)
    }

    /// As a charge: a dropped connection, a 5xx or a 409 on a key in use is sent again
    /// once, under the same key.
    fn replay_now(&self, failure: &RefundFailure) -> bool {
        matches!(failure, RefundFailure::Provider(e) if crate::drivers::charge::replays_now(e))
    }
}
