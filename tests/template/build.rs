//! One architecture from build to deploy: `make build` pins the built template's
//! `Architecture` to the bootstrap it built (scripts/built_architecture.py), and
//! `make deploy` refuses a build that is not pinned or an ARCH that differs.

use std::path::Path;
use std::process::{Command, Output};

use serde_norway::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/built_architecture.py");

/// The first 20 bytes of an ELF header for `machine` (x86-64: 0x3e, AArch64: 0xb7).
fn elf(path: &Path, machine: u16) {
    let mut header = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    header.extend([0; 8]);
    header.extend(2u16.to_le_bytes());
    header.extend(machine.to_le_bytes());
    std::fs::write(path, header).unwrap();
}

fn script(args: &[&Path], extra: &[&str]) -> Output {
    Command::new("python3")
        .arg(SCRIPT)
        .args(args)
        .args(extra)
        .output()
        .unwrap()
}

fn architecture(template: &Path) -> (String, Vec<String>) {
    let built: Value = serde_norway::from_str(&std::fs::read_to_string(template).unwrap()).unwrap();
    let parameter = &built["Parameters"]["Architecture"];
    let allowed = parameter["AllowedValues"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    (parameter["Default"].as_str().unwrap().to_owned(), allowed)
}

fn one_line_failure(out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

#[test]
fn a_build_pins_the_template_to_its_bootstrap_and_a_deploy_of_another_architecture_is_refused() {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml")).unwrap();
    // As written here, and as `sam build` writes it back (block lists, quoted strings).
    let as_sam_writes = source.replace(
        "    AllowedValues: [arm64, x86_64]\n",
        "    AllowedValues:\n    - arm64\n    - x86_64\n",
    );
    assert_ne!(
        source, as_sam_writes,
        "the parameter's layout changed: update this test"
    );
    for text in [source, as_sam_writes] {
        let dir = tempfile::tempdir().unwrap();
        let (template, bootstrap) = (
            dir.path().join("template.yaml"),
            dir.path().join("bootstrap"),
        );
        std::fs::write(&template, &text).unwrap();
        elf(&bootstrap, 0x3e);
        let paths = [template.as_path(), bootstrap.as_path()];

        // Unpinned (a template straight from the repository): deploy refuses.
        one_line_failure(
            &Command::new("python3")
                .arg(SCRIPT)
                .arg("check")
                .args(paths)
                .output()
                .unwrap(),
            "not pinned",
        );
        let out = Command::new("python3")
            .arg(SCRIPT)
            .arg("pin")
            .args(paths)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "x86_64");
        assert_eq!(
            architecture(&template),
            ("x86_64".to_owned(), vec!["x86_64".to_owned()])
        );

        let check = |wanted: &[&str]| {
            let mut command = Command::new("python3");
            command.arg(SCRIPT).arg("check").args(paths).args(wanted);
            command.output().unwrap()
        };
        let out = check(&[]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "x86_64");
        assert!(check(&["x86_64"]).status.success());
        one_line_failure(&check(&["arm64"]), "ARCH=arm64 but the build is x86_64");
        // The bootstrap replaced by another architecture's: the pin no longer holds.
        elf(&bootstrap, 0xb7);
        one_line_failure(&check(&[]), "not pinned to the bootstrap's arm64");
    }
}

#[test]
fn a_bootstrap_that_is_not_a_lambda_binary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (template, bootstrap) = (
        dir.path().join("template.yaml"),
        dir.path().join("bootstrap"),
    );
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"),
        &template,
    )
    .unwrap();
    std::fs::write(&bootstrap, "#!/bin/sh\n").unwrap();
    let out = script(&[Path::new("pin"), &template, &bootstrap], &[]);
    one_line_failure(&out, "is not an ELF binary");
    elf(&bootstrap, 0x28); // 32-bit ARM
    let out = script(&[Path::new("pin"), &template, &bootstrap], &[]);
    one_line_failure(&out, "which Lambda does not run");
}

