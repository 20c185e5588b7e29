//! `outbox-relay config print`: the merged configuration, secrets redacted, each value with
//! where it came from: the file, an environment variable, an `[[outbox]]` preset, or the
//! default.

use std::path::Path;

use figment::Figment;
use relay_runtime::config::{ENV_PREFIX, RelayConfig};

/// Prints `key = value  # source` lines.
pub fn print(config: &RelayConfig, figment: &Figment) -> anyhow::Result<()> {
    for (key, value) in relay_runtime::config::flattened(config)? {
        let source = preset_of(config, &key).unwrap_or_else(|| source_of(figment, &key));
        println!("{key} = {value}  # {source}");
    }
    Ok(())
}

/// `preset <name>` when an `[[outbox]]` preset set `key` (`outbox.<i>.<key below the entry>`).
fn preset_of(config: &RelayConfig, key: &str) -> Option<String> {
    let rest = key.strip_prefix("outbox.")?;
    let (index, below) = rest.split_once('.')?;
    let name = config.outbox.preset_of(index.parse().ok()?, below)?;
    Some(format!("preset {name}"))
}

/// Where `key` came from. Array elements (`outbox.0.table`) are attributed to their array.
fn source_of(figment: &Figment, key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let lookup = match parts.iter().position(|p| p.parse::<usize>().is_ok()) {
        Some(i) => parts[..i].join("."),
        None => key.to_owned(),
    };
    if figment.find_value(&lookup).is_err() {
        return "default".into();
    }
    let Some(meta) = figment.find_metadata(&lookup) else {
        return "default".into();
    };
    if meta.name.contains("environment") {
        let var = format!("{ENV_PREFIX}{}", lookup.replace('.', "__").to_uppercase());
        return format!("environment {var}");
    }
    match &meta.source {
        Some(figment::Source::File(path)) => format!("file {}", display(path)),
        Some(other) => other.to_string(),
        None => meta.name.to_string(),
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
