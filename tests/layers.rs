//! The layers of ARCHITECTURE.md, "The layers", held against the source: no file under
//! `src/` names a module of a layer above its own (`crate::<module>` in its code;
//! comments aside, which may point anywhere). The source is read as text, so the check
//! needs no build of the crate. The rule is also shown failing on a file broken on
//! purpose.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};

/// Every module of the crate's root with its layer, from the bottom up; a module may
/// name its own layer and those below. `config` and `crash_points` are read by the
/// drivers and the adapters, and read the policy; the entry files are at the top.
const LAYERS: &[(&str, u8)] = &[
    ("domain", 1),
    ("contracts", 2),
    ("policy", 3),
    ("config", 4),
    ("crash_points", 4),
    ("drivers", 5),
    ("adapters", 6),
    ("telemetry", 7),
    ("traces", 7),
    ("wiring", 7),
    ("commands", 7),
    ("audit_lambda", 7),
    ("cli", 7),
    ("main", 7),
    ("lib", 7),
];

/// Items of the crate's root itself (`lib.rs`), which every layer may use.
const ROOT_ITEMS: &[&str] = &["BoxError", "error_chain"];

fn layer(module: &str) -> Option<u8> {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, rank)| *rank)
}

/// The root module a file of `src/` belongs to: its folder, or its own name.
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().unwrap();
    let first = first.as_os_str().to_string_lossy();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

/// The code of a file without its comments (`//` to the end of a line, outside a
/// string; the source has no block comments).
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut previous = ' ';
        let mut end = line.len();
        for (i, c) in line.char_indices() {
            match c {
                '"' if previous != '\\' => in_string = !in_string,
                '/' if !in_string && previous == '/' => {
                    end = i - 1;
                    break;
                }
                _ => {}
            }
            previous = c;
        }
        out.push_str(&line[..end]);
        out.push('\n');
    }
    out
}

/// The root modules (or root items) a file's code names through `crate::`, grouped
/// imports (`use crate::{a, b::c}`) included.
fn named(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `charge_once::`-like paths of another crate's name
        }
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                names.extend(
                    group
                        .split(',')
                        .map(|part| ident(part.trim()))
                        .filter(|name| !name.is_empty()),
                );
            }
            None => names.push(ident(rest)),
        }
    }
    names
}

/// What a file of `module` names against the layers, one sentence each.
fn violations(file: &str, module: &str, text: &str) -> Vec<String> {
    let Some(own) = layer(module) else {
        return vec![format!(
            "{file}: module `{module}` has no layer in tests/layers.rs (ARCHITECTURE.md, \"The layers\")"
        )];
    };
    let mut out = Vec::new();
    for name in named(&code(text)) {
        if ROOT_ITEMS.contains(&name.as_str()) {
            continue;
        }
        match layer(&name) {
            Some(rank) if rank <= own => {}
            Some(_) => out.push(format!(
                "{file}: `crate::{name}` runs up from {module} to a layer above its own"
            )),
            None => out.push(format!(
                "{file}: `crate::{name}` is neither a module with a layer nor a root item"
            )),
        }
    }
    out
}

/// Every `.rs` file under `src/`, relative to it.
fn sources() -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    // Bounded: the source tree is a few levels deep.
    for _ in 0..10_000 {
        let Some(dir) = dirs.pop() else { break };
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(&src).unwrap().to_owned());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources();
    assert!(files.len() > 20, "the source tree was not found");
    let mut found = Vec::new();
    for relative in &files {
        let text = std::fs::read_to_string(src.join(relative)).unwrap();
        let file = format!("src/{}", relative.display());
        found.extend(violations(&file, &module_of(relative), &text));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_layer_in_order_is_one_lib_rs_declares() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    for (module, _) in LAYERS {
        let binary = matches!(*module, "main" | "cli" | "lib");
        assert!(
            binary || lib.contains(&format!("pub mod {module};")),
            "lib.rs declares no module {module}"
        );
    }
}

#[test]
fn an_import_from_above_is_found_and_a_comment_or_one_from_below_is_not() {
    let broken = "//! Points at [`crate::drivers::charge`], which a comment may.\n\
                  use crate::domain::Key;\n\
                  use crate::{error_chain, contracts::store};\n\
                  let url = \"https://example.com\"; // crate::adapters in a comment\n\
                  fn f() { crate::drivers::metrics::count_outcome(k) }\n\
                  use crate::{policy, adapters::sqs};\n";
    assert_eq!(
        violations("src/policy/x.rs", "policy", broken),
        [
            "src/policy/x.rs: `crate::drivers` runs up from policy to a layer above its own",
            "src/policy/x.rs: `crate::adapters` runs up from policy to a layer above its own",
        ]
    );
    assert_eq!(
        violations(
            "src/contracts/x.rs",
            "contracts",
            "use crate::nowhere::X;\n"
        ),
        ["src/contracts/x.rs: `crate::nowhere` is neither a module with a layer nor a root item"]
    );
    assert!(violations("src/wiring.rs", "wiring", broken).is_empty());
}
