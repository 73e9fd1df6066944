//! The unit tests of `traces.rs`.

use std::collections::HashMap;

use super::*;

fn settings(pairs: &[(&str, &str)]) -> Result<Option<Settings>, TracesError> {
    let map: HashMap<&str, &str> = pairs.iter().copied().collect();
    Settings::from_lookup(|k| map.get(k).map(|v| (*v).to_owned()))
}

#[test]
fn traces_are_off_without_an_endpoint_or_when_disabled() {
    assert_eq!(settings(&[]).unwrap(), None);
    let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
    assert!(settings(&on).unwrap().is_some());
    for off in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ] {
        assert_eq!(settings(&[on[0], off]).unwrap(), None, "{off:?}");
    }
}

#[test]
fn a_base_endpoint_gets_the_traces_path_and_a_traces_endpoint_is_kept_as_it_is() {
    let base = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")]);
    assert_eq!(
        base.unwrap().unwrap(),
        Settings {
            endpoint: "http://localhost:4318/v1/traces".into(),
            timeout: DEFAULT_TIMEOUT,
        }
    );
    let own = settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://xray.eu-west-1.amazonaws.com/v1/traces",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
    ]);
    assert_eq!(
        own.unwrap().unwrap(),
        Settings {
            endpoint: "https://xray.eu-west-1.amazonaws.com/v1/traces".into(),
            timeout: Duration::from_millis(2500),
        }
    );
}

#[test]
fn each_bad_setting_names_its_variable() {
    let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    for (bad, var) in [
        (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://10.0.0.8:4318"),
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ),
        (
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ),
        (("OTEL_TRACES_SAMPLER", "sometimes"), "OTEL_TRACES_SAMPLER"),
        (("OTEL_TRACES_SAMPLER_ARG", "2"), "OTEL_TRACES_SAMPLER_ARG"),
        (("OTEL_SDK_DISABLED", "yes"), "OTEL_SDK_DISABLED"),
        (("OTEL_TRACES_EXPORTER", "zipkin"), "OTEL_TRACES_EXPORTER"),
    ] {
        let pairs = if bad.0 == on.0 {
            vec![bad]
        } else {
            vec![on, bad]
        };
        let error = settings(&pairs).unwrap_err().to_string();
        assert!(error.starts_with(var), "{bad:?}: {error}");
    }
}

#[test]
fn a_bad_header_is_named_without_its_value() {
    let error = settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization Basic c2VjcmV0"),
    ])
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("OTEL_EXPORTER_OTLP_HEADERS"), "{error}");
    assert!(!error.contains("c2VjcmV0"), "{error}");
}
