//! What on-call needs from the template: a page for every order that reaches the DLQ
//! (not one page while the DLQ holds anything), an alarm when nobody reads the reports
//! of ended waits, and a version and alias per deploy that the event sources invoke,
//! so that the code can be rolled back (docs/deploy.md, "Rolling back").

use serde_json::json;
use serde_norway::Value;

use crate::values::{get_mut, is_tag, number, template, transformed_template};

/// The alarms of the template, by name.
fn alarms(t: &Value) -> Vec<(String, &Value)> {
    t["Resources"]
        .as_mapping()
        .into_iter()
        .flatten()
        .filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Alarm")
        .map(|(name, r)| (name.as_str().unwrap_or_default().to_owned(), r))
        .collect()
}

/// Whether `metric` of a metric-math query is `name` of the AWS/SQS queue `queue`.
fn is_queue_metric(query: &Value, name: &str, queue: &str) -> bool {
    let metric = &query["MetricStat"]["Metric"];
    metric["Namespace"] == "AWS/SQS"
        && metric["MetricName"] == name
        && metric["Dimensions"].as_sequence().is_some_and(|d| {
            d.iter()
                .any(|d| is_tag(&d["Value"], "GetAtt", &format!("{queue}.QueueName")))
        })
}

/// What is wrong with the DLQ's alarm: there must be one on arrivals (what the function
/// sends, and the rise of what the DLQ holds, visible or not, for what the redrive
/// policy moves in), and none on the DLQ merely holding messages, which pages once in
/// 14 days.
pub fn dead_letter_alarm_violations(t: &Value, dlq: &str) -> Vec<String> {
    let mut out = Vec::new();
    let on_arrivals = alarms(t).into_iter().any(|(_, a)| {
        let p = &a["Properties"];
        let Some(queries) = p["Metrics"].as_sequence() else {
            return false;
        };
        let id_of = |name: &str| {
            queries
                .iter()
                .find(|q| is_queue_metric(q, name, dlq))
                .and_then(|q| q["Id"].as_str())
        };
        let (Some(sent), Some(visible), Some(hidden)) = (
            id_of("NumberOfMessagesSent"),
            id_of("ApproximateNumberOfMessagesVisible"),
            id_of("ApproximateNumberOfMessagesNotVisible"),
        ) else {
            return false;
        };
        // What the DLQ holds, read or not, a missing minute repeating the last figure:
        // a read message that shows again is no arrival.
        let held = queries.iter().find(|q| {
            q["Expression"].as_str().is_some_and(|e| {
                e.contains(&format!("FILL({visible}, REPEAT)"))
                    && e.contains(&format!("FILL({hidden}, REPEAT)"))
            })
        });
        let Some(held) = held.and_then(|q| q["Id"].as_str()) else {
            return false;
        };
        let returned: Vec<&Value> = queries.iter().filter(|q| q["ReturnData"] == true).collect();
        let expression = returned
            .first()
            .and_then(|q| q["Expression"].as_str())
            .unwrap_or_default();
        returned.len() == 1
            && expression.contains(sent)
            && expression.contains(&format!("DIFF({held})"))
            && number(t, &p["Threshold"]) == Some(0)
            && p["ComparisonOperator"] == "GreaterThanThreshold"
            && number(t, &p["EvaluationPeriods"]) == Some(1)
    });
    if !on_arrivals {
        out.push(format!(
            "no alarm on messages arriving in the DLQ {dlq} (NumberOfMessagesSent + the rise of \
             ApproximateNumberOfMessagesVisible)"
        ));
    }
    for (name, a) in alarms(t) {
        let p = &a["Properties"];
        let on_depth = p["MetricName"] == "ApproximateNumberOfMessagesVisible"
            && p["Dimensions"].as_sequence().is_some_and(|d| {
                d.iter()
                    .any(|d| is_tag(&d["Value"], "GetAtt", &format!("{dlq}.QueueName")))
            });
        if on_depth {
            out.push(format!(
                "{name} alarms while the DLQ holds messages: it pages once for 14 days"
            ));
        }
    }
    out
}

/// What is wrong with the alarm on unread reports of ended waits.
fn ended_wait_alarm_violations(t: &Value) -> Vec<String> {
    let retention = number(
        t,
        &t["Resources"]["AuthenticationEndedQueue"]["Properties"]["MessageRetentionPeriod"],
    )
    .unwrap_or(345_600);
    let alarm = alarms(t).into_iter().find(|(_, a)| {
        let p = &a["Properties"];
        p["Namespace"] == "AWS/SQS"
            && p["MetricName"] == "ApproximateAgeOfOldestMessage"
            && p["Dimensions"].as_sequence().is_some_and(|d| {
                d.iter()
                    .any(|d| is_tag(&d["Value"], "GetAtt", "AuthenticationEndedQueue.QueueName"))
            })
    });
    let Some((name, alarm)) = alarm else {
        return vec!["no alarm on the age of AuthenticationEndedQueue's oldest report".to_owned()];
    };
    let p = &alarm["Properties"];
    let threshold = number(t, &p["Threshold"]);
    // A parameter's bound: what a deployer may set it to.
    let most = match &p["Threshold"] {
        Value::Tagged(tag) if tag.tag == "Ref" => tag
            .value
            .as_str()
            .and_then(|param| number(t, &t["Parameters"][param]["MaxValue"])),
        _ => threshold,
    };
    let mut out = Vec::new();
    if threshold.is_none_or(|s| s >= retention) || most.is_none_or(|s| s >= retention) {
        out.push(format!(
            "{name}'s threshold (default {threshold:?} s, at most {most:?} s) must stay below the \
             queue's retention ({retention} s): SQS deletes an unread report first"
        ));
    }
    if p["ComparisonOperator"] != "GreaterThanThreshold" || p["Statistic"] != "Maximum" {
        out.push(format!("{name} must alarm on the oldest report's age"));
    }
    out
}

