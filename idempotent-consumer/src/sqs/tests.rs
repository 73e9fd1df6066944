//! The unit tests of `sqs.rs`.

use super::*;

/// A consumer's name, its dead letters' note attribute.
const NOTE: &str = "a-consumer";

#[test]
fn a_deduplication_id_is_stable_per_message_and_valid_for_sqs() {
    let a = deduplication_id(NOTE, "059f36b4-87a3-44ab-83d2-661975830a7d");
    assert_eq!(
        a,
        deduplication_id(NOTE, "059f36b4-87a3-44ab-83d2-661975830a7d")
    );
    assert_ne!(a, deduplication_id(NOTE, "another"));
    assert_eq!(a.len(), 64);
    assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[test]
fn a_note_goes_whole_when_it_fits_trimmed_when_a_short_one_does_and_else_not_at_all() {
    let mut message = SqsMessage::default();
    message.body = Some("x".repeat(800));
    let whole = serde_json::json!({"outcome": "invalid", "reason": "r".repeat(100),
                                        "message_id": "m-1", "receive_count": 1})
    .to_string();
    let letter = DeadLetter {
        message: &message,
        message_id: "m-1",
        note: whole.clone(),
    };
    let size = |note: &str| weight(&message, note, NOTE) + "String".len();
    assert_eq!(fitted_note(&letter, size(&whole), NOTE), whole);
    // 40 bytes short: the reason is cut, the rest kept, and it says so.
    let trimmed = fitted_note(&letter, size(&whole) - 40, NOTE);
    assert!(size(&trimmed) <= size(&whole) - 40, "{trimmed}");
    let note: serde_json::Value = serde_json::from_str(&trimmed).unwrap();
    assert_eq!(
        (&note["outcome"], &note["message_id"], &note["note_trimmed"]),
        (&"invalid".into(), &"m-1".into(), &true.into())
    );
    assert!(note["reason"].as_str().unwrap().len() < 100);
    // No room even for the short note: none, the body untouched.
    assert_eq!(fitted_note(&letter, size("") + 10, NOTE), "");
}

#[test]
fn a_refused_entry_fails_alone_and_a_failed_call_fails_every_entry() {
    let refused = BatchResultErrorEntry::builder()
        .id("1")
        .sender_fault(true)
        .code("ReceiptHandleIsInvalid")
        .build()
        .unwrap();
    let results = per_entry("X", 3, Ok(vec![refused]));
    assert!(results[0].is_ok() && results[2].is_ok());
    assert!(
        matches!(&results[1], Err(QueueError::Entry { code, .. }) if code == "ReceiptHandleIsInvalid")
    );
    let all = per_entry("X", 2, Err(QueueError::TimedOut));
    assert!(all.iter().all(Result::is_err));
}

#[test]
fn the_note_is_added_beside_the_original_attributes_unless_there_are_ten() {
    let attribute = |data_type: &str, value: &str| {
        let mut a = SqsMessageAttribute::default();
        a.data_type = Some(data_type.into());
        a.string_value = Some(value.into());
        a
    };
    let mut message = SqsMessage::default();
    message.body = Some("{}".into());
    message
        .message_attributes
        .insert("trace".into(), attribute("String", "abc"));
    let note = "{\"outcome\":\"invalid\"}".to_owned();
    let letter = DeadLetter {
        message: &message,
        message_id: "m-1",
        note: note.clone(),
    };
    let sent = entry(0, &letter, true, NOTE).unwrap();
    let attributes = sent.message_attributes.unwrap();
    assert_eq!(attributes["trace"].string_value.as_deref(), Some("abc"));
    assert_eq!(
        attributes[NOTE].string_value.as_deref(),
        Some(note.as_str())
    );
    assert_eq!(sent.message_group_id.as_deref(), Some(NOTE));
    assert!(sent.message_deduplication_id.is_some());

    for n in 0..9 {
        message
            .message_attributes
            .insert(format!("a{n}"), attribute("Number", &n.to_string()));
    }
    let letter = DeadLetter {
        message: &message,
        message_id: "m-1",
        note,
    };
    let full = entry(0, &letter, false, NOTE)
        .unwrap()
        .message_attributes
        .unwrap();
    assert_eq!(full.len(), 10);
    assert!(!full.contains_key(NOTE));
}
