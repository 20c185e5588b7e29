//! `outbox-relay validate --connect`: a read-only preflight of everything `run` needs
//! (`relay_ops::preflight`), one line per check (`PASS`, `WARN` or `FAIL`), each failure
//! with a `hint:` that fixes it.
//!
//! Exit code: 0 when nothing failed (warnings allowed); otherwise 65 when a check found a
//! data-safety problem (slot lost or ahead of the checkpoint), 69 when a server could not be
//! reached, 78 for anything else.

use relay_ops::preflight::{self, Verdict};
use relay_runtime::config::RelayConfig;
use relay_runtime::fleet::FleetConfig;

use crate::exit::Failure;

/// `validate` without `--connect`: checks the files every pipeline (or the one named) reads, as
/// `run` does, and prints the configuration with secrets redacted: one relay's as it is, a
/// fleet's as `{"<pipeline>": <its configuration>}`.
pub fn offline(fleet: &FleetConfig, name: Option<&str>) -> Result<(), Failure> {
    let entries = match (name, fleet.is_fleet) {
        (None, true) => {
            if let Some(error) = fleet.refused_error() {
                return Err(Failure::config(error));
            }
            fleet.pipelines.iter().collect()
        }
        _ => vec![crate::fleet::one(fleet, name)?],
    };
    for entry in &entries {
        relay_runtime::files::check_files(&entry.config).map_err(|f| {
            if fleet.is_fleet {
                Failure::new(
                    f.kind,
                    f.error
                        .context(format!("pipeline `{}` ({})", entry.name, entry.origin)),
                )
            } else {
                f
            }
        })?;
    }
    // The settings serialize their secrets and URLs redacted.
    let text = match (fleet.is_fleet, entries.as_slice()) {
        (false, [only]) => serde_json::to_string_pretty(&only.config),
        _ => serde_json::to_string_pretty(
            &entries
                .iter()
                .map(|e| (e.name.as_str(), &e.config))
                .collect::<std::collections::BTreeMap<_, _>>(),
        ),
    }
    .map_err(|e| Failure::internal(anyhow::Error::new(e)))?;
    println!("{text}");
    eprintln!("configuration is valid");
    Ok(())
}

/// Runs every check, prints one line each, and maps failures to an exit code.
pub async fn preflight(config: &RelayConfig) -> Result<(), Failure> {
    let checks = preflight::run(config).await;
    for check in &checks {
        println!("{check}");
    }
    let failed = checks
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Fail(_)))
        .count();
    match preflight::worst(&checks) {
        None => {
            println!("preflight passed: {} checks", checks.len());
            Ok(())
        }
        Some(kind) => Err(Failure::new(
            kind,
            anyhow::anyhow!("preflight failed: {failed} of {} checks", checks.len()),
        )),
    }
}
