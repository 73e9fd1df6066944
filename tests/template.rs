//! Checks `template.yaml` for what linters miss and what silently breaks the
//! guarantees: visibility timeout, partial batch responses, TTL, least privilege,
//! queue retentions, the retry path against them, the batch-size bound, the DLQ alarm.
//! Each rule is also shown failing on a template broken on purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use charge_once::retry::Backoff;
use serde_norway::Value;

fn template() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap();
    serde_norway::from_str(&text).expect("template.yaml parses (CloudFormation tags included)")
}

fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

/// A mutable node; path parts that are numbers index sequences.
fn get_mut<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &mut v[i],
        Err(_) => &mut v[*k],
    })
}

/// Resolves `!Ref Parameter` to the parameter's default; other values as they are.
fn resolve<'a>(t: &'a Value, v: &'a Value) -> &'a Value {
    if let Value::Tagged(tagged) = v
        && tagged.tag == "Ref"
        && let Some(name) = tagged.value.as_str()
    {
        let default = get(t, &["Parameters", name, "Default"]);
        if !default.is_null() {
            return default;
        }
    }
    v
}

fn number(t: &Value, v: &Value) -> Option<u64> {
    match resolve(t, v) {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn duration(t: &Value, v: &Value) -> Option<Duration> {
    if let Some((name, unit)) = sub_of_parameter(v) {
        let n = number(t, get(t, &["Parameters", name, "Default"]))?;
        return humantime::parse_duration(&format!("{n}{unit}")).ok();
    }
    resolve(t, v)
        .as_str()
        .and_then(|s| humantime::parse_duration(s).ok())
}

/// `!Sub "${Name}unit"`: (the parameter, the unit after it).
fn sub_of_parameter(v: &Value) -> Option<(&str, &str)> {
    match v {
        Value::Tagged(t) if t.tag == "Sub" => {
            let text = t.value.as_str()?.strip_prefix("${")?;
            let (name, unit) = text.split_once('}')?;
            Some((name, unit))
        }
        _ => None,
    }
}

const MIN_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// IDEMPOTENCY_RETENTION can never be deployed below 30 days: a fixed value, or a
/// number-of-days parameter whose default and minimum are both at least 30.
fn retention_violations(t: &Value, env: &Value) -> Vec<String> {
    let value = &env["IDEMPOTENCY_RETENTION"];
    if let Some((name, "d")) = sub_of_parameter(value) {
        let param = get(t, &["Parameters", name]);
        let min = number(t, &param["MinValue"]);
        let default = number(t, &param["Default"]);
        if param["Type"] != "Number" || min.is_none_or(|m| m < 30) || default.is_none_or(|d| d < 30)
        {
            return vec![format!(
                "parameter {name} (IDEMPOTENCY_RETENTION in days) must be a Number with Default and MinValue of at least 30"
            )];
        }
        return vec![];
    }
    match (value, duration(t, value)) {
        (Value::Tagged(_), _) => vec![
            "IDEMPOTENCY_RETENTION comes from a parameter with no 30-day minimum (use !Sub \"${Days}d\" of a Number parameter with MinValue 30)".to_owned(),
        ],
        (_, Some(d)) if d >= MIN_RETENTION => vec![],
        _ => vec![format!("IDEMPOTENCY_RETENTION {value:?} is below 30 days")],
    }
}

fn is_tag(v: &Value, tag: &str, value: &str) -> bool {
    matches!(v, Value::Tagged(t) if t.tag == tag && t.value.as_str() == Some(value))
}

/// The resource behind `!GetAtt Name.Arn`, or "" for anything else.
fn arn_of(v: &Value) -> String {
    match v {
        Value::Tagged(t) if t.tag == "GetAtt" => t
            .value
            .as_str()
            .unwrap_or("")
            .trim_end_matches(".Arn")
            .to_owned(),
        _ => String::new(),
    }
}

const FUNCTION: &str = "ChargeFunction";

/// Every rule the template must keep; each violation is one sentence.
fn violations(t: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let res = |name: &str| get(t, &["Resources", name]);
    let function = get(res(FUNCTION), &["Properties"]);
    let env = get(function, &["Environment", "Variables"]);
    let timeout = number(t, &function["Timeout"]).unwrap_or(3);

    // The function's event source queue, found through its SQS event.
    let events: Vec<&Value> = function["Events"]
        .as_mapping()
        .map(|m| m.values().filter(|e| e["Type"] == "SQS").collect())
        .unwrap_or_default();
    if events.is_empty() {
        out.push("the function has no SQS event".to_owned());
    }
    for event in &events {
        let props = &event["Properties"];
        let reports = props["FunctionResponseTypes"]
            .as_sequence()
            .is_some_and(|s| s.iter().any(|v| v == "ReportBatchItemFailures"));
        if !reports {
            out.push(
                "the SQS event lacks FunctionResponseTypes: [ReportBatchItemFailures]".to_owned(),
            );
        }
        // BatchSize <= MAX_CONCURRENCY x floor((Timeout - DEADLINE_MARGIN) / (PAYMENT_TIMEOUT + 2 s)).
        let max_concurrency = number(t, &env["MAX_CONCURRENCY"]).unwrap_or(10);
        let payment = duration(t, &env["PAYMENT_TIMEOUT"]).unwrap_or(Duration::from_secs(10));
        let margin =
            duration(t, &env["DEADLINE_MARGIN"]).unwrap_or(payment + Duration::from_secs(2));
        let per_record = (payment + Duration::from_secs(2)).as_secs();
        let rounds = Duration::from_secs(timeout)
            .saturating_sub(margin)
            .as_secs()
            / per_record;
        let bound = max_concurrency * rounds;
        let batch = number(t, &props["BatchSize"]).unwrap_or(10);
        if batch > bound {
            out.push(format!("BatchSize {batch} exceeds {bound} records that can start before the deadline margin"));
        }
        if let Value::Tagged(tagged) = &props["BatchSize"]
            && let Some(name) = tagged.value.as_str()
            && let Some(max) = number(t, get(t, &["Parameters", name, "MaxValue"]))
            && max > bound
        {
            out.push(format!(
                "parameter {name} allows {max}, above the bound {bound}"
            ));
        }
        let queue_name = arn_of(&props["Queue"]);
        let queue = get(res(&queue_name), &["Properties"]);
        let visibility = number(t, &queue["VisibilityTimeout"]).unwrap_or(30);
        if visibility < 6 * timeout {
            out.push(format!("queue VisibilityTimeout {visibility} s is below 6 x the function Timeout {timeout} s"));
        }
        let redrive = &queue["RedrivePolicy"];
        let dlq_name = arn_of(&redrive["deadLetterTargetArn"]);
        if dlq_name.is_empty() {
            out.push("the queue has no redrive to a DLQ".to_owned());
        }
        let queue_retention = number(t, &queue["MessageRetentionPeriod"]).unwrap_or(345_600);
        let dlq_retention = number(
            t,
            get(res(&dlq_name), &["Properties", "MessageRetentionPeriod"]),
        )
        .unwrap_or(345_600);
        if dlq_retention < 14 * 24 * 3600 || dlq_retention <= queue_retention {
            out.push(format!(
                "DLQ retention {dlq_retention} s must be 14 days and above the queue's {queue_retention} s"
            ));
        }
        out.extend(retry_path_violations(
            t,
            env,
            &redrive["maxReceiveCount"],
            timeout,
            queue_retention,
        ));
        match duration(t, &env["IDEMPOTENCY_RETENTION"]) {
            Some(r) if r.as_secs() > dlq_retention.max(queue_retention) => {}
            other => out.push(format!(
                "IDEMPOTENCY_RETENTION {other:?} must exceed both queues' retention"
            )),
        }
        let alarmed = t["Resources"].as_mapping().is_some_and(|m| {
            m.values().any(|r| {
                r["Type"] == "AWS::CloudWatch::Alarm"
                    && r["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"
                    && r["Properties"]["Dimensions"]
                        .as_sequence()
                        .is_some_and(|d| {
                            d.iter().any(|d| {
                                is_tag(&d["Value"], "GetAtt", &format!("{dlq_name}.QueueName"))
                            })
                        })
            })
        });
        if !alarmed {
            out.push("no alarm on the DLQ's depth".to_owned());
        }
    }

    let table = get(res("IdempotencyTable"), &["Properties"]);
    let ttl = &table["TimeToLiveSpecification"];
    if ttl["AttributeName"] != "expira" || ttl["Enabled"] != true {
        out.push("the table's TTL is not enabled on `expira`".to_owned());
    }

    // The event source mapping: its own metrics; provisioned pollers or a concurrency
    // cap, never both (AWS refuses the pair), and no provisioned pollers by default.
    for event in &events {
        let props = &event["Properties"];
        let metrics = props["MetricsConfig"]["Metrics"].as_sequence();
        if !metrics.is_some_and(|m| m.iter().any(|m| m == "EventCount")) {
            out.push("the SQS event has no MetricsConfig with EventCount".to_owned());
        }
        out.extend(poller_violations(t, props));
    }
    out.extend(dashboard_violations(t, env));

    // Logs the Lambda way: JSON lines (the binary follows AWS_LAMBDA_LOG_FORMAT) at a
    // level the deployer picks; X-Ray on.
    let logging = &function["LoggingConfig"];
    if logging["LogFormat"] != "JSON" {
        out.push("LoggingConfig.LogFormat is not JSON: the logs would be text lines".to_owned());
    }
    if logging["ApplicationLogLevel"].is_null() {
        out.push("LoggingConfig has no ApplicationLogLevel".to_owned());
    }
    if function["Tracing"] != "Active" {
        out.push("Tracing is not Active".to_owned());
    }

    if table["DeletionProtectionEnabled"] != true {
        out.push(
            "the table lacks DeletionProtectionEnabled: true (deleting it forgets every charge)"
                .to_owned(),
        );
    }
    out.extend(retention_violations(t, env));

    // IAM: DynamoDB only through the item actions the code uses, only on the table.
    let allowed = ["dynamodb:UpdateItem", "dynamodb:GetItem"];
    let role_policies = &get(res(&arn_of(&function["Role"])), &["Properties", "Policies"]);
    let documents: Vec<&Value> = function["Policies"]
        .as_sequence()
        .into_iter()
        .flatten()
        .chain(
            role_policies
                .as_sequence()
                .into_iter()
                .flatten()
                .map(|p| &p["PolicyDocument"]),
        )
        .collect();
    for policy in documents {
        for statement in policy["Statement"].as_sequence().into_iter().flatten() {
            let actions: Vec<&str> = match &statement["Action"] {
                Value::String(s) => vec![s.as_str()],
                Value::Sequence(s) => s.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            for action in &actions {
                if action.contains('*') {
                    out.push(format!("wildcard action {action}"));
                }
                if action.starts_with("dynamodb:") && !allowed.contains(action) {
                    out.push(format!("{action} is not an item action the code uses"));
                }
            }
            if actions.iter().any(|a| a.starts_with("dynamodb:"))
                && !is_tag(&statement["Resource"], "GetAtt", "IdempotencyTable.Arn")
            {
                out.push("DynamoDB actions are not limited to the idempotency table".to_owned());
            }
        }
    }
    out
}

/// A parameter's `field` (`Default`, `MaxValue`) behind `!Ref` or `!Sub "${Name}s"`,
/// else the value itself.
fn parameter_field(t: &Value, v: &Value, field: &str) -> Option<u64> {
    let name = match v {
        Value::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str(),
        _ => sub_of_parameter(v).map(|(name, _)| name),
    };
    match name {
        Some(name) => number(t, get(t, &["Parameters", name, field])),
        None => number(t, v).or_else(|| duration(t, v).map(|d| d.as_secs())),
    }
}

/// The retry path against the queue (ARCHITECTURE.md, "Retries"): SQS deletes a
/// message that outlives the queue's retention, with no DLQ, so the longest path (every
/// delay at its cap of jitter, one function timeout per receive) must end well before
/// it: within half of it by default, within it at every parameter's maximum. And a
/// 24-hour outage must not move an order to the DLQ: the shortest path (every delay at
/// the bottom of its jitter) must outlast it.
fn retry_path_violations(
    t: &Value,
    env: &Value,
    max_receive_count: &Value,
    timeout: u64,
    queue_retention: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    let seconds = |v: &Value, field: &str, default: u64| {
        Duration::from_secs(parameter_field(t, v, field).unwrap_or(default))
    };
    let path = |field: &str| {
        let backoff = Backoff {
            base: seconds(&env["RETRY_BASE"], field, 30),
            cap: seconds(&env["RETRY_CAP"], field, 900),
        };
        let receives = u32::try_from(parameter_field(t, max_receive_count, field).unwrap_or(3))
            .unwrap_or(u32::MAX);
        let longest = backoff.longest_path(receives) + Duration::from_secs(timeout) * receives;
        (backoff, receives, longest)
    };
    let retention = Duration::from_secs(queue_retention);
    let (backoff, receives, longest) = path("Default");
    if longest > retention / 2 {
        out.push(format!(
            "the longest retry path ({} receives: {:?}) does not end well before the queue's retention ({retention:?})",
            receives, longest
        ));
    }
    let (_, max_receives, longest_at_max) = path("MaxValue");
    if longest_at_max >= retention {
        out.push(format!(
            "at the parameters' maxima the longest retry path ({max_receives} receives: {longest_at_max:?}) outlives the queue's retention ({retention:?}): messages would expire"
        ));
    }
    let shortest = backoff.shortest_path(receives);
    if shortest < Duration::from_secs(24 * 3600) {
        out.push(format!(
            "a 24-hour outage would move orders to the DLQ: {receives} receives last at least {shortest:?}"
        ));
    }
    out
}

#[test]
fn the_template_keeps_every_rule() {
    assert_eq!(violations(&template()), Vec::<String>::new());
}

/// `(condition, when true, when false)` of an `!If`.
fn if_branches(v: &Value) -> Option<(&str, &Value, &Value)> {
    let Value::Tagged(tagged) = v else {
        return None;
    };
    if tagged.tag != "If" {
        return None;
    }
    let parts = tagged.value.as_sequence()?;
    Some((parts.first()?.as_str()?, parts.get(1)?, parts.get(2)?))
}

fn is_no_value(v: &Value) -> bool {
    matches!(v, Value::Tagged(t) if t.tag == "Ref" && t.value == "AWS::NoValue")
}

fn poller_violations(t: &Value, props: &Value) -> Vec<String> {
    let pollers = &props["ProvisionedPollerConfig"];
    if pollers.is_null() {
        return Vec::new();
    }
    let exclusive = match (if_branches(pollers), if_branches(&props["ScalingConfig"])) {
        (Some((c1, on, off)), Some((c2, cap_on, cap_off))) => {
            c1 == c2
                && !on.is_null()
                && is_no_value(off)
                && is_no_value(cap_on)
                && !cap_off.is_null()
        }
        _ => props["ScalingConfig"].is_null(),
    };
    let mut out = Vec::new();
    if !exclusive {
        out.push("ProvisionedPollerConfig and ScalingConfig can both be set".to_owned());
    }
    if number(t, get(t, &["Parameters", "MaximumPollers", "Default"])) != Some(0) {
        out.push("provisioned pollers are on by default (billed whether used or not)".to_owned());
    }
    out
}

/// The dashboard shows every outcome, both latencies, the queue's age and depth and
/// the DLQ's depth, in the namespace the function writes.
fn dashboard_violations(t: &Value, env: &Value) -> Vec<String> {
    let dashboards: Vec<&Value> = t["Resources"]
        .as_mapping()
        .into_iter()
        .flatten()
        .map(|(_, r)| r)
        .filter(|r| r["Type"] == "AWS::CloudWatch::Dashboard")
        .collect();
    let Some(dashboard) = dashboards.first() else {
        return vec!["no CloudWatch dashboard".to_owned()];
    };
    let (body, vars) = match &dashboard["Properties"]["DashboardBody"] {
        Value::Tagged(sub) if sub.tag == "Sub" => {
            (sub.value[0].as_str().unwrap_or(""), sub.value[1].clone())
        }
        other => (other.as_str().unwrap_or(""), Value::Null),
    };
    let mut out = Vec::new();
    if vars["Namespace"] != env["METRICS_NAMESPACE"] {
        out.push("the dashboard reads another namespace than METRICS_NAMESPACE".to_owned());
    }
    let shown = [
        "charged",
        "reconciled",
        "duplicate",
        "declined",
        "rejected",
        "failed_retryable",
        "deadline",
        "in_progress",
        "conflict",
        "needs_reconciliation",
        "invalid",
        "unstarted",
        "skipped",
        "deferred",
        "dead_lettered",
        "store_latency_ms",
        "payment_latency_ms",
        "ApproximateAgeOfOldestMessage",
        "ApproximateNumberOfMessagesVisible",
        "${Dlq}",
    ];
    for name in shown {
        if !body.contains(&format!("\"{name}\"")) {
            out.push(format!("the dashboard does not show {name}"));
        }
    }
    out
}

/// Breaks the template at `path` and expects a violation mentioning `expect`.
fn broken(path: &[&str], value: Value, expect: &str) {
    let mut t = template();
    *get_mut(&mut t, path) = value;
    let found = violations(&t);
    assert!(
        found.iter().any(|v| v.contains(expect)),
        "breaking {path:?} was not caught (expected {expect:?}); violations: {found:?}"
    );
}

const FN_PROPS: [&str; 3] = ["Resources", FUNCTION, "Properties"];

fn at<'a>(base: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(rest).copied().collect()
}

#[test]
fn a_dashboard_without_an_outcome_or_pollers_beside_a_concurrency_cap_are_caught() {
    let mut t = template();
    let body = get_mut(
        &mut t,
        &["Resources", "Dashboard", "Properties", "DashboardBody"],
    );
    let Value::Tagged(sub) = body else {
        panic!("DashboardBody is a !Sub")
    };
    let text = sub.value[0]
        .as_str()
        .unwrap()
        .replace("\"conflict\"", "\"x\"");
    sub.value[0] = Value::from(text);
    assert!(
        violations(&t)
            .iter()
            .any(|v| v.contains("does not show conflict"))
    );

    let events = at(&FN_PROPS, &["Events", "Orders", "Properties"]);
    broken(
        &at(&events, &["ScalingConfig"]),
        serde_norway::from_str("MaximumConcurrency: 10").unwrap(),
        "can both be set",
    );
    broken(
        &["Parameters", "MaximumPollers", "Default"],
        Value::from(2),
        "on by default",
    );
    broken(&at(&events, &["MetricsConfig"]), Value::Null, "EventCount");
}

#[test]
fn text_logs_or_no_tracing_are_caught() {
    broken(
        &at(&FN_PROPS, &["LoggingConfig", "LogFormat"]),
        Value::from("Text"),
        "LogFormat is not JSON",
    );
    broken(
        &at(&FN_PROPS, &["Tracing"]),
        Value::from("PassThrough"),
        "Tracing",
    );
}

#[test]
fn a_short_visibility_timeout_is_caught() {
    broken(
        &[
            "Resources",
            "OrdersQueue",
            "Properties",
            "VisibilityTimeout",
        ],
        Value::from(300),
        "VisibilityTimeout",
    );
    broken(
        &at(&FN_PROPS, &["Timeout"]),
        Value::from(120),
        "VisibilityTimeout",
    );
}

#[test]
fn a_missing_report_batch_item_failures_is_caught() {
    let path = at(
        &FN_PROPS,
        &["Events", "Orders", "Properties", "FunctionResponseTypes"],
    );
    broken(&path, Value::Sequence(vec![]), "ReportBatchItemFailures");
}

#[test]
fn ttl_on_another_attribute_is_caught() {
    let path = [
        "Resources",
        "IdempotencyTable",
        "Properties",
        "TimeToLiveSpecification",
        "AttributeName",
    ];
    broken(&path, Value::from("ttl"), "TTL");
}

#[test]
fn broader_iam_is_caught() {
    let statement = [
        "Resources",
        "ChargeFunctionRole",
        "Properties",
        "Policies",
        "0",
        "PolicyDocument",
        "Statement",
        "2",
    ];
    let action = at(&statement, &["Action"]);
    broken(
        &action,
        Value::Sequence(vec!["dynamodb:*".into()]),
        "wildcard",
    );
    broken(
        &action,
        Value::Sequence(vec!["dynamodb:Scan".into()]),
        "dynamodb:Scan",
    );
    broken(
        &at(&statement, &["Resource"]),
        Value::from("*"),
        "not limited to the idempotency table",
    );
}

#[test]
fn a_retry_path_that_outlives_the_queue_or_not_a_day_of_outage_is_caught() {
    // The old settings: 3 receives end in minutes.
    broken(
        &["Parameters", "MaxReceiveCount", "Default"],
        Value::from(3),
        "a 24-hour outage",
    );
    // A 4-day queue cannot hold the default path twice over.
    broken(
        &[
            "Resources",
            "OrdersQueue",
            "Properties",
            "MessageRetentionPeriod",
        ],
        Value::from(345_600),
        "does not end well before the queue's retention",
    );
    // Allowed to reach an hour per delay and 300 receives: 12 days.
    broken(
        &["Parameters", "RetryCapSeconds", "MaxValue"],
        Value::from(3600),
        "messages would expire",
    );
    broken(
        &at(&FN_PROPS, &["Environment", "Variables", "RETRY_CAP"]),
        Value::from("1h"),
        "does not end well before",
    );
}

#[test]
fn a_dlq_retention_not_above_the_queues_is_caught() {
    let path = [
        "Resources",
        "OrdersDeadLetterQueue",
        "Properties",
        "MessageRetentionPeriod",
    ];
    broken(&path, Value::from(345_600), "DLQ retention");
}

#[test]
fn a_retention_shorter_than_the_queues_is_caught() {
    broken(
        &["Parameters", "IdempotencyRetentionDays", "Default"],
        Value::from(7),
        "IDEMPOTENCY_RETENTION",
    );
}

#[test]
fn a_retention_parameter_that_allows_less_than_thirty_days_is_caught() {
    broken(
        &["Parameters", "IdempotencyRetentionDays", "MinValue"],
        Value::from(1),
        "at least 30",
    );
    broken(
        &at(
            &FN_PROPS,
            &["Environment", "Variables", "IDEMPOTENCY_RETENTION"],
        ),
        Value::from("7d"),
        "below 30 days",
    );
}

#[test]
fn a_table_without_deletion_protection_is_caught() {
    broken(
        &[
            "Resources",
            "IdempotencyTable",
            "Properties",
            "DeletionProtectionEnabled",
        ],
        Value::from(false),
        "DeletionProtectionEnabled",
    );
}

// --- The template as CloudFormation receives it ----------------------------------

/// `template` after the SAM transform (aws-sam-translator, offline), as JSON.
fn transformed(template: &Value) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (it installs aws-sam-translator into .venv from requirements-test.txt)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.yaml");
    std::fs::write(&file, serde_norway::to_string(template).unwrap()).unwrap();
    let out = std::process::Command::new(python)
        .arg(root.join("harness/servers/sam_transform.py"))
        .arg(&file)
        .arg("PaymentApiKeySecretArn=arn:aws:secretsmanager:eu-west-1:123456789012:secret:x")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SAM transform failed (is aws-sam-translator installed? `make test` installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Strings of a JSON value: a string, or each string of a list.
fn strings(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(items) => items.iter().flat_map(strings).collect(),
        other => vec![other.to_string()],
    }
}

/// Every statement of a role's inline policies (after the SAM transform).
fn statements(role: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    role["Policies"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["PolicyDocument"]["Statement"]
                .as_array()
                .into_iter()
                .flatten()
        })
}

/// What the function's role can do beyond its own queue, table, secret and logs.
fn role_violations(cfn: &serde_json::Value) -> Vec<String> {
    let resources = &cfn["Resources"];
    let mut out = Vec::new();
    let role_name = match cfn["Resources"][FUNCTION]["Properties"]["Role"]["Fn::GetAtt"][0].as_str()
    {
        Some(name) => name,
        None => return vec!["the function's Role is not a role of this stack".to_owned()],
    };
    let role = &resources[role_name]["Properties"];
    for arn in strings(&role["ManagedPolicyArns"]) {
        // Logs only; anything else (AWSLambdaSQSQueueExecutionRole: every queue) is too much.
        if !arn.contains("service-role/AWSLambdaBasicExecutionRole") {
            out.push(format!("managed policy {arn} on the function's role"));
        }
    }
    let queue = serde_json::json!({"Fn::GetAtt": ["OrdersQueue", "Arn"]});
    let dlq = serde_json::json!({"Fn::GetAtt": ["OrdersDeadLetterQueue", "Arn"]});
    let table = serde_json::json!({"Fn::GetAtt": ["IdempotencyTable", "Arn"]});
    let secret = serde_json::json!({"Ref": "PaymentApiKeySecretArn"});
    let anything = serde_json::json!("*");
    let mut sqs_actions = Vec::new();
    let mut xray_actions = Vec::new();
    for statement in statements(role) {
        let resource = &statement["Resource"];
        for action in strings(&statement["Action"]) {
            let expected = match action.split(':').next() {
                // Dead letters: only sent, only to the DLQ.
                Some("sqs") if action == "sqs:SendMessage" => &dlq,
                Some("sqs") => &queue,
                Some("dynamodb") => &table,
                Some("secretsmanager") => &secret,
                // Tracing: Active. X-Ray has no resource-level permissions.
                Some("xray")
                    if ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
                        .contains(&action.as_str()) =>
                {
                    xray_actions.push(action.clone());
                    &anything
                }
                _ => {
                    out.push(format!("unexpected action {action}"));
                    continue;
                }
            };
            if action.contains('*') || resource != expected {
                out.push(format!("{action} on {resource}, expected only {expected}"));
            }
            if action.starts_with("sqs:") {
                sqs_actions.push(action);
            }
        }
    }
    sqs_actions.sort();
    if sqs_actions
        != [
            "sqs:ChangeMessageVisibility",
            "sqs:DeleteMessage",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
            "sqs:ReceiveMessage",
            "sqs:SendMessage",
        ]
    {
        out.push(format!(
            "the role's SQS actions on the orders queue and the DLQ are {sqs_actions:?}"
        ));
    }
    let traced = cfn["Resources"][FUNCTION]["Properties"]["TracingConfig"]["Mode"] == "Active";
    if traced && !xray_actions.iter().any(|a| a == "xray:PutTraceSegments") {
        out.push("Tracing is Active but the role cannot put trace segments".to_owned());
    }
    for (name, resource) in resources.as_object().into_iter().flatten() {
        let kind = resource["Type"].as_str().unwrap_or("");
        if (kind == "AWS::IAM::Policy" || kind == "AWS::IAM::ManagedPolicy")
            && resource.to_string().contains(role_name)
        {
            out.push(format!("{name} ({kind}) adds to the function's role"));
        }
    }
    out
}

#[test]
fn after_the_sam_transform_the_function_role_reaches_only_its_queue_table_and_secret() {
    assert_eq!(
        role_violations(&transformed(&template())),
        Vec::<String>::new()
    );
}

#[test]
fn dead_letters_sent_anywhere_but_the_dlq_or_a_missing_visibility_right_are_caught() {
    let policies = ["Resources", "ChargeFunctionRole", "Properties", "Policies"];
    let mut t = template();
    let statements = get_mut(&mut t, &policies)[0]["PolicyDocument"]["Statement"]
        .as_sequence_mut()
        .unwrap();
    for statement in statements.iter_mut().filter(|s| s["Sid"] == "DeadLetters") {
        statement["Resource"] = Value::from("*");
    }
    let found = role_violations(&transformed(&t));
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("sqs:SendMessage on \"*\"")),
        "{found:?}"
    );

    let mut t = template();
    let statements = get_mut(&mut t, &policies)[0]["PolicyDocument"]["Statement"]
        .as_sequence_mut()
        .unwrap();
    for statement in statements.iter_mut().filter(|s| s["Sid"] == "OrdersQueue") {
        statement["Action"]
            .as_sequence_mut()
            .unwrap()
            .retain(|a| a != "sqs:ChangeMessageVisibility");
    }
    let found = role_violations(&transformed(&t));
    assert!(
        found.iter().any(|v| v.contains("the role's SQS actions")),
        "{found:?}"
    );
}

