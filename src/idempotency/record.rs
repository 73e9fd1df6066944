//! The stored idempotency record (DESIGN §4), as the policy sees it. Its storage
//! names are in [`super::schema`].

use super::Key;

/// `estado` of a record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// `en-curso`: a lease is (or was) held by `titular` until `en_curso_hasta`.
    InProgress,
    /// `hecho`: charged; final, whatever `expira` says.
    Done,
    /// `libre`: released after a failed charge; the next delivery may reserve it.
    Free,
    /// Anything else: written by something we do not know. Never taken over.
    Other(String),
}

/// One item of the idempotency table. Optional fields are absent on items written by
/// the pattern card's TypeScript consumer (no `huella`, no lease, no attempt).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub pk: Key,
    pub state: State,
    /// ms epoch of the first reservation.
    pub created_ms: Option<i64>,
    /// s epoch; TTL attribute, retention only.
    pub expires_s: Option<i64>,
    pub receipt: Option<String>,
    pub fingerprint: Option<String>,
    pub owner: Option<String>,
    /// ms epoch when the current lease ends.
    pub lease_until_ms: Option<i64>,
    pub attempt: Option<u32>,
    /// ms epoch when the current attempt's key was first sent.
    pub sent_ms: Option<i64>,
    /// `rechazos`: how many times the provider declined this order (DESIGN §5).
    pub declines: Option<u32>,
}

impl Record {
    /// Written by the card's consumer: no fingerprint, so no lease and no provider key.
    pub fn is_card_format(&self) -> bool {
        self.fingerprint.is_none()
    }

    /// The attempt number, 1 when absent.
    pub fn attempt(&self) -> u32 {
        self.attempt.unwrap_or(1)
    }

    /// Declines so far, 0 when absent.
    pub fn declines(&self) -> u32 {
        self.declines.unwrap_or(0)
    }
}
