//! Reading the template: parameters' defaults behind `!Ref` and `!Sub`, durations,
//! paths, the SAM transform, and breaking a template on purpose.

use std::time::Duration;

use serde_norway::Value;

use crate::rules::violations;

/// The consumer function's resource name.
pub const FUNCTION: &str = "ChargeFunction";

pub fn template() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap();
    serde_norway::from_str(&text).expect("template.yaml parses (CloudFormation tags included)")
}

pub fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

/// A mutable node; path parts that are numbers index sequences.
pub fn get_mut<'a>(v: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &mut v[i],
        Err(_) => &mut v[*k],
    })
}

/// Resolves `!Ref Parameter` to the parameter's default; other values as they are.
pub fn resolve<'a>(t: &'a Value, v: &'a Value) -> &'a Value {
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

pub fn number(t: &Value, v: &Value) -> Option<u64> {
    match resolve(t, v) {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

pub fn duration(t: &Value, v: &Value) -> Option<Duration> {
    if let Some((name, unit)) = sub_of_parameter(v) {
        let n = number(t, get(t, &["Parameters", name, "Default"]))?;
        return humantime::parse_duration(&format!("{n}{unit}")).ok();
    }
    resolve(t, v)
        .as_str()
        .and_then(|s| humantime::parse_duration(s).ok())
}

/// `!Sub "${Name}unit"`: (the parameter, the unit after it).
pub fn sub_of_parameter(v: &Value) -> Option<(&str, &str)> {
    match v {
        Value::Tagged(t) if t.tag == "Sub" => {
            let text = t.value.as_str()?.strip_prefix("${")?;
            let (name, unit) = text.split_once('}')?;
            Some((name, unit))
        }
        _ => None,
    }
}

pub fn is_tag(v: &Value, tag: &str, value: &str) -> bool {
    matches!(v, Value::Tagged(t) if t.tag == tag && t.value.as_str() == Some(value))
}

/// The resource behind `!GetAtt Name.Arn`, or "" for anything else.
pub fn arn_of(v: &Value) -> String {
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

/// A parameter's `field` (`Default`, `MaxValue`) behind `!Ref` or `!Sub "${Name}s"`,
/// else the value itself.
pub fn parameter_field(t: &Value, v: &Value, field: &str) -> Option<u64> {
    let name = match v {
        Value::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str(),
        _ => sub_of_parameter(v).map(|(name, _)| name),
    };
    match name {
        Some(name) => number(t, get(t, &["Parameters", name, field])),
        None => number(t, v).or_else(|| duration(t, v).map(|d| d.as_secs())),
    }
}

/// Breaks the template at `path` and expects a violation mentioning `expect`.
pub fn broken(path: &[&str], value: Value, expect: &str) {
    let mut t = template();
    *get_mut(&mut t, path) = value;
    let found = violations(&t);
    assert!(
        found.iter().any(|v| v.contains(expect)),
        "breaking {path:?} was not caught (expected {expect:?}); violations: {found:?}"
    );
}

pub const FN_PROPS: [&str; 3] = ["Resources", FUNCTION, "Properties"];

pub fn at<'a>(base: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(rest).copied().collect()
}

/// `template` after the SAM transform (aws-sam-translator, offline), as JSON.
pub fn transformed(template: &Value) -> serde_json::Value {
    transformed_with(template, &[])
}

/// template.yaml itself after the SAM transform, transformed once per test binary (a
/// transform starts Python: seconds): what the tests that break nothing read.
pub fn transformed_template() -> &'static serde_json::Value {
    static ONCE: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| transformed(&template()))
}

/// `template` after the SAM transform with these parameter values (besides the
/// required secret's ARN), as JSON.
pub fn transformed_with(template: &Value, parameters: &[(&str, &str)]) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (it installs aws-sam-translator into .venv from requirements-test.txt)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.yaml");
    std::fs::write(&file, serde_norway::to_string(template).unwrap()).unwrap();
    let out = std::process::Command::new(python)
        .arg(root.join("harness/servers/sam_transform.py"))
        .arg(&file)
        .arg("PaymentApiKeySecretArn=arn:aws:secretsmanager:eu-west-1:123456789012:secret:x")
        .args(
            parameters
                .iter()
                .map(|(name, value)| format!("{name}={value}")),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SAM transform failed (is aws-sam-translator installed? `make test` installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Strings of a JSON value: a string, or each string of a list.
pub fn strings(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(items) => items.iter().flat_map(strings).collect(),
        other => vec![other.to_string()],
    }
}

/// Every statement of a role's inline policies (after the SAM transform).
pub fn statements(role: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    role["Policies"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["PolicyDocument"]["Statement"]
                .as_array()
                .into_iter()
                .flatten()
        })
}

/// What CloudFormation creates from a transformed template with these parameter values
/// (the others at their defaults): each condition decided, the resources and outputs
/// of a false one left out, every `Fn::If` replaced by its branch and
/// `AWS::NoValue` removed. The transform keeps the conditions for CloudFormation; this
/// is the deploy's view of them.
pub fn deployed(cfn: &serde_json::Value, parameters: &[(&str, &str)]) -> serde_json::Value {
    let conditions: std::collections::BTreeMap<String, bool> = cfn["Conditions"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, _)| (name.clone(), condition(cfn, parameters, name, 0)))
        .collect();
    let mut out = cfn.clone();
    for section in ["Resources", "Outputs"] {
        if let Some(entries) = out[section].as_object_mut() {
            entries.retain(|_, entry| {
                entry["Condition"]
                    .as_str()
                    .is_none_or(|name| conditions[name])
            });
        }
    }
    out.as_object_mut().unwrap().remove("Conditions");
    chosen(&out, &conditions).unwrap_or(serde_json::Value::Null)
}

