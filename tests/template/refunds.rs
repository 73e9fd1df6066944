//! The refund function after the SAM transform: its own queue (with the partial batch
//! response), DLQ, alarms and key, its role reaching nothing else, its settings read
//! as the binary reads them; and `Refunds=disabled` leaving every part of it out.

use serde_norway::Value;

use crate::values::*;

const REFUND_FUNCTION: &str = "RefundFunction";

/// What the refund function's role can do beyond its queue, DLQ, table, key and logs.
fn refund_role_violations(cfn: &serde_json::Value) -> Vec<String> {
    let resources = &cfn["Resources"];
    let role_name = resources[REFUND_FUNCTION]["Properties"]["Role"]["Fn::GetAtt"][0].as_str();
    let Some(role_name) = role_name else {
        return vec!["the refund function's Role is not a role of this stack".to_owned()];
    };
    let role = &resources[role_name]["Properties"];
    let mut out = Vec::new();
    for arn in strings(&role["ManagedPolicyArns"]) {
        if !arn.contains("service-role/AWSLambdaBasicExecutionRole") {
            out.push(format!(
                "managed policy {arn} on the refund function's role"
            ));
        }
    }
    let arn = |name: &str| serde_json::json!({"Fn::GetAtt": [name, "Arn"]});
    let key = serde_json::json!({"Fn::If": ["HasRefundKey", {"Ref": "RefundApiKeySecretArn"}, {"Ref": "PaymentApiKeySecretArn"}]});
    let allowed: [(&str, serde_json::Value); 8] = [
        ("sqs:ReceiveMessage", arn("RefundsQueue")),
        ("sqs:DeleteMessage", arn("RefundsQueue")),
        ("sqs:GetQueueAttributes", arn("RefundsQueue")),
        ("sqs:SendMessage", arn("RefundsDeadLetterQueue")),
        ("sqs:GetQueueAttributes", arn("RefundsDeadLetterQueue")),
        ("dynamodb:GetItem", arn("IdempotencyTable")),
        ("dynamodb:UpdateItem", arn("IdempotencyTable")),
        ("secretsmanager:GetSecretValue", key),
    ];
    let mut granted = Vec::new();
    for statement in statements(role) {
        for action in strings(&statement["Action"]) {
            let pair = (action.clone(), statement["Resource"].clone());
            if !allowed.iter().any(|(a, r)| *a == action && *r == pair.1) {
                out.push(format!("{action} on {}", pair.1));
            }
            granted.push(pair);
        }
    }
    for (action, resource) in &allowed {
        if !granted.iter().any(|(a, r)| a == action && r == resource) {
            out.push(format!("missing {action} on {resource}"));
        }
    }
    out
}

#[test]
fn after_the_sam_transform_the_refund_role_reaches_only_its_queue_dlq_table_and_key() {
    assert_eq!(
        refund_role_violations(transformed_template()),
        Vec::<String>::new()
    );
}

#[test]
fn a_refund_role_that_can_query_the_table_or_send_to_the_orders_dlq_is_caught() {
    let mut t = template();
    let statements = get_mut(
        &mut t,
        &["Resources", "RefundFunctionRole", "Properties", "Policies"],
    );
    let added: Value = serde_norway::from_str(
        "{Effect: Allow, Action: [dynamodb:Query, sqs:SendMessage], Resource: '*'}",
    )
    .unwrap();
    let Value::Sequence(policies) = statements else {
        panic!("policies")
    };
    let Value::Mapping(policy) = &mut policies[0] else {
        panic!("a policy")
    };
    let document = policy.get_mut("PolicyDocument").unwrap();
    let Value::Mapping(document) = document else {
        panic!("a document")
    };
    let Some(Value::Sequence(list)) = document.get_mut("Statement") else {
        panic!("statements")
    };
    list.push(added);
    let found = refund_role_violations(&transformed(&t));
    assert!(
        found.iter().any(|v| v.starts_with("dynamodb:Query"))
            && found
                .iter()
                .any(|v| v.starts_with("sqs:SendMessage on \"*\"")),
        "{found:?}"
    );
}

