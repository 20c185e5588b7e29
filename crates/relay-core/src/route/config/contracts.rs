//! `[outbox.contracts]`: the JSON Schema each event type of a table must satisfy, and the checks
//! of it that need neither the files nor the database.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[outbox.contracts]` of one outbox table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractsConfig {
    /// Column whose value is the event type. Default `type` (unless `type_header` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_column: Option<String>,
    /// Header (as the mapping sets it, `headers_json` members too) whose value is the event
    /// type, instead of a column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_header: Option<String>,
    /// Event type → contract file.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub types: BTreeMap<String, ContractFile>,
    /// Subject pattern (`*`, `>` as in NATS) → contract file, for events whose type has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subjects: BTreeMap<String, ContractFile>,
    /// An event no contract matches is a bad row. Default `false`: published unchecked.
    #[serde(default)]
    pub required: bool,
    /// Largest payload checked, bytes; a larger one is a violation. Default 1 MiB.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects checked (at most 128); a deeper payload is a
    /// violation. Default 64.
    #[serde(default = "default_max_depth")]
    pub max_depth: usize,
}

/// A contract file: its path, or `{ schema = "…", name = "…" }` to name it (default: the file
/// name without `.json`). The name is the first part of its KV key and `Outbox-Schema` value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContractFile {
    /// `"contracts/order-placed.json"`.
    Path(PathBuf),
    /// `{ schema = "contracts/order-placed.json", name = "order-placed" }`.
    Named {
        /// The file.
        schema: PathBuf,
        /// The contract's name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
}

impl ContractFile {
    /// The schema file.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Self::Path(path) | Self::Named { schema: path, .. } => path,
        }
    }

    /// The name given, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Path(_) => None,
            Self::Named { name, .. } => name.as_deref(),
        }
    }
}

fn default_max_bytes() -> usize {
    1024 * 1024
}

fn default_max_depth() -> usize {
    64
}

/// Where the event type of a row is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeSource {
    /// A column's value.
    Column(String),
    /// A header's value on the built message.
    Header(String),
}

impl ContractsConfig {
    /// Where the event type is read.
    pub fn type_source(&self) -> TypeSource {
        match (&self.type_header, &self.type_column) {
            (Some(header), _) => TypeSource::Header(header.clone()),
            (None, Some(column)) => TypeSource::Column(column.clone()),
            (None, None) => TypeSource::Column("type".into()),
        }
    }

    /// Every contract file with the key that names it (`types.<type>`, `subjects."<pattern>"`).
    pub fn files(&self) -> impl Iterator<Item = (String, &ContractFile)> {
        let types = self.types.iter().map(|(t, f)| (format!("types.{t}"), f));
        let subjects = self
            .subjects
            .iter()
            .map(|(s, f)| (format!("subjects.\"{s}\""), f));
        types.chain(subjects)
    }

    /// Checks what needs neither the files nor the database.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.type_column.is_some() && self.type_header.is_some() {
            return Err("[outbox.contracts] sets both `type_column` and `type_header`: the event type comes from one of them".into());
        }
        if [&self.type_column, &self.type_header]
            .iter()
            .any(|v| v.as_deref().is_some_and(str::is_empty))
        {
            return Err(
                "[outbox.contracts] `type_column` and `type_header` must name something".into(),
            );
        }
        if self.types.is_empty() && self.subjects.is_empty() && !self.required {
            return Err("[outbox.contracts] names no contract: add `types` or `subjects` (or remove the section)".into());
        }
        if self.max_bytes == 0 || !(1..=128).contains(&self.max_depth) {
            return Err("[outbox.contracts] `max_bytes` must be at least 1 and `max_depth` 1 to 128 (the JSON parser's own nesting limit)".into());
        }
        for pattern in self.subjects.keys() {
            let tokens: Vec<&str> = pattern.split('.').collect();
            let bad_wildcard = tokens
                .iter()
                .enumerate()
                .any(|(i, t)| *t == ">" && i + 1 != tokens.len());
            if tokens
                .iter()
                .any(|t| t.is_empty() || t.contains(char::is_whitespace))
                || bad_wildcard
            {
                return Err(format!(
                    "[outbox.contracts] subjects: `{pattern}` is not a NATS subject pattern (dot-separated tokens, `*` for one token, `>` only last)"
                ));
            }
        }
        for (key, file) in self.files() {
            if file.path().as_os_str().is_empty() {
                return Err(format!("[outbox.contracts] {key} names no file"));
            }
        }
        Ok(())
    }
}
