//! Traces (docs/deploy.md, "Traces"): with `CollectorLayerArn` set, the consumer runs
//! with that layer and the OTLP settings that send its spans to it on localhost;
//! without, neither the layer nor any `OTEL_*` setting, so nothing is exported.
//! Checked after the SAM transform, with its conditions evaluated both ways.

use serde_json::{Map, Value, json};

use crate::values::{FUNCTION, template, transformed};

/// A condition of the transformed template, with `CollectorLayerArn` = `layer` (the
/// few intrinsics the template's conditions use; any other is a failure).
fn holds(cfn: &Value, condition: &Value, layer: &str) -> bool {
    let value = |v: &Value| -> Value {
        match v.get("Ref").and_then(Value::as_str) {
            Some("CollectorLayerArn") => json!(layer),
            Some(other) => json!(cfn["Parameters"][other]["Default"]),
            None => v.clone(),
        }
    };
    if let Some(name) = condition.get("Condition").and_then(Value::as_str) {
        return holds(cfn, &cfn["Conditions"][name], layer);
    }
    if let Some([inner]) = condition
        .get("Fn::Not")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        return !holds(cfn, inner, layer);
    }
    if let Some([a, b]) = condition
        .get("Fn::Equals")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        return value(a).to_string().trim_matches('"') == value(b).to_string().trim_matches('"');
    }
    panic!("an intrinsic this check does not evaluate: {condition}");
}

/// `node` with every `Fn::If` chosen, every `AWS::NoValue` removed and the parameter
/// put in, as
/// CloudFormation deploys it with `CollectorLayerArn` = `layer`; `None`: no value.
fn deployed(cfn: &Value, node: &Value, layer: &str) -> Option<Value> {
    match node {
        Value::Object(map) => {
            match map.get("Ref").and_then(Value::as_str) {
                Some("AWS::NoValue") => return None,
                Some("CollectorLayerArn") => return Some(json!(layer)),
                _ => {}
            }
            if let Some([name, then, otherwise]) = map
                .get("Fn::If")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
            {
                let name = name.as_str().unwrap();
                let chosen = if holds(cfn, &cfn["Conditions"][name], layer) {
                    then
                } else {
                    otherwise
                };
                return deployed(cfn, chosen, layer);
            }
            let out: Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| deployed(cfn, v, layer).map(|v| (k.clone(), v)))
                .collect();
            Some(Value::Object(out))
        }
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .filter_map(|v| deployed(cfn, v, layer))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// What is wrong with the consumer's traces in `cfn`, deployed both ways.
fn traces_violations(cfn: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let function = &cfn["Resources"][FUNCTION];
    let arn = "arn:aws:lambda:eu-west-1:901920570463:layer:aws-otel-collector-arm64-ver-0-117-0:1";
    for (layer, with) in [("", false), (arn, true)] {
        let props = deployed(cfn, &function["Properties"], layer).unwrap();
        let layers = props.get("Layers");
        let env = &props["Environment"]["Variables"];
        let otel: Vec<&String> = env
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .filter(|k| k.starts_with("OTEL_"))
            .collect();
        if with {
            if layers != Some(&json!([arn])) {
                found.push(format!("with CollectorLayerArn set the function must run with that layer alone: {layers:?}"));
            }
            if env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://localhost:4318"
                || env["OTEL_EXPORTER_OTLP_PROTOCOL"] != "http/protobuf"
            {
                found.push(format!("with CollectorLayerArn set the spans must go to the collector on localhost over OTLP/HTTP: {otel:?}"));
            }
        } else {
            if layers.is_some_and(|l| l != &json!([])) {
                found.push(format!(
                    "without CollectorLayerArn the function must have no layer: {layers:?}"
                ));
            }
            if !otel.is_empty() {
                found.push(format!(
                    "without CollectorLayerArn no OTEL_ setting may be set: {otel:?}"
                ));
            }
        }
    }
    found
}

#[test]
fn the_collector_layer_and_the_otlp_settings_come_only_with_collector_layer_arn() {
    let cfn = transformed(&template());
    assert_eq!(traces_violations(&cfn), Vec::<String>::new());
    assert_eq!(cfn["Parameters"]["CollectorLayerArn"]["Default"], "");
}

#[test]
fn a_layer_or_an_otel_setting_that_stays_without_the_parameter_is_caught() {
    let mut t = template();
    let props = &mut t["Resources"][FUNCTION]["Properties"];
    props["Layers"] =
        serde_norway::from_str("[arn:aws:lambda:eu-west-1:901920570463:layer:x:1]").unwrap();
    props["Environment"]["Variables"]["OTEL_EXPORTER_OTLP_ENDPOINT"] =
        serde_norway::Value::String("http://localhost:4318".into());
    let found = traces_violations(&transformed(&t));
    assert!(found.iter().any(|f| f.contains("no layer")), "{found:?}");
    assert!(
        found.iter().any(|f| f.contains("no OTEL_ setting")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|f| f.contains("that layer alone")),
        "{found:?}"
    );
}