#[test]
fn a_traced_function_whose_role_cannot_write_traces_is_caught() {
    let mut t = template();
    let statements = get_mut(
        &mut t,
        &["Resources", "ChargeFunctionRole", "Properties", "Policies"],
    )[0]["PolicyDocument"]["Statement"]
        .as_sequence_mut()
        .unwrap();
    statements.retain(|s| s["Sid"] != "XRay");
    let found = role_violations(&transformed(&t));
    assert!(
        found
            .iter()
            .any(|v| v.contains("cannot put trace segments")),
        "{found:?}"
    );
}

#[test]
fn a_role_left_to_sam_is_caught_after_the_transform() {
    // Without a role of its own, SAM attaches AWSLambdaSQSQueueExecutionRole:
    // receive and delete on every queue of the account.
    let mut t = template();
    get_mut(&mut t, &FN_PROPS)
        .as_mapping_mut()
        .unwrap()
        .remove("Role");
    t["Resources"]
        .as_mapping_mut()
        .unwrap()
        .remove("ChargeFunctionRole");
    let found = role_violations(&transformed(&t));
    assert!(
        found
            .iter()
            .any(|v| v.contains("AWSLambdaSQSQueueExecutionRole")),
        "{found:?}"
    );
}

#[test]
fn a_batch_too_large_for_the_deadline_is_caught() {
    broken(
        &["Parameters", "BatchSize", "Default"],
        Value::from(50),
        "BatchSize 50",
    );
    broken(
        &["Parameters", "BatchSize", "MaxValue"],
        Value::from(100),
        "allows 100",
    );
    broken(
        &at(&FN_PROPS, &["Environment", "Variables", "PAYMENT_TIMEOUT"]),
        Value::from("25s"),
        "BatchSize",
    );
}

