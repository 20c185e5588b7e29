//! The reference docs against the code: every key `docs/configuration.md` lists exists, with
//! the default the code has, and every key the code has is listed; every command is in
//! `docs/operations.md`'s command table, which also quotes each command's one-line summary as
//! `outbox-relay help` prints it; a default a doc gives for a command's flag
//! (`` `--page-size` (default 1000) ``) is the flag's own.

use clap::CommandFactory as _;
use serde_json::Value;
use std::collections::BTreeMap;

use relay_runtime::config::RelayConfig;

fn doc(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/");
    std::fs::read_to_string(format!("{path}{name}")).unwrap_or_else(|e| panic!("docs/{name}: {e}"))
}

/// The `| key | default | meaning |` rows below `heading`, up to the next heading: key →
/// default cell. A row naming two keys (`` `user`, `password` ``) gives each its part of the
/// default cell when that has as many parts.
fn documented_keys(text: &str, heading: &str) -> BTreeMap<String, String> {
    let mut keys = BTreeMap::new();
    let Some(start) = text.find(heading) else {
        panic!("docs/configuration.md has no heading {heading:?}");
    };
    let section = &text[start + heading.len()..];
    let end = section.find("\n#").unwrap_or(section.len());
    for line in section[..end].lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        if cells.len() < 3 || !cells[0].starts_with("| `") {
            continue;
        }
        let names: Vec<&str> = cells[0]
            .trim_start_matches("| ")
            .split(", ")
            .map(|n| n.trim_matches('`'))
            .collect();
        let defaults: Vec<&str> = cells[1].split(", ").collect();
        for (i, name) in names.iter().enumerate() {
            let default = if defaults.len() == names.len() {
                defaults[i]
            } else {
                cells[1]
            };
            keys.insert((*name).to_owned(), default.trim().to_owned());
        }
    }
    keys
}

/// A documented default as a value to compare: the first backticked text, or `None` when
/// the doc gives no value (`–`, "not set", a sentence).
fn documented_value(cell: &str) -> Option<String> {
    let rest = cell.strip_prefix('`')?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// The code's default as the docs write it.
fn code_value(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Object(map) if map.is_empty() => None,
        other => Some(other.to_string()),
    }
}

/// Whether two defaults say the same: equal, or the same duration (`7d` and `7days`).
fn same(documented: &str, code: &str) -> bool {
    let duration = |s: &str| humantime::parse_duration(s).ok();
    documented == code
        || matches!((duration(documented), duration(code)), (Some(a), Some(b)) if a == b)
}

