//! Every setting of DESIGN §7, read from the environment once at cold start, typed and
//! validated. A missing or bad value is one error naming the variable, so the cold
//! start stops with a line that says what to fix.

use std::fmt;
use std::time::Duration;

/// What the first failure in a FIFO batch stops (`FIFO_FAILURE_SCOPE`). Order in a
/// FIFO queue holds per `MessageGroupId`, so `Group` keeps every group's order while
/// other groups go on, as Powertools' `skip_group_on_error` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FifoScope {
    #[default]
    Group,
    Batch,
}

/// What the function does when Lambda invokes it (`CHARGE_ONCE_FUNCTION`): consume
/// the queue (the default), or audit the table against the provider (the scheduled
/// `AuditFunction` of the template).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Function {
    #[default]
    Consume,
    Audit,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var} is required{context}")]
    Missing {
        var: &'static str,
        context: &'static str,
    },
    #[error("{var}={value:?} is invalid: {problem}")]
    Invalid {
        var: &'static str,
        value: String,
        problem: String,
    },
}

/// A secret value: never printed, not even in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub table: Option<String>,
    pub retention: Duration,
    pub max_concurrency: usize,
    /// What a failure in a FIFO batch stops: the rest of its message group (default)
    /// or the rest of the batch.
    pub fifo_failure_scope: FifoScope,
    pub function: Function,
    /// The scheduled audit's window (`AUDIT_SINCE`) and stuck threshold
    /// (`AUDIT_STUCK_AFTER`).
    pub audit_since: Duration,
    pub audit_stuck_after: Duration,
    pub payment_api_url: Option<String>,
    pub payment_api_key_secret_arn: Option<String>,
    pub payment_api_key: Option<Secret>,
    pub payment_timeout: Duration,
    pub provider_key_ttl: Duration,
    /// How long the provider keeps idempotency keys (Stripe: 24 h).
    pub provider_key_lifetime: Duration,
    /// Declines per order before deliveries stop calling the provider.
    pub max_declines: u32,
    pub deadline_margin: Duration,
    pub invoke_deadline: Duration,
    pub metrics_namespace: String,
    /// Where dead letters go (DESIGN §6b): required in Lambda, and by `invoke --sqs`.
    pub dead_letter_queue_url: Option<String>,
    /// The backoff of transient failures: `RETRY_BASE` doubling up to `RETRY_CAP`.
    pub retry_base: Duration,
    pub retry_cap: Duration,
    /// Transient failures in a row that open a dependency's breaker.
    pub breaker_threshold: u32,
    /// Extra trusted roots for both HTTPS clients (`AWS_CA_BUNDLE`, a PEM file), on
    /// top of Mozilla's compiled-in roots: see `tls.rs`.
    pub ca_bundle: Option<std::path::PathBuf>,
}

