//! The docs check: README.md, ARCHITECTURE.md and every page under docs/ are held
//! against the repository. It fails on a relative link or `#anchor` that points
//! nowhere, a `make` target the Makefile lacks, and an environment variable that
//! nothing reads, and a repository path in backticks that names no file or folder;
//! the settings table must list exactly the variables `config.rs` reads (and the
//! `OTEL_*` ones `traces.rs` reads), the deploy page's guided prompts every template
//! parameter in the order sam asks, the mutant tables exactly the model's mutants, the
//! alarms table and every count of alarms the template's alarms, and every Stripe API
//! version named the one the code pins. Each
//! rule is also shown failing on a page broken on purpose. (That every command shown
//! is one its CLI accepts: tests/documented_commands.rs.)

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
    /// Code spans alone (what a path in backticks is written in).
    spans: Vec<String>,
    /// The rows of each table, cell by cell (the first row is the header).
    tables: Vec<Vec<Vec<String>>>,
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
            Event::Start(Tag::TableHead) => {
                (in_head, column) = (true, 0);
                if let Some(table) = page.tables.last_mut() {
                    table.push(Vec::new());
                }
            }
            Event::End(TagEnd::TableHead) => in_head = false,
            Event::Start(Tag::Table(_)) => page.tables.push(Vec::new()),
            Event::Start(Tag::TableRow) => {
                column = 0;
                if let Some(table) = page.tables.last_mut() {
                    table.push(Vec::new());
                }
            }
            Event::Start(Tag::TableCell) => cell.clear(),
            Event::End(TagEnd::TableCell) => {
                if let Some(row) = page.tables.last_mut().and_then(|t| t.last_mut()) {
                    row.push(cell.trim().to_owned());
                }
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
                page.spans.push(t.to_string());
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
    // Read by the OpenTelemetry SDK itself, and by the collector extension.
    "OTEL_RESOURCE_ATTRIBUTES",
    "OPENTELEMETRY_COLLECTOR_CONFIG_URI",
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
        let mut settings = settings_read(config_code);
        // The traces' settings are read apart (src/traces.rs), each by its quoted name.
        let traces = std::fs::read_to_string(root().join("src/traces.rs")).unwrap();
        let traces_code = traces.split("#[cfg(test)]").next().unwrap();
        settings.extend(
            quoted_names(traces_code)
                .into_iter()
                .filter(|v| v.starts_with("OTEL_")),
        );
        let mut files = Vec::new();
        for dir in [
            "src",
            "local/src",
            "local/tests",
            "bench/src",
            "harness/src",
            "tests",
            "examples",
            "idempotent-consumer/src",
            "idempotent-consumer/examples",
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
        // A shell variable a block of the page sets (`DLQ=$(aws …)`) is the page's own.
        let assigned: BTreeSet<String> = page
            .code
            .iter()
            .flat_map(|code| code.lines())
            .filter_map(|line| {
                let line = line.trim_start();
                let line = line.strip_prefix("export ").unwrap_or(line);
                line.split_once('=').map(|(name, _)| name.to_owned())
            })
            .filter(|name| variables(name).contains(name))
            .collect();
        for text in page.code.iter().chain(&page.prose) {
            for var in variables(text) {
                if !repo.known.contains(&var) && !assigned.contains(&var) {
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

/// The repository's files and folders, relative to its root (`src/lib.rs`,
/// `src/policy/`): what a path in backticks may name. Generated trees are left out.
/// What the build, the installs and `sam` make: never a path a page must find.
const GENERATED: &[&str] = &[
    "target",
    ".git",
    ".venv",
    "node_modules",
    ".local",
    ".aws-sam",
    "samconfig.toml",
];

fn tree() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![PathBuf::new()];
    // Bounded: the repository has a few hundred files in a few dozen folders.
    for _ in 0..10_000 {
        let Some(dir) = dirs.pop() else { break };
        let Ok(entries) = std::fs::read_dir(root().join(&dir)) else {
            continue;
        };
        for entry in entries.map(Result::unwrap) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if GENERATED.contains(&name.as_str()) {
                continue;
            }
            let path = dir.join(&name);
            let text = path.to_string_lossy().into_owned();
            if entry.path().is_dir() {
                found.insert(format!("{text}/"));
                dirs.push(path);
            } else {
                found.insert(text);
            }
        }
    }
    found
}

/// Endings of the files a page names.
const FILE_ENDINGS: &[&str] = &[
    ".rs", ".md", ".json", ".yaml", ".yml", ".py", ".js", ".mjs", ".toml", ".txt", ".sh", ".svg",
    ".lock",
];

/// The repository path a code span names, if it names one: no spaces, placeholders,
/// URLs or absolute paths; a file ending, or a first folder the repository has
/// (`policy/machine/` is read under `src/` too). A `:line` or `#anchor` is cut off.
fn repository_path<'a>(span: &'a str, folders: &BTreeSet<String>) -> Option<&'a str> {
    let span = span.trim();
    // The double quote as an escape: this file's own strings are read for names.
    let odd = |c: char| c.is_whitespace() || "<>*{}$=?[]@|,()'`…\u{22}".contains(c);
    if span.is_empty()
        || span.contains(odd)
        || span.contains("://")
        || span.contains("::")
        || span.starts_with(['/', '~', '-', '.', '#']) && !span.starts_with(".ci/")
    {
        return None;
    }
    let span = span.split('#').next()?;
    let span = match span.split_once(':') {
        Some((path, line)) if line.chars().all(|c| c.is_ascii_digit() || c == '-') => path,
        Some(_) => return None,
        None => span,
    };
    let first = span.split('/').next()?;
    if span.split('/').any(|part| GENERATED.contains(&part)) {
        return None;
    }
    let names_a_file = FILE_ENDINGS.iter().any(|e| span.ends_with(e)) && span.len() > 3;
    let names_a_folder = span.contains('/') && folders.contains(&format!("{first}/"));
    (names_a_file || names_a_folder).then_some(span)
}

/// Whether `path` (as a page writes it) is in `tree`: from the root, from `src/`, from
/// the page's own folder, or, for a bare file name, anywhere.
fn in_tree(path: &str, page_dir: &str, tree: &BTreeSet<String>) -> bool {
    let bare = path.trim_end_matches('/');
    let candidates = [
        path.to_owned(),
        format!("src/{path}"),
        format!("{page_dir}{path}"),
    ];
    candidates
        .iter()
        .any(|c| tree.contains(c) || tree.contains(&format!("{}/", c.trim_end_matches('/'))))
        || (!bare.contains('/')
            && tree
                .iter()
                .any(|t| t.trim_end_matches('/').rsplit('/').next() == Some(bare)))
}

/// Every path in backticks on `pages` that names nothing in the repository.
fn missing_paths(pages: &[(PathBuf, String)], tree: &BTreeSet<String>) -> Vec<String> {
    // Folder names at any depth: `policy/…` is a path, `application/json` is not.
    let folders: BTreeSet<String> = tree
        .iter()
        .filter(|t| t.ends_with('/'))
        .map(|t| {
            let name = t
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default();
            format!("{name}/")
        })
        .collect();
    let mut found = Vec::new();
    for (path, text) in pages {
        let shown = path
            .strip_prefix(root())
            .unwrap_or(path)
            .display()
            .to_string();
        let page_dir = match shown.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/"),
            None => String::new(),
        };
        for span in read_page(text).spans {
            if let Some(named) = repository_path(&span, &folders)
                && !in_tree(named, &page_dir, tree)
            {
                found.push(format!(
                    "{shown}: `{span}` names no file or folder of the repository"
                ));
            }
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
fn every_repository_path_in_backticks_exists() {
    let tree = tree();
    assert!(tree.contains("src/lib.rs") && tree.contains("src/policy/"));
    let missing = missing_paths(&the_docs(), &tree);
    assert!(
        missing.is_empty(),
        "the docs check found:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_path_that_moved_or_never_was_fails_the_check() {
    let tree = tree();
    let page = "The machine is in `src/policy/machine/mod.rs:12`, the batch in \
                `policy/batch/`; the old `idempotency/machine.rs`, `src/batch.rs` and \
                `docs/nowhere.md#x` are gone. Not paths: `application/json`, \
                `/v1/payment_intents`, `cobro#<id>`, `bench/results/<date>.md`.\n";
    let found = missing_paths(&[(root().join("README.md"), page.to_owned())], &tree);
    assert_eq!(
        found,
        [
            "README.md: `docs/nowhere.md#x` names no file or folder of the repository",
            "README.md: `idempotency/machine.rs` names no file or folder of the repository",
            "README.md: `src/batch.rs` names no file or folder of the repository",
        ]
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

/// The template's parameters, in the order it declares them (and sam asks for them).
fn template_parameters(template: &str) -> Vec<String> {
    let Some((_, after)) = template.split_once("\nParameters:\n") else {
        return Vec::new();
    };
    after
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#'))
        .filter_map(|l| l.strip_suffix(':'))
        .map(str::to_owned)
        .collect()
}

/// The `Parameter <Name>` prompts a page's tables list, in order.
fn prompted_parameters(page: &str) -> Vec<String> {
    read_page(page)
        .tables
        .iter()
        .flatten()
        .filter_map(|row| row.first())
        .filter_map(|cell| cell.strip_prefix("Parameter "))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn the_guided_deploys_prompts_list_every_template_parameter_in_the_order_sam_asks() {
    let template = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let parameters = template_parameters(&template);
    assert!(
        parameters.len() >= 20 && parameters[0] == "Architecture",
        "{parameters:?}"
    );
    let readme = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    assert_eq!(prompted_parameters(&readme), parameters);
    // A parameter added to the template and not to the page fails the check.
    let grown = template.replace(
        "\nParameters:\n",
        "\nParameters:\n  NewOne:\n    Type: String\n",
    );
    assert_ne!(prompted_parameters(&readme), template_parameters(&grown));
}

/// The mutants the model checker knows: the names of `examples/model.rs`'s `MUTANTS`.
fn model_mutants(model: &str) -> Vec<String> {
    let Some((_, list)) = model.split_once("const MUTANTS: &[(&str, &str)] = &[") else {
        return Vec::new();
    };
    let list = list.split("\n];").next().unwrap_or_default();
    list.split("\n    (")
        .skip(1)
        .filter_map(|entry| entry.split('"').nth(1))
        .map(str::to_owned)
        .collect()
}

/// The first cells of a page's table whose header starts with `header`, backticks
/// and `MUTANT=` taken off.
fn table_names(page: &str, header: &str) -> Vec<String> {
    read_page(page)
        .tables
        .into_iter()
        .filter(|t| {
            t.first()
                .and_then(|h| h.first())
                .is_some_and(|h| h.starts_with(header))
        })
        .flat_map(|t| t.into_iter().skip(1))
        .filter_map(|row| row.into_iter().next())
        .map(|cell| cell.trim().trim_start_matches("MUTANT=").to_owned())
        .collect()
}

#[test]
fn the_mutant_tables_of_the_docs_list_exactly_the_models_mutants() {
    let model = std::fs::read_to_string(root().join("examples/model.rs")).unwrap();
    let mut mutants = model_mutants(&model);
    assert!(mutants.len() >= 10 && mutants.contains(&"unfenced-release".to_owned()));
    mutants.sort();
    for (page, header) in [
        ("ARCHITECTURE.md", "mutant"),
        ("docs/guarantees.md", "MUTANT="),
    ] {
        let text = std::fs::read_to_string(root().join(page)).unwrap();
        let mut listed = table_names(&text, header);
        listed.sort();
        assert_eq!(listed, mutants, "{page}'s mutant table");
    }
    // A mutant the model gains and a page lacks fails the check.
    let grown = model.replace(
        "const MUTANTS: &[(&str, &str)] = &[",
        "const MUTANTS: &[(&str, &str)] = &[\n    (\"a-new-rule-off\", \"x\"),",
    );
    assert_eq!(model_mutants(&grown).len(), mutants.len() + 1);
}

/// The Stripe API versions (`2026-09-30.endive`: a date, a dot, a release's name) that
/// `text` names and that are not `pinned`.
fn other_versions(text: &str, pinned: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-dd.";
    let mut found = Vec::new();
    for start in 0..bytes.len().saturating_sub(shape.len()) {
        let fits = shape.iter().enumerate().all(|(i, s)| match s {
            b'd' => bytes[start + i].is_ascii_digit(),
            other => bytes[start + i] == *other,
        });
        let preceded = start > 0 && bytes[start - 1].is_ascii_alphanumeric();
        if !fits || preceded {
            continue;
        }
        let name_end = bytes[start + shape.len()..]
            .iter()
            .position(|b| !b.is_ascii_lowercase())
            .map_or(bytes.len(), |n| start + shape.len() + n);
        // A release's name (`endive`), not a file's extension (`2026-12-01.md`).
        if name_end >= start + shape.len() + 5 {
            let version = &text[start..name_end];
            if version != pinned {
                found.push(version.to_owned());
            }
        }
    }
    found
}

/// The files a user reads or runs that name a Stripe version: the docs, the template,
/// the sample events, and the local run (its simulator's events).
fn version_bearing_files() -> Vec<PathBuf> {
    let mut files = pages();
    files.push(root().join("template.yaml"));
    for dir in ["events", "local/src"] {
        let mut found = Vec::new();
        let mut stack = vec![root().join(dir)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    found.push(path);
                }
            }
        }
        found.sort();
        files.extend(found);
    }
    files
}

#[test]
fn every_stripe_version_the_docs_and_samples_name_is_the_one_the_code_pins() {
    let pinned = charge_once::adapters::payment_http::STRIPE_VERSION;
    let mut stale = Vec::new();
    for file in version_bearing_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for version in other_versions(&text, pinned) {
            stale.push(format!("{}: {version}", file.display()));
        }
    }
    assert!(
        stale.is_empty(),
        "pinned {pinned}, yet:\n{}",
        stale.join("\n")
    );
    // The kind it missed once: the simulator's events at an old version.
    assert_eq!(
        other_versions(
            "\"api_version\": \"2025-09-30.clover\", and 2026-12-01.json",
            pinned
        ),
        ["2025-09-30.clover"]
    );
    assert!(other_versions(&format!("`Stripe-Version: {pinned}`"), pinned).is_empty());
}

/// The template's alarms, by name.
fn template_alarms() -> Vec<String> {
    let template = std::fs::read_to_string(root().join("template.yaml")).unwrap();
    let mut names = Vec::new();
    let mut last = "";
    for line in template.lines() {
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'))
            && !name.starts_with(' ')
        {
            last = name;
        }
        if line.trim() == "Type: AWS::CloudWatch::Alarm" {
            names.push(last.to_owned());
        }
    }
    names.sort();
    names
}

/// Every count of alarms `text` states ("the six alarms", "two template alarms"), as
/// (the number, the words).
fn alarm_counts(text: &str) -> Vec<(usize, String)> {
    const NUMBERS: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut counts = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if !word.to_ascii_lowercase().starts_with("alarms") || i == 0 {
            continue;
        }
        let before = if words[i - 1] == "template" && i >= 2 {
            words[i - 2]
        } else {
            words[i - 1]
        };
        let lower = before.to_ascii_lowercase();
        let number = NUMBERS
            .iter()
            .position(|n| *n == lower)
            .or_else(|| lower.parse().ok());
        if let Some(n) = number {
            counts.push((n, words[i.saturating_sub(2)..=i].join(" ")));
        }
    }
    counts
}

#[test]
fn the_alarms_table_and_every_count_of_alarms_are_the_templates() {
    let alarms = template_alarms();
    assert!(alarms.len() >= 6, "{alarms:?}");
    let operate = std::fs::read_to_string(root().join("docs/operate.md")).unwrap();
    let mut listed: Vec<String> = table_names(&operate, "alarm")
        .into_iter()
        .map(|n| n.trim_matches('`').to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, alarms, "docs/operate.md's alarms table");
    let mut wrong = Vec::new();
    for (page, text) in the_docs().iter().chain(std::iter::once(&(
        root().join("template.yaml"),
        std::fs::read_to_string(root().join("template.yaml")).unwrap(),
    ))) {
        for (n, words) in alarm_counts(text) {
            if n != alarms.len() {
                wrong.push(format!("{}: \"{words}\"", page.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the template has {} alarms, yet:\n{}",
        alarms.len(),
        wrong.join("\n")
    );
    // The kinds it missed once.
    assert_eq!(alarm_counts("the two template alarms")[0].0, 2);
    assert_eq!(alarm_counts("SNS topic the four alarms notify")[0].0, 4);
}
