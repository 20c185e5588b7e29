//! `outbox-relay validate --connect`: a read-only preflight of everything `run` needs
//! (`relay_ops::preflight`), one line per check (`PASS`, `WARN` or `FAIL`), each failure
//! with a `hint:` that fixes it.
//!
//! Exit code: 0 when nothing failed (warnings allowed); otherwise 65 when a check found a
//! data-safety problem (slot lost or ahead of the checkpoint), 69 when a server could not be
//! reached, 78 for anything else.

use relay_ops::preflight::{self, Verdict};
use relay_runtime::config::RelayConfig;

use crate::exit::Failure;

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
