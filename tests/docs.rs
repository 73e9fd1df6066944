//! The docs check: README.md, ARCHITECTURE.md and every page under docs/ are held
//! against the repository. It fails on a relative link or `#anchor` that points
//! nowhere, a `make` target the Makefile lacks, and an environment variable that
//! nothing reads; and the settings table must list exactly the variables `config.rs`
//! reads. Each rule is also shown failing on a page broken on purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The pages a reader follows: README.md, ARCHITECTURE.md and docs/**.md.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let mut dirs = vec![root().join("docs")];
    // Bounded: docs/ is a shallow tree of a few pages.
    for _ in 0..64 {
        let Some(dir) = dirs.pop() else { break };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// What one page says that the check holds against the repository.
#[derive(Default, Debug)]
struct Page {
    /// The GitHub anchors of its headings.
    anchors: BTreeSet<String>,
    /// Relative link targets (`path#anchor`, `#anchor`).
    links: Vec<String>,
    /// Code spans and code blocks.
    code: Vec<String>,
    /// Everything else that is text.
    prose: Vec<String>,
    /// The first column of each table whose first header cell is `variable`.
    settings: BTreeSet<String>,
}

/// GitHub's anchor of a heading: lower case; letters, digits, `-` and `_` kept;
/// spaces become `-`; everything else dropped. Repeats get `-1`, `-2`, …
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn read_page(text: &str) -> Page {
    let mut page = Page::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<String> = None;
    let mut in_code_block: Option<String> = None;
    // Tables: the current cell's text, the column, whether this table lists settings.
    let (mut cell, mut column, mut settings_table, mut in_head) =
        (String::new(), 0usize, false, false);
    for event in Parser::new_ext(text, pulldown_cmark::Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(base.clone()).or_insert(0);
                let anchor = if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                };
                *n += 1;
                page.anchors.insert(anchor);
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                let url = dest_url.to_string();
                if !url.contains("://") && !url.starts_with("mailto:") {
                    page.links.push(url);
                }
            }
            Event::Start(Tag::CodeBlock(_)) => in_code_block = Some(String::new()),
            Event::End(TagEnd::CodeBlock) => page.code.extend(in_code_block.take()),
            Event::Start(Tag::TableHead) => (in_head, column) = (true, 0),
            Event::End(TagEnd::TableHead) => in_head = false,
            Event::Start(Tag::TableRow) => column = 0,
            Event::Start(Tag::TableCell) => cell.clear(),
            Event::End(TagEnd::TableCell) => {
                if column == 0 {
                    if in_head {
                        settings_table = cell.trim().eq_ignore_ascii_case("variable");
                    } else if settings_table {
                        page.settings.extend(variables(&cell));
                    }
                }
                column += 1;
            }
            Event::End(TagEnd::Table) => settings_table = false,
            Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
                cell.push_str(&t);
                cell.push(' ');
                page.code.push(t.to_string());
            }
            Event::Text(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
                match in_code_block.as_mut() {
                    Some(block) => block.push_str(&t),
                    None => page.prose.push(t.to_string()),
                }
                cell.push_str(&t);
                cell.push(' ');
            }
            _ => {}
        }
    }
    page
}

/// Upper-case names with an underscore (`PAYMENT_API_URL`), as variables are written.
fn variables(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| {
            w.len() >= 3
                && w.contains('_')
                && w.starts_with(|c: char| c.is_ascii_uppercase())
                && !w.ends_with('_')
        })
        .map(str::to_owned)
        .collect()
}

/// `make <target>` in code: the targets named.
fn make_targets(code: &str) -> BTreeSet<String> {
    let mut targets = BTreeSet::new();
    let words: Vec<&str> = code.split_whitespace().collect();
    for pair in words.windows(2) {
        if pair[0] == "make" {
            let target = pair[1].trim_end_matches([',', ';', ')', '`']);
            if target.starts_with(|c: char| c.is_ascii_lowercase())
                && target.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            {
                targets.insert(target.to_owned());
            }
        }
    }
    targets
}

/// What the repository defines: Makefile targets and variables, the settings
/// `config.rs` reads, and every other name the code knows (string literals and
/// constants of the Rust code, the platform's variables).
struct Repository {
    targets: BTreeSet<String>,
    settings: BTreeSet<String>,
    known: BTreeSet<String>,
}

