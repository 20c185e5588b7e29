//! `outbox-relay status`: where the slot, the stored checkpoint and the stream are, how long a
//! stopped relay has before the slot is invalidated (the retention window, at the WAL rate of a
//! short sample), where each backfill is, and what a running relay says about itself (from its
//! `/status`, when `[http] listen` is set or `--relay` names it). The facts are gathered by
//! `relay_ops::status`; this prints them ([`text`] and the modules beside it, from the typed
//! report).
//!
//! Exit code: 0; 65 when the slot is lost or ahead of the checkpoint; 69 when PostgreSQL cannot
//! be reached.

mod backfills;
mod checks;
mod relay;
mod tables;
mod text;

use std::fmt::Display;
use std::time::Duration;

use relay_ops::status::{StatusReport, relay_address};
use relay_runtime::config::RelayConfig;

use crate::exit::{Failure, FailureKind};

/// Prints the status as text, or as one JSON document with `json`.
pub async fn status(
    config: &RelayConfig,
    json_out: bool,
    relay: Option<String>,
) -> Result<(), Failure> {
    let pg = &config.postgres;
    let report = relay_ops::status::gather(config, relay_address(config, relay)).await?;
    if json_out {
        // Through a JSON value, whose keys are sorted: the document's key order.
        let doc = serde_json::to_value(&report.doc).unwrap_or_default();
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        let replay_retention = config.relay.replay_retention.map(|r| r.to_string());
        for line in text::lines(&report.doc, replay_retention.as_deref()) {
            println!("{line}");
        }
    }
    match data_safety_problem(&report) {
        Some(problem) => Err(Failure::new(
            FailureKind::DataSafety,
            anyhow::anyhow!("slot `{}` is {problem}: see docs/operations.md", pg.slot),
        )),
        None => Ok(()),
    }
}

/// What makes `status` exit 65: the slot ahead of the stored checkpoint, or lost.
fn data_safety_problem(report: &StatusReport) -> Option<&'static str> {
    if report.ahead {
        Some("ahead of the stored checkpoint")
    } else if report.lost {
        Some("lost")
    } else {
        None
    }
}

/// A value as status lines show it; `-` when unknown.
fn opt<T: Display>(value: &Option<T>) -> String {
    value.as_ref().map_or_else(|| "-".to_owned(), T::to_string)
}

/// A float as JSON writes it (`12.0`, not `12`), as status lines always showed it.
fn float(value: f64) -> String {
    match serde_json::Number::from_f64(value) {
        Some(n) => n.to_string(),
        None => "-".to_owned(),
    }
}

/// `outbox-relay health [--ready]`: exit 0 when the relay answers 200 on `/livez` (`/readyz`).
pub async fn health(
    config: &RelayConfig,
    ready: bool,
    relay: Option<String>,
) -> Result<(), Failure> {
    let Some(addr) = relay_address(config, relay) else {
        return Err(Failure::config(anyhow::anyhow!(
            "no [http] listen configured and no --relay given"
        )));
    };
    let path = if ready { "/readyz" } else { "/livez" };
    match relay_ops::client::get_text(&addr, path, Duration::from_secs(3)).await {
        Ok((200, body)) => {
            println!("{body}");
            Ok(())
        }
        Ok((code, body)) => Err(Failure::new(
            FailureKind::NotHealthy,
            anyhow::anyhow!("{addr}{path}: HTTP {code} {body}"),
        )),
        Err(e) => Err(Failure::new(FailureKind::NotHealthy, e)),
    }
}

#[cfg(test)]
mod tests;
