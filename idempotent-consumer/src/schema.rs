//! The table's storage format, written once. Items keep the pattern card's reference
//! consumer's Spanish attribute names and state values (`estado = hecho`, `recibo`,
//! `huella`…): they are what the table holds, what the card's own consumer wrote, and
//! what an operator reads in the console. The Rust code speaks English (`state =
//! Done`, `receipt`, `fingerprint`…). The DynamoDB adapter and every other store or
//! tool that reads items map between the two here. A few names are the first
//! application's, a payment consumer's (`pago`, `huella_pagada`, `rechazos`): kept as
//! the table's format for every consumer, so that its items never change.

use crate::clock::Time;
use crate::record::{Fingerprint, Key, Owner, Record, State};
use crate::store::StoreError;

/// Attribute (and column) names. Those every record of the table has, whatever its
/// consumer, are the in-store effects' too ([`crate::in_store::attr`]).
pub mod attr {
    use crate::in_store::attr as shared;

    /// The partition key: `<kind>#<id>`.
    pub const PK: &str = shared::PK;
    /// The record's state: one of [`super::state`].
    pub const STATE: &str = shared::STATE;
    /// ms epoch of the first reservation.
    pub const CREATED: &str = shared::CREATED;
    /// s epoch: the TTL attribute (retention only).
    pub const EXPIRES: &str = shared::EXPIRES;
    /// Once `hecho`: the provider's reference of the effect.
    pub const RECEIPT: &str = "recibo";
    /// The fingerprint of the fact's payload.
    pub const FINGERPRINT: &str = shared::FINGERPRINT;
    /// The random token of the current lease.
    pub const OWNER: &str = "titular";
    /// ms epoch when the current lease ends.
    pub const LEASE_UNTIL: &str = "en_curso_hasta";
    /// The attempt whose provider key is current.
    pub const ATTEMPT: &str = "intento";
    /// ms epoch when the current attempt's key was first sent.
    pub const SENT: &str = "enviado";
    /// The fact's refusals, over all its copies.
    pub const REFUSALS: &str = "rechazos";
    /// While `espera`: the provider's reference of what the record awaits (the card's
    /// consumer named it `pago`).
    pub const AWAITED: &str = "pago";
    /// While `espera`: s epoch when the wait ends; the awaiting index's sort key, so
    /// that only awaiting records are in that index.
    pub const WAIT_UNTIL: &str = "espera_hasta";
    /// `hecho` by what it awaited, done with other fields: the fingerprint of what was
    /// done.
    pub const DONE_FINGERPRINT: &str = "huella_pagada";
}

/// The item that keeps where the settler's last run stopped in the awaiting index
/// ([`crate::store::AwaitingCursor`]): no fact's, and never in the index (no
/// `espera_hasta`).
pub const SETTLE_CURSOR_PK: &str = "cursor#settle";

/// The settle cursor's attributes: the end of the wait (s epoch) and the key of the
/// last record the run reached.
pub mod cursor {
    /// The end of the wait (s epoch) of the last record reached.
    pub const WAIT_UNTIL: &str = "tras_hasta";
    /// The key of the last record reached.
    pub const PK: &str = "tras_pk";
}

/// The table's one secondary index: the records that await someone (sparse:
/// only items with `espera_hasta` are in it), partitioned by `estado`.
pub const AWAITING_INDEX: &str = "espera";

/// The stored values of `estado`.
pub mod state {
    /// `InProgress`: a lease is (or was) held.
    pub const IN_PROGRESS: &str = "en-curso";
    /// `Done`: the effect is applied and recorded.
    pub const DONE: &str = crate::in_store::attr::DONE;
    /// `Free`: released after a failed attempt.
    pub const FREE: &str = "libre";
    /// `Awaiting`: the effect waits for someone else.
    pub const AWAITING: &str = "espera";
    /// `Failed`: the wait ended without the effect.
    pub const FAILED: &str = "fallido";
    /// `Uncertain`: an at-most-once effect's outcome is unknown.
    pub const UNCERTAIN: &str = "incierto";
}

/// A record state as stored.
pub fn state_value(state: &State) -> &str {
    match state {
        State::InProgress => state::IN_PROGRESS,
        State::Done => state::DONE,
        State::Free => state::FREE,
        State::Awaiting => state::AWAITING,
        State::Failed => state::FAILED,
        State::Uncertain => state::UNCERTAIN,
        State::Other(value) => value,
    }
}