#[test]
fn a_missing_dlq_alarm_is_caught() {
    let mut t = template();
    t["Resources"]
        .as_mapping_mut()
        .unwrap()
        .remove("DeadLetterQueueDepthAlarm");
    assert!(
        violations(&t)
            .iter()
            .any(|v| v.contains("no alarm on the DLQ"))
    );
}

#[test]
fn the_environment_parses_as_the_consumer_would() {
    let t = template();
    let vars = get(&t, &at(&FN_PROPS, &["Environment", "Variables"]));
    let lookup = |name: &str| -> Option<String> {
        let v = resolve(&t, &vars[name]);
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            // `!Sub "${Days}d"`: the parameter's default, in days.
            Value::Tagged(_) if name == "IDEMPOTENCY_RETENTION" => {
                duration(&t, &vars[name]).map(|d| format!("{}s", d.as_secs()))
            }
            Value::Tagged(_) if name.starts_with("RETRY_") => {
                duration(&t, &vars[name]).map(|d| format!("{}s", d.as_secs()))
            }
            // Resource references resolve at deploy time; any valid stand-in will do.
            Value::Tagged(_) if name == "IDEMPOTENCY_TABLE" => {
                Some("charge-once-idempotency".to_owned())
            }
            Value::Tagged(_) if name == "DEAD_LETTER_QUEUE_URL" => {
                Some("https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq".to_owned())
            }
            Value::Tagged(_) => {
                Some("arn:aws:secretsmanager:eu-west-1:123456789012:secret:x".to_owned())
            }
            _ => None,
        }
    };
    let config = charge_once::config::Config::from_lookup(lookup)
        .expect("the template's settings are valid");
    assert_eq!(config.max_concurrency, 10);
    assert_eq!(config.deadline_margin, Duration::from_secs(12));
    assert_eq!(config.retention, Duration::from_secs(400 * 24 * 3600));
    assert_eq!(config.max_declines, 3, "MAX_DECLINES has its own parameter");
    assert_eq!(config.retry_base, Duration::from_secs(30));
    assert_eq!(config.retry_cap, Duration::from_secs(15 * 60));
    assert_eq!(config.breaker_threshold, 5);
    assert!(config.require_dead_letter_queue_url().is_ok());
}