/// Variables that the AWS SDK, Lambda and the tools read (not the function's settings).
const PLATFORM: &[&str] = &[
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_SECRETS_MANAGER",
    "AWS_LAMBDA_LOG_LEVEL",
    "AWS_LAMBDA_LOG_FORMAT",
    "AWS_LAMBDA_RUNTIME_API",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_MAX_CONCURRENCY",
    "RUST_LOG",
    "SAM_CLI_TELEMETRY",
    "CARGO_INCREMENTAL",
];

/// Upper-case words of the AWS APIs that the docs quote and that are no variables
/// (DynamoDB's `ReturnValues`, the code names them by the SDK's enums).
const API_VALUES: &[&str] = &["ALL_OLD", "ALL_NEW", "UPDATED_NEW", "NEW_AND_OLD_IMAGES"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The variables `config.rs` reads: the first argument of each `env.<reader>(` call.
fn settings_read(config: &str) -> BTreeSet<String> {
    config
        .split("env.")
        .skip(1)
        .filter_map(|call| {
            let (reader, rest) = call.split_once('(')?;
            if !reader.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                return None;
            }
            let name = rest.trim_start().strip_prefix('"')?.split('"').next()?;
            variables(name).into_iter().next()
        })
        .collect()
}

fn quoted_names(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .flat_map(variables)
        .collect()
}

impl Repository {
    fn read() -> Self {
        let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
        let mut targets = BTreeSet::new();
        let mut known = BTreeSet::new();
        for line in makefile.lines() {
            if let Some((head, _)) = line.split_once(':')
                && !line.starts_with(['\t', '#', ' '])
                && !head.contains(['=', '$', ' '])
                && !line[head.len()..].starts_with(":=")
            {
                targets.insert(head.to_owned());
            }
            if let Some((name, _)) = line.split_once(['?', ':', '='])
                && !line.starts_with(['\t', '#'])
            {
                known.extend(variables(name.trim()));
            }
            known.extend(
                variables(line)
                    .into_iter()
                    .filter(|v| line.contains(&format!("$({v})"))),
            );
        }
        let config = std::fs::read_to_string(root().join("src/config.rs")).unwrap();
        let config_code = config.split("#[cfg(test)]").next().unwrap();
        let settings = settings_read(config_code);
        let mut files = Vec::new();
        for dir in [
            "src",
            "local/src",
            "local/tests",
            "bench/src",
            "harness/src",
            "tests",
            "examples",
        ] {
            rust_files(&root().join(dir), &mut files);
        }
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            known.extend(quoted_names(&text));
            for line in text.lines() {
                let line = line
                    .trim_start()
                    .trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ");
                if let Some(rest) = line
                    .strip_prefix("const ")
                    .or_else(|| line.strip_prefix("static "))
                {
                    known.extend(variables(rest.split(':').next().unwrap_or_default()));
                }
            }
        }
        for script in ["scripts/local.sh", ".ci/run"] {
            if let Ok(text) = std::fs::read_to_string(root().join(script)) {
                known.extend(variables(&text));
            }
        }
        known.extend(PLATFORM.iter().chain(API_VALUES).map(|v| (*v).to_owned()));
        known.extend(settings.iter().cloned());
        Self {
            targets,
            settings,
            known,
        }
    }
}