/// A record's state, attempt and receipt as an operator finds them in the console:
/// under their stored names, absent ones said so (`estado hecho, intento 2, recibo
/// tr_1`). Outcomes that show a record to a person render it here, so the stored names
/// are written in this module only.
pub fn stored_fields(state: Option<&State>, attempt: Option<u32>, receipt: Option<&str>) -> String {
    const ABSENT: &str = "(absent)";
    let attempt = attempt.map(|n| n.to_string());
    format!(
        "{} {}, {} {}, {} {}",
        attr::STATE,
        state.map_or(ABSENT, state_value),
        attr::ATTEMPT,
        attempt.as_deref().unwrap_or(ABSENT),
        attr::RECEIPT,
        receipt.unwrap_or(ABSENT),
    )
}

/// A stored `estado`; an unknown value is kept as it is and never taken over.
pub fn parse_state(value: &str) -> State {
    match value {
        state::IN_PROGRESS => State::InProgress,
        state::DONE => State::Done,
        state::FREE => State::Free,
        state::AWAITING => State::Awaiting,
        state::FAILED => State::Failed,
        state::UNCERTAIN => State::Uncertain,
        other => State::Other(other.to_owned()),
    }
}

/// An attribute's value as every adapter can give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A string.
    S(String),
    /// A number.
    N(i64),
}

/// Why an attribute cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The value is not a string.
    NotAString,
    /// The value is not a number.
    NotANumber,
}

/// One stored item, as an adapter reads it: the value of an attribute, `None` when
/// absent (or null).
pub trait Item {
    /// The value of `attribute` (`None`: absent or null).
    fn value(&self, attribute: &'static str) -> Result<Option<Value>, Problem>;
}

/// Reads an item into a record. A wrong type or a missing `estado` is `Malformed`,
/// never a guess; both adapters report it the same way.
pub fn read(item: &impl Item) -> Result<Record, StoreError> {
    let malformed =
        |pk: &str, attribute: &'static str, problem: &'static str| StoreError::Malformed {
            pk: pk.to_owned(),
            attribute,
            problem,
        };
    let pk = match item.value(attr::PK) {
        Ok(Some(Value::S(pk))) => pk,
        _ => return Err(malformed("", attr::PK, "is missing or not a string")),
    };
    let string = |attribute| match item.value(attribute) {
        Ok(None) => Ok(None),
        Ok(Some(Value::S(v))) => Ok(Some(v)),
        Ok(Some(Value::N(_))) | Err(_) => Err(malformed(&pk, attribute, "is not a string")),
    };
    let number = |attribute| match item.value(attribute) {
        Ok(None) => Ok(None),
        Ok(Some(Value::N(v))) => Ok(Some(v)),
        Ok(Some(Value::S(_))) | Err(_) => Err(malformed(&pk, attribute, "is not a number")),
    };
    let count = |attribute| {
        number(attribute)?
            .map(|v| u32::try_from(v).map_err(|_| malformed(&pk, attribute, "is out of range")))
            .transpose()
    };
    let state = string(attr::STATE)?.ok_or_else(|| malformed(&pk, attr::STATE, "is missing"))?;
    let record = Record {
        state: parse_state(&state),
        created: number(attr::CREATED)?.map(Time::from_ms),
        expires: number(attr::EXPIRES)?.map(Time::from_secs),
        receipt: string(attr::RECEIPT)?,
        fingerprint: string(attr::FINGERPRINT)?.map(Fingerprint::new),
        owner: string(attr::OWNER)?.map(Owner::new),
        lease_until: number(attr::LEASE_UNTIL)?.map(Time::from_ms),
        attempt: count(attr::ATTEMPT)?,
        sent: number(attr::SENT)?.map(Time::from_ms),
        refusals: count(attr::REFUSALS)?,
        awaited: string(attr::AWAITED)?,
        wait_until: number(attr::WAIT_UNTIL)?.map(Time::from_secs),
        done_fingerprint: string(attr::DONE_FINGERPRINT)?.map(Fingerprint::new),
        pk: Key::from_stored(&pk)
            .ok_or_else(|| malformed(&pk, attr::PK, "is not `<kind>#<id>`"))?,
    };
    Ok(record)
}

/// A record's attributes under their table names, absent ones left out, listed
/// as the table's documentation lists them.
pub fn attributes(record: &Record) -> Vec<(&'static str, Value)> {
    let s = |v: &str| Some(Value::S(v.to_owned()));
    let n = |v: Option<i64>| v.map(Value::N);
    let fields = [
        (attr::PK, s(record.pk.as_str())),
        (attr::STATE, s(state_value(&record.state))),
        (attr::CREATED, n(record.created.map(Time::as_ms))),
        (attr::EXPIRES, n(record.expires.map(Time::as_secs))),
        (attr::RECEIPT, record.receipt.as_deref().and_then(s)),
        (attr::FINGERPRINT, record.fingerprint.as_deref().and_then(s)),
        (attr::OWNER, record.owner.as_deref().and_then(s)),
        (attr::LEASE_UNTIL, n(record.lease_until.map(Time::as_ms))),
        (attr::ATTEMPT, n(record.attempt.map(i64::from))),
        (attr::SENT, n(record.sent.map(Time::as_ms))),
        (attr::REFUSALS, n(record.refusals.map(i64::from))),
        (attr::AWAITED, record.awaited.as_deref().and_then(s)),
        (attr::WAIT_UNTIL, n(record.wait_until.map(Time::as_secs))),
        (
            attr::DONE_FINGERPRINT,
            record.done_fingerprint.as_deref().and_then(s),
        ),
    ];
    fields
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    impl Item for HashMap<&'static str, Value> {
        fn value(&self, attribute: &'static str) -> Result<Option<Value>, Problem> {
            Ok(self.get(attribute).cloned())
        }
    }