const AUDIT: &str = "AuditFunction";
const AUDIT_PROPS: [&str; 3] = ["Resources", AUDIT, "Properties"];

/// The scheduled audit: the same binary and build as the consumer, started as the
/// audit, daily, reading at least a day back; an alarm on any finding in the
/// function's namespace.
fn audit_violations(t: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let consumer = get(t, &["Resources", FUNCTION]);
    let audit = get(t, &["Resources", AUDIT]);
    if audit.is_null() {
        return vec!["no AuditFunction".to_owned()];
    }
    if audit["Metadata"] != consumer["Metadata"]
        || audit["Properties"]["CodeUri"] != consumer["Properties"]["CodeUri"]
    {
        out.push("the AuditFunction is not the consumer's code and build".to_owned());
    }
    let env = &audit["Properties"]["Environment"]["Variables"];
    if env["CHARGE_ONCE_FUNCTION"] != "audit" {
        out.push("the AuditFunction does not start as the audit".to_owned());
    }
    let daily = audit["Properties"]["Events"]
        .as_mapping()
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|e| e["Type"] == "ScheduleV2")
        .filter_map(|e| resolve(t, &e["Properties"]["ScheduleExpression"]).as_str())
        .any(|expr| {
            let fields: Vec<&str> = expr
                .trim_start_matches("cron(")
                .trim_end_matches(')')
                .split(' ')
                .collect();
            expr == "rate(1 day)"
                || (expr.starts_with("cron(")
                    && fields.len() == 6
                    && fields[2..] == ["*", "*", "?", "*"])
        });
    if !daily {
        out.push("the AuditFunction has no daily ScheduleV2 event".to_owned());
    }
    if duration(t, &env["AUDIT_SINCE"]).is_none_or(|d| d < Duration::from_secs(24 * 3600)) {
        out.push("AUDIT_SINCE is shorter than the day between two audits".to_owned());
    }
    let namespace = &audit["Properties"]["Environment"]["Variables"]["METRICS_NAMESPACE"];
    let alarmed = t["Resources"]
        .as_mapping()
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|r| r["Type"] == "AWS::CloudWatch::Alarm")
        .map(|r| &r["Properties"])
        .any(|a| {
            a["MetricName"] == "audit_findings"
                && a["Namespace"] == *namespace
                && number(t, &a["Threshold"]) == Some(0)
                && a["ComparisonOperator"] == "GreaterThanThreshold"
        });
    if !alarmed {
        out.push("no alarm on any audit finding (audit_findings > 0)".to_owned());
    }
    out
}