/// Longest accepted retention: DynamoDB TTL ignores items more than five years in the
/// future, so a larger value would silently keep records forever.
const MAX_RETENTION: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// Shortest accepted retention: a record must outlive the queue's and the DLQ's
/// retention (14 days at most) and any redrive, or a late copy starts again at key 1,
/// which the provider has forgotten.
const MIN_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How far below the provider's key lifetime `PROVIDER_KEY_TTL` must stay: a key's age
/// is checked before the charge is sent, up to one invocation (15 min) earlier.
const KEY_TTL_HEADROOM: Duration = Duration::from_secs(3600);
/// Longest a single Lambda invocation can run.
const LAMBDA_MAX: Duration = Duration::from_secs(15 * 60);
/// SQS's longest visibility timeout: no retry delay can be longer.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads settings through `lookup`; an empty value counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());

        let retention = duration(&get, "IDEMPOTENCY_RETENTION", "400d")?;
        if retention < MIN_RETENTION || retention > MAX_RETENTION {
            return Err(invalid(
                "IDEMPOTENCY_RETENTION",
                &humantime::format_duration(retention).to_string(),
                "must be between 30 days and 5 years (a record must outlive the queue's and \
                 the DLQ's retention and every redrive)",
            ));
        }
        let max_concurrency = match get("MAX_CONCURRENCY") {
            None => 10,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "MAX_CONCURRENCY",
                        &v,
                        "must be an integer in 1..=1000",
                    ));
                }
            },
        };
        let fifo_failure_scope = match get("FIFO_FAILURE_SCOPE").as_deref().map(str::trim) {
            None | Some("group") => FifoScope::Group,
            Some("batch") => FifoScope::Batch,
            Some(other) => {
                return Err(invalid(
                    "FIFO_FAILURE_SCOPE",
                    other,
                    "must be `group` (a failure stops its message group) or `batch`",
                ));
            }
        };
        let payment_timeout = duration(&get, "PAYMENT_TIMEOUT", "10s")?;
        if payment_timeout.is_zero() || payment_timeout > LAMBDA_MAX {
            return Err(invalid(
                "PAYMENT_TIMEOUT",
                &humantime::format_duration(payment_timeout).to_string(),
                "must be above 0 and at most 15m",
            ));
        }
        let provider_key_lifetime = duration(&get, "PROVIDER_KEY_LIFETIME", "24h")?;
        if provider_key_lifetime <= KEY_TTL_HEADROOM {
            return Err(invalid(
                "PROVIDER_KEY_LIFETIME",
                &humantime::format_duration(provider_key_lifetime).to_string(),
                "must be above 1h (how long the provider keeps idempotency keys; Stripe: 24h)",
            ));
        }
        let provider_key_ttl = duration(&get, "PROVIDER_KEY_TTL", "23h")?;
        if provider_key_ttl.is_zero() || provider_key_ttl + KEY_TTL_HEADROOM > provider_key_lifetime
        {
            return Err(ConfigError::Invalid {
                var: "PROVIDER_KEY_TTL",
                value: humantime::format_duration(provider_key_ttl).to_string(),
                problem: format!(
                    "must be above 0 and at most PROVIDER_KEY_LIFETIME ({}) - 1h, or a key the \
                     provider has forgotten is sent again and charges twice",
                    humantime::format_duration(provider_key_lifetime)
                ),
            });
        }
        let max_declines = match get("MAX_DECLINES") {
            None => 3,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=100).contains(&n) => n,
                _ => {
                    return Err(invalid("MAX_DECLINES", &v, "must be an integer in 1..=100"));
                }
            },
        };
        let deadline_margin = match get("DEADLINE_MARGIN") {
            None => payment_timeout + Duration::from_secs(2),
            Some(v) => parse_duration("DEADLINE_MARGIN", &v)?,
        };
        if deadline_margin < payment_timeout + crate::deadline::SAFETY {
            return Err(invalid(
                "DEADLINE_MARGIN",
                &humantime::format_duration(deadline_margin).to_string(),
                "must be at least PAYMENT_TIMEOUT + 500ms, or no record could start its charge",
            ));
        }
        let invoke_deadline = duration(&get, "INVOKE_DEADLINE", "60s")?;
        if invoke_deadline <= deadline_margin {
            return Err(invalid(
                "INVOKE_DEADLINE",
                &humantime::format_duration(invoke_deadline).to_string(),
                "must exceed DEADLINE_MARGIN, or no record could ever start",
            ));
        }
        let function = match get("CHARGE_ONCE_FUNCTION").as_deref().map(str::trim) {
            None | Some("consume") => Function::Consume,
            Some("audit") => Function::Audit,
            Some(other) => {
                return Err(invalid(
                    "CHARGE_ONCE_FUNCTION",
                    other,
                    "must be consume or audit",
                ));
            }
        };
        let retry_base = duration(&get, "RETRY_BASE", "30s")?;
        if retry_base < Duration::from_secs(1) || retry_base > MAX_VISIBILITY {
            return Err(invalid(
                "RETRY_BASE",
                &humantime::format_duration(retry_base).to_string(),
                "must be between 1s and 12h (SQS counts visibility in whole seconds, and \
                 a delay of 0 would retry an outage in lockstep)",
            ));
        }
        let retry_cap = duration(&get, "RETRY_CAP", "15m")?;
        if retry_cap < retry_base || retry_cap > MAX_VISIBILITY {
            return Err(invalid(
                "RETRY_CAP",
                &humantime::format_duration(retry_cap).to_string(),
                "must be at least RETRY_BASE and at most 12h (SQS's longest visibility)",
            ));
        }
        let breaker_threshold = match get("BREAKER_THRESHOLD") {
            None => 5,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "BREAKER_THRESHOLD",
                        &v,
                        "must be an integer in 1..=1000",
                    ));
                }
            },
        };
        let dead_letter_queue_url = match get("DEAD_LETTER_QUEUE_URL") {
            None => None,
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
                Some(url.trim().to_owned())
            }
            Some(url) => {
                return Err(invalid(
                    "DEAD_LETTER_QUEUE_URL",
                    &url,
                    "must be the DLQ's URL (https://sqs.<region>.amazonaws.com/<account>/<name>)",
                ));
            }
        };
        let audit_since = duration(&get, "AUDIT_SINCE", "1d")?;
        let audit_stuck_after = duration(&get, "AUDIT_STUCK_AFTER", "1h")?;
        let payment_api_url = match get("PAYMENT_API_URL") {
            None => None,
            Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
                Some(url.trim_end_matches('/').to_owned())
            }
            Some(url) => {
                return Err(invalid(
                    "PAYMENT_API_URL",
                    &url,
                    "must start with https:// or http://",
                ));
            }
        };
        let table = get("IDEMPOTENCY_TABLE");
        if let Some(t) = &table {
            let ok_chars = t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !(3..=255).contains(&t.len()) || !ok_chars {
                return Err(invalid(
                    "IDEMPOTENCY_TABLE",
                    t,
                    "must be 3-255 characters of A-Z a-z 0-9 _ - .",
                ));
            }
        }
        let metrics_namespace =
            get("METRICS_NAMESPACE").unwrap_or_else(|| "charge-once".to_owned());
        if metrics_namespace.len() > 255 {
            return Err(invalid(
                "METRICS_NAMESPACE",
                &metrics_namespace,
                "must be at most 255 characters",
            ));
        }

        Ok(Self {
            table,
            retention,
            max_concurrency,
            fifo_failure_scope,
            function,
            audit_since,
            audit_stuck_after,
            payment_api_url,
            payment_api_key_secret_arn: get("PAYMENT_API_KEY_SECRET_ARN"),
            payment_api_key: get("PAYMENT_API_KEY").map(Secret::new),
            payment_timeout,
            provider_key_ttl,
            provider_key_lifetime,
            max_declines,
            deadline_margin,
            invoke_deadline,
            metrics_namespace,
            dead_letter_queue_url,
            retry_base,
            retry_cap,
            breaker_threshold,
            ca_bundle: get("AWS_CA_BUNDLE")
                .filter(|path| !path.trim().is_empty())
                .map(std::path::PathBuf::from),
        })
    }

    /// The table name, required wherever DynamoDB is used.
    pub fn require_table(&self) -> Result<&str, ConfigError> {
        self.table.as_deref().ok_or(ConfigError::Missing {
            var: "IDEMPOTENCY_TABLE",
            context: " (the DynamoDB idempotency table)",
        })
    }

    /// The DLQ's URL, required inside Lambda and by `invoke --sqs`.
    pub fn require_dead_letter_queue_url(&self) -> Result<&str, ConfigError> {
        self.dead_letter_queue_url
            .as_deref()
            .ok_or(ConfigError::Missing {
                var: "DEAD_LETTER_QUEUE_URL",
                context: " (the queue that takes messages no retry can fix)",
            })
    }

    /// The provider base URL, required inside Lambda.
    pub fn require_payment_api_url(&self) -> Result<&str, ConfigError> {
        self.payment_api_url.as_deref().ok_or(ConfigError::Missing {
            var: "PAYMENT_API_URL",
            context: " (the Stripe-compatible provider base URL)",
        })
    }
}

