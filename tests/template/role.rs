//! The function's role after the SAM transform: its own queue, DLQ, report queue,
//! table, secret and logs, nothing on `*` but X-Ray.

use serde_norway::Value;

use crate::values::*;

/// What the function's role can do beyond its own queue, table, secret and logs.
pub fn role_violations(cfn: &serde_json::Value) -> Vec<String> {
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
    let reports = serde_json::json!({"Fn::GetAtt": ["AuthenticationEndedQueue", "Arn"]});
    let mut sent_to = Vec::new();
    let table = serde_json::json!({"Fn::GetAtt": ["IdempotencyTable", "Arn"]});
    let secret = serde_json::json!({"Ref": "PaymentApiKeySecretArn"});
    let anything = serde_json::json!("*");
    let mut sqs_actions = Vec::new();
    let mut xray_actions = Vec::new();
    for statement in statements(role) {
        let resource = &statement["Resource"];
        for action in strings(&statement["Action"]) {
            let expected = match action.split(':').next() {
                // Dead letters and ended waits: only sent, only to the DLQ and the
                // report queue.
                Some("sqs") if action == "sqs:SendMessage" => {
                    sent_to.push(resource.clone());
                    if resource == &reports { &reports } else { &dlq }
                }
                // The DLQ's MaximumMessageSize, which dead letters are fitted to.
                Some("sqs") if action == "sqs:GetQueueAttributes" && resource == &dlq => &dlq,
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
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
            "sqs:ReceiveMessage",
            "sqs:SendMessage",
            "sqs:SendMessage",
        ]
    {
        out.push(format!(
            "the role's SQS actions on the orders queue, the DLQ and the report queue are {sqs_actions:?}"
        ));
    }
    if sent_to != [dlq.clone(), reports.clone()] {
        out.push(format!(
            "the role must send to the DLQ and the report queue, each once: {sent_to:?}"
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
pub fn after_the_sam_transform_the_function_role_reaches_only_its_queue_table_and_secret() {
    assert_eq!(
        role_violations(transformed_template()),
        Vec::<String>::new()
    );
}

#[test]
pub fn dead_letters_sent_anywhere_but_the_dlq_or_a_missing_visibility_right_are_caught() {
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
pub fn a_function_that_cannot_report_an_ended_wait_is_caught() {
    let mut t = template();
    let statements = get_mut(
        &mut t,
        &["Resources", "ChargeFunctionRole", "Properties", "Policies"],
    )[0]["PolicyDocument"]["Statement"]
        .as_sequence_mut()
        .unwrap();
    statements.retain(|s| s["Sid"] != "AuthenticationEnded");
    let found = role_violations(&transformed(&t));
    assert!(
        found
            .iter()
            .any(|v| v.contains("send to the DLQ and the report queue")),
        "{found:?}"
    );
}

#[test]
pub fn a_traced_function_whose_role_cannot_write_traces_is_caught() {
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
pub fn a_role_left_to_sam_is_caught_after_the_transform() {
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
