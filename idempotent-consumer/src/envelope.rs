//! What a message carries: a fact's body as its producer wrote it, or wrapped by SNS
//! (a `Notification` whose `Message` is the body) or by EventBridge (an event whose
//! `detail` is the body). Every copy of one fact reads as the same body, so its key
//! is the same whatever carried it.

use serde_json::Value;

use crate::in_store::Invalid;

/// The body inside `raw`'s envelope, or `raw` itself when it has none.
pub fn body(raw: &str) -> Result<String, Invalid> {
    let value: Value =
        serde_json::from_str(raw).map_err(|e| Invalid(format!("the body is not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(Invalid("the body is not a JSON object".to_owned()));
    };
    if object.get("Type").and_then(Value::as_str) == Some("Notification") {
        return match object.get("Message") {
            Some(Value::String(message)) => Ok(message.clone()),
            _ => Err(Invalid(
                "an SNS notification whose Message is not a string".to_owned(),
            )),
        };
    }
    if object.contains_key("detail-type") {
        return match object.get("detail") {
            Some(detail @ Value::Object(_)) => Ok(detail.to_string()),
            _ => Err(Invalid(
                "an EventBridge event whose detail is not an object".to_owned(),
            )),
        };
    }
    Ok(raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_of_one_fact_reads_as_the_same_fact() {
        let raw = r#"{"id":"dep-1","amount":10}"#;
        let sns = serde_json::json!({"Type": "Notification", "MessageId": "m-2", "Message": raw});
        let bridge = serde_json::json!({"detail-type": "deposit", "source": "shop",
            "detail": serde_json::from_str::<Value>(raw).unwrap()});
        for copy in [raw.to_owned(), sns.to_string(), bridge.to_string()] {
            let body: Value = serde_json::from_str(&body(&copy).unwrap()).unwrap();
            assert_eq!(body, serde_json::from_str::<Value>(raw).unwrap(), "{copy}");
        }
    }

    #[test]
    fn a_broken_envelope_fails_with_its_reason() {
        assert!(body("[1]").unwrap_err().0.contains("not a JSON object"));
        assert!(body("{").unwrap_err().0.contains("not JSON"));
        let sns = r#"{"Type":"Notification","Message":{"id":"x"}}"#;
        assert!(body(sns).unwrap_err().0.contains("Message is not a string"));
    }
}
