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
use relay_runtime::config::{HttpSettings, RelayConfig};
use relay_runtime::fleet::FleetConfig;

use crate::exit::{Failure, FailureKind};

/// Prints the status of the pipeline `name` names (or the only one) as text, or as one JSON
/// document with `json`; in a fleet without `name`, of every pipeline: under a heading each, or
/// as one JSON document `{"<pipeline>": <its document>}`. Exits as the worst of them.
pub async fn status(
    fleet: &FleetConfig,
    name: Option<&str>,
    json_out: bool,
    relay: Option<String>,
) -> Result<(), Failure> {
    if !json_out {
        return crate::fleet::each(fleet, name, async |entry| {
            let pipeline = fleet.is_fleet.then_some(entry.name.as_str());
            let report = gather(&entry.config, relay.clone(), pipeline).await?;
            let replay_retention = entry.config.relay.replay_retention.map(|r| r.to_string());
            for line in text::lines(&report.doc, replay_retention.as_deref()) {
                println!("{line}");
            }
            verdict(&entry.config, &report)
        })
        .await;
    }
    let entries = match (name, fleet.is_fleet) {
        (None, true) => fleet.pipelines.iter().collect(),
        _ => vec![crate::fleet::one(fleet, name)?],
    };
    let mut docs = serde_json::Map::new();
    let mut first = None;
    for entry in &entries {
        let pipeline = fleet.is_fleet.then_some(entry.name.as_str());
        let report = gather(&entry.config, relay.clone(), pipeline).await?;
        // Through a JSON value, whose keys are sorted: the document's key order.
        docs.insert(
            entry.name.clone(),
            serde_json::to_value(&report.doc).unwrap_or_default(),
        );
        if let Err(failure) = verdict(&entry.config, &report) {
            first.get_or_insert(failure);
        }
    }
    let doc = match (name, fleet.is_fleet) {
        (None, true) => serde_json::Value::Object(docs),
        _ => docs.into_iter().next().map(|(_, d)| d).unwrap_or_default(),
    };
    println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    first.map_or(Ok(()), Err)
}

async fn gather(
    config: &RelayConfig,
    relay: Option<String>,
    pipeline: Option<&str>,
) -> Result<StatusReport, Failure> {
    relay_ops::status::gather(config, relay_address(&config.http, relay), pipeline).await
}

/// 65 when the slot is lost or ahead of the stored checkpoint.
fn verdict(config: &RelayConfig, report: &StatusReport) -> Result<(), Failure> {
    let pg = &config.postgres;
    match data_safety_problem(report) {
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
    http: &HttpSettings,
    ready: bool,
    relay: Option<String>,
) -> Result<(), Failure> {
    let Some(addr) = relay_address(http, relay) else {
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
