//! The idempotency policy: keys, the stored record, the store contract and the state
//! machine of DESIGN §4–5. Nothing in here knows about AWS: adapters in `store/` and
//! `payment/` do the I/O, this module decides. [`core`] is the state machine as a pure
//! function (no I/O, clock or randomness); `machine` drives it with real parts.

pub mod core;
mod key;
mod machine;
mod outcome;
mod record;
mod resolve;
pub mod schema;
mod store;

pub use core::{Reservation, Rules};
pub use key::Key;
pub use machine::{Charger, Clock, Settings, perform, reserve};
pub use outcome::{Call, Details, Level, Outcome, ReconcileCause, RetryCause, Shared};
pub use record::{Fingerprint, Owner, Record, State};
pub use resolve::{
    Confirmed, Resolution, ResolveError, ResolveInput, ResolveStep, ResolveWrite, Resolver, resolve,
};
pub use store::{
    CompleteRequest, IdempotencyStore, ReleaseKind, ReleaseRequest, ReserveRequest,
    ResolveLeaseRequest, StoreError, WriteOutcome,
};
