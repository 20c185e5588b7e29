//! Event contracts on the routing path: which contract an event must satisfy, the check, and
//! the counts `/metrics` and `/status` show. The contracts themselves are compiled by the
//! caller (the files are read outside this IO-free crate) and handed to
//! [`super::Router::with_contracts`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use outbox_schema::{Contract, Limits};

use super::config::{ContractFile, ContractsConfig, TypeSource};
use crate::subject::subject_matches;

/// Longest reason kept as a contract's last refusal.
const LAST_REFUSED_CHARS: usize = 600;

/// One compiled contract and its counts.
#[derive(Debug)]
pub struct LoadedContract {
    contract: Contract,
    /// `Outbox-Schema`'s value: the contract's KV key.
    header: Arc<str>,
    /// The file, as configured.
    file: String,
    checked: AtomicU64,
    refused: AtomicU64,
    last_refused: Mutex<Option<RefusedEvent>>,
}

/// The latest event a contract refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusedEvent {
    /// The table.
    pub table: String,
    /// The event id.
    pub event_id: String,
    /// The violation.
    pub reason: String,
}

impl LoadedContract {
    /// A compiled contract read from `file`.
    pub fn new(contract: Contract, file: impl Into<String>) -> Self {
        Self {
            header: contract.key().into(),
            contract,
            file: file.into(),
            checked: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            last_refused: Mutex::new(None),
        }
    }

    /// The compiled contract.
    pub fn contract(&self) -> &Contract {
        &self.contract
    }

    /// The file it was read from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// Events checked against it.
    pub fn checked(&self) -> u64 {
        self.checked.load(Ordering::Relaxed)
    }

    /// Events it refused.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The latest event it refused, if any.
    pub fn last_refused(&self) -> Option<RefusedEvent> {
        self.last_refused.lock().ok().and_then(|last| last.clone())
    }
}

/// The contracts of one outbox table, matched to its events.
#[derive(Debug)]
pub struct TableContracts {
    type_source: TypeSource,
    by_type: HashMap<String, Arc<LoadedContract>>,
    /// Most specific pattern first.
    by_subject: Vec<(String, Arc<LoadedContract>)>,
    required: bool,
    limits: Limits,
}

impl TableContracts {
    /// The contracts `config` names, each compiled by `load` (which reads the file; the same
    /// file may be asked for more than once).
    pub fn new<E>(
        config: &ContractsConfig,
        mut load: impl FnMut(&ContractFile) -> Result<Arc<LoadedContract>, E>,
    ) -> Result<Self, E> {
        let mut by_type = HashMap::with_capacity(config.types.len());
        for (event_type, file) in &config.types {
            by_type.insert(event_type.clone(), load(file)?);
        }
        let mut by_subject = Vec::with_capacity(config.subjects.len());
        for (pattern, file) in &config.subjects {
            by_subject.push((pattern.clone(), load(file)?));
        }
        by_subject.sort_by_key(|(pattern, _)| std::cmp::Reverse(specificity(pattern)));
        Ok(Self {
            type_source: config.type_source(),
            by_type,
            by_subject,
            required: config.required,
            limits: Limits {
                max_bytes: config.max_bytes,
                max_depth: config.max_depth,
            },
        })
    }

    /// Where the event type is read.
    pub fn type_source(&self) -> &TypeSource {
        &self.type_source
    }

    /// Whether an event no contract matches is refused.
    pub fn required(&self) -> bool {
        self.required
    }

    /// The bounds payloads are checked within.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Every contract of the table, each once.
    pub fn contracts(&self) -> Vec<Arc<LoadedContract>> {
        let mut out: Vec<Arc<LoadedContract>> = Vec::new();
        for contract in self
            .by_type
            .values()
            .chain(self.by_subject.iter().map(|(_, c)| c))
        {
            if !out.iter().any(|c| Arc::ptr_eq(c, contract)) {
                out.push(contract.clone());
            }
        }
        out.sort_by(|a, b| a.header.cmp(&b.header));
        out
    }

    /// The contract an event of `event_type` on `subject` must satisfy, if any.
    pub fn find(&self, event_type: Option<&str>, subject: &str) -> Option<&Arc<LoadedContract>> {
        event_type.and_then(|t| self.by_type.get(t)).or_else(|| {
            self.by_subject
                .iter()
                .find(|(pattern, _)| subject_matches(pattern, subject))
                .map(|(_, contract)| contract)
        })
    }

    /// Checks `payload` of event `event_id` against the contract it matches: `Ok(Some(header
    /// value))` when it satisfies one, `Ok(None)` when none matches and none is required.
    pub fn check(
        &self,
        table: &str,
        event_id: &str,
        event_type: Option<&str>,
        subject: &str,
        payload: &[u8],
    ) -> Result<Option<Arc<str>>, ContractRefusal> {
        let Some(contract) = self.find(event_type, subject) else {
            if self.required {
                return Err(ContractRefusal::NoContract {
                    event_type: event_type.map(str::to_owned),
                });
            }
            return Ok(None);
        };
        contract.checked.fetch_add(1, Ordering::Relaxed);
        match contract.contract.check(payload, &self.limits) {
            Ok(()) => Ok(Some(contract.header.clone())),
            Err(violation) => {
                contract.refused.fetch_add(1, Ordering::Relaxed);
                let reason = violation.to_string();
                if let Ok(mut last) = contract.last_refused.lock() {
                    *last = Some(RefusedEvent {
                        table: table.to_owned(),
                        event_id: event_id.to_owned(),
                        reason: outbox_schema_cut(&reason),
                    });
                }
                Err(ContractRefusal::Violation {
                    contract: contract.header.to_string(),
                    file: contract.file.clone(),
                    reason,
                })
            }
        }
    }
}

fn outbox_schema_cut(text: &str) -> String {
    match text.char_indices().nth(LAST_REFUSED_CHARS) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

/// Literal tokens first, then `*`, then `>`: the most specific pattern is tried first.
fn specificity(pattern: &str) -> (usize, usize, usize) {
    let literal = pattern
        .split('.')
        .filter(|t| *t != "*" && *t != ">")
        .count();
    let single = pattern.split('.').filter(|t| *t == "*").count();
    (literal, single, usize::from(!pattern.ends_with('>')))
}

/// Why an event's payload is refused by its table's contracts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractRefusal {
    /// The payload breaks its contract.
    #[error("payload breaks contract `{contract}` ({file}): {reason}")]
    Violation {
        /// The contract's key.
        contract: String,
        /// Its file.
        file: String,
        /// The violation (pointer, keyword, expected, found; cut).
        reason: String,
    },
    /// `required = true` and no contract matches.
    #[error(
        "no contract for event type {} or its subject, and [outbox.contracts] required = true: add the type to `types` (or a `subjects` pattern), or write a type that has one",
        .event_type.as_deref().map_or_else(|| "(none)".to_owned(), |t| format!("`{t}`"))
    )]
    NoContract {
        /// The event's type, if it had one.
        event_type: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_patterns_are_tried_before_wildcards() {
        let mut patterns = vec!["orders.>", "orders.*.placed", "orders.eu.placed", "*.*.*"];
        patterns.sort_by_key(|p| std::cmp::Reverse(specificity(p)));
        assert_eq!(
            patterns,
            vec!["orders.eu.placed", "orders.*.placed", "orders.>", "*.*.*"]
        );
    }
}
