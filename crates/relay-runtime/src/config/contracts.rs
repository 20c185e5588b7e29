//! `[outbox.contracts]` files, read and compiled once per process: every router the process
//! builds (each session's, a backfill's, a restore's) checks against the same compiled
//! contracts and counts into the same counters, and a file changed under a running relay
//! changes nothing until it restarts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use outbox_schema::Contract;
use relay_core::route::{ContractFile, LoadedContract, OutboxTableConfig, TableContracts};

use super::ConfigError;

/// The compiled contracts of each table (by its `table` key), and the configuration they were
/// compiled from.
#[derive(Debug, Default)]
pub struct ContractCache {
    loaded: Mutex<Option<Loaded>>,
}

#[derive(Debug)]
struct Loaded {
    /// The `[outbox.contracts]` sections, as JSON: a changed configuration is compiled anew.
    source: String,
    tables: HashMap<String, Arc<TableContracts>>,
}

impl ContractCache {
    /// The compiled contracts of `outbox`, compiled on first use.
    pub(super) fn tables(
        &self,
        outbox: &[OutboxTableConfig],
    ) -> Result<HashMap<String, Arc<TableContracts>>, ConfigError> {
        let source = serde_json::to_string(
            &outbox
                .iter()
                .map(|o| (&o.table, &o.contracts))
                .collect::<Vec<_>>(),
        )
        .unwrap_or_default();
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| ConfigError::Invalid("contracts: a loader panicked".into()))?;
        if let Some(loaded) = loaded.as_ref()
            && loaded.source == source
        {
            return Ok(loaded.tables.clone());
        }
        let tables = compile(outbox)?;
        *loaded = Some(Loaded {
            source,
            tables: tables.clone(),
        });
        Ok(tables)
    }
}

/// Reads and compiles every contract file of `outbox`, each file once.
fn compile(
    outbox: &[OutboxTableConfig],
) -> Result<HashMap<String, Arc<TableContracts>>, ConfigError> {
    let mut files: HashMap<(PathBuf, Option<String>), Arc<LoadedContract>> = HashMap::new();
    let mut names: HashMap<String, (String, String)> = HashMap::new();
    let mut tables = HashMap::new();
    for table in outbox {
        let Some(config) = &table.contracts else {
            continue;
        };
        let invalid = |reason: String| {
            ConfigError::Invalid(format!(
                "[[outbox]] table `{}`: [outbox.contracts] {reason}",
                table.table
            ))
        };
        let load = |file: &ContractFile| -> Result<Arc<LoadedContract>, ConfigError> {
            let key = (file.path().to_path_buf(), file.name().map(str::to_owned));
            if let Some(loaded) = files.get(&key) {
                return Ok(loaded.clone());
            }
            let contract =
                Contract::load(file.path(), file.name()).map_err(|e| invalid(format!("{e}")))?;
            let shown = file.path().display().to_string();
            // One name, one document: two files under one name would share `Outbox-Schema`
            // names that consumers cannot tell apart.
            if let Some((version, other)) = names.get(contract.name())
                && *version != contract.version()
            {
                return Err(invalid(format!(
                    "two different contracts are named `{}` ({other} and {shown}): give one a `name` (types.<type> = {{ schema = \"…\", name = \"…\" }})",
                    contract.name()
                )));
            }
            names.insert(
                contract.name().to_owned(),
                (contract.version().to_owned(), shown.clone()),
            );
            let loaded = Arc::new(LoadedContract::new(contract, shown));
            files.insert(key, loaded.clone());
            Ok(loaded)
        };
        // `files` and `names` are borrowed by `load` only while this table's contracts load.
        let set = TableContracts::new(config, load)?;
        tables.insert(table.table.clone(), Arc::new(set));
    }
    Ok(tables)
}