/// Every problem of `pages` (path, text) against `repo`, one line each.
fn problems(pages: &[(PathBuf, String)], repo: &Repository) -> Vec<String> {
    let read: BTreeMap<PathBuf, Page> = pages
        .iter()
        .map(|(path, text)| (path.clone(), read_page(text)))
        .collect();
    let mut found = Vec::new();
    let mut table_settings = BTreeSet::new();
    for (path, page) in &read {
        let shown = path
            .strip_prefix(root())
            .unwrap_or(path)
            .display()
            .to_string();
        for link in &page.links {
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            let target = normalize(&target);
            if !file.is_empty() && !target.exists() && !read.contains_key(&target) {
                found.push(format!("{shown}: link `{link}` points to no file"));
                continue;
            }
            if !anchor.is_empty() {
                let anchors = read
                    .get(&target)
                    .map(|p| p.anchors.clone())
                    .or_else(|| {
                        std::fs::read_to_string(&target)
                            .ok()
                            .map(|t| read_page(&t).anchors)
                    })
                    .unwrap_or_default();
                if !anchors.contains(anchor) {
                    found.push(format!(
                        "{shown}: link `{link}` names no heading of its page"
                    ));
                }
            }
        }
        for code in &page.code {
            for target in make_targets(code) {
                if !repo.targets.contains(&target) {
                    found.push(format!(
                        "{shown}: `make {target}`: the Makefile has no such target"
                    ));
                }
            }
        }
        for text in page.code.iter().chain(&page.prose) {
            for var in variables(text) {
                if !repo.known.contains(&var) {
                    found.push(format!("{shown}: `{var}`: no setting or code reads it"));
                }
            }
        }
        for var in &page.settings {
            if !repo.settings.contains(var) && !PLATFORM.contains(&var.as_str()) {
                found.push(format!(
                    "{shown}: the settings table lists `{var}`, which config.rs does not read"
                ));
            }
        }
        table_settings.extend(page.settings.iter().cloned());
    }
    if !table_settings.is_empty() {
        for var in repo.settings.difference(&table_settings) {
            found.push(format!(
                "config.rs reads `{var}`, which no settings table lists"
            ));
        }
    }
    found.sort();
    found.dedup();
    found
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn the_docs() -> Vec<(PathBuf, String)> {
    pages()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

#[test]
fn every_link_anchor_make_target_and_variable_in_the_docs_is_real() {
    let repo = Repository::read();
    assert!(repo.targets.contains("test") && repo.targets.contains("run"));
    assert!(repo.settings.contains("PAYMENT_API_URL") && repo.settings.len() >= 20);
    let problems = problems(&the_docs(), &repo);
    assert!(
        problems.is_empty(),
        "the docs check found:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_broken_link_a_missing_anchor_target_or_variable_fails_the_check() {
    let repo = Repository::read();
    let mut docs = the_docs();
    let readme = root().join("README.md");
    let broken = "\n\nSee [the guide](docs/nowhere.md), [a section](#no-such-section),\n\
                  `make deploy-everything`, and `PAYMENT_API_SECRET`.\n";
    docs.iter_mut()
        .find(|(p, _)| *p == readme)
        .unwrap()
        .1
        .push_str(broken);
    let found = problems(&docs, &repo);
    for expected in [
        "README.md: link `docs/nowhere.md` points to no file",
        "README.md: link `#no-such-section` names no heading of its page",
        "README.md: `make deploy-everything`: the Makefile has no such target",
        "README.md: `PAYMENT_API_SECRET`: no setting or code reads it",
    ] {
        assert!(
            found.iter().any(|f| f == expected),
            "{expected}\nfound:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn every_page_under_docs_is_checked_and_its_links_resolve_from_its_own_folder() {
    let docs = the_docs();
    for page in ["deploy.md", "operate.md", "guarantees.md", "performance.md"] {
        let path = root().join("docs").join(page);
        assert!(
            docs.iter().any(|(p, _)| *p == path),
            "docs/{page} is not checked"
        );
    }
    let repo = Repository::read();
    let mut docs = docs;
    let operate = root().join("docs/operate.md");
    let broken = "\n\nSee [the rules](../ARCHITECTURE.md#no-such-rule), \
                  [the deploy](deploy.md#nowhere) and [a page](../nowhere.md).\n";
    docs.iter_mut()
        .find(|(p, _)| *p == operate)
        .unwrap()
        .1
        .push_str(broken);
    let found = problems(&docs, &repo);
    for expected in [
        "docs/operate.md: link `../ARCHITECTURE.md#no-such-rule` names no heading of its page",
        "docs/operate.md: link `deploy.md#nowhere` names no heading of its page",
        "docs/operate.md: link `../nowhere.md` points to no file",
    ] {
        assert!(
            found.iter().any(|f| f == expected),
            "{expected}\nfound:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn a_settings_table_must_list_exactly_what_config_reads() {
    let repo = Repository::read();
    let page = "| variable | default |\n| --- | --- |\n| `PAYMENT_API_URL` | — |\n| `PAYMENT_API_SECRET` | — |\n";
    let found = problems(&[(root().join("docs/x.md"), page.to_owned())], &repo);
    assert!(
        found
            .iter()
            .any(|f| f.contains("lists `PAYMENT_API_SECRET`")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f == "config.rs reads `MAX_DECLINES`, which no settings table lists"),
        "{found:?}"
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(slug("Deploy"), "deploy");
    assert_eq!(
        slug("Why is this message in the DLQ?"),
        "why-is-this-message-in-the-dlq"
    );
    assert_eq!(
        slug("Retries: backoff, dead letters, breakers"),
        "retries-backoff-dead-letters-breakers"
    );
    assert_eq!(slug("`resolve` and `audit`"), "resolve-and-audit");
}
