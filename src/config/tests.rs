//! The unit tests of `config.rs`.

use super::*;
use std::collections::HashMap;

fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn defaults_follow_the_design() {
    let c = config(&[]).unwrap();
    assert_eq!(c.retention, Duration::from_secs(90 * 24 * 3600));
    assert_eq!(c.max_concurrency, 10);
    assert_eq!(c.payment_timeout, Duration::from_secs(10));
    assert_eq!(c.provider_key_ttl, Duration::from_secs(23 * 3600));
    assert_eq!(c.deadline_margin, Duration::from_secs(12));
    assert_eq!(c.invoke_deadline, Duration::from_secs(60));
    assert_eq!(c.max_declines, 3);
    assert_eq!(c.fifo_failure_scope, FifoScope::Group);
    assert_eq!(c.metrics_namespace, "charge-once");
    assert!(c.table.is_none() && c.payment_api_url.is_none());
    assert_eq!(c.retry_base, Duration::from_secs(30));
    assert_eq!(c.retry_cap, Duration::from_secs(15 * 60));
    assert_eq!(c.breaker_threshold, 5);
    assert!(c.dead_letter_queue_url.is_none());
}

#[test]
fn a_missing_dead_letter_queue_is_reported_by_name() {
    let err = config(&[])
        .unwrap()
        .require_dead_letter_queue_url()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("DEAD_LETTER_QUEUE_URL is required"),
        "{err}"
    );
    let url = "http://127.0.0.1:1/123456789012/orders-dlq";
    let c = config(&[("DEAD_LETTER_QUEUE_URL", url)]).unwrap();
    assert_eq!(c.require_dead_letter_queue_url().unwrap(), url);
}

#[test]
fn the_function_consumes_unless_told_to_audit_or_refund() {
    assert_eq!(config(&[]).unwrap().function, Function::Consume);
    let refund = config(&[("CHARGE_ONCE_FUNCTION", "refund")]).unwrap();
    assert_eq!(refund.function, Function::Refund);
    assert!(
        refund.audit_refunds,
        "the audit holds refunds unless told not to"
    );
    let no_refunds = config(&[("REFUNDS", "disabled")]).unwrap();
    assert!(!no_refunds.audit_refunds);
    let bad = config(&[("REFUNDS", "off")]).unwrap_err().to_string();
    assert!(
        bad.starts_with("REFUNDS=") && bad.contains("enabled or disabled"),
        "{bad}"
    );
    let audit = config(&[("CHARGE_ONCE_FUNCTION", "audit"), ("AUDIT_SINCE", "2d")]).unwrap();
    assert_eq!(audit.function, Function::Audit);
    assert_eq!(audit.audit_since, Duration::from_secs(2 * 24 * 3600));
    assert_eq!(audit.audit_stuck_after, Duration::from_secs(3600));
    let bad = config(&[("CHARGE_ONCE_FUNCTION", "charge")]).unwrap_err();
    assert!(
        bad.to_string().starts_with("CHARGE_ONCE_FUNCTION=")
            && bad.to_string().contains("consume, audit or refund"),
        "{bad}"
    );
}

#[test]
fn fifo_failure_scope_is_group_or_batch() {
    let batch = config(&[("FIFO_FAILURE_SCOPE", "batch")]).unwrap();
    assert_eq!(batch.fifo_failure_scope, FifoScope::Batch);
    let group = config(&[("FIFO_FAILURE_SCOPE", "group")]).unwrap();
    assert_eq!(group.fifo_failure_scope, FifoScope::Group);
}

#[test]
fn an_off_session_charge_is_unscheduled_unless_the_shop_says_recurring_or_installment() {
    let unset = config(&[]).unwrap();
    assert_eq!(
        unset.stored_credential_usage,
        StoredCredentialUsage::Unscheduled
    );
    for (value, usage) in [
        ("recurring", StoredCredentialUsage::Recurring),
        ("installment", StoredCredentialUsage::Installment),
        ("unscheduled", StoredCredentialUsage::Unscheduled),
    ] {
        let c = config(&[("STORED_CREDENTIAL_USAGE", value)]).unwrap();
        assert_eq!(c.stored_credential_usage, usage);
        assert_eq!(usage.as_str(), value);
    }
}

#[test]
fn deadline_margin_defaults_to_payment_timeout_plus_two_seconds() {
    let c = config(&[("PAYMENT_TIMEOUT", "3s")]).unwrap();
    assert_eq!(c.deadline_margin, Duration::from_secs(5));
}

