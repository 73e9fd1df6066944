//! The pattern card's fan-out (an SNS topic in front of the queue), deployable without
//! hand-written IAM: with `OrdersTopicArn` set, the queue subscribes to the topic and
//! the queue policy lets that topic alone send to it and refuses every other sender (an
//! explicit Deny, but the Stripe event rule and `OrdersQueueSenderArns`); without it,
//! neither exists.
//! Checked after the SAM transform, as CloudFormation decides its conditions.

use serde_json::{Value, json};

use crate::values::{deployed, template, transformed_template, transformed_with};

pub const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders";

/// The queue policy's statement that lets `sid`'s sender send, wherever it stands in
/// a transformed template (inside the `Fn::If` of its condition, or bare).
pub fn statement_mut<'a>(cfn: &'a mut Value, sid: &str) -> &'a mut Value {
    let statements =
        cfn["Resources"]["OrdersQueueTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
            .as_array_mut()
            .expect("the queue policy has statements");
    statements
        .iter_mut()
        .map(|s| match s.get("Fn::If") {
            Some(_) => &mut s["Fn::If"][1],
            None => s,
        })
        .find(|s| s["Sid"] == sid)
        .unwrap_or_else(|| panic!("no statement {sid}"))
}

/// The statements of the orders queue's policy as deployed (none: no policy).
pub fn queue_statements(deployed: &Value) -> Vec<Value> {
    let policies: Vec<&Value> = deployed["Resources"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, r)| r)
        .filter(|r| r["Type"] == "AWS::SQS::QueuePolicy")
        .collect();
    assert!(policies.len() <= 1, "a queue has one policy: {policies:?}");
    policies
        .first()
        .map(|p| {
            assert_eq!(p["Properties"]["Queues"], json!([{"Ref": "OrdersQueue"}]));
            p["Properties"]["PolicyDocument"]["Statement"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// What is wrong with the fan-out of a transformed template.
fn fanout_violations(cfn: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let with = deployed(cfn, &[("OrdersTopicArn", TOPIC)]);
    let without = deployed(cfn, &[]);
    let subscription = &with["Resources"]["OrdersTopicSubscription"];
    let expected = json!({
        "TopicArn": {"Ref": "OrdersTopicArn"},
        "Protocol": "sqs",
        "Endpoint": {"Fn::GetAtt": ["OrdersQueue", "Arn"]}
    });
    if subscription["Type"] != "AWS::SNS::Subscription" || subscription["Properties"] != expected {
        found.push(format!(
            "the queue must subscribe to OrdersTopicArn: {subscription}"
        ));
    }
    if !without["Resources"]["OrdersTopicSubscription"].is_null() {
        found.push("the queue subscribes to a topic when OrdersTopicArn is empty".to_owned());
    }
    let only = json!({
        "Sid": "OrdersTopicSendsOnly",
        "Effect": "Allow",
        "Principal": {"Service": "sns.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": {"Fn::GetAtt": ["OrdersQueue", "Arn"]},
        "Condition": {"ArnEquals": {"aws:SourceArn": {"Ref": "OrdersTopicArn"}}}
    });
    // Every other sender is refused, but the principals OrdersQueueSenderArns names.
    let deny = |senders: Option<&str>| {
        let mut condition = json!({"ArnNotEquals": {"aws:SourceArn": [{"Ref": "OrdersTopicArn"}]}});
        if senders.is_some() {
            condition["ArnNotLike"] = json!({"aws:PrincipalArn": {"Ref": "OrdersQueueSenderArns"}});
        }
        json!({
            "Sid": "NobodyElseSends",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": ["OrdersQueue", "Arn"]},
            "Condition": condition
        })
    };
    let statements = queue_statements(&with);
    if statements != [only.clone(), deny(None)] {
        found.push(format!(
            "the queue policy must let SNS send for OrdersTopicArn alone (aws:SourceArn) and \
             refuse every other sender: {statements:?}"
        ));
    }
    let oncall = "arn:aws:iam::123456789012:role/oncall";
    let with_senders = deployed(
        cfn,
        &[("OrdersTopicArn", TOPIC), ("OrdersQueueSenderArns", oncall)],
    );
    let statements = queue_statements(&with_senders);
    if statements != [only, deny(Some(oncall))] {
        found.push(format!(
            "with OrdersQueueSenderArns the queue must refuse every sender but the topic and \
             them: {statements:?}"
        ));
    }
    let statements = queue_statements(&without);
    if !statements.is_empty() {
        found.push(format!(
            "without a topic or an event source nobody may send to the queue by its policy: {statements:?}"
        ));
    }
    found
}

#[test]
fn with_a_topic_set_the_queue_subscribes_and_that_topic_alone_may_send() {
    assert_eq!(
        fanout_violations(transformed_template()),
        Vec::<String>::new()
    );
    // Transformed with the topic as CloudFormation receives it: the same.
    let set = transformed_with(&template(), &[("OrdersTopicArn", TOPIC)]);
    assert_eq!(fanout_violations(&set), Vec::<String>::new());
    let pattern = template()["Parameters"]["OrdersTopicArn"]["AllowedPattern"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        pattern.starts_with("^(arn:aws") && pattern.ends_with(")?$"),
        "{pattern}"
    );
}

#[test]
fn a_policy_open_to_any_topic_or_any_sender_is_caught() {
    let cfn = transformed_template().clone();
    let breakages: [(&str, Value); 3] = [
        ("Condition", json!({})),
        ("Principal", json!("*")),
        ("Action", json!("sqs:*")),
    ];
    for (field, value) in breakages {
        let mut broken = cfn.clone();
        statement_mut(&mut broken, "OrdersTopicSendsOnly")[field] = value;
        assert!(
            !fanout_violations(&broken).is_empty(),
            "a statement with {field} broken was not caught"
        );
    }
    // Without the Deny, any principal of the account allowed sqs:SendMessage sends.
    let mut open = cfn.clone();
    open["Resources"]["OrdersQueueTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
        .as_array_mut()
        .unwrap()
        .retain(|s| s["Fn::If"][1]["Sid"] != "NobodyElseSends");
    assert!(
        fanout_violations(&open)
            .iter()
            .any(|v| v.contains("refuse every other sender")),
        "a policy without the Deny was not caught"
    );
    let mut unconditional = cfn.clone();
    unconditional["Resources"]["OrdersTopicSubscription"]
        .as_object_mut()
        .unwrap()
        .remove("Condition");
    assert!(!fanout_violations(&unconditional).is_empty());
}
