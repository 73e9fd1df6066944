//! The batch's plan, pure: how a record of a batch ends ([`ending`]) and the rules
//! that plan and settle a batch ([`plan`]). The batch's I/O is `drivers/batch`.

pub mod ending;
pub mod plan;

pub use ending::{Declared, InvalidRecord, RecordOutcome};
pub use plan::BatchError;
pub use plan::Skip;
