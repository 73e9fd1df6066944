//! The provider API key: read once at cold start from Secrets Manager
//! (`PAYMENT_API_KEY_SECRET_ARN`, which wins) or from `PAYMENT_API_KEY`.
//!
//! The secret is either the key itself or a JSON object `{"api_key": "..."}`.

use crate::config::{Config, Secret};

#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("PAYMENT_API_KEY_SECRET_ARN or PAYMENT_API_KEY is required (the provider API key)")]
    Missing,
    #[error("PAYMENT_API_KEY_SECRET_ARN={arn:?}: reading the secret failed")]
    Fetch {
        arn: String,
        #[source]
        source: aws_sdk_secretsmanager::Error,
    },
    #[error(
        "PAYMENT_API_KEY_SECRET_ARN={arn:?}: the secret has no usable string value ({problem})"
    )]
    Unusable { arn: String, problem: &'static str },
}

/// Reads the key: Secrets Manager when the ARN is set, else the plain variable.
pub async fn load(config: &Config, sdk: &aws_config::SdkConfig) -> Result<Secret, ApiKeyError> {
    let Some(arn) = &config.payment_api_key_secret_arn else {
        return config.payment_api_key.clone().ok_or(ApiKeyError::Missing);
    };
    let client = aws_sdk_secretsmanager::Client::new(sdk);
    let output = client
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| ApiKeyError::Fetch {
            arn: arn.clone(),
            source: e.into(),
        })?;
    let unusable = |problem| ApiKeyError::Unusable {
        arn: arn.clone(),
        problem,
    };
    let text = output
        .secret_string()
        .ok_or_else(|| unusable("binary or empty secret"))?;
    key_from_secret_string(text)
        .ok_or_else(|| unusable("empty, or JSON without a string `api_key`"))
}

fn key_from_secret_string(text: &str) -> Option<Secret> {
    let text = text.trim();
    let key = if text.starts_with('{') {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        value.get("api_key")?.as_str()?.trim().to_owned()
    } else {
        text.to_owned()
    };
    (!key.is_empty()).then(|| Secret::new(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_the_key_itself_or_a_json_object_with_api_key() {
        assert_eq!(
            key_from_secret_string(" sk_test_1\n").unwrap().expose(),
            "sk_test_1"
        );
        assert_eq!(
            key_from_secret_string(r#"{"api_key":"sk_test_2"}"#)
                .unwrap()
                .expose(),
            "sk_test_2"
        );
        assert!(key_from_secret_string(r#"{"other":"x"}"#).is_none());
        assert!(key_from_secret_string("  ").is_none());
    }
}
