//! An order that awaits its customer, as the template deploys it (ARCHITECTURE.md, "An
//! order that awaits its customer"): Stripe's events routed to the orders queue only
//! when `StripeEventSourceName` names their source, by a rule alone allowed to send;
//! the sparse awaiting index the settler reads, as `idempotent-consumer/src/schema.rs` names it; the
//! report queue and the wait both functions are given. Checked after the SAM
//! transform, with and without the parameter.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fanout::{TOPIC, queue_statements, statement_mut};
use crate::values::*;
use charge_once::contracts::schema::{self, attr};

pub const SOURCE: &str = "aws.partner/stripe.com/ed_test_61RSa2nY5kA0Vf9cU16RSa2nY5kA0Vf9c";

/// What is wrong with the routing of Stripe's events in a transformed template.
fn event_violations(cfn: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let with = deployed(cfn, &[("StripeEventSourceName", SOURCE)]);
    let without = deployed(cfn, &[]);
    let of_type = |deployed: &Value, kind: &str| -> Vec<(String, Value)> {
        deployed["Resources"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, r)| r["Type"] == kind)
            .map(|(name, r)| (name.clone(), r.clone()))
            .collect()
    };
    for kind in ["AWS::Events::EventBus", "AWS::Events::Rule"] {
        if !of_type(&without, kind).is_empty() {
            found.push(format!("an {kind} exists without StripeEventSourceName"));
        }
    }
    if !queue_statements(&without).is_empty() {
        found.push("the queue has a policy without StripeEventSourceName".to_owned());
    }

    // The bus: the partner source's own name, associating it.
    let buses = of_type(&with, "AWS::Events::EventBus");
    let source = json!({"Ref": "StripeEventSourceName"});
    let [(bus, bus_resource)] = buses.as_slice() else {
        found.push(format!("one event bus expected, found {buses:?}"));
        return found;
    };
    let props = &bus_resource["Properties"];
    if props["Name"] != source || props["EventSourceName"] != source {
        found.push(format!(
            "the bus must be named after the partner event source and associate it: {props}"
        ));
    }

    // The rule: on that bus, Stripe's three PaymentIntent events, to the orders queue.
    let rules = of_type(&with, "AWS::Events::Rule");
    let [(rule, rule_resource)] = rules.as_slice() else {
        found.push(format!("one rule expected, found {rules:?}"));
        return found;
    };
    let props = &rule_resource["Properties"];
    if props["EventBusName"] != json!({"Ref": bus}) {
        found.push(format!(
            "the rule is not on the partner bus {bus}: {}",
            props["EventBusName"]
        ));
    }
    let pattern = json!({
        "source": [{"prefix": charge_once::domain::event::STRIPE_SOURCE_PREFIX}],
        "detail-type": [
            "payment_intent.succeeded",
            "payment_intent.payment_failed",
            "payment_intent.canceled"
        ]
    });
    if props["EventPattern"] != pattern {
        found.push(format!(
            "the rule's pattern must be Stripe's PaymentIntent events: {}",
            props["EventPattern"]
        ));
    }
    if props["State"] != "ENABLED" {
        found.push("the rule is not enabled".to_owned());
    }
    let targets: Vec<&Value> = props["Targets"].as_array().into_iter().flatten().collect();
    let queue = json!({"Fn::GetAtt": ["OrdersQueue", "Arn"]});
    if targets.len() != 1 || targets[0]["Arn"] != queue {
        found.push(format!(
            "the rule's one target must be the orders queue: {targets:?}"
        ));
    }

    // The queue policy: that rule alone may send.
    let statements = queue_statements(&with);
    let expected = json!({
        "Sid": "StripeEventsRuleSendsOnly",
        "Effect": "Allow",
        "Principal": {"Service": "events.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": queue,
        "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [rule, "Arn"]}}}
    });
    if statements != [expected] {
        found.push(format!(
            "the queue policy must let EventBridge send for the rule {rule} alone (aws:SourceArn), nothing else: {statements:?}"
        ));
    }
    found
}

