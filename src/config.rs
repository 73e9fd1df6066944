//! Every setting of ARCHITECTURE.md, "Settings", read from the environment once at cold start, typed and
//! validated. A missing or bad value is one error naming the variable, so the cold
//! start stops with a line that says what to fix.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::contracts::payment::StoredCredentialUsage;
pub use crate::policy::batch::plan::FifoScope;
use crate::policy::deadline;
use crate::policy::retry::MAX_VISIBILITY;

/// What the function does when Lambda invokes it (`CHARGE_ONCE_FUNCTION`): consume
/// the orders queue (the default), audit the table against the provider (the
/// scheduled `AuditFunction` of the template), or consume the refunds queue (the
/// `RefundFunction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Function {
    #[default]
    Consume,
    Audit,
    Refund,
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
    /// Whether the stack refunds (`REFUNDS`: `enabled`, the default, or `disabled`):
    /// the audit then holds the refunds too, and its key reads them.
    pub audit_refunds: bool,
    pub payment_api_url: Option<String>,
    pub payment_api_key_secret_arn: Option<String>,
    pub payment_api_key: Option<Secret>,
    pub payment_timeout: Duration,
    /// What an off-session charge says of itself (`STORED_CREDENTIAL_USAGE`).
    pub stored_credential_usage: StoredCredentialUsage,
    pub provider_key_ttl: Duration,
    /// How long the provider keeps idempotency keys (Stripe: 24 h).
    pub provider_key_lifetime: Duration,
    /// Declines per order before deliveries stop calling the provider.
    pub max_declines: u32,
    pub deadline_margin: Duration,
    pub invoke_deadline: Duration,
    pub metrics_namespace: String,
    /// Where dead letters go (ARCHITECTURE.md, "Retries"): required in Lambda, and by `invoke --sqs`.
    pub dead_letter_queue_url: Option<String>,
    /// The backoff of transient failures: `RETRY_BASE` doubling up to `RETRY_CAP`.
    pub retry_base: Duration,
    pub retry_cap: Duration,
    /// Transient failures in a row that open a dependency's breaker.
    pub breaker_threshold: u32,
    /// The fleet's provider requests a second (`PAYMENT_RATE_BUDGET`), when set, and
    /// the event source's `MaximumConcurrency` it is divided by
    /// (`EVENT_SOURCE_MAX_CONCURRENCY`): this environment's pacing ceiling.
    pub payment_rate_budget: Option<u32>,
    pub event_source_max_concurrency: Option<u32>,
    /// How long an order awaits its customer's authentication (`AUTHENTICATION_WAIT`)
    /// before the settler cancels its payment.
    pub authentication_wait: Duration,
    /// Where an order whose wait ended without a payment is reported
    /// (`AUTHENTICATION_ENDED_QUEUE_URL`): the shop's queue, to ask for another card.
    pub authentication_ended_queue_url: Option<String>,
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
/// The shortest and longest wait for a customer's authentication: the customer needs
/// time to come back, and an order's record must outlive its wait by far (the record's
/// retention is at least 30 days).
const MIN_AUTHENTICATION_WAIT: Duration = Duration::from_secs(3600);
const MAX_AUTHENTICATION_WAIT: Duration = Duration::from_secs(28 * 24 * 3600);
/// Longest a single Lambda invocation can run.
const LAMBDA_MAX: Duration = Duration::from_secs(15 * 60);

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads settings through `lookup`; an empty value counts as unset. Long because
    /// it is the list of settings: one statement each, a setting's rules in its range.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(|var: &str| lookup(var).filter(|v| !v.trim().is_empty()));
        // 90 days: four times the longest a message circulates (the queue's 7 days and
        // the DLQ's 14), so two redrives and a late producer replay still meet their
        // record; beyond that each day is paid in storage, backups and the audit's
        // reads (the cost per setting: `make bench`).
        let retention = env.duration(
            "IDEMPOTENCY_RETENTION",
            "90d",
            MIN_RETENTION..=MAX_RETENTION,
            "must be between 30 days and 5 years (a record must outlive the queue's and \
             the DLQ's retention and every redrive)",
        )?;
        let max_concurrency = env.integer("MAX_CONCURRENCY", 10, 1..=1000)?;
        let fifo_failure_scope = env.choice(
            "FIFO_FAILURE_SCOPE",
            &[("group", FifoScope::Group), ("batch", FifoScope::Batch)],
            "must be `group` (a failure stops its message group) or `batch`",
        )?;
        let (payment_timeout, provider_key_lifetime, provider_key_ttl) = provider_times(&env)?;
        let max_declines = env.integer("MAX_DECLINES", 3, 1..=100)?;
        let deadline_margin = env.duration(
            "DEADLINE_MARGIN",
            &humantime::format_duration(payment_timeout + Duration::from_secs(2)).to_string(),
            payment_timeout + deadline::SAFETY..=Duration::MAX,
            "must be at least PAYMENT_TIMEOUT + 500ms, or no record could start its charge",
        )?;
        let invoke_deadline = env.duration(
            "INVOKE_DEADLINE",
            "60s",
            deadline_margin + Duration::from_nanos(1)..=Duration::MAX,
            "must exceed DEADLINE_MARGIN, or no record could ever start",
        )?;
        let (retry_base, retry_cap) = retries(&env)?;
        let (event_source_max_concurrency, payment_rate_budget) = fleet_budget(&env)?;
        // 7 days: a customer asked by email or in the app comes back within days; a
        // shorter wait cancels payments they were about to confirm.
        let authentication_wait = env.duration(
            "AUTHENTICATION_WAIT",
            "7d",
            MIN_AUTHENTICATION_WAIT..=MAX_AUTHENTICATION_WAIT,
            "must be between 1h and 28d (the customer needs time to come back; the record \
             must outlive the wait)",
        )?;
        Ok(Self {
            table: env.name("IDEMPOTENCY_TABLE")?,
            retention,
            max_concurrency,
            fifo_failure_scope,
            function: env.choice(
                "CHARGE_ONCE_FUNCTION",
                &[
                    ("consume", Function::Consume),
                    ("audit", Function::Audit),
                    ("refund", Function::Refund),
                ],
                "must be consume, audit or refund",
            )?,
            audit_since: env.duration("AUDIT_SINCE", "1d", Duration::ZERO..=Duration::MAX, "")?,
            audit_stuck_after: env.duration(
                "AUDIT_STUCK_AFTER",
                "1h",
                Duration::ZERO..=Duration::MAX,
                "",
            )?,
            audit_refunds: env.choice(
                "REFUNDS",
                &[("enabled", true), ("disabled", false)],
                "must be enabled or disabled",
            )?,
            payment_api_url: env.base_url("PAYMENT_API_URL")?,
            payment_api_key_secret_arn: env.text("PAYMENT_API_KEY_SECRET_ARN"),
            payment_api_key: env.text("PAYMENT_API_KEY").map(Secret::new),
            payment_timeout,
            stored_credential_usage: env.choice(
                "STORED_CREDENTIAL_USAGE",
                &[
                    ("unscheduled", StoredCredentialUsage::Unscheduled),
                    ("recurring", StoredCredentialUsage::Recurring),
                    ("installment", StoredCredentialUsage::Installment),
                ],
                "must be unscheduled (an order charged when it comes), recurring (a \
                 subscription's charge) or installment (a part of one purchase)",
            )?,
            provider_key_ttl,
            provider_key_lifetime,
            max_declines,
            deadline_margin,
            invoke_deadline,
            metrics_namespace: env.namespace("METRICS_NAMESPACE", "charge-once")?,
            dead_letter_queue_url: env.url(
                "DEAD_LETTER_QUEUE_URL",
                "must be the DLQ's URL (https://sqs.<region>.amazonaws.com/<account>/<name>)",
            )?,
            retry_base,
            retry_cap,
            breaker_threshold: env.integer("BREAKER_THRESHOLD", 5, 1..=1000)?,
            payment_rate_budget,
            event_source_max_concurrency,
            authentication_wait,
            authentication_ended_queue_url: env.url(
                "AUTHENTICATION_ENDED_QUEUE_URL",
                "must be the URL of the queue that hears of orders whose authentication \
                 ended without a payment (https://sqs.<region>.amazonaws.com/<account>/<name>)",
            )?,
            ca_bundle: env.text("AWS_CA_BUNDLE").map(std::path::PathBuf::from),
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

    /// This environment's share of the fleet's provider budget, requests a second.
    pub fn payment_rate_share(&self) -> Option<f64> {
        crate::policy::pacing::share(
            self.payment_rate_budget.map(f64::from),
            self.event_source_max_concurrency.unwrap_or(1),
        )
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

/// A provider call's timeout, and how long the provider keeps a key and how long this
/// consumer reuses one: `(PAYMENT_TIMEOUT, PROVIDER_KEY_LIFETIME, PROVIDER_KEY_TTL)`.
fn provider_times(
    env: &Env<impl Fn(&str) -> Option<String>>,
) -> Result<(Duration, Duration, Duration), ConfigError> {
    let payment_timeout = env.duration(
        "PAYMENT_TIMEOUT",
        "10s",
        Duration::from_nanos(1)..=LAMBDA_MAX,
        "must be above 0 and at most 15m",
    )?;
    let provider_key_lifetime = env.duration(
        "PROVIDER_KEY_LIFETIME",
        "24h",
        KEY_TTL_HEADROOM + Duration::from_nanos(1)..=Duration::MAX,
        "must be above 1h (how long the provider keeps idempotency keys; Stripe: 24h)",
    )?;
    let provider_key_ttl = env.duration(
        "PROVIDER_KEY_TTL",
        "23h",
        Duration::from_nanos(1)..=provider_key_lifetime.saturating_sub(KEY_TTL_HEADROOM),
        &format!(
            "must be above 0 and at most PROVIDER_KEY_LIFETIME ({}) - 1h, or a key the \
                 provider has forgotten is sent again and charges twice",
            humantime::format_duration(provider_key_lifetime)
        ),
    )?;
    Ok((payment_timeout, provider_key_lifetime, provider_key_ttl))
}

/// The backoff of transient failures: `(RETRY_BASE, RETRY_CAP)`.
fn retries(
    env: &Env<impl Fn(&str) -> Option<String>>,
) -> Result<(Duration, Duration), ConfigError> {
    let retry_base = env.duration(
        "RETRY_BASE",
        "30s",
        Duration::from_secs(1)..=MAX_VISIBILITY,
        "must be between 1s and 12h (SQS counts visibility in whole seconds, and a \
             delay of 0 would retry an outage in lockstep)",
    )?;
    let retry_cap = env.duration(
        "RETRY_CAP",
        "15m",
        retry_base..=MAX_VISIBILITY,
        "must be at least RETRY_BASE and at most 12h (SQS's longest visibility)",
    )?;
    Ok((retry_base, retry_cap))
}

/// The fleet's provider budget and what divides it:
/// `(EVENT_SOURCE_MAX_CONCURRENCY, PAYMENT_RATE_BUDGET)`.
fn fleet_budget(
    env: &Env<impl Fn(&str) -> Option<String>>,
) -> Result<(Option<u32>, Option<u32>), ConfigError> {
    // Lambda's MaximumConcurrency of an SQS event source is 2..=1000.
    let event_source_max_concurrency =
        env.optional_integer("EVENT_SOURCE_MAX_CONCURRENCY", 2..=1000)?;
    let payment_rate_budget = env.optional_integer("PAYMENT_RATE_BUDGET", 1..=100_000)?;
    if let (Some(budget), None) = (payment_rate_budget, event_source_max_concurrency) {
        return Err(invalid(
            "PAYMENT_RATE_BUDGET",
            &budget.to_string(),
            "needs EVENT_SOURCE_MAX_CONCURRENCY (the event source's MaximumConcurrency), \
                 which it is divided by: each environment's share of the fleet's budget",
        ));
    }
    Ok((event_source_max_concurrency, payment_rate_budget))
}

/// The typed readers of the settings: each reads one variable (unset when empty),
/// parses it, checks its range, and names the variable in its error.
struct Env<F>(F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn text(&self, var: &str) -> Option<String> {
        (self.0)(var).map(|v| v.trim().to_owned())
    }

    /// A `humantime` duration in `range`.
    fn duration(
        &self,
        var: &'static str,
        default: &str,
        range: RangeInclusive<Duration>,
        problem: &str,
    ) -> Result<Duration, ConfigError> {
        let value = self.text(var).unwrap_or_else(|| default.to_owned());
        let parsed = humantime::parse_duration(&value).map_err(|e| ConfigError::Invalid {
            var,
            value: value.clone(),
            problem: format!("{e} (use humantime syntax such as 10s, 23h, 400d)"),
        })?;
        if range.contains(&parsed) {
            Ok(parsed)
        } else {
            let shown = humantime::format_duration(parsed).to_string();
            Err(invalid(var, &shown, problem))
        }
    }

    /// An integer in `range`.
    fn integer<T>(
        &self,
        var: &'static str,
        default: T,
        range: RangeInclusive<T>,
    ) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display,
    {
        let Some(value) = self.text(var) else {
            return Ok(default);
        };
        match value.parse::<T>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(invalid(
                var,
                &value,
                &format!("must be an integer in {}..={}", range.start(), range.end()),
            )),
        }
    }

    /// An integer in `range`, when set.
    fn optional_integer(
        &self,
        var: &'static str,
        range: RangeInclusive<u32>,
    ) -> Result<Option<u32>, ConfigError> {
        match self.text(var) {
            None => Ok(None),
            Some(_) => self.integer(var, 0, range).map(Some),
        }
    }

    /// One of `options` by name; the first when unset.
    fn choice<T: Copy>(
        &self,
        var: &'static str,
        options: &[(&str, T)],
        problem: &str,
    ) -> Result<T, ConfigError> {
        let Some(value) = self.text(var) else {
            return Ok(options[0].1);
        };
        options
            .iter()
            .find(|(name, _)| *name == value)
            .map(|(_, v)| *v)
            .ok_or_else(|| invalid(var, &value, problem))
    }

    /// An `http(s)://` URL, when set.
    fn url(&self, var: &'static str, problem: &str) -> Result<Option<String>, ConfigError> {
        match self.text(var) {
            Some(url) if !(url.starts_with("https://") || url.starts_with("http://")) => {
                Err(invalid(var, &url, problem))
            }
            url => Ok(url),
        }
    }

    /// A provider's base URL, when set: `https://host[:port]`, or `http://` to a
    /// loopback address (a local mock); no path, query or credentials. The client
    /// appends `/v1/...` itself, so a pasted `https://api.stripe.com/v1` would send
    /// every charge to `/v1/v1/...` and fail every order alike.
    fn base_url(&self, var: &'static str) -> Result<Option<String>, ConfigError> {
        let Some(text) = self.text(var) else {
            return Ok(None);
        };
        let refuse = |problem: &str| invalid(var, &text, problem);
        let url = url::Url::parse(&text).map_err(|e| {
            refuse(&format!(
                "{e}: must be a base URL such as https://api.stripe.com"
            ))
        })?;
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&url) => {}
            "http" => {
                return Err(refuse(
                    "http:// is accepted only for a loopback address (a local mock): use https://",
                ));
            }
            _ => return Err(refuse("must start with https://")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse(
                "must not carry credentials: the key is PAYMENT_API_KEY(_SECRET_ARN)",
            ));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(refuse(
                "must be a base URL without a path (https://api.stripe.com, not .../v1): \
                 the client adds /v1/... itself",
            ));
        }
        Ok(Some(text.trim_end_matches('/').to_owned()))
    }

    /// A DynamoDB table name, when set.
    fn name(&self, var: &'static str) -> Result<Option<String>, ConfigError> {
        let Some(name) = self.text(var) else {
            return Ok(None);
        };
        let ok_chars = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if (3..=255).contains(&name.len()) && ok_chars {
            Ok(Some(name))
        } else {
            Err(invalid(
                var,
                &name,
                "must be 3-255 characters of A-Z a-z 0-9 _ - .",
            ))
        }
    }

    /// A CloudWatch namespace.
    fn namespace(&self, var: &'static str, default: &str) -> Result<String, ConfigError> {
        let namespace = self.text(var).unwrap_or_else(|| default.to_owned());
        if namespace.len() > 255 {
            return Err(invalid(var, &namespace, "must be at most 255 characters"));
        }
        Ok(namespace)
    }
}

/// 127.0.0.0/8, ::1 or `localhost`: the only hosts plain HTTP may reach.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests;
