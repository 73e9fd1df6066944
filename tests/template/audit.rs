//! The scheduled function: the same binary and build; the audit daily, a day back,
//! alarmed; the settler beside it; a role that reads, and writes only the settle.

use std::time::Duration;

use serde_norway::Value;

use crate::values::*;

pub const AUDIT: &str = "AuditFunction";
pub const AUDIT_PROPS: [&str; 3] = ["Resources", AUDIT, "Properties"];

/// The scheduled audit: the same binary and build as the consumer, started as the
/// audit, daily, reading at least a day back; an alarm on any finding in the
/// function's namespace.
pub fn audit_violations(t: &Value) -> Vec<String> {
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
        .collect::<Vec<_>>();
    for (metric, what) in [
        ("audit_findings", "any audit finding"),
        ("payment_missing", "a payment Stripe does not have"),
        ("provider_key_refused", "a key Stripe refuses"),
    ] {
        let on_it = alarmed.iter().any(|a| {
            a["MetricName"] == metric
                && a["Namespace"] == *namespace
                && number(t, &a["Threshold"]) == Some(0)
                && a["ComparisonOperator"] == "GreaterThanThreshold"
        });
        if !on_it {
            out.push(format!("no alarm on {what} ({metric} > 0)"));
        }
    }
    out
}

#[test]
pub fn the_audit_runs_daily_as_the_same_binary_with_an_alarm_on_any_finding() {
    assert_eq!(audit_violations(&template()), Vec::<String>::new());
}

#[test]
pub fn an_audit_that_is_not_daily_reads_less_than_a_day_or_goes_unalarmed_is_caught() {
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
        "no alarm on any audit finding",
    );
    caught(
        &[
            "Resources",
            "PaymentMissingAlarm",
            "Properties",
            "Namespace",
        ],
        "another".into(),
        "no alarm on a payment Stripe does not have",
    );
    caught(
        &[
            "Resources",
            "ProviderKeyRefusedAlarm",
            "Properties",
            "MetricName",
        ],
        "provider_key".into(),
        "no alarm on a key Stripe refuses",
    );
    caught(
        &at(&AUDIT_PROPS, &["CodeUri"]),
        "audit/".into(),
        "code and build",
    );
}

