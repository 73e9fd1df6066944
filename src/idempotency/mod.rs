//! The idempotency policy: keys, the stored record, the store contract and the state
//! machine of DESIGN §4–5. Nothing in here knows about AWS: adapters in `store/` and
//! `payment/` do the I/O, this module decides.

mod key;
mod machine;
mod record;
mod resolve;
mod store;

pub use key::Key;
pub use machine::{Charger, Clock, DEADLINE_SAFETY, Outcome, Reservation, Settings, reserve};
pub use record::{Estado, Record};
pub use resolve::{Confirmed, Resolution, ResolveError, resolve};
pub use store::{
    CompleteRequest, FenceOutcome, IdempotencyStore, ReleaseKind, ReleaseRequest, ReserveOutcome,
    ReserveRequest, ResolveLeaseRequest, StoreError,
};
