//! Checks `template.yaml` for what linters miss and what silently breaks the
//! guarantees: visibility timeout, partial batch responses, TTL, least privilege,
//! queue retentions, the batch-size bound, the DLQ alarm. Each rule is also shown
//! failing on a template broken on purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

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
    resolve(t, v)
        .as_str()
        .and_then(|s| humantime::parse_duration(s).ok())
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

    // IAM: DynamoDB only through the item actions the code uses, only on the table.
    let allowed = ["dynamodb:UpdateItem", "dynamodb:GetItem"];
    for policy in function["Policies"].as_sequence().into_iter().flatten() {
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

#[test]
fn the_template_keeps_every_rule() {
    assert_eq!(violations(&template()), Vec::<String>::new());
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
    let statement = at(&FN_PROPS, &["Policies", "0", "Statement", "0"]);
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
        &["Parameters", "IdempotencyRetention", "Default"],
        Value::from("7d"),
        "IDEMPOTENCY_RETENTION",
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
            // Resource references resolve at deploy time; any valid stand-in will do.
            Value::Tagged(_) if name == "IDEMPOTENCY_TABLE" => {
                Some("charge-once-idempotency".to_owned())
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
}
