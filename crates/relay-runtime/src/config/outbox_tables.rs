//! The `[[outbox]]` entries: each table's mapping, its `[outbox.cleanup]`, its backfill at
//! slot creation and the preset it names, read from one TOML array of tables.

use relay_core::route::OutboxTableConfig;
use serde::{Deserialize, Serialize};

use super::CleanupSettings;
use super::presets::{self, AppliedPreset};

/// The `[[outbox]]` tables: each table's mapping (relay-core's [`OutboxTableConfig`]) and its
/// optional `[outbox.cleanup]`. Derefs to the mappings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxTables {
    tables: Vec<OutboxTableConfig>,
    cleanup: Vec<Option<CleanupSettings>>,
    backfill: Vec<BackfillSetting>,
    /// `preset = "…"` of each entry, and the keys it filled in.
    presets: Vec<Option<AppliedPreset>>,
}

/// `[[outbox]] backfill`: whether the rows a table already holds when the relay creates its
/// slot are published (docs/replay.md, "Backfill at slot creation").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackfillSetting {
    /// Only rows committed after the slot's creation are published (`outbox-relay backfill`
    /// publishes older ones on demand).
    #[default]
    Off,
    /// When the relay creates the slot, it publishes the rows committed before the slot's
    /// consistent point from the slot's exported snapshot, then streams.
    OnCreate,
}

impl From<Vec<OutboxTableConfig>> for OutboxTables {
    fn from(tables: Vec<OutboxTableConfig>) -> Self {
        let cleanup = vec![None; tables.len()];
        let backfill = vec![BackfillSetting::Off; tables.len()];
        let presets = vec![None; tables.len()];
        Self {
            tables,
            cleanup,
            backfill,
            presets,
        }
    }
}

impl std::ops::Deref for OutboxTables {
    type Target = [OutboxTableConfig];

    fn deref(&self) -> &Self::Target {
        &self.tables
    }
}

impl OutboxTables {
    /// Every table with an `[outbox.cleanup]`, and its settings.
    pub fn cleanup(&self) -> impl Iterator<Item = (&OutboxTableConfig, &CleanupSettings)> {
        self.tables
            .iter()
            .zip(&self.cleanup)
            .filter_map(|(t, c)| c.as_ref().map(|c| (t, c)))
    }

    /// The tables with `backfill = "on-create"`.
    pub fn backfill_on_create(&self) -> impl Iterator<Item = &OutboxTableConfig> {
        self.tables
            .iter()
            .zip(&self.backfill)
            .filter(|(_, b)| **b == BackfillSetting::OnCreate)
            .map(|(t, _)| t)
    }

    /// The preset that set key `key` (as `config print` names it below the entry: `subject`,
    /// `headers.Foo`, `cleanup.status_column`) of entry `index`, if one did.
    pub fn preset_of(&self, index: usize, key: &str) -> Option<&str> {
        let preset = self.presets.get(index)?.as_ref()?;
        preset
            .keys
            .iter()
            .any(|k| k == key)
            .then_some(preset.name.as_str())
    }

    /// Every `row_filter` is one condition ([`relay_backfill::condition`]): it is put in
    /// parentheses in the publication's definition and in cleanup's statements, and must not
    /// leave them.
    pub fn check_row_filters(&self) -> Result<(), String> {
        for table in &self.tables {
            if let Some(filter) = &table.row_filter
                && !filter.trim().is_empty()
            {
                relay_backfill::condition::check_condition(filter).map_err(|problem| {
                    format!(
                        "[[outbox]] table `{}`: row_filter `{filter}` {problem}: give one condition on the table's columns, e.g. `aggregateid = '1' OR aggregateid = '2'`",
                        table.table
                    )
                })?;
            }
        }
        Ok(())
    }

    /// The `[outbox.cleanup]` of `table` (`schema.table`), if any.
    pub fn cleanup_of(&self, schema: &str, table: &str) -> Option<&CleanupSettings> {
        self.cleanup()
            .find(|(t, _)| t.is_table(schema, table))
            .map(|(_, c)| c)
    }
}

// Each entry is the mapping's keys plus `cleanup`: the mapping is read by relay-core's own
// (strict) deserializer, the cleanup by [`CleanupSettings`]'s, so an unknown key in either is
// an error naming it.
impl Serialize for OutboxTables {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        let mut seq = serializer.serialize_seq(Some(self.tables.len()))?;
        for (((table, cleanup), backfill), preset) in self
            .tables
            .iter()
            .zip(&self.cleanup)
            .zip(&self.backfill)
            .zip(&self.presets)
        {
            let mut entry = serde_json::to_value(table).map_err(S::Error::custom)?;
            if let (Some(preset), Some(map)) = (preset, entry.as_object_mut()) {
                map.insert("preset".into(), preset.name.clone().into());
            }
            if let (BackfillSetting::OnCreate, Some(map)) = (backfill, entry.as_object_mut()) {
                map.insert(
                    "backfill".into(),
                    serde_json::to_value(backfill).map_err(S::Error::custom)?,
                );
            }
            if let (Some(cleanup), Some(map)) = (cleanup, entry.as_object_mut()) {
                map.insert(
                    "cleanup".into(),
                    serde_json::to_value(cleanup).map_err(S::Error::custom)?,
                );
            }
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for OutboxTables {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let entries = Vec::<serde_json::Map<String, serde_json::Value>>::deserialize(deserializer)?;
        let mut out = Self::default();
        for mut entry in entries {
            let preset = match entry.remove("preset") {
                None => None,
                Some(serde_json::Value::String(name)) => {
                    Some(presets::apply(&name, &mut entry).map_err(|e| {
                        D::Error::custom(format!(
                            "[[outbox]] {}: {e}",
                            entry.get("table").and_then(|t| t.as_str()).map_or_else(
                                || format!("preset `{name}`"),
                                |t| format!("table `{t}`")
                            )
                        ))
                    })?)
                }
                Some(other) => {
                    return Err(D::Error::custom(format!(
                        "[[outbox]] preset = {other}: a preset is a name, one of {}",
                        presets::names().collect::<Vec<_>>().join(", ")
                    )));
                }
            };
            let table = entry
                .get("table")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_owned();
            let cleanup = entry
                .remove("cleanup")
                .map(serde_json::from_value::<CleanupSettings>)
                .transpose()
                .map_err(|e| {
                    D::Error::custom(format!("[[outbox]] table `{table}`: [outbox.cleanup]: {e}"))
                })?;
            let backfill = entry
                .remove("backfill")
                .map(serde_json::from_value::<BackfillSetting>)
                .transpose()
                .map_err(|e| {
                    D::Error::custom(format!(
                        "[[outbox]] table `{table}`: backfill: {e} (\"off\" or \"on-create\")"
                    ))
                })?
                .unwrap_or_default();
            let mapping = serde_json::from_value(serde_json::Value::Object(entry))
                .map_err(|e| D::Error::custom(format!("[[outbox]] table `{table}`: {e}")))?;
            out.tables.push(mapping);
            out.cleanup.push(cleanup);
            out.backfill.push(backfill);
            out.presets.push(preset);
        }
        Ok(out)
    }
}