#[test]
fn the_refund_function_reads_its_queue_with_partial_batch_responses_through_its_alias() {
    let cfn = deployed(transformed_template(), &[]);
    let mappings: Vec<&serde_json::Value> = cfn["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| {
            r["Type"] == "AWS::Lambda::EventSourceMapping"
                && r["Properties"]["EventSourceArn"]
                    == serde_json::json!({"Fn::GetAtt": ["RefundsQueue", "Arn"]})
        })
        .collect();
    assert_eq!(mappings.len(), 1, "{mappings:?}");
    let mapping = &mappings[0]["Properties"];
    assert_eq!(
        mapping["FunctionResponseTypes"],
        serde_json::json!(["ReportBatchItemFailures"])
    );
    assert_eq!(
        mapping["FunctionName"],
        serde_json::json!({"Ref": "RefundFunctionAliaslive"}),
        "the alias, so a rollback moves it"
    );
    let queue = &cfn["Resources"]["RefundsQueue"]["Properties"];
    assert_eq!(
        queue["RedrivePolicy"]["deadLetterTargetArn"],
        serde_json::json!({"Fn::GetAtt": ["RefundsDeadLetterQueue", "Arn"]})
    );
    let timeout = cfn["Resources"][REFUND_FUNCTION]["Properties"]["Timeout"]
        .as_u64()
        .unwrap();
    assert!(queue["VisibilityTimeout"].as_u64().unwrap() >= 6 * timeout);
    for alarm in [
        "RefundsDeadLetterArrivalAlarm",
        "RefundsOldestMessageAgeAlarm",
    ] {
        assert_eq!(
            cfn["Resources"][alarm]["Type"], "AWS::CloudWatch::Alarm",
            "{alarm}"
        );
    }
}

#[test]
fn with_refunds_disabled_no_part_of_the_refund_function_is_deployed() {
    let on = deployed(transformed_template(), &[]);
    let off = deployed(transformed_template(), &[("Refunds", "disabled")]);
    let refund_parts = |cfn: &serde_json::Value| -> Vec<String> {
        ["Resources", "Outputs"]
            .iter()
            .flat_map(|section| cfn[section].as_object().unwrap().keys())
            .filter(|name| name.starts_with("Refund"))
            .cloned()
            .collect()
    };
    let parts = refund_parts(&on);
    for expected in [
        "RefundFunction",
        "RefundFunctionRole",
        "RefundsQueue",
        "RefundsDeadLetterQueue",
        "RefundsQueueUrl",
    ] {
        assert!(parts.iter().any(|p| p == expected), "{expected}: {parts:?}");
    }
    assert_eq!(refund_parts(&off), Vec::<String>::new());
    // The audit holds refunds only with them: without, its key need not read them.
    let audit_env = &on["Resources"]["AuditFunction"]["Properties"]["Environment"]["Variables"];
    assert_eq!(audit_env["REFUNDS"], serde_json::json!({"Ref": "Refunds"}));
    for section in ["Resources", "Outputs"] {
        assert!(
            !off[section].to_string().contains("RefundsQueue"),
            "nothing else names them: {section}"
        );
    }
}

#[test]
fn the_refund_environment_parses_as_the_binary_would_with_its_own_key() {
    let key = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:refunds";
    let cfn = deployed(transformed_template(), &[("RefundApiKeySecretArn", key)]);
    let vars = &cfn["Resources"][REFUND_FUNCTION]["Properties"]["Environment"]["Variables"];
    let own_key = serde_json::json!({"Ref": "RefundApiKeySecretArn"});
    assert_eq!(vars["PAYMENT_API_KEY_SECRET_ARN"], own_key);
    let role = &cfn["Resources"]["RefundFunctionRole"]["Properties"];
    let secrets: Vec<&serde_json::Value> = statements(role)
        .filter(|s| s["Action"] == "secretsmanager:GetSecretValue")
        .map(|s| &s["Resource"])
        .collect();
    assert_eq!(secrets, vec![&own_key]);

    let lookup = |name: &str| -> Option<String> {
        match &vars[name] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            serde_json::Value::Null => None,
            // A parameter's default.
            serde_json::Value::Object(o)
                if o.get("Ref").and_then(|r| r.as_str()).is_some_and(|r| {
                    cfn["Parameters"][r]["Default"].is_number()
                        || cfn["Parameters"][r]["Default"].is_string()
                            && r != "RefundApiKeySecretArn"
                }) =>
            {
                let default = &cfn["Parameters"][o["Ref"].as_str().unwrap()]["Default"];
                Some(
                    default
                        .as_str()
                        .map_or_else(|| default.to_string(), str::to_owned),
                )
            }
            // A reference to a resource or a parameter: a plausible value of its kind.
            _ if name == "PAYMENT_API_KEY_SECRET_ARN" => Some(key.to_owned()),
            _ if name == "DEAD_LETTER_QUEUE_URL" => {
                Some("https://sqs.eu-west-1.amazonaws.com/123456789012/refunds-dlq".to_owned())
            }
            _ if name == "IDEMPOTENCY_TABLE" => Some("charge-once-table".to_owned()),
            _ if name == "IDEMPOTENCY_RETENTION" => Some("90d".to_owned()),
            _ if name == "AUTHENTICATION_WAIT" => Some("7d".to_owned()),
            _ if name.starts_with("RETRY_") => Some("30s".to_owned()),
            other => panic!("{name} = {other}"),
        }
    };
    let config = charge_once::config::Config::from_lookup(lookup).expect("valid settings");
    assert_eq!(config.function, charge_once::config::Function::Refund);
    assert!(config.require_dead_letter_queue_url().is_ok());
}