#[test]
fn stripes_events_reach_the_orders_queue_only_when_their_source_is_named() {
    let plain = transformed_template();
    assert_eq!(event_violations(plain), Vec::<String>::new());
    let named = transformed_with(&template(), &[("StripeEventSourceName", SOURCE)]);
    assert_eq!(event_violations(&named), Vec::<String>::new());
    let with = deployed(&named, &[("StripeEventSourceName", SOURCE)]);
    assert!(with["Resources"]["StripeEventBus"].is_object());
    assert!(deployed(&named, &[])["Resources"]["StripeEventBus"].is_null());

    // With a topic too: one policy, each sender by its own statement.
    let both = deployed(
        plain,
        &[("StripeEventSourceName", SOURCE), ("OrdersTopicArn", TOPIC)],
    );
    let statements = queue_statements(&both);
    let senders: Vec<Value> = statements
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .map(|s| s["Principal"]["Service"].clone())
        .collect();
    assert_eq!(
        senders,
        [json!("sns.amazonaws.com"), json!("events.amazonaws.com")]
    );
    // And the topic's Deny of every other sender spares the rule.
    let deny = statements
        .iter()
        .find(|s| s["Effect"] == "Deny")
        .expect("the Deny of other senders");
    assert_eq!(
        deny["Condition"]["ArnNotEquals"]["aws:SourceArn"],
        json!([{"Ref": "OrdersTopicArn"}, {"Fn::GetAtt": ["StripeEventsRule", "Arn"]}])
    );

    // The parameter takes a partner source of Stripe's, or nothing.
    let parameter = &plain["Parameters"]["StripeEventSourceName"];
    assert_eq!(parameter["Default"], "");
    assert_eq!(
        parameter["AllowedPattern"],
        r"^(aws\.partner/stripe\.com/[A-Za-z0-9._/-]{1,200})?$"
    );
}

#[test]
fn a_rule_on_another_bus_a_wider_pattern_or_a_policy_open_to_any_rule_is_caught() {
    let cfn = transformed_template().clone();
    let caught = |broken: Value, expect: &str| {
        let found = event_violations(&broken);
        assert!(
            found.iter().any(|v| v.contains(expect)),
            "not caught (expected {expect:?}): {found:?}"
        );
    };
    let mut t = cfn.clone();
    t["Resources"]["StripeEventsRule"]["Properties"]["EventBusName"] = json!("default");
    caught(t, "not on the partner bus");
    let mut t = cfn.clone();
    t["Resources"]["StripeEventsRule"]["Properties"]["EventPattern"]["detail-type"] =
        json!([{"prefix": "payment_intent."}]);
    caught(t, "pattern");
    let mut t = cfn.clone();
    t["Resources"]["StripeEventBus"]["Properties"]
        .as_object_mut()
        .unwrap()
        .remove("EventSourceName");
    caught(t, "associate it");
    let mut t = cfn.clone();
    statement_mut(&mut t, "StripeEventsRuleSendsOnly")["Condition"] =
        json!({"StringLike": {"aws:SourceArn": "arn:aws:events:*"}});
    caught(t, "for the rule StripeEventsRule alone");
    let mut t = cfn.clone();
    statement_mut(&mut t, "StripeEventsRuleSendsOnly")["Principal"] = json!("*");
    caught(t, "alone");
    let mut t = cfn.clone();
    t["Resources"]["StripeEventsRule"]
        .as_object_mut()
        .unwrap()
        .remove("Condition");
    caught(t, "without StripeEventSourceName");
}