#[test]
fn the_audit_runs_daily_as_the_same_binary_with_an_alarm_on_any_finding() {
    assert_eq!(audit_violations(&template()), Vec::<String>::new());
}

#[test]
fn an_audit_that_is_not_daily_reads_less_than_a_day_or_goes_unalarmed_is_caught() {
    let caught = |path: &[&str], value: Value, expect: &str| {
        let mut t = template();
        *get_mut(&mut t, path) = value;
        let found = audit_violations(&t);
        assert!(
            found.iter().any(|v| v.contains(expect)),
            "breaking {path:?} was not caught (expected {expect:?}): {found:?}"
        );
    };
    let env = at(&AUDIT_PROPS, &["Environment", "Variables"]);
    caught(&at(&env, &["AUDIT_SINCE"]), "12h".into(), "AUDIT_SINCE");
    caught(
        &at(&env, &["CHARGE_ONCE_FUNCTION"]),
        "consume".into(),
        "start as the audit",
    );
    caught(
        &["Parameters", "AuditSchedule", "Default"],
        "cron(0 6 ? * MON *)".into(),
        "daily",
    );
    caught(
        &[
            "Resources",
            "AuditFindingsAlarm",
            "Properties",
            "MetricName",
        ],
        "audit_stuck".into(),
        "no alarm",
    );
    caught(
        &at(&AUDIT_PROPS, &["CodeUri"]),
        "audit/".into(),
        "code and build",
    );
}

