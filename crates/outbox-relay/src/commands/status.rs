//! `outbox-relay status`: where the slot, the stored checkpoint and the stream are, how long a
//! stopped relay has before the slot is invalidated (the retention window, at the WAL rate of a
//! short sample), where each backfill is, and what a running relay says about itself (from its
//! `/status`, when `[http] listen` is set or `--relay` names it). The facts are gathered by
//! `relay_ops::status`; this prints them.
//!
//! Exit code: 0; 65 when the slot is lost or ahead of the checkpoint; 69 when PostgreSQL cannot
//! be reached.

mod backfills;

use std::time::Duration;

use relay_ops::status::{StatusReport, relay_address};
use relay_runtime::config::RelayConfig;
use serde_json::Value;

use crate::exit::{Failure, FailureKind};

/// Prints the status as text, or as one JSON document with `json`.
pub async fn status(
    config: &RelayConfig,
    json_out: bool,
    relay: Option<String>,
) -> Result<(), Failure> {
    let pg = &config.postgres;
    let StatusReport { doc, lost, ahead } =
        relay_ops::status::gather(config, relay_address(config, relay)).await?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_text(config, &doc);
    }
    if lost || ahead {
        return Err(Failure::new(
            FailureKind::DataSafety,
            anyhow::anyhow!(
                "slot `{}` is {}: see docs/operations.md",
                pg.slot,
                if ahead {
                    "ahead of the stored checkpoint"
                } else {
                    "lost"
                }
            ),
        ));
    }
    Ok(())
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

// Long: prints the status document's sections in order, each a few lines
fn print_text(config: &RelayConfig, doc: &Value) {
    let slot = &doc["slot_state"];
    if slot.is_null() {
        println!("slot {}: missing", config.postgres.slot);
    } else {
        println!(
            "slot {}: wal_status {}, active pid {}",
            config.postgres.slot,
            text(&slot["wal_status"]),
            text(&slot["active_pid"])
        );
        println!(
            "  confirmed_flush_lsn {}, lag {} bytes, retained WAL {} bytes, safe_wal_size {}",
            text(&slot["confirmed_flush_lsn"]),
            text(&slot["lag_bytes"]),
            text(&slot["retained_wal_bytes"]),
            text(&slot["safe_wal_size"])
        );
    }
    print_retention(&doc["retention"]);
    print_replay_window(config, &doc["replay_window"]);
    print_tables(&doc["tables"]);
    backfills::print_backfills(&doc["backfills"]);
    print_failover(&doc["failover"]);
    match doc["checkpoint"].as_object() {
        None => println!("checkpoint: none stored"),
        Some(c) => {
            let relation = match doc["slot_minus_checkpoint_bytes"].as_i64() {
                Some(0) => "slot at the checkpoint".to_owned(),
                Some(d) if d < 0 && config.relay.replay_retention.is_some() => {
                    format!("slot {} bytes behind (the replay window)", -d)
                }
                Some(d) if d < 0 => format!("slot {} bytes behind (confirm pending)", -d),
                Some(d) => format!("SLOT AHEAD by {d} bytes"),
                None => "slot position unknown".to_owned(),
            };
            println!(
                "checkpoint {} stored {:.0}s ago; {relation}",
                text(&c["lsn"]),
                c["stored_seconds_ago"].as_f64().unwrap_or_default()
            );
        }
    }
    let stream = &doc["stream_state"];
    if let Some(e) = stream.get("error") {
        println!("stream {}: {}", config.nats.stream, text(e));
    } else if stream["present"] == Value::Bool(false) {
        println!("stream {}: missing", config.nats.stream);
    } else {
        println!(
            "stream {}: last sequence {}, {} messages",
            config.nats.stream,
            text(&stream["last_sequence"]),
            text(&stream["messages"])
        );
        print_durability(&stream["durability"]);
    }
    let relay = &doc["relay_status"];
    match doc["relay"].as_str() {
        None => println!("relay: no [http] listen configured (pass --relay host:port)"),
        Some(addr) if relay.get("error").is_some() => {
            println!("relay {addr}: {}", text(&relay["error"]))
        }
        Some(addr) => {
            let ready = relay["ready"].as_bool().unwrap_or(false);
            println!(
                "relay {addr}: {} (version {}, up {}s)",
                if ready { "ready" } else { "NOT READY" },
                text(&relay["version"]),
                text(&relay["uptime_seconds"])
            );
            if let Some(reasons) = relay["reasons"].as_array() {
                for r in reasons {
                    println!("  reason: {}", text(r));
                }
            }
            let p = &relay["pipeline"];
            println!(
                "  published {}, outstanding acks {}, last stream seq {}, last acknowledged commit {}",
                text(&p["events_published"]),
                text(&p["outstanding_acks"]),
                text(&p["last_stream_seq"]),
                text(&p["last_acked_commit_time"])
            );
            print_contracts(&relay["contracts"]);
        }
    }
}

/// Each contract's counts and the last event it refused (`/status`'s `contracts`).
fn print_contracts(contracts: &Value) {
    for c in contracts.as_array().into_iter().flatten() {
        println!(
            "  contract {} ({}): {} checked, {} refused",
            text(&c["contract"]),
            text(&c["file"]),
            text(&c["checked"]),
            text(&c["refused"])
        );
        if let Some(last) = c["last_refused"].as_object() {
            println!(
                "    last refused: event {} in {}: {}",
                last.get("event_id").map(text).unwrap_or_default(),
                last.get("table").map(text).unwrap_or_default(),
                last.get("reason").map(text).unwrap_or_default()
            );
        }
    }
}