/// The awaiting index as the table declares it: `idempotent-consumer/src/schema.rs`'s name and key
/// attributes (HASH `estado` S, RANGE `espera_hasta` N), everything projected, no
/// capacity of its own (on demand), and no other index.
#[test]
fn the_awaiting_index_is_the_schemas_sparse_index_on_state_and_wait_end() {
    let cfn = transformed_template().clone();
    let table = &cfn["Resources"]["IdempotencyTable"]["Properties"];
    assert_eq!(table["BillingMode"], "PAY_PER_REQUEST");
    let indexes = table["GlobalSecondaryIndexes"].as_array().unwrap();
    assert_eq!(indexes.len(), 1, "{indexes:?}");
    assert_eq!(
        indexes[0],
        json!({
            "IndexName": schema::AWAITING_INDEX,
            "KeySchema": [
                {"AttributeName": attr::STATE, "KeyType": "HASH"},
                {"AttributeName": attr::WAIT_UNTIL, "KeyType": "RANGE"}
            ],
            "Projection": {"ProjectionType": "ALL"}
        })
    );
    let mut defined: Vec<(String, String)> = table["AttributeDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["AttributeName"].as_str().unwrap().to_owned(),
                d["AttributeType"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    defined.sort();
    let mut expected = [(attr::PK, "S"), (attr::STATE, "S"), (attr::WAIT_UNTIL, "N")]
        .map(|(a, t)| (a.to_owned(), t.to_owned()));
    expected.sort();
    assert_eq!(defined, expected);
    // Sparse: the sort key is an attribute only an awaiting record holds, and the
    // table's own key is the one every record has.
    assert_ne!(attr::WAIT_UNTIL, attr::PK);
    assert_eq!(
        table["KeySchema"],
        json!([{"AttributeName": attr::PK, "KeyType": "HASH"}])
    );
}

/// The report queue: its own, kept 14 days, encrypted, an output the shop subscribes
/// to by URL and ARN; both functions send to it and to nothing else of the kind.
#[test]
fn ended_waits_go_to_a_queue_of_their_own_that_the_stack_outputs() {
    let cfn = transformed_template().clone();
    let queue = &cfn["Resources"]["AuthenticationEndedQueue"];
    assert_eq!(queue["Type"], "AWS::SQS::Queue");
    assert_eq!(queue["Properties"]["MessageRetentionPeriod"], 1_209_600);
    assert_eq!(queue["Properties"]["SqsManagedSseEnabled"], true);
    assert!(queue["Properties"]["RedrivePolicy"].is_null());
    let outputs = &cfn["Outputs"];
    assert_eq!(
        outputs["AuthenticationEndedQueueUrl"]["Value"],
        json!({"Ref": "AuthenticationEndedQueue"})
    );
    assert_eq!(
        outputs["AuthenticationEndedQueueArn"]["Value"],
        json!({"Fn::GetAtt": ["AuthenticationEndedQueue", "Arn"]})
    );
}

/// Both functions learn where ended waits go and how long a wait lasts, from the same
/// parameter, and their settings' own rules accept it at its default and bounds.
#[test]
fn both_functions_learn_where_ended_waits_go_and_how_long_a_wait_lasts() {
    let t = template();
    let cfn = transformed(&t);
    for function in [FUNCTION, crate::audit::AUDIT] {
        let env = &cfn["Resources"][function]["Properties"]["Environment"]["Variables"];
        assert_eq!(
            env["AUTHENTICATION_ENDED_QUEUE_URL"],
            json!({"Ref": "AuthenticationEndedQueue"}),
            "{function}"
        );
        assert_eq!(
            env["AUTHENTICATION_WAIT"],
            json!({"Fn::Sub": "${AuthenticationWaitDays}d"}),
            "{function}"
        );
    }
    let days = |field: &str| {
        number(&t, &t["Parameters"]["AuthenticationWaitDays"][field]).expect("a number")
    };
    let wait = |days: u64| {
        charge_once::config::Config::from_lookup(|var| {
            (var == "AUTHENTICATION_WAIT").then(|| format!("{days}d"))
        })
        .map(|c| c.authentication_wait)
    };
    assert_eq!(
        wait(days("Default")).unwrap(),
        Duration::from_secs(7 * 24 * 3600)
    );
    assert!(wait(days("MinValue")).is_ok());
    assert!(wait(days("MaxValue")).is_ok());
    assert!(
        wait(days("MaxValue") + 1).is_err(),
        "the parameter's bound is the setting's"
    );
    // The record outlives the longest wait: the shortest retention is longer.
    let retention_min = number(&t, &t["Parameters"]["IdempotencyRetentionDays"]["MinValue"]);
    assert!(retention_min.unwrap() > days("MaxValue"));
}

/// The settler's schedule: the scheduled function, often, with the event
/// `audit_lambda.rs` reads as "settle".
#[test]
fn the_settler_runs_every_quarter_hour_on_the_scheduled_function() {
    let cfn = transformed_template().clone();
    let settle: Vec<&Value> = cfn["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["Type"] == "AWS::Scheduler::Schedule")
        .filter(|r| r["Properties"]["Target"]["Input"].is_string())
        .collect();
    assert_eq!(settle.len(), 1, "{settle:?}");
    let props = &settle[0]["Properties"];
    assert_eq!(props["ScheduleExpression"], "rate(15 minutes)");
    assert_eq!(
        props["Target"]["Arn"],
        json!({"Ref": format!("{}Aliaslive", crate::audit::AUDIT)})
    );
    let input: Value =
        serde_json::from_str(props["Target"]["Input"].as_str().unwrap()).expect("JSON input");
    assert_eq!(input, json!({"run": "settle"}));
}