/// The audit's role reads the table (scan, get) and the secret; it writes nothing.
fn audit_role_violations(cfn: &serde_json::Value) -> Vec<String> {
    let resources = &cfn["Resources"];
    let Some(role_name) = resources[AUDIT]["Properties"]["Role"]["Fn::GetAtt"][0].as_str() else {
        return vec!["the AuditFunction's Role is not a role of this stack".to_owned()];
    };
    let role = &resources[role_name]["Properties"];
    let mut out = Vec::new();
    for arn in strings(&role["ManagedPolicyArns"]) {
        if !arn.contains("service-role/AWSLambdaBasicExecutionRole") {
            out.push(format!("managed policy {arn} on the audit's role"));
        }
    }
    let table = serde_json::json!({"Fn::GetAtt": ["IdempotencyTable", "Arn"]});
    let secret = serde_json::json!({"Ref": "PaymentApiKeySecretArn"});
    let mut actions = Vec::new();
    for statement in statements(role) {
        for action in strings(&statement["Action"]) {
            let expected = match action.as_str() {
                "dynamodb:Scan" | "dynamodb:GetItem" => &table,
                "secretsmanager:GetSecretValue" => &secret,
                _ => {
                    out.push(format!("the audit's role may {action}"));
                    continue;
                }
            };
            if statement["Resource"] != *expected {
                out.push(format!(
                    "{action} on {}, expected only {expected}",
                    statement["Resource"]
                ));
            }
            actions.push(action);
        }
    }
    actions.sort();
    if actions
        != [
            "dynamodb:GetItem",
            "dynamodb:Scan",
            "secretsmanager:GetSecretValue",
        ]
    {
        out.push(format!("the audit's role can do {actions:?}"));
    }
    out
}

