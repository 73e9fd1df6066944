//! The shell commands the docs show (fenced `sh` blocks, and inline code that is a
//! command), as a reader would paste them, and a shell that runs them against moto with
//! the AWS CLI and the SAM CLI of `.venv`, recording every command that a CLI refused
//! as written (a usage error).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

use crate::servers::Backend;

/// Where a command was shown.
#[derive(Clone, Debug)]
pub struct Shown {
    /// The page, relative to the repository.
    pub page: String,
    /// The heading the command is under (its text).
    pub section: String,
    /// The block's lines, continuation lines (`\`) joined, as one script.
    pub script: String,
    /// Inline code, not a block.
    pub inline: bool,
}

/// The pages a user reads: README.md, ARCHITECTURE.md and docs/*.md.
pub fn pages() -> Vec<PathBuf> {
    let root = crate::root();
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Every `sh` block of `page` and every inline code span of it that starts with one of
/// `commands` followed by a space.
pub fn shown(page: &Path, commands: &[&str]) -> Vec<Shown> {
    let text = std::fs::read_to_string(page).expect("a page");
    let name = page
        .strip_prefix(crate::root())
        .unwrap_or(page)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut section = String::new();
    let mut heading: Option<String> = None;
    let mut block: Option<String> = None;
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => section = heading.take().unwrap_or_default(),
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang)))
                if matches!(&*lang, "sh" | "bash" | "shell") =>
            {
                block = Some(String::new());
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(script) = block.take() {
                    out.push(Shown {
                        page: name.clone(),
                        section: section.clone(),
                        script: script.replace("\\\n", " "),
                        inline: false,
                    });
                }
            }
            Event::Text(t) => {
                if let Some(b) = block.as_mut() {
                    b.push_str(&t);
                }
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Code(code) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&code);
                }
                if commands.iter().any(|c| code.starts_with(&format!("{c} "))) {
                    out.push(Shown {
                        page: name.clone(),
                        section: section.clone(),
                        script: code.to_string(),
                        inline: true,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// A shell whose `aws` is `.venv`'s AWS CLI on moto (one attempt per call), whose
/// `sam` is `.venv`'s SAM CLI on moto, and whose `charge-once` and `charge-once-local`
/// are the workspace's debug binaries run with no setting; every call that ends in a
/// usage error (exit status 2 with the CLI's `usage:` line, the AWS CLI's and the SAM
/// CLI's, or clap's "try '--help'"; charge-once's own status 2 means something else)
/// is recorded with its arguments. The AWS account is the tests' (`servers::test_account`).
pub struct Shell {
    dir: tempfile::TempDir,
}

impl Shell {
    pub fn new() -> Self {
        let venv = crate::root().join(".venv/bin");
        for tool in ["aws", "sam"] {
            assert!(
                venv.join(tool).exists(),
                "{} is missing: run `make deps tools` (it installs requirements-test.txt and \
                 requirements-build.txt into .venv)",
                venv.join(tool).display()
            );
        }
        let dir = tempfile::tempdir().expect("a directory");
        let bin = crate::root().join("target/debug");
        let prelude = format!(
            r#"checked() {{ local err; err=$(mktemp); "$@" 2> "$err"; local s=$?; cat "$err" >&2
  if [ "$s" -eq 2 ] && grep -qiE "^usage: |try '--help'" "$err"; then printf '%s\n' "$*" >> "{refused}"; fi
  rm -f "$err"; return "$s"; }}
aws() {{ checked "{venv}/aws" --endpoint-url "{moto}" "$@"; }}
sam() {{ checked "{venv}/sam" "$@" < /dev/null; }}
charge-once() {{ checked "{bin}/charge-once" "$@"; }}
charge-once-local() {{ checked "{bin}/charge-once-local" "$@"; }}
"#,
            refused = dir.path().join("refused").display(),
            venv = venv.display(),
            moto = Backend::Moto.url(),
            bin = bin.display(),
        );
        std::fs::write(dir.path().join("prelude.sh"), prelude).expect("the prelude");
        Self { dir }
    }

    /// Runs `script` (after the prelude) in a new directory of its own, so that runs
    /// may go side by side.
    pub fn run(&self, script: &str) -> Output {
        let work = tempfile::tempdir_in(self.dir.path()).expect("a directory");
        let work = work.path();
        let none = self.dir.path().join("none");
        let mut command = Command::new("bash");
        crate::servers::test_account(&mut command)
            .arg("-c")
            .arg(format!(
                ". {}\n{script}",
                self.dir.path().join("prelude.sh").display()
            ))
            .current_dir(work)
            .env("AWS_MAX_ATTEMPTS", "1")
            .env("AWS_ENDPOINT_URL", Backend::Moto.url())
            .env("AWS_CONFIG_FILE", &none)
            .env("AWS_SHARED_CREDENTIALS_FILE", &none)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("SAM_CLI_TELEMETRY", "0")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("IDEMPOTENCY_TABLE")
            .env_remove("PAYMENT_API_URL")
            .env_remove("PAYMENT_API_KEY")
            .env_remove("PAYMENT_API_KEY_SECRET_ARN")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("bash")
    }

    /// The calls refused so far, one per line.
    pub fn refused(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("refused"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Default for Shell {
    fn default() -> Self {
        Self::new()
    }
}
