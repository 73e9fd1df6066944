//! The product's binary outside Lambda, the operator's tool: its commands run only
//! against the real parts (the table in IDEMPOTENCY_TABLE, the provider at
//! PAYMENT_API_URL) and know no local option; a missing or bad setting stops the start
//! with one line naming the variable, before any record is touched. The same commands
//! on moto and localstripe: `operations.rs`, `audit.rs`, `queue.rs`; local runs: the
//! local member's `local/tests/cli.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_charge-once");

const RESOLVE: [&str; 10] = [
    "resolve",
    "ord-1001",
    "--amount",
    "5000",
    "--currency",
    "EUR",
    "--customer",
    "cus_123",
    "--payment-method",
    "pm_card_visa",
];

/// The binary outside Lambda with none of the settings that name a table or a
/// provider, then `settings`.
fn bare(args: &[&str], settings: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env_remove("AWS_LAMBDA_FUNCTION_NAME")
        .env_remove("IDEMPOTENCY_TABLE")
        .env_remove("PAYMENT_API_URL")
        .env_remove("PAYMENT_API_KEY")
        .env_remove("PAYMENT_API_KEY_SECRET_ARN")
        .envs(settings.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn the_operators_commands_know_no_local_store_nor_simulator() {
    for command in ["invoke", "inspect", "resolve", "audit"] {
        let help = bare(&[command, "--help"], &[]);
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "{command}");
        for local in ["--db", "--store", "--provider", "sqlite", "simulator"] {
            assert!(
                !text.contains(local),
                "{command} --help names {local}:\n{text}"
            );
        }
    }
    let out = bare(
        &[
            "invoke",
            "events/sqs-single.json",
            "--provider",
            "simulator",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--provider"));
    // The top-level help says where local runs went.
    let help = bare(&["--help"], &[]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("charge-once-local"));
}

/// A command, its settings, the variable it must name, and its exit status.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, i32);

#[test]
fn without_a_table_or_a_provider_url_each_command_stops_with_one_line_naming_it() {
    let provider = [
        ("PAYMENT_API_URL", "http://127.0.0.1:9"),
        ("PAYMENT_API_KEY", "sk_test_x"),
    ];
    let table = [("IDEMPOTENCY_TABLE", "orders-idempotency")];
    let cases: [Case; 6] = [
        (
            &["invoke", "events/sqs-single.json"],
            &provider,
            "IDEMPOTENCY_TABLE",
            1,
        ),
        (
            &["invoke", "events/sqs-single.json"],
            &table,
            "PAYMENT_API_URL",
            1,
        ),
        (&RESOLVE, &provider, "IDEMPOTENCY_TABLE", 1),
        (&RESOLVE, &table, "PAYMENT_API_URL", 1),
        (&["inspect", "ord-1001"], &provider, "IDEMPOTENCY_TABLE", 1),
        // The audit never says "clean" without reading: its every error is a 2.
        (&["audit"], &table, "PAYMENT_API_URL", 2),
    ];
    for (args, settings, variable, status) in cases {
        let out = bare(args, settings);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("{variable} is required")),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_bad_setting_stops_the_start_with_one_line_naming_the_variable() {
    let out = bare(
        &["invoke", "events/sqs-single.json"],
        &[("MAX_CONCURRENCY", "zero")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("MAX_CONCURRENCY=\\\"zero\\\" is invalid"),
        "{stderr}"
    );
}

#[test]
fn a_provider_url_with_a_path_or_plain_http_to_another_host_stops_the_start() {
    for (url, says) in [
        ("https://api.stripe.com/v1", "without a path"),
        ("http://api.stripe.com", "only for a loopback address"),
    ] {
        let out = bare(
            &["invoke", "events/sqs-single.json"],
            &[("PAYMENT_API_URL", url)],
        );
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("PAYMENT_API_URL="), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Settings that would reopen double charging stop `invoke` and `resolve` before any
/// record is touched, with one line naming the variable.
#[test]
fn settings_that_reopen_double_charging_stop_invoke_and_resolve() {
    let commands: [&[&str]; 2] = [&["invoke", "events/sqs-single.json"], &RESOLVE];
    for (var, value) in [("IDEMPOTENCY_RETENTION", "1d"), ("PROVIDER_KEY_TTL", "48h")] {
        for args in commands {
            // Every other setting is there: the bad one alone stops the start.
            let out = bare(
                args,
                &[
                    ("IDEMPOTENCY_TABLE", "orders-idempotency"),
                    ("PAYMENT_API_URL", "http://127.0.0.1:9"),
                    ("PAYMENT_API_KEY", "sk_test_x"),
                    (var, value),
                ],
            );
            let stderr = String::from_utf8(out.stderr).unwrap();
            assert_eq!(
                out.status.code(),
                Some(1),
                "{var}={value} {args:?}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{var}={value} {args:?}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains(&format!("{var}=")), "{stderr}");
        }
    }
}

#[test]
fn a_file_that_is_not_an_sqs_event_is_refused_clearly() {
    let out = bare(&["invoke", "Cargo.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("Cargo.toml is not an SQS event"),
        "{stderr}"
    );
}

#[test]
fn a_command_without_aws_credentials_says_so_in_one_line_and_touches_nothing() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path().to_str().unwrap();
    let out = Command::new(BIN)
        .arg("inspect")
        .arg("ord-1001")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // No profile, no keys, and no instance metadata service to ask (this machine
        // has none; loopback-only tests must not look for one).
        .env("HOME", home)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_REGION", "eu-west-1")
        // Never reached: the check comes before any call.
        .env("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:9")
        .env("IDEMPOTENCY_TABLE", "orders")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("no AWS credentials"), "{stderr}");
    assert!(lines[0].contains("AWS_PROFILE"), "{stderr}");
}