/// A built template and bootstrap in `dir`, as `make build` leaves them (x86_64).
fn built_in(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (template, bootstrap) = (dir.join("template.yaml"), dir.join("bootstrap"));
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/template.yaml"),
        &template,
    )
    .unwrap();
    elf(&bootstrap, 0x3e);
    let out = script(&[Path::new("pin"), &template, &bootstrap], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (template, bootstrap)
}

/// `make deploy` with `args`, as a pipeline with no AWS credentials runs it: no `AWS_*`
/// variable but `env`, the AWS configuration files pointed at none (no `~/.aws`),
/// nothing asked. What it printed, and its exit status.
fn deploy(dir: &Path, args: &[String], env: &[(&str, &str)]) -> (String, Option<i32>) {
    let (template, bootstrap) = built_in(dir);
    let none = dir.join("none");
    let mut command = Command::new("make");
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("AWS_")) {
        command.env_remove(name);
    }
    let sam = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/sam");
    assert!(
        sam.exists(),
        "{} is missing: run `make tools` (make test does)",
        sam.display()
    );
    let out = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // The SAM CLI is installed (above): the deploy installs nothing here.
        .args(["--no-print-directory", "--old-file=tools", "deploy"])
        .arg(format!("BUILT_TEMPLATE={}", template.display()))
        .arg(format!("BUILT_BOOTSTRAP={}", bootstrap.display()))
        .args(args)
        .env("AWS_CONFIG_FILE", &none)
        .env("AWS_SHARED_CREDENTIALS_FILE", &none)
        // No instance metadata to ask for credentials on a machine that has none.
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("SAM_CLI_TELEMETRY", "0")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (printed, out.status.code())
}

const SECRET: &str =
    "PARAMS=PaymentApiKeySecretArn=arn:aws:secretsmanager:eu-west-1:123456789012:secret:x";

/// It got past the SAM CLI's region resolution and stopped at the credentials it was
/// not given.
fn stopped_at_credentials(printed: &str, code: Option<i32>) {
    assert_ne!(code, Some(0), "{printed}");
    assert!(
        !printed.contains("Unable to resolve a region"),
        "the region was not resolved: {printed}"
    );
    assert!(
        printed.contains("Unable to locate credentials"),
        "it did not stop at the credentials: {printed}"
    );
}

#[test]
fn a_deploy_with_aws_region_alone_passes_the_sam_clis_region_resolution() {
    for variable in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
        let dir = tempfile::tempdir().unwrap();
        let (printed, code) = deploy(dir.path(), &[SECRET.to_owned()], &[(variable, "eu-west-1")]);
        stopped_at_credentials(&printed, code);
    }
    // The configuration file the docs lead with, as written, region included.
    let dir = tempfile::tempdir().unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/samconfig.example.toml");
    let (printed, code) = deploy(dir.path(), &[format!("SAMCONFIG={config}")], &[]);
    stopped_at_credentials(&printed, code);
}

#[test]
fn a_deploy_without_a_prompt_or_a_region_stops_with_one_line_naming_what_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let (printed, code) = deploy(dir.path(), &[SECRET.to_owned()], &[]);
    assert_eq!(
        code,
        Some(2),
        "make's status for a failed recipe: {printed}"
    );
    let lines: Vec<&str> = printed
        .lines()
        // make's own line for the failed recipe (`make[1]:` under another make).
        .filter(|l| !(l.starts_with("make") && l.contains(": ***")))
        .collect();
    assert_eq!(
        lines,
        [
            "make deploy: no region: set AWS_REGION or AWS_DEFAULT_REGION (or region in the SAMCONFIG file)"
        ],
        "{printed}"
    );
    // A configuration file without a region says the same.
    let config = dir.path().join("samconfig.toml");
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/samconfig.example.toml"
    ))
    .unwrap();
    std::fs::write(
        &config,
        example
            .lines()
            .filter(|l| !l.starts_with("region"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let (printed, _) = deploy(
        dir.path(),
        &[format!("SAMCONFIG={}", config.display())],
        &[],
    );
    assert!(printed.contains("make deploy: no region"), "{printed}");
}
