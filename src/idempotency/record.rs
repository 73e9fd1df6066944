//! The stored idempotency record (DESIGN §4), as the policy sees it.

/// `estado` of a record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Estado {
    /// `en-curso`: a lease is (or was) held by `titular` until `en_curso_hasta`.
    EnCurso,
    /// `hecho`: charged; final, whatever `expira` says.
    Hecho,
    /// `libre`: released after a failed charge; the next delivery may reserve it.
    Libre,
    /// Anything else: written by something we do not know. Never taken over.
    Other(String),
}

impl Estado {
    pub const EN_CURSO: &'static str = "en-curso";
    pub const HECHO: &'static str = "hecho";
    pub const LIBRE: &'static str = "libre";

    pub fn parse(s: &str) -> Self {
        match s {
            Self::EN_CURSO => Self::EnCurso,
            Self::HECHO => Self::Hecho,
            Self::LIBRE => Self::Libre,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::EnCurso => Self::EN_CURSO,
            Self::Hecho => Self::HECHO,
            Self::Libre => Self::LIBRE,
            Self::Other(s) => s,
        }
    }
}

/// One item of the idempotency table. Optional fields are absent on items written by
/// the pattern card's TypeScript consumer (no `huella`, no lease, no attempt).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub pk: String,
    pub estado: Estado,
    /// ms epoch of the first reservation.
    pub creado_ms: Option<i64>,
    /// s epoch; TTL attribute, retention only.
    pub expira_s: Option<i64>,
    pub recibo: Option<String>,
    pub huella: Option<String>,
    pub titular: Option<String>,
    /// ms epoch when the current lease ends.
    pub en_curso_hasta_ms: Option<i64>,
    pub intento: Option<u32>,
    /// ms epoch when the current attempt's key was first sent.
    pub enviado_ms: Option<i64>,
    /// `rechazos`: how many times the provider declined this order (DESIGN §5).
    pub rechazos: Option<u32>,
}

impl Record {
    /// Written by the card's consumer: no fingerprint, so no lease and no provider key.
    pub fn is_card_format(&self) -> bool {
        self.huella.is_none()
    }

    /// The attempt number, 1 when absent.
    pub fn attempt(&self) -> u32 {
        self.intento.unwrap_or(1)
    }

    /// Declines so far, 0 when absent.
    pub fn declines(&self) -> u32 {
        self.rechazos.unwrap_or(0)
    }
}