/// A parameter's value: given, else its default.
fn parameter(
    cfn: &serde_json::Value,
    parameters: &[(&str, &str)],
    name: &str,
) -> serde_json::Value {
    parameters
        .iter()
        .find(|(given, _)| *given == name)
        .map(|(_, value)| serde_json::Value::from(*value))
        .unwrap_or_else(|| cfn["Parameters"][name]["Default"].clone())
}

/// Decides the condition `name` (`depth`: conditions refer to conditions, never in a
/// cycle CloudFormation would accept; the bound stops a broken template).
fn condition(cfn: &serde_json::Value, parameters: &[(&str, &str)], name: &str, depth: u8) -> bool {
    assert!(depth < 16, "conditions nest too deep at {name}");
    decide(cfn, parameters, &cfn["Conditions"][name], depth + 1)
}

fn decide(
    cfn: &serde_json::Value,
    parameters: &[(&str, &str)],
    v: &serde_json::Value,
    depth: u8,
) -> bool {
    fn value(
        cfn: &serde_json::Value,
        parameters: &[(&str, &str)],
        v: &serde_json::Value,
    ) -> String {
        match v {
            serde_json::Value::Object(o) if o.contains_key("Ref") => {
                let found = parameter(cfn, parameters, o["Ref"].as_str().unwrap());
                found
                    .as_str()
                    .map_or_else(|| found.to_string(), str::to_owned)
            }
            // `!Join [sep, !Ref AList]`: a CommaDelimitedList's items joined by `sep`.
            serde_json::Value::Object(o) if o.contains_key("Fn::Join") => {
                let join = &o["Fn::Join"];
                let separator = join[0].as_str().unwrap_or_default();
                match &join[1] {
                    serde_json::Value::Array(items) => items
                        .iter()
                        .map(|i| value(cfn, parameters, i))
                        .collect::<Vec<_>>()
                        .join(separator),
                    list => value(cfn, parameters, list)
                        .split(',')
                        .collect::<Vec<_>>()
                        .join(separator),
                }
            }
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
    let value = |v: &serde_json::Value| value(cfn, parameters, v);
    let (op, args) = v
        .as_object()
        .and_then(|o| o.iter().next())
        .unwrap_or_else(|| panic!("not a condition: {v}"));
    let args = args.as_array();
    let arg = |i: usize| &args.unwrap()[i];
    match op.as_str() {
        "Fn::Equals" => value(arg(0)) == value(arg(1)),
        "Fn::Not" => !decide(cfn, parameters, arg(0), depth),
        "Fn::And" => args
            .unwrap()
            .iter()
            .all(|a| decide(cfn, parameters, a, depth)),
        "Fn::Or" => args
            .unwrap()
            .iter()
            .any(|a| decide(cfn, parameters, a, depth)),
        "Fn::Condition" | "Condition" => {
            let name = v[op.as_str()].as_str().unwrap();
            condition(cfn, parameters, name, depth)
        }
        other => panic!("no such condition function {other}"),
    }
}

/// `v` with every `Fn::If` replaced by its branch; `None` for `AWS::NoValue`.
fn chosen(
    v: &serde_json::Value,
    conditions: &std::collections::BTreeMap<String, bool>,
) -> Option<serde_json::Value> {
    use serde_json::Value as J;
    match v {
        J::Object(o) if o.len() == 1 && o.get("Ref") == Some(&J::from("AWS::NoValue")) => None,
        J::Object(o) if o.len() == 1 && o.contains_key("Fn::If") => {
            let parts = o["Fn::If"].as_array().unwrap();
            let holds = conditions[parts[0].as_str().unwrap()];
            chosen(&parts[if holds { 1 } else { 2 }], conditions)
        }
        J::Object(o) => Some(J::Object(
            o.iter()
                .filter_map(|(k, v)| chosen(v, conditions).map(|v| (k.clone(), v)))
                .collect(),
        )),
        J::Array(items) => Some(J::Array(
            items.iter().filter_map(|v| chosen(v, conditions)).collect(),
        )),
        other => Some(other.clone()),
    }
}