/// The audit's role reads the table (records by key, the awaiting index, never a scan)
/// and the secret; for the settler it writes items (the settle: `UpdateItem`, on the
/// table alone) and sends to the report queue. Nothing else, on nothing broader.
pub fn audit_role_violations(cfn: &serde_json::Value) -> Vec<String> {
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
    let index = serde_json::json!({"Fn::Sub": format!(
        "${{IdempotencyTable.Arn}}/index/{}",
        charge_once::contracts::schema::AWAITING_INDEX
    )});
    let reports = serde_json::json!({"Fn::GetAtt": ["AuthenticationEndedQueue", "Arn"]});
    // Its own key's secret when the stack has one, else the consumer's.
    let secret = serde_json::json!({"Fn::If": [
        "HasScheduledKey",
        {"Ref": "ScheduledPaymentApiKeySecretArn"},
        {"Ref": "PaymentApiKeySecretArn"}
    ]});
    let mut actions = Vec::new();
    for statement in statements(role) {
        if statement["Effect"] != "Allow" || !statement["NotAction"].is_null() {
            out.push(format!("the audit's role has a statement {statement}"));
        }
        for action in strings(&statement["Action"]) {
            let expected = match action.as_str() {
                "dynamodb:GetItem" | "dynamodb:UpdateItem" => &table,
                "dynamodb:Query" => &index,
                "sqs:SendMessage" => &reports,
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
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "secretsmanager:GetSecretValue",
            "sqs:SendMessage",
        ]
    {
        out.push(format!("the audit's role can do {actions:?}"));
    }
    out
}

#[test]
pub fn after_the_sam_transform_the_audit_role_reads_and_writes_only_the_settle() {
    let t = template();
    let cfn = transformed_template();
    assert_eq!(audit_role_violations(cfn), Vec::<String>::new());
    // The function reads the secret its role may read: its own key's, when given.
    let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:scheduled";
    for (parameters, expected) in [
        (vec![], "PaymentApiKeySecretArn"),
        (
            vec![("ScheduledPaymentApiKeySecretArn", arn)],
            "ScheduledPaymentApiKeySecretArn",
        ),
    ] {
        let deployed = crate::values::deployed(cfn, &parameters);
        let env = &deployed["Resources"][AUDIT]["Properties"]["Environment"]["Variables"];
        assert_eq!(
            env["PAYMENT_API_KEY_SECRET_ARN"],
            serde_json::json!({"Ref": expected})
        );
        let role = &deployed["Resources"]["AuditFunctionRole"]["Properties"];
        let reads: Vec<&serde_json::Value> = crate::values::statements(role)
            .filter(|s| s["Action"] == "secretsmanager:GetSecretValue")
            .map(|s| &s["Resource"])
            .collect();
        assert_eq!(reads, [&serde_json::json!({"Ref": expected})]);
    }
    // The schedules became EventBridge Scheduler schedules that invoke the function's
    // alias: the audit's and the settler's.
    let schedules: Vec<&serde_json::Value> = cfn["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["Type"] == "AWS::Scheduler::Schedule")
        .collect();
    assert_eq!(schedules.len(), 2, "{schedules:?}");
    for schedule in schedules {
        assert_eq!(
            schedule["Properties"]["Target"]["Arn"],
            serde_json::json!({"Ref": format!("{AUDIT}Aliaslive")}),
            "a schedule invokes the function's alias (operate.rs)"
        );
    }

    // Broken after the transform (the role passes through it as written).
    let broken = |sid: &str, field: &str, value: serde_json::Value, expect: &str| {
        let mut cfn = cfn.clone();
        let list = cfn["Resources"]["AuditFunctionRole"]["Properties"]["Policies"][0]
            ["PolicyDocument"]["Statement"]
            .as_array_mut()
            .unwrap();
        let statement = list.iter_mut().find(|s| s["Sid"] == sid).unwrap();
        statement[field] = value.clone();
        let found = audit_role_violations(&cfn);
        assert!(
            found.iter().any(|v| v.contains(expect)),
            "{sid}.{field} = {value} was not caught (expected {expect:?}): {found:?}"
        );
    };
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    broken(
        "IdempotencyTableRead",
        "Action",
        json(r#"["dynamodb:Scan", "dynamodb:GetItem", "dynamodb:DeleteItem"]"#),
        "may dynamodb:DeleteItem",
    );
    broken(
        "SettleAwaiting",
        "Action",
        json(r#"["dynamodb:UpdateItem", "dynamodb:PutItem"]"#),
        "may dynamodb:PutItem",
    );
    // The index's query on the whole table, or on every index, is broader.
    broken(
        "AwaitingIndex",
        "Resource",
        json(r#"{"Fn::GetAtt": ["IdempotencyTable", "Arn"]}"#),
        "dynamodb:Query on",
    );
    broken(
        "AwaitingIndex",
        "Resource",
        json(r#"{"Fn::Sub": "${IdempotencyTable.Arn}/index/*"}"#),
        "dynamodb:Query on",
    );
    broken(
        "SettleAwaiting",
        "Resource",
        json(r#""*""#),
        "dynamodb:UpdateItem on",
    );
    broken(
        "AuthenticationEnded",
        "Resource",
        json(r#"{"Fn::GetAtt": ["OrdersQueue", "Arn"]}"#),
        "sqs:SendMessage on",
    );
    broken(
        "AuthenticationEnded",
        "Action",
        json(r#"["sqs:SendMessage", "sqs:ReceiveMessage"]"#),
        "may sqs:ReceiveMessage",
    );
    // And a write the template adds later is caught through the transform too.
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
    *actions = serde_norway::from_str("[dynamodb:GetItem, dynamodb:BatchWriteItem]").unwrap();
    let found = audit_role_violations(&transformed(&writable));
    assert!(
        found
            .iter()
            .any(|v| v.contains("may dynamodb:BatchWriteItem")),
        "{found:?}"
    );
}

#[test]
pub fn the_audit_environment_parses_as_the_binary_would() {
    let t = template();
    let vars = get(&t, &at(&AUDIT_PROPS, &["Environment", "Variables"]));
    let lookup = |name: &str| -> Option<String> {
        match resolve(&t, &vars[name]) {
            Value::String(s) => Some(s.clone()),
            // `!Sub "${Days}d"`: the parameter's default, in days.
            Value::Tagged(_)
                if name == "IDEMPOTENCY_RETENTION" || name == "AUTHENTICATION_WAIT" =>
            {
                duration(&t, &vars[name]).map(|d| format!("{}s", d.as_secs()))
            }
            Value::Tagged(_) if name == "IDEMPOTENCY_TABLE" => Some("charge-once-table".to_owned()),
            Value::Tagged(_) if name == "AUTHENTICATION_ENDED_QUEUE_URL" => Some(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/authentication-ended".to_owned(),
            ),
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
    // The settler completes an order with the consumer's retention, and ends a wait
    // the consumer's wait began.
    assert_eq!(config.retention, Duration::from_secs(90 * 24 * 3600));
    assert_eq!(
        config.authentication_wait,
        Duration::from_secs(7 * 24 * 3600)
    );
    assert!(config.authentication_ended_queue_url.is_some());
    let consumer = get(&t, &at(&FN_PROPS, &["Environment", "Variables"]));
    for shared in [
        "IDEMPOTENCY_RETENTION",
        "AUTHENTICATION_WAIT",
        "AUTHENTICATION_ENDED_QUEUE_URL",
        "IDEMPOTENCY_TABLE",
        "PAYMENT_API_URL",
    ] {
        assert_eq!(vars[shared], consumer[shared], "{shared}");
    }
    // Its key's secret is its own when the stack has one (the role's test holds both).
    assert!(
        matches!(&vars["PAYMENT_API_KEY_SECRET_ARN"], Value::Tagged(t) if t.tag == "If"),
        "{:?}",
        vars["PAYMENT_API_KEY_SECRET_ARN"]
    );
}