#[test]
fn every_order_arriving_in_the_dlq_pages_however_many_it_already_holds() {
    assert_eq!(
        dead_letter_alarm_violations(&template(), "OrdersDeadLetterQueue"),
        Vec::<String>::new()
    );
}

#[test]
fn an_alarm_on_the_dlq_holding_messages_or_one_that_misses_the_redrive_is_caught() {
    let mut t = template();
    // The alarm this replaced: the DLQ's depth above 0, which pages for its first
    // message and then stays in ALARM for the 14 days the DLQ keeps it.
    let depth = serde_norway::from_str::<Value>(
        "Type: AWS::CloudWatch::Alarm\nProperties:\n  Namespace: AWS/SQS\n  \
         MetricName: ApproximateNumberOfMessagesVisible\n  Dimensions:\n    - Name: QueueName\n      \
         Value: !GetAtt OrdersDeadLetterQueue.QueueName\n  Statistic: Maximum\n  Period: 60\n  \
         EvaluationPeriods: 1\n  Threshold: 0\n  ComparisonOperator: GreaterThanThreshold\n",
    )
    .unwrap();
    let resources = t["Resources"].as_mapping_mut().unwrap();
    resources.remove("DeadLetterArrivalAlarm");
    resources.insert("DeadLetterQueueDepthAlarm".into(), depth);
    let found = dead_letter_alarm_violations(&t, "OrdersDeadLetterQueue");
    assert!(
        found
            .iter()
            .any(|v| v.contains("no alarm on messages arriving"))
            && found.iter().any(|v| v.contains("pages once")),
        "{found:?}"
    );

    // An expression of the alarm (its index among the metrics) broken on purpose is
    // no alarm on arrivals any more.
    let misses_arrivals = |index: &str, expression: &str| {
        let mut t = template();
        *get_mut(
            &mut t,
            &[
                "Resources",
                "DeadLetterArrivalAlarm",
                "Properties",
                "Metrics",
                index,
                "Expression",
            ],
        ) = expression.into();
        dead_letter_alarm_violations(&t, "OrdersDeadLetterQueue")
            .iter()
            .any(|v| v.contains("no alarm on messages arriving"))
    };
    // Sends alone miss what the redrive policy moves in (a crash loop).
    assert!(misses_arrivals("4", "FILL(sent, 0)"));
    // The visible messages alone: a message the runbook reads shows again after its
    // visibility and would page as an arrival.
    assert!(misses_arrivals("3", "FILL(visible, 0)"));
}

#[test]
fn an_unread_report_of_an_ended_wait_alarms_before_sqs_deletes_it() {
    assert_eq!(
        ended_wait_alarm_violations(&template()),
        Vec::<String>::new()
    );

    let mut t = template();
    *get_mut(
        &mut t,
        &["Parameters", "EndedWaitReportAgeAlarmSeconds", "MaxValue"],
    ) = Value::from(1_209_600);
    assert!(
        ended_wait_alarm_violations(&t)
            .iter()
            .any(|v| v.contains("below the queue's retention"))
    );
    let mut t = template();
    t["Resources"]
        .as_mapping_mut()
        .unwrap()
        .remove("AuthenticationEndedAgeAlarm");
    assert!(
        ended_wait_alarm_violations(&t)
            .iter()
            .any(|v| v.contains("no alarm"))
    );
}

#[test]
fn every_deploy_publishes_a_version_and_the_event_sources_invoke_its_alias() {
    let cfn = transformed_template();
    let resources = cfn["Resources"].as_object().unwrap();
    for function in ["ChargeFunction", "AuditFunction"] {
        let alias_name = format!("{function}Aliaslive");
        let alias = &resources[&alias_name];
        assert_eq!(alias["Type"], "AWS::Lambda::Alias", "{function}: {alias}");
        assert_eq!(
            alias["Properties"]["FunctionName"],
            json!({"Ref": function})
        );
        assert_eq!(alias["Properties"]["Name"], "live");
        let version = alias["Properties"]["FunctionVersion"]["Fn::GetAtt"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{function}'s alias names no version: {alias}"));
        assert_eq!(resources[version]["Type"], "AWS::Lambda::Version");
        // An old version stays, so that the alias can be pointed back at it.
        assert_eq!(resources[version]["DeletionPolicy"], "Retain");
        // Every event source of the function invokes the alias, none the function
        // itself (which would run $LATEST, beside any rollback).
        let sources: Vec<&serde_json::Value> = resources
            .values()
            .filter_map(|r| match r["Type"].as_str() {
                Some("AWS::Lambda::EventSourceMapping") => Some(&r["Properties"]["FunctionName"]),
                Some("AWS::Scheduler::Schedule") => Some(&r["Properties"]["Target"]["Arn"]),
                _ => None,
            })
            .filter(|target| target.to_string().contains(function))
            .collect();
        assert!(!sources.is_empty(), "{function} has no event source");
        for target in sources {
            assert_eq!(target, &json!({"Ref": alias_name}), "{function}'s source");
        }
    }
    // Any change publishes a version, settings included: rolling back restores them.
    let t = template();
    for function in ["ChargeFunction", "AuditFunction"] {
        let p = &t["Resources"][function]["Properties"];
        assert_eq!(p["AutoPublishAlias"], "live", "{function}");
        assert_eq!(p["AutoPublishAliasAllProperties"], true, "{function}");
    }
}
