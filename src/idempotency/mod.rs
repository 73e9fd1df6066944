//! The idempotency policy: keys, the stored record, the store contract and the state
//! machine (ARCHITECTURE.md, "The table" and "The state machine"). Nothing in here
//! knows about AWS: adapters in `store/` and `payment/` do the I/O, this module
//! decides.
//!
//! | module | owns |
//! | --- | --- |
//! | `key`, `record`, [`schema`] | the key and the fingerprint; the record in English; its Spanish storage names |
//! | `store` | the store contract: the requests and answers of each write |
//! | [`table`] | the write specification: each write's condition and effect, how a refused reservation is judged |
//! | [`rules`] | the safety rules, each switchable for a mutant of the model |
//! | [`machine`] | the state machine of one record, pure |
//! | `outcome` | how a record ends: typed causes; its kind (`outcomes.rs`) gives name, level, handling |
//! | `resolve` | the state machine of `resolve`, pure |
//! | `driver` | the driver of both machines with the real store and provider |

mod driver;
mod key;
pub mod machine;
mod outcome;
mod record;
mod resolve;
pub mod rules;
pub mod schema;
mod store;
pub mod table;

pub use driver::{Charger, Clock, Settings, resolve};
pub use key::Key;
pub use outcome::{Call, Details, Outcome, ReconcileCause, RetryCause, Shared};
pub use record::{Fingerprint, Identity, Owner, Record, State};
pub use resolve::{
    Confirmed, Resolution, ResolveError, ResolveInput, ResolveStep, ResolveWrite, Resolver,
};
pub use rules::Rules;
pub use store::{
    CompleteRequest, IdempotencyStore, ReleaseKind, ReleaseRequest, ReserveRequest,
    ResolveLeaseRequest, StoreError, Write, WriteOutcome,
};
pub use table::{Reservation, judge};
