//! Every command README.md, ARCHITECTURE.md and docs/ show for the AWS CLI, the SAM CLI
//! and charge-once's own binaries is accepted as written by the CLI that runs it: each
//! is run (placeholders such as `<order-id>` or `…` filled with a stand-in), the AWS
//! calls against moto with no real account, and none may end in a usage error. What a
//! command then does is for the tests of each command (tests/operations.rs runs the
//! DLQ's commands for real).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use harness::docs::{Shell, pages, shown};

/// The commands whose lines are run; any other line of a block (`make`, `curl`, `cd`)
/// is not.
const COMMANDS: [&str; 4] = ["aws", "sam", "charge-once", "charge-once-local"];

/// `line` without a trailing `# comment` (a `#` after a space, outside quotes).
fn without_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

/// A shown line as a reader runs it: the docs' spellings of the binaries made the
/// shell's, and each placeholder (`<…>`, `…`) a stand-in that any of their values'
/// checks takes (`1`: an order id, an amount, the end of `pm_…`).
fn as_run(line: &str) -> String {
    let mut line = line
        .replace("cargo run -q -p charge-once-local --", "charge-once-local")
        .replace("cargo run -q --", "charge-once")
        .replace(".venv/bin/sam", "sam")
        .replace('…', "1");
    // `[--since DURATION]`: a synopsis's optional part, left out.
    while let Some(start) = line.find("[-") {
        let Some(end) = line[start..].find(']') else {
            break;
        };
        line.replace_range(start..start + end + 1, "");
    }
    // `<the topic's ARN>`, `<order-id>`: a placeholder, never a redirection (a space
    // follows a redirection's `<`).
    while let Some(start) = line.find('<').filter(|&i| {
        line[i + 1..]
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace())
    }) {
        let Some(end) = line[start..].find('>') else {
            break;
        };
        line.replace_range(start..start + end + 1, "1");
    }
    without_comment(&line)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first word of `line` once its `export` and `NAME=value` prefixes are left out.
fn command_of(line: &str) -> &str {
    line.split_whitespace()
        .find(|w| *w != "export" && !w.contains('='))
        .unwrap_or("")
}

/// The lines of a shown script that are run: those that call one of [`COMMANDS`]
/// (first, or in a `$(…)`), and plain assignments, which later lines read.
fn runnable(script: &str) -> Vec<String> {
    script
        .lines()
        .map(as_run)
        .filter(|line| {
            let first = command_of(line);
            COMMANDS.contains(&first)
                || COMMANDS.iter().any(|c| line.contains(&format!("$({c} ")))
                || (first.is_empty() && line.contains('='))
        })
        .collect()
}

#[test]
fn every_command_the_docs_show_is_accepted_as_written_by_its_cli() {
    let shell = Shell::new();
    let mut scripts = Vec::new();
    let mut ran = Vec::new();
    for page in pages() {
        for shown in shown(&page, &["aws", ".venv/bin/sam", "charge-once"]) {
            // Inline code names a command in prose (`charge-once resolve`) unless it
            // gives a flag.
            if shown.inline && !shown.script.contains(" -") {
                continue;
            }
            let lines = runnable(&shown.script);
            if lines.iter().all(|l| command_of(l).is_empty()) {
                continue;
            }
            scripts.push(lines.join("\n"));
            ran.push(format!(
                "{} ({}): {}",
                shown.page,
                shown.section,
                lines.join("; ")
            ));
        }
    }
    // Each block in a shell of its own, four at a time: the CLIs start slowly.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while let Some(script) =
                    scripts.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    shell.run(script);
                }
            });
        }
    });
    let refused = shell.refused();
    assert!(
        refused.is_empty(),
        "commands of the docs refused by their CLI as written:\n{}\n\nof the shown:\n{}",
        refused.join("\n"),
        ran.join("\n")
    );
    // The check reads what it should: the deploy's, the DLQ's and the operator's.
    for expected in [
        "aws secretsmanager create-secret",
        "aws sqs start-message-move-task",
        "aws logs filter-log-events",
        "charge-once resolve",
        "charge-once-local inspect",
        "sam logs",
    ] {
        assert!(
            ran.iter().any(|r| r.contains(expected)),
            "no `{expected}` among the docs' commands:\n{}",
            ran.join("\n")
        );
    }
}

#[test]
fn a_command_its_cli_refuses_is_caught_and_a_placeholder_is_not_a_redirection() {
    let shell = Shell::new();
    // The runbook once showed this: it lacks the queue's URL.
    shell.run(&as_run(
        "aws sqs receive-message --message-attribute-names All",
    ));
    // A flag that `resolve` does not have.
    shell.run(&as_run(
        "charge-once resolve <order-id> --amount 5000 --card pm_…",
    ));
    let refused = shell.refused();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].ends_with(
            "aws --endpoint-url {moto} sqs receive-message --message-attribute-names All"
                .replace("{moto}", harness::servers::Backend::Moto.url())
                .as_str()
        ),
        "{refused:?}"
    );
    assert!(
        refused[1].ends_with("charge-once resolve 1 --amount 5000 --card pm_1"),
        "{refused:?}"
    );

    assert_eq!(
        as_run("aws sns subscribe --topic-arn <the topic's ARN>   # then confirm"),
        "aws sns subscribe --topic-arn 1"
    );
    assert_eq!(as_run("sam deploy < /dev/null"), "sam deploy < /dev/null");
    assert_eq!(
        runnable("make build\nQUEUE=$(aws sqs get-queue-url --queue-name o)\ncurl -s x"),
        ["QUEUE=$(aws sqs get-queue-url --queue-name o)"]
    );
}