    fn record() -> Record {
        Record {
            pk: Key::new("hecho#", "A-1"),
            state: State::Done,
            created: Some(Time::from_ms(1_000)),
            expires: Some(Time::from_secs(2)),
            receipt: Some("ch_1".into()),
            fingerprint: Some(Fingerprint::new("f")),
            owner: None,
            lease_until: None,
            attempt: Some(2),
            sent: Some(Time::from_ms(1_500)),
            refusals: Some(1),
            awaited: Some("tr_1".into()),
            wait_until: Some(Time::from_secs(3)),
            done_fingerprint: Some(Fingerprint::new("paid")),
        }
    }

    #[test]
    fn a_record_reads_back_from_its_own_attributes() {
        let item: HashMap<_, _> = attributes(&record()).into_iter().collect();
        assert_eq!(item[attr::STATE], Value::S("hecho".into()));
        assert!(!item.contains_key(attr::OWNER));
        assert_eq!(read(&item).unwrap(), record());
    }

    #[test]
    fn a_record_shown_to_an_operator_uses_the_stored_names() {
        assert_eq!(
            stored_fields(Some(&State::Done), Some(2), Some("tr_1")),
            "estado hecho, intento 2, recibo tr_1"
        );
        assert_eq!(
            stored_fields(None, None, None),
            "estado (absent), intento (absent), recibo (absent)"
        );
    }

    #[test]
    fn every_state_value_parses_back_and_an_unknown_one_is_kept() {
        for state in [
            State::InProgress,
            State::Done,
            State::Free,
            State::Awaiting,
            State::Failed,
            State::Uncertain,
        ] {
            assert_eq!(parse_state(state_value(&state)), state);
        }
        assert_eq!(parse_state("pagado"), State::Other("pagado".into()));
    }

    #[test]
    fn a_wrongly_typed_or_missing_attribute_is_malformed() {
        let mut item: HashMap<_, _> = attributes(&record()).into_iter().collect();
        item.insert(attr::ATTEMPT, Value::S("uno".into()));
        assert!(matches!(
            read(&item),
            Err(StoreError::Malformed {
                attribute: "intento",
                ..
            })
        ));
        item.insert(attr::ATTEMPT, Value::N(-1));
        assert!(matches!(
            read(&item),
            Err(StoreError::Malformed {
                problem: "is out of range",
                ..
            })
        ));
        item.remove(attr::ATTEMPT);
        item.remove(attr::STATE);
        assert!(matches!(
            read(&item),
            Err(StoreError::Malformed {
                attribute: "estado",
                problem: "is missing",
                ..
            })
        ));
    }
}
