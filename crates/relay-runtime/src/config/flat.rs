//! The configuration as `key = value` lines (`outbox.0.table = "public.outbox"`), secrets
//! redacted: what `config print` prints and the console shows.

use serde_json::Value;

use super::RelayConfig;

/// Every key of `config` with its value as JSON text, in the configuration's order. Secrets
/// serialize as `<redacted>` and URLs without their password (relay_core::secret).
pub fn flattened(config: &RelayConfig) -> Result<Vec<(String, String)>, serde_json::Error> {
    let value = serde_json::to_value(config)?;
    let mut lines = Vec::new();
    flatten("", &value, &mut lines);
    Ok(lines)
}

fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), v, out);
            }
        }
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}
