//! The rules of the consumer's template: event source, queue and DLQ, retention,
//! TTL, logs, IAM limited to the table's item actions, pollers, dashboard, the batch
//! bound, the DLQ alarm, the table class as a parameter; each shown failing on a
//! template broken on purpose.

use std::time::Duration;

use serde_norway::Value;

use crate::retry_path::retry_path_violations;
use crate::values::*;

pub const MIN_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// IDEMPOTENCY_RETENTION can never be deployed below 30 days: a fixed value, or a
/// number-of-days parameter whose default and minimum are both at least 30.
pub fn retention_violations(t: &Value, env: &Value) -> Vec<String> {
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

/// Every rule the template must keep; each violation is one sentence.
pub fn violations(t: &Value) -> Vec<String> {
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
        // BatchSize <= MAX_CONCURRENCY x rounds, where a round of records starts every
        // PAYMENT_TIMEOUT + 2 s while DEADLINE_MARGIN is left before the records'
        // deadline (the function's, less the room kept for the queue steps):
        // rounds = floor((Timeout - queue reserve - DEADLINE_MARGIN) / (PAYMENT_TIMEOUT + 2 s)) + 1.
        let max_concurrency = number(t, &env["MAX_CONCURRENCY"]).unwrap_or(10);
        let payment = duration(t, &env["PAYMENT_TIMEOUT"]).unwrap_or(Duration::from_secs(10));
        let margin =
            duration(t, &env["DEADLINE_MARGIN"]).unwrap_or(payment + Duration::from_secs(2));
        let per_record = (payment + Duration::from_secs(2)).as_millis();
        let rounds = Duration::from_secs(timeout)
            .saturating_sub(charge_once::policy::deadline::QUEUE_RESERVE)
            .checked_sub(margin)
            .map_or(0, |window| {
                u64::try_from(window.as_millis() / per_record).unwrap() + 1
            });
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
        out.extend(crate::operate::dead_letter_alarm_violations(t, &dlq_name));
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
    out.extend(table_class_violations(t, table));

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

/// The table's class is a parameter that offers both classes (Standard, and
/// Standard-IA: cheaper storage, dearer writes) and defaults to one of them.
pub fn table_class_violations(t: &Value, table: &Value) -> Vec<String> {
    const CLASSES: [&str; 2] = ["STANDARD", "STANDARD_INFREQUENT_ACCESS"];
    let Value::Tagged(tagged) = &table["TableClass"] else {
        return vec!["the table's TableClass is not a parameter (!Ref)".to_owned()];
    };
    let Some(name) = tagged.value.as_str().filter(|_| tagged.tag == "Ref") else {
        return vec!["the table's TableClass is not a parameter (!Ref)".to_owned()];
    };
    let param = get(t, &["Parameters", name]);
    let allowed: Vec<&str> = param["AllowedValues"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Vec::new();
    if param["Type"] != "String"
        || allowed.len() != 2
        || !CLASSES.iter().all(|c| allowed.contains(c))
    {
        out.push(format!(
            "parameter {name} (the table class) must be a String allowing exactly {CLASSES:?}"
        ));
    }
    if !param["Default"]
        .as_str()
        .is_some_and(|d| CLASSES.contains(&d))
    {
        out.push(format!("parameter {name} has no default table class"));
    }
    out
}

#[test]
fn the_template_keeps_every_rule() {
    assert_eq!(violations(&template()), Vec::<String>::new());
}

/// `(condition, when true, when false)` of an `!If`.
pub fn if_branches(v: &Value) -> Option<(&str, &Value, &Value)> {
    let Value::Tagged(tagged) = v else {
        return None;
    };
    if tagged.tag != "If" {
        return None;
    }
    let parts = tagged.value.as_sequence()?;
    Some((parts.first()?.as_str()?, parts.get(1)?, parts.get(2)?))
}

pub fn is_no_value(v: &Value) -> bool {
    matches!(v, Value::Tagged(t) if t.tag == "Ref" && t.value == "AWS::NoValue")
}

pub fn poller_violations(t: &Value, props: &Value) -> Vec<String> {
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

/// The dashboard shows every declared outcome (and no other among them), both latencies, the queue's age and depth and
/// the DLQ's depth, in the namespace the function writes.
pub fn dashboard_violations(t: &Value, env: &Value) -> Vec<String> {
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
    // Every declared outcome, and nothing else, besides the other counters.
    let outcomes: Vec<&str> = charge_once::policy::outcome_kind::DECLARED
        .iter()
        .map(|d| d.name)
        .collect();
    let counters = [
        "dead_lettered",
        "charge_retried",
        "queue_failures",
        "takeover",
        "payment_missing",
    ];
    let charted = outcome_widget_metrics(body);
    for name in &charted {
        if !outcomes.contains(&name.as_str()) && !counters.contains(&name.as_str()) {
            out.push(format!(
                "the dashboard's outcomes show {name}, which is no outcome"
            ));
        }
    }
    let shown = outcomes.into_iter().chain(counters).chain([
        "store_latency_ms",
        "payment_latency_ms",
        // Backpressure, apart from failures: rate limits, locks, the pace's waits.
        "provider_rate_limited",
        "provider_locked",
        "pacing_wait_ms",
        "ApproximateAgeOfOldestMessage",
        "ApproximateNumberOfMessagesVisible",
        "${Dlq}",
    ]);
    for name in shown {
        if !body.contains(&format!("\"{name}\"")) {
            out.push(format!("the dashboard does not show {name}"));
        }
    }
    out
}

/// The metric names of the dashboard's "Record outcomes" widget.
fn outcome_widget_metrics(body: &str) -> Vec<String> {
    let Ok(parsed) = serde_json::from_str::<serde_json::Value>(body) else {
        return vec!["(the dashboard body is not JSON)".to_owned()];
    };
    parsed["widgets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["properties"]["title"] == "Record outcomes")
        .flat_map(|w| {
            w["properties"]["metrics"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|m| m.get(1)?.as_str().map(str::to_owned))
        .collect()
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
    assert!(
        violations(&t)
            .iter()
            .any(|v| v.contains("show x, which is no outcome"))
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
fn a_fixed_or_unknown_table_class_is_caught() {
    broken(
        &["Resources", "IdempotencyTable", "Properties", "TableClass"],
        Value::from("STANDARD"),
        "not a parameter",
    );
    broken(
        &["Parameters", "TableClass", "AllowedValues"],
        serde_norway::from_str("[STANDARD, GLACIER]").unwrap(),
        "allowing exactly",
    );
    broken(
        &["Parameters", "TableClass", "Default"],
        Value::from("STANDARD_IA"),
        "no default table class",
    );
}

/// CloudFormation receives the class as the parameter, with both values allowed.
#[test]
fn the_table_class_reaches_cloudformation_as_the_parameter() {
    let out = transformed_template();
    assert_eq!(
        out["Resources"]["IdempotencyTable"]["Properties"]["TableClass"],
        serde_json::json!({"Ref": "TableClass"})
    );
    assert_eq!(
        out["Parameters"]["TableClass"]["AllowedValues"],
        serde_json::json!(["STANDARD", "STANDARD_INFREQUENT_ACCESS"])
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
            Value::Tagged(_) if name.starts_with("RETRY_") || name == "AUTHENTICATION_WAIT" => {
                duration(&t, &vars[name]).map(|d| format!("{}s", d.as_secs()))
            }
            // Resource references resolve at deploy time; any valid stand-in will do.
            Value::Tagged(_) if name == "IDEMPOTENCY_TABLE" => {
                Some("charge-once-idempotency".to_owned())
            }
            Value::Tagged(_) if name == "DEAD_LETTER_QUEUE_URL" => {
                Some("https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq".to_owned())
            }
            Value::Tagged(_) if name == "AUTHENTICATION_ENDED_QUEUE_URL" => Some(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/authentication-ended".to_owned(),
            ),
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
    assert_eq!(config.retention, Duration::from_secs(90 * 24 * 3600));
    assert_eq!(config.max_declines, 3, "MAX_DECLINES has its own parameter");
    assert_eq!(config.retry_base, Duration::from_secs(30));
    assert_eq!(config.retry_cap, Duration::from_secs(15 * 60));
    assert_eq!(config.breaker_threshold, 5);
    assert!(config.require_dead_letter_queue_url().is_ok());
    assert_eq!(
        config.authentication_wait,
        Duration::from_secs(7 * 24 * 3600)
    );
    assert!(config.authentication_ended_queue_url.is_some());
}

/// The function learns the event source's `MaximumConcurrency` (its fleet budget's
/// divisor) and an optional fleet budget, empty by default (no budget: the pace is
/// found from the provider's answers); the settings' own rules accept both defaults.
#[test]
fn the_function_gets_the_event_sources_concurrency_and_no_fleet_budget_by_default() {
    let t = template();
    let env = get(
        &t,
        &[
            "Resources",
            FUNCTION,
            "Properties",
            "Environment",
            "Variables",
        ],
    );
    let divisor = &env["EVENT_SOURCE_MAX_CONCURRENCY"];
    assert!(
        matches!(divisor, Value::Tagged(tag) if tag.tag == "Ref" && tag.value == "MaximumConcurrency"),
        "{divisor:?}"
    );
    let budget = &env["PAYMENT_RATE_BUDGET"];
    assert!(
        matches!(budget, Value::Tagged(tag) if tag.tag == "Ref" && tag.value == "PaymentRateBudget"),
        "{budget:?}"
    );
    assert_eq!(
        resolve(&t, budget).as_str(),
        Some(""),
        "no budget by default"
    );
    let concurrency = number(&t, divisor).expect("a number");
    let config = charge_once::config::Config::from_lookup(|var| match var {
        "EVENT_SOURCE_MAX_CONCURRENCY" => Some(concurrency.to_string()),
        "PAYMENT_RATE_BUDGET" => Some("25".to_owned()),
        _ => None,
    })
    .expect("the template's values are valid settings");
    assert_eq!(config.payment_rate_share(), Some(25.0 / concurrency as f64));
}
