//! `[[outbox]] preset = "<framework>"`: the mapping of an application framework's own outbox
//! table, so that the relay takes over from the framework's polling dispatcher by
//! configuration alone (docs/frameworks.md).
//!
//! A preset is a TOML file in `presets/`: the `[[outbox]]` keys it sets, a `[cleanup]` table of
//! `[outbox.cleanup]` defaults (applied only when the entry has an `[outbox.cleanup]`: a preset
//! never turns cleanup on), and a `[needs]` table of keys the user must set, each with a hint.
//! Every key the entry sets itself wins over the preset's.

use figment::providers::Format as _;
use serde_json::{Map, Value};

/// Every preset, by name, with its TOML.
const PRESETS: &[(&str, &str)] = &[
    ("brighter", include_str!("presets/brighter.toml")),
    ("cap", include_str!("presets/cap.toml")),
    ("debezium", include_str!("presets/debezium.toml")),
    ("eventuate", include_str!("presets/eventuate.toml")),
    ("masstransit", include_str!("presets/masstransit.toml")),
    (
        "spring-modulith",
        include_str!("presets/spring-modulith.toml"),
    ),
    ("watermill", include_str!("presets/watermill.toml")),
    ("wolverine", include_str!("presets/wolverine.toml")),
];

/// `[outbox.cleanup]` keys of `mode = "mark"` only.
const MARK_KEYS: &[&str] = &["status_column", "status_value", "sent_at_column"];

/// The preset an `[[outbox]]` entry names, and the keys it filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedPreset {
    /// The preset's name.
    pub name: String,
    /// The keys the preset set, as `config print` names them below the entry: `subject`,
    /// `headers.Foo`, `cleanup.status_column`.
    pub keys: Vec<String>,
}

/// The names of every preset.
pub fn names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|(name, _)| *name)
}

/// A preset's TOML, as JSON.
struct Preset {
    /// The `[[outbox]]` keys.
    keys: Map<String, Value>,
    /// `[outbox.cleanup]` defaults.
    cleanup: Map<String, Value>,
    /// Keys the user must set, and a hint for each.
    needs: Map<String, Value>,
}

fn load(name: &str) -> Result<Preset, String> {
    let Some((_, text)) = PRESETS.iter().find(|(n, _)| *n == name) else {
        return Err(format!(
            "unknown preset `{name}`; the presets are {}",
            names().collect::<Vec<_>>().join(", ")
        ));
    };
    let mut keys: Map<String, Value> =
        figment::Figment::from(figment::providers::Toml::string(text))
            .extract()
            .map_err(|e| format!("preset `{name}` does not parse: {e}"))?;
    let take = |keys: &mut Map<String, Value>, table: &str| match keys.remove(table) {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let cleanup = take(&mut keys, "cleanup");
    let needs = take(&mut keys, "needs");
    Ok(Preset {
        keys,
        cleanup,
        needs,
    })
}

/// Fills `entry` (one `[[outbox]]` entry's keys) with preset `name`'s keys it does not set;
/// a `headers` table is filled header by header, so an entry adds headers or overrides one.
pub fn apply(name: &str, entry: &mut Map<String, Value>) -> Result<AppliedPreset, String> {
    let Preset {
        keys,
        cleanup,
        needs,
    } = load(name)?;
    let missing: Vec<String> = needs
        .iter()
        .filter(|(key, _)| !entry.contains_key(key.as_str()))
        .map(|(key, hint)| format!("`{key}` ({})", hint.as_str().unwrap_or_default()))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "preset `{name}` needs {} in the [[outbox]] entry",
            missing.join(" and ")
        ));
    }
    let mut filled = Vec::new();
    fill(entry, keys, "", &mut filled);
    if let Some(Value::Object(entry_cleanup)) = entry.get_mut("cleanup") {
        // What the framework's dispatcher marks applies to `mode = "mark"` only.
        let mark = entry_cleanup.get("mode").and_then(Value::as_str) == Some("mark");
        let cleanup = cleanup
            .into_iter()
            .filter(|(key, _)| mark || !MARK_KEYS.contains(&key.as_str()))
            .collect();
        fill(entry_cleanup, cleanup, "cleanup.", &mut filled);
    }
    Ok(AppliedPreset {
        name: name.to_owned(),
        keys: filled,
    })
}

/// Copies each of `from`'s keys that `into` lacks; the `headers` table header by header.
fn fill(
    into: &mut Map<String, Value>,
    from: Map<String, Value>,
    prefix: &str,
    filled: &mut Vec<String>,
) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (None, value) => {
                match &value {
                    Value::Object(map) if !map.is_empty() => {
                        filled.extend(map.keys().map(|k| format!("{prefix}{key}.{k}")));
                    }
                    _ => filled.push(format!("{prefix}{key}")),
                }
                into.insert(key, value);
            }
            (Some(Value::Object(own)), Value::Object(preset)) if key == "headers" => {
                for (header, column) in preset {
                    // NATS header names compare without regard to case (as the mapped-header
                    // check does): an entry's `traceParent` replaces the preset's `traceparent`.
                    if !own.keys().any(|name| name.eq_ignore_ascii_case(&header)) {
                        filled.push(format!("{prefix}headers.{header}"));
                        own.insert(header, column);
                    }
                }
            }
            // The entry's own value wins.
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset parses and sets a table mapping (or says which keys the user must give).
    #[test]
    fn every_preset_parses() {
        for name in names() {
            let Preset { keys, needs, .. } = load(name).unwrap_or_else(|e| panic!("{e}"));
            for key in ["event_id", "payload"] {
                assert!(keys.contains_key(key), "preset {name} sets {key}");
            }
            for key in ["table", "subject"] {
                assert!(
                    keys.contains_key(key) || needs.contains_key(key),
                    "preset {name} sets or needs {key}"
                );
            }
        }
    }

    #[test]
    fn unknown_presets_are_named_with_the_known_ones() {
        let error = apply("nservicebus", &mut Map::new()).expect_err("unknown");
        assert!(error.contains("unknown preset `nservicebus`"), "{error}");
        assert!(error.contains("cap, debezium"), "{error}");
    }

    #[test]
    fn an_entrys_header_replaces_the_presets_whatever_its_case() {
        let mut entry: Map<String, Value> = serde_json::from_str(
            r#"{"headers": {"TRACEPARENT": "trace_ctx", "outbox-event-type": "kind"}}"#,
        )
        .unwrap();
        let applied = apply("debezium", &mut entry).unwrap();
        let headers = entry["headers"].as_object().unwrap();
        let names: Vec<&str> = headers.keys().map(String::as_str).collect();
        for preset_name in ["traceparent", "Outbox-Event-Type"] {
            assert!(!names.contains(&preset_name), "{names:?}");
            assert!(
                !applied.keys.iter().any(|k| k.ends_with(preset_name)),
                "{:?}",
                applied.keys
            );
        }
        assert_eq!(headers["TRACEPARENT"], "trace_ctx");
        assert_eq!(headers["outbox-event-type"], "kind");
        assert!(names.contains(&"Outbox-Aggregate-Id"), "{names:?}");
    }
}
