//! The pattern card's fan-out (an SNS topic in front of the queue), deployable without
//! hand-written IAM: with `OrdersTopicArn` set, the queue subscribes to the topic and
//! a queue policy lets that topic alone send to it. Checked after the SAM transform.

use serde_json::{Value, json};

use crate::values::{template, transformed};

/// What is wrong with the fan-out of a transformed template.
fn fanout_violations(cfn: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let when_set = json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "OrdersTopicArn"}, ""]}]});
    if cfn["Conditions"]["HasOrdersTopic"] != when_set {
        found.push("HasOrdersTopic must hold exactly when OrdersTopicArn is set".to_owned());
    }
    let subscription = &cfn["Resources"]["OrdersTopicSubscription"];
    let expected = json!({
        "TopicArn": {"Ref": "OrdersTopicArn"},
        "Protocol": "sqs",
        "Endpoint": {"Fn::GetAtt": ["OrdersQueue", "Arn"]}
    });
    if subscription["Type"] != "AWS::SNS::Subscription"
        || subscription["Condition"] != "HasOrdersTopic"
        || subscription["Properties"] != expected
    {
        found.push(format!(
            "the queue must subscribe to OrdersTopicArn: {subscription}"
        ));
    }
    let policy = &cfn["Resources"]["OrdersQueueTopicPolicy"];
    if policy["Condition"] != "HasOrdersTopic"
        || policy["Properties"]["Queues"] != json!([{"Ref": "OrdersQueue"}])
    {
        found.push(format!(
            "the queue policy must apply to the orders queue only, when the topic is set: {policy}"
        ));
    }
    let statements = policy["Properties"]["PolicyDocument"]["Statement"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let only = json!({
        "Sid": "OrdersTopicSendsOnly",
        "Effect": "Allow",
        "Principal": {"Service": "sns.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": {"Fn::GetAtt": ["OrdersQueue", "Arn"]},
        "Condition": {"ArnEquals": {"aws:SourceArn": {"Ref": "OrdersTopicArn"}}}
    });
    if statements != [only] {
        found.push(format!(
            "the queue policy must let SNS send for OrdersTopicArn alone (aws:SourceArn), nothing else: {statements:?}"
        ));
    }
    found
}

#[test]
fn with_a_topic_set_the_queue_subscribes_and_that_topic_alone_may_send() {
    let cfn = transformed(&template());
    assert_eq!(fanout_violations(&cfn), Vec::<String>::new());
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
    let cfn = transformed(&template());
    let statement = [
        "Resources",
        "OrdersQueueTopicPolicy",
        "Properties",
        "PolicyDocument",
        "Statement",
    ];
    let breakages: [(&str, Value); 3] = [
        ("Condition", json!({})),
        ("Principal", json!("*")),
        ("Action", json!("sqs:*")),
    ];
    for (field, value) in breakages {
        let mut broken = cfn.clone();
        let mut node = &mut broken;
        for step in statement {
            node = &mut node[step];
        }
        node[0][field] = value;
        assert!(
            !fanout_violations(&broken).is_empty(),
            "a statement with {field} broken was not caught"
        );
    }
    let mut unconditional = cfn.clone();
    unconditional["Resources"]["OrdersTopicSubscription"]
        .as_object_mut()
        .unwrap()
        .remove("Condition");
    assert!(!fanout_violations(&unconditional).is_empty());
}