#[test]
fn each_bad_value_names_its_variable_on_one_line() {
    for (var, value) in [
        ("IDEMPOTENCY_RETENTION", "forever"),
        ("IDEMPOTENCY_RETENTION", "1h"),
        ("MAX_CONCURRENCY", "0"),
        ("MAX_CONCURRENCY", "ten"),
        ("FIFO_FAILURE_SCOPE", "queue"),
        ("PAYMENT_TIMEOUT", "0s"),
        ("PAYMENT_TIMEOUT", "10"),
        ("PROVIDER_KEY_TTL", "soon"),
        ("PROVIDER_KEY_LIFETIME", "1h"),
        ("MAX_DECLINES", "0"),
        ("MAX_DECLINES", "many"),
        ("DEADLINE_MARGIN", "1s"),
        ("INVOKE_DEADLINE", "5s"),
        ("PAYMENT_API_URL", "ftp://x"),
        ("PAYMENT_API_URL", "https://api.stripe.com/v1"),
        ("PAYMENT_API_URL", "http://api.stripe.com"),
        ("IDEMPOTENCY_TABLE", "no spaces"),
        ("RETRY_BASE", "0s"),
        ("RETRY_BASE", "13h"),
        ("RETRY_CAP", "1s"),
        ("RETRY_CAP", "1d"),
        ("BREAKER_THRESHOLD", "0"),
        ("DEAD_LETTER_QUEUE_URL", "orders-dlq"),
        ("PAYMENT_RATE_BUDGET", "0"),
        ("PAYMENT_RATE_BUDGET", "fast"),
        ("PAYMENT_RATE_BUDGET", "25"),
        ("EVENT_SOURCE_MAX_CONCURRENCY", "1"),
        ("EVENT_SOURCE_MAX_CONCURRENCY", "1001"),
        ("STORED_CREDENTIAL_USAGE", "subscription"),
    ] {
        let err = config(&[(var, value)]).expect_err(var).to_string();
        assert!(err.starts_with(var), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn the_fleet_budget_is_shared_among_the_event_sources_environments() {
    assert_eq!(config(&[]).unwrap().payment_rate_share(), None);
    let c = config(&[
        ("PAYMENT_RATE_BUDGET", "25"),
        ("EVENT_SOURCE_MAX_CONCURRENCY", "5"),
    ])
    .unwrap();
    assert_eq!(c.payment_rate_share(), Some(5.0));
    let err = config(&[("PAYMENT_RATE_BUDGET", "25")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("EVENT_SOURCE_MAX_CONCURRENCY"), "{err}");
}

#[test]
fn a_retention_below_thirty_days_is_refused() {
    // A record must outlive the queue's and the DLQ's retention and any redrive.
    for value in ["1d", "29d 23h"] {
        let err = config(&[("IDEMPOTENCY_RETENTION", value)])
            .expect_err(value)
            .to_string();
        assert!(err.starts_with("IDEMPOTENCY_RETENTION="), "{err}");
        assert!(err.contains("30 days"), "{err}");
    }
    let c = config(&[("IDEMPOTENCY_RETENTION", "30d")]).unwrap();
    assert_eq!(c.retention, Duration::from_secs(30 * 24 * 3600));
}

#[test]
fn a_provider_key_ttl_not_an_hour_below_the_key_lifetime_is_refused() {
    // Stripe forgets keys after 24 h: a 48 h TTL would re-send a forgotten key.
    for pairs in [
        &[("PROVIDER_KEY_TTL", "48h")][..],
        &[("PROVIDER_KEY_TTL", "23h 1m")][..],
        &[
            ("PROVIDER_KEY_TTL", "23h"),
            ("PROVIDER_KEY_LIFETIME", "12h"),
        ][..],
    ] {
        let err = config(pairs).expect_err("refused").to_string();
        assert!(err.starts_with("PROVIDER_KEY_TTL="), "{err}");
        assert!(err.contains("PROVIDER_KEY_LIFETIME"), "{err}");
    }
    let c = config(&[
        ("PROVIDER_KEY_TTL", "47h"),
        ("PROVIDER_KEY_LIFETIME", "48h"),
    ])
    .unwrap();
    assert_eq!(c.provider_key_ttl, Duration::from_secs(47 * 3600));
}

#[test]
fn the_provider_key_lifetime_defaults_to_stripes_24_hours() {
    assert_eq!(
        config(&[]).unwrap().provider_key_lifetime,
        Duration::from_secs(24 * 3600)
    );
    let c = config(&[
        ("PROVIDER_KEY_TTL", "47h"),
        ("PROVIDER_KEY_LIFETIME", "48h"),
    ])
    .unwrap();
    assert_eq!(c.provider_key_lifetime, Duration::from_secs(48 * 3600));
}

#[test]
fn the_payment_api_url_is_a_base_url_and_plain_http_only_reaches_loopback() {
    for refused in [
        "https://api.stripe.com/v1",
        "https://api.stripe.com/v1/",
        "https://api.stripe.com/?x=1",
        "https://user:pw@api.stripe.com",
        "http://api.stripe.com",
        "http://10.0.0.5:12111",
        "api.stripe.com",
    ] {
        let err = config(&[("PAYMENT_API_URL", refused)])
            .expect_err(refused)
            .to_string();
        assert!(err.starts_with("PAYMENT_API_URL="), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
    assert!(
        config(&[("PAYMENT_API_URL", "https://api.stripe.com/v1")])
            .unwrap_err()
            .to_string()
            .contains("without a path")
    );
    for (accepted, stored) in [
        ("https://api.stripe.com", "https://api.stripe.com"),
        ("https://api.stripe.com/", "https://api.stripe.com"),
        ("http://127.0.0.1:12111", "http://127.0.0.1:12111"),
        ("http://127.8.9.1:1", "http://127.8.9.1:1"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("http://localhost:12111", "http://localhost:12111"),
    ] {
        let c = config(&[("PAYMENT_API_URL", accepted)]).expect(accepted);
        assert_eq!(c.payment_api_url.as_deref(), Some(stored));
    }
}

#[test]
fn missing_table_is_reported_by_name() {
    let err = config(&[])
        .unwrap()
        .require_table()
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("IDEMPOTENCY_TABLE is required"), "{err}");
}

#[test]
fn the_api_key_never_shows_in_debug_output() {
    let c = config(&[("PAYMENT_API_KEY", "sk_test_supersecret123")]).unwrap();
    let text = format!("{c:?}");
    assert!(!text.contains("supersecret"), "{text}");
    assert_eq!(
        c.payment_api_key.unwrap().expose(),
        "sk_test_supersecret123"
    );
}