/// The stream's durability (see `relay_nats::Durability`): a summary, then each warning with
/// its hint, as `validate --connect` prints them.
fn print_durability(d: &Value) {
    let sync = match d["server_sync"]["mode"].as_str() {
        Some(mode) => format!("server sync {mode}"),
        None => "server sync n/a".to_owned(),
    };
    println!(
        "  durability: {} storage, {} replica(s), persist_mode {}, {sync}",
        text(&d["storage"]),
        text(&d["replicas"]),
        text(&d["persist_mode"])
    );
    for check in d["checks"].as_array().into_iter().flatten() {
        if check["verdict"] == "warn" {
            println!(
                "  WARN  {}: {}",
                text(&check["check"]),
                text(&check["detail"])
            );
            println!("        hint: {}", text(&check["hint"]));
        }
    }
}

/// The WAL kept behind the checkpoint for `outbox-relay restore`.
fn print_replay_window(config: &RelayConfig, w: &Value) {
    let setting = config
        .relay
        .replay_retention
        .map_or_else(|| "not set".to_owned(), |r| r.to_string());
    match w.get("error") {
        Some(e) => println!("replay window (replay_retention {setting}): {}", text(e)),
        None => println!(
            "replay window (replay_retention {setting}): {}",
            text(&w["summary"])
        ),
    }
    if let Some(warning) = w["warning"].as_str() {
        println!("  WARN {warning}: {}", text(&w["hint"]));
    }
}

/// The retention window (see `relay_postgres::catalog::retention`): the headline, the numbers,
/// then each check, nested under it (warnings with their hint).
fn print_retention(r: &Value) {
    if let Some(e) = r.get("error") {
        println!("retention window: {}", text(e));
        return;
    }
    println!("retention window: {}", text(&r["headline"]));
    println!("  {}", text(&r["numbers"]));
    print_checks(&r["checks"]);
}

/// What a failover needs (see `relay_postgres::catalog::failover`): the server's role and the
/// slot's flags, then each check, warnings with their hint.
fn print_failover(f: &Value) {
    if let Some(e) = f.get("error") {
        println!("failover: {}", text(e));
        return;
    }
    let slot = &f["slot"];
    let flags = if slot.is_null() {
        "slot missing".to_owned()
    } else {
        format!(
            "slot failover {}, synced {}",
            text(&slot["failover"]),
            text(&slot["synced"])
        )
    };
    let extra = match f["synchronized_standby_slots"].as_array() {
        Some(list) => format!(
            ", synchronized_standby_slots {}",
            if list.is_empty() {
                "empty".to_owned()
            } else {
                list.iter().map(text).collect::<Vec<_>>().join(",")
            }
        ),
        None => String::new(),
    };
    println!(
        "failover: {} (timeline {}), {flags}{extra}",
        text(&f["server"]),
        text(&f["timeline"])
    );
    print_checks(&f["checks"]);
}

/// The checks of an assessment (the retention window, failover), nested under its headline.
fn print_checks(checks: &Value) {
    for line in check_lines(checks) {
        println!("{line}");
    }
}

/// Each check (`{"check", "verdict", "detail", "hint"}`) as `    VERDICT  check: detail`, then
/// its hint on a line of its own where it has one.
fn check_lines(checks: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    for check in checks.as_array().into_iter().flatten() {
        let verdict = match check["verdict"].as_str() {
            Some("warn") => "WARN",
            Some("fail") => "FAIL",
            _ => "PASS",
        };
        lines.push(format!(
            "    {verdict}  {}: {}",
            text(&check["check"]),
            text(&check["detail"])
        ));
        if !check["hint"].is_null() {
            lines.push(format!("          hint: {}", text(&check["hint"])));
        }
    }
    lines
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

fn print_tables(tables: &Value) {
    let Some(tables) = tables.as_object() else {
        return;
    };
    for (name, t) in tables {
        if let Some(e) = t.get("error") {
            println!("table {name}: {}", text(e));
            continue;
        }
        let oldest = match t["oldest_unconfirmed_age_seconds"].as_f64() {
            Some(age) if age > 0.0 => format!(
                "oldest row not yet confirmed created {}s ago ({})",
                age.round(),
                text(&t["oldest_unconfirmed_measured_by"])
            ),
            Some(_) => "every row confirmed".to_owned(),
            None => "no created_at column: age of unconfirmed rows unknown".to_owned(),
        };
        println!(
            "table {name}: about {} rows, {} bytes; {oldest}",
            t["rows_estimate"].as_f64().unwrap_or_default().round(),
            text(&t["size_bytes"])
        );
        let cleanup = &t["cleanup"];
        if cleanup.is_object() {
            let running = &cleanup["running"];
            let done = if running.is_object() {
                format!(
                    "{} rows cleaned, {} partitions dropped, {} waiting for the checkpoint, {} failed rounds{}",
                    text(&running["rows_cleaned"]),
                    text(&running["partitions_dropped"]),
                    text(&running["waiting_for_checkpoint"]),
                    text(&running["errors"]),
                    running["last_error"]
                        .as_str()
                        .map(|e| format!(" (last: {e})"))
                        .unwrap_or_default()
                )
            } else {
                "no running relay to ask what it cleaned".to_owned()
            };
            println!(
                "  cleanup {} (retain {}s): {done}",
                text(&cleanup["mode"]),
                text(&cleanup["retain_seconds"])
            );
        }
    }
}

#[cfg(test)]
mod tests;
