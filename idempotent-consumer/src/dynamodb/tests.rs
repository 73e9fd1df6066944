//! The unit tests of `dynamodb.rs`.

use super::*;

#[test]
fn every_attribute_in_every_expression_is_aliased() {
    let expressions = [
        RESERVE_UPDATE,
        RESERVE_CONDITION,
        FENCE,
        COMPLETE_UPDATE,
        COMPLETE_ATTEMPT_CONDITION,
        RELEASE_UPDATE,
        RELEASE_NEXT_UPDATE,
        RELEASE_UNCERTAIN_UPDATE,
        RELEASE_REFUSED_UPDATE,
        RELEASE_NEXT_RESET_UPDATE,
        NEXT_ATTEMPT_UPDATE,
        RESOLVE_UPDATE,
        RESOLVE_CONDITION,
        AWAIT_UPDATE,
        SETTLE_CONDITION,
        SETTLE_DONE_UPDATE,
        SETTLE_ENDED_UPDATE,
        SETTLE_ENDING_UPDATE,
        ADOPT_CONDITION,
        CORRECT_UPDATE,
        CORRECT_CONDITION,
        AWAITING_KEY,
    ];
    for expression in expressions {
        for (_, name) in NAMES {
            let bare = expression
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#' || c == ':'))
                .any(|word| word == *name);
            assert!(!bare, "`{name}` appears unaliased in {expression}");
        }
    }
}

#[test]
fn placeholders_are_whole_names_and_values() {
    let found: Vec<&str> =
        placeholders("SET #estado_x = :x, #hastaX = if_not_exists(#lease_until, :now_ms)")
            .collect();
    assert_eq!(
        found,
        ["#estado_x", ":x", "#hastaX", "#lease_until", ":now_ms"]
    );
}

#[test]
fn a_wrongly_typed_attribute_is_malformed() {
    let mut item = Item::new();
    item.insert("pk".into(), s("hecho#a"));
    item.insert("estado".into(), s("hecho"));
    item.insert("intento".into(), s("uno"));
    assert!(matches!(
        record_from_item(&item),
        Err(StoreError::Malformed {
            attribute: "intento",
            ..
        })
    ));
}