#[test]
fn configuration_md_lists_every_key_with_the_codes_default() {
    let text = doc("configuration.md");
    let defaults = serde_json::to_value(RelayConfig::default()).expect("serializes");
    let mut problems = Vec::new();
    for section in ["postgres", "nats", "relay", "http"] {
        let documented = documented_keys(&text, &format!("## `[{section}]`"));
        let Some(Value::Object(code)) = defaults.get(section) else {
            panic!("no [{section}] in the defaults");
        };
        for (key, value) in code {
            match documented.get(key) {
                None => problems.push(format!("[{section}] {key}: not in docs/configuration.md")),
                Some(cell) => {
                    if let (Some(doc), Some(code)) = (documented_value(cell), code_value(value))
                        && !same(&doc, &code)
                    {
                        problems.push(format!(
                            "[{section}] {key}: documented default `{doc}`, the code's is `{code}`"
                        ));
                    }
                }
            }
        }
        for key in documented.keys() {
            // Keys without a default are not serialized when unset.
            let optional = documented_value(&documented[key]).is_none();
            if !code.contains_key(key) && !optional {
                problems.push(format!(
                    "[{section}] {key}: documented with a default, but the code has no such key"
                ));
            }
        }
    }
    let outbox = documented_keys(&text, "## `[[outbox]]`");
    let Value::Object(first) = serde_json::to_value(
        relay_core::route::OutboxTableConfig::with_defaults("public.outbox"),
    )
    .expect("serializes") else {
        panic!("an [[outbox]] entry is a table");
    };
    for key in first.keys() {
        if !outbox.contains_key(key) {
            problems.push(format!("[[outbox]] {key}: not in docs/configuration.md"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn operations_md_lists_every_command() {
    let text = doc("operations.md");
    let mut missing = Vec::new();
    for command in crate::Cli::command().get_subcommands() {
        let name = command.get_name();
        if name != "help" && !text.contains(&format!("| `outbox-relay {name}")) {
            missing.push(name.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "commands missing from docs/operations.md's command table: {missing:?}"
    );
}

#[test]
fn flag_defaults_in_the_docs_are_the_flags_own() {
    let docs: Vec<(String, String)> = ["replay.md", "operations.md", "configuration.md"]
        .into_iter()
        .map(|name| (name.to_owned(), doc(name)))
        .collect();
    let mut problems = Vec::new();
    let mut commands = vec![crate::Cli::command()];
    while let Some(command) = commands.pop() {
        for arg in command.get_arguments() {
            let (Some(long), [default]) = (arg.get_long(), arg.get_default_values()) else {
                continue;
            };
            let default = default.to_string_lossy();
            let needle = format!("`--{long}` (");
            for (name, text) in &docs {
                for (at, _) in text.match_indices(&needle) {
                    // The flag of the command whose section this is (a heading naming it).
                    let heading = text[..at].rfind("\n##").map_or("", |h| {
                        let line = &text[h + 1..];
                        &line[..line.find('\n').unwrap_or(line.len())]
                    });
                    if !heading.to_lowercase().contains(command.get_name()) {
                        continue;
                    }
                    let inside = &text[at + needle.len()..];
                    let inside = &inside[..inside.find(')').unwrap_or(0)];
                    let value = inside.strip_prefix("default ").unwrap_or(inside);
                    let value = value.replace(',', "");
                    if value.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
                        && !same(&value, &default)
                    {
                        problems.push(format!(
                            "docs/{name}: `{} --{long}` documented as ({inside}), its default is {default}",
                            command.get_name()
                        ));
                    }
                }
            }
        }
        commands.extend(command.get_subcommands().cloned());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `outbox-relay help`'s one-line summary of each command (and of `config print`), as
/// `docs/operations.md` quotes it: a summary changed in the code without the docs, or the other
/// way round, fails here, so the two are read side by side when either changes.
#[test]
fn operations_md_quotes_each_commands_summary_as_the_cli_gives_it() {
    let text = doc("operations.md");
    let heading = "### What `outbox-relay help` says of each command";
    let Some(start) = text.find(heading) else {
        panic!("docs/operations.md has no heading {heading:?}");
    };
    let section = &text[start + heading.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    let mut expected = Vec::new();
    let mut commands = vec![(String::new(), crate::Cli::command())];
    while let Some((prefix, command)) = commands.pop() {
        for sub in command.get_subcommands() {
            let name = format!("{prefix}{}", sub.get_name());
            if sub.get_name() == "help" {
                continue;
            }
            if sub.has_subcommands() {
                commands.push((format!("{name} "), sub.clone()));
            } else {
                let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
                expected.push(format!("- `outbox-relay {name}`: {about}"));
            }
        }
    }
    // The docs wrap nothing here: one line per command.
    let quoted: Vec<&str> = section.lines().filter(|l| l.starts_with("- `")).collect();
    let mut problems = Vec::new();
    for line in &expected {
        if !quoted.contains(&line.as_str()) {
            problems.push(format!("missing or different: {line}"));
        }
    }
    for line in &quoted {
        if !expected.iter().any(|e| e == line) {
            problems.push(format!("no such command or summary: {line}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every flag of every command is in that command's `--help` (`contracts check --json`
/// included), and every flag docs/operations.md's command table gives a command is one of its
/// own.
#[test]
fn each_commands_help_lists_its_flags_and_the_command_table_only_real_ones() {
    let text = doc("operations.md");
    let mut problems = Vec::new();
    let mut commands = vec![(String::new(), crate::Cli::command())];
    while let Some((path, mut command)) = commands.pop() {
        let path = format!("{path} {}", command.get_name()).trim().to_owned();
        let help = command.render_long_help().to_string();
        let longs: Vec<String> = command
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        for long in &longs {
            if !help.contains(long.as_str()) {
                problems.push(format!("`{path} --help` does not list {long}"));
            }
        }
        // The table row of this command: `| \`outbox-relay <command> [flags]\` |`.
        let name = path.strip_prefix("outbox-relay ").unwrap_or_default();
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| `outbox-relay {name} [")))
            .filter(|_| !name.is_empty());
        if let Some(row) = row {
            let cell = row.split('`').nth(1).unwrap_or_default();
            for flag in cell
                .split(['[', ']', ' ', '|'])
                .filter(|w| w.starts_with("--"))
            {
                if !longs.iter().any(|l| l == flag) {
                    problems.push(format!("docs/operations.md gives `{name}` {flag}"));
                }
            }
        }
        commands.extend(
            command
                .get_subcommands()
                .filter(|c| c.get_name() != "help")
                .map(|c| (path.clone(), c.clone())),
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