fn invalid(var: &'static str, value: &str, problem: &str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        problem: problem.to_owned(),
    }
}

fn duration(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: &str,
) -> Result<Duration, ConfigError> {
    parse_duration(var, &get(var).unwrap_or_else(|| default.to_owned()))
}

fn parse_duration(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|e| ConfigError::Invalid {
        var,
        value: value.to_owned(),
        problem: format!("{e} (use humantime syntax such as 10s, 23h, 400d)"),
    })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.retention, Duration::from_secs(400 * 24 * 3600));
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
    fn the_function_consumes_unless_told_to_audit() {
        assert_eq!(config(&[]).unwrap().function, Function::Consume);
        let audit = config(&[("CHARGE_ONCE_FUNCTION", "audit"), ("AUDIT_SINCE", "2d")]).unwrap();
        assert_eq!(audit.function, Function::Audit);
        assert_eq!(audit.audit_since, Duration::from_secs(2 * 24 * 3600));
        assert_eq!(audit.audit_stuck_after, Duration::from_secs(3600));
        let bad = config(&[("CHARGE_ONCE_FUNCTION", "charge")]).unwrap_err();
        assert!(
            bad.to_string().starts_with("CHARGE_ONCE_FUNCTION="),
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
            ("IDEMPOTENCY_TABLE", "no spaces"),
            ("RETRY_BASE", "0s"),
            ("RETRY_BASE", "13h"),
            ("RETRY_CAP", "1s"),
            ("RETRY_CAP", "1d"),
            ("BREAKER_THRESHOLD", "0"),
            ("DEAD_LETTER_QUEUE_URL", "orders-dlq"),
        ] {
            let err = config(&[(var, value)]).expect_err(var).to_string();
            assert!(err.starts_with(var), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
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
}