#[test]
fn after_the_sam_transform_the_audit_role_only_reads() {
    let t = template();
    let cfn = transformed(&t);
    assert_eq!(audit_role_violations(&cfn), Vec::<String>::new());
    // The schedule became an EventBridge Scheduler schedule that invokes the audit.
    let schedules: Vec<&serde_json::Value> = cfn["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["Type"] == "AWS::Scheduler::Schedule")
        .collect();
    assert_eq!(schedules.len(), 1, "{schedules:?}");
    assert_eq!(
        schedules[0]["Properties"]["Target"]["Arn"],
        serde_json::json!({"Fn::GetAtt": [AUDIT, "Arn"]})
    );

    let mut writable = t.clone();
    let actions = get_mut(
        &mut writable,
        &[
            "Resources",
            "AuditFunctionRole",
            "Properties",
            "Policies",
            "0",
            "PolicyDocument",
            "Statement",
            "0",
            "Action",
        ],
    );
    *actions =
        serde_norway::from_str("[dynamodb:Scan, dynamodb:GetItem, dynamodb:UpdateItem]").unwrap();
    let found = audit_role_violations(&transformed(&writable));
    assert!(
        found.iter().any(|v| v.contains("may dynamodb:UpdateItem")),
        "{found:?}"
    );
}

#[test]
fn the_audit_environment_parses_as_the_binary_would() {
    let t = template();
    let vars = get(&t, &at(&AUDIT_PROPS, &["Environment", "Variables"]));
    let lookup = |name: &str| -> Option<String> {
        match resolve(&t, &vars[name]) {
            Value::String(s) => Some(s.clone()),
            Value::Tagged(_) if name == "IDEMPOTENCY_TABLE" => Some("charge-once-table".to_owned()),
            Value::Tagged(_) => {
                Some("arn:aws:secretsmanager:eu-west-1:123456789012:secret:x".to_owned())
            }
            _ => None,
        }
    };
    let config = charge_once::config::Config::from_lookup(lookup).expect("valid settings");
    assert_eq!(config.function, charge_once::config::Function::Audit);
    assert_eq!(config.audit_since, Duration::from_secs(25 * 3600));
    assert_eq!(config.audit_stuck_after, Duration::from_secs(3600));
}
