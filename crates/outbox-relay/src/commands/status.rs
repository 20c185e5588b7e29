//! `outbox-relay status`: where the slot, the stored checkpoint and the stream are, how long a
//! stopped relay has before the slot is invalidated (the retention window, at the WAL rate of a
//! short sample), where each backfill is, and what a running relay says about itself (from its `/status`, when
//! `[http] listen` is set or `--relay` names it).
//!
//! Exit code: 0; 65 when the slot is lost or ahead of the checkpoint; 69 when PostgreSQL cannot
//! be reached.

mod backfills;

use std::time::Duration;

use relay_postgres::catalog::failover;
use relay_postgres::catalog::retention::{self, SHORT_SAMPLE, TakeoverPolicy};
use serde_json::{Value, json};

use crate::config::RelayConfig;
use crate::exit::pg_exit;
use crate::exit::{Exit, ExitKind};
use crate::inspect::{self, StreamLookup};

/// Prints the status as text, or as one JSON document with `json`.
// Long: builds the one JSON document `status` prints, a section after the other, each a few lines
pub async fn status(
    config: &RelayConfig,
    json_out: bool,
    relay: Option<String>,
) -> Result<(), Exit> {
    let pg = &config.postgres;
    let client = relay_postgres::connect(pg).await.map_err(pg_exit)?;
    let unavailable = |e: tokio_postgres::Error| Exit::new(ExitKind::Unavailable, e);
    let slot = inspect::slot(&client, &pg.slot)
        .await
        .map_err(unavailable)?;
    let checkpoint = inspect::checkpoint(&client, &pg.slot)
        .await
        .map_err(unavailable)?;
    let failover = match failover::facts(&client, &pg.slot).await {
        Ok(facts) => {
            let database = relay_postgres::catalog::current_database(&client)
                .await
                .map_err(unavailable)?;
            let checks = failover::assess(&facts, pg.failover, &pg.slot, &database);
            failover::to_json(&facts, &checks)
        }
        Err(e) => json!({ "error": format!("cannot read what failover needs: {e}") }),
    };

    let policy = TakeoverPolicy {
        budget: config.relay.takeover_budget,
        reconnect_max: config.relay.reconnect_max,
    };
    // The WAL rate sample takes a moment: look at the stream and the relay meanwhile.
    let (retention, stream, (relay_addr, relay_status)) = tokio::join!(
        retention::measure(&client, &pg.slot, SHORT_SAMPLE, policy),
        stream_state(config),
        relay_state(config, relay),
    );
    let retention = match retention {
        Ok(window) => window.to_json(),
        Err(e) => json!({ "error": format!("cannot read the retention window: {e}") }),
    };

    let replay_window = match relay_postgres::checkpoint::replay_window(&client, &pg.slot).await {
        Ok(window) => window.to_json(config.relay.replay_retention_bytes()),
        Err(e) => json!({ "error": format!("cannot read the replay window: {e}") }),
    };

    let backfills = backfills::backfills_state(&client, &pg.slot).await;
    let tables = tables_state(
        config,
        &client,
        checkpoint.map(|(lsn, _)| lsn),
        &relay_status,
    )
    .await;
    let behind = match (&slot, checkpoint) {
        (Some(s), Some((stored, _))) => s
            .confirmed_flush_lsn
            .map(|l| l.0 as i128 - stored.0 as i128),
        _ => None,
    };
    let lost = slot
        .as_ref()
        .is_some_and(|s| s.wal_status.as_deref() == Some("lost"))
        || (slot.is_none() && checkpoint.is_some());
    let ahead = behind.is_some_and(|d| d > 0);
    let doc = json!({
        "slot": pg.slot,
        "slot_state": slot.as_ref().map(|s| s.to_json()),
        "checkpoint": checkpoint.map(|(lsn, age)| json!({
            "lsn": lsn.to_string(),
            "stored_seconds_ago": age,
        })),
        "slot_minus_checkpoint_bytes": behind.map(|d| d as i64),
        "retention": retention,
        "replay_window": replay_window,
        "failover": failover,
        "stream": config.nats.stream,
        "stream_state": stream,
        "relay": relay_addr,
        "relay_status": relay_status,
        "tables": tables,
        "backfills": backfills,
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_text(config, &doc);
    }
    if lost || ahead {
        return Err(Exit::new(
            ExitKind::DataSafety,
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

/// The stream's state, or why it is unknown.
async fn stream_state(config: &RelayConfig) -> Value {
    match relay_nats::connect(&config.nats).await {
        Ok(connection) => {
            let jetstream = connection.jetstream();
            match inspect::stream(jetstream.context(), &config.nats.stream).await {
                StreamLookup::Found(info) => json!({
                    "present": true,
                    "last_sequence": info.state.last_sequence,
                    "messages": info.state.messages,
                    "subjects": info.config.subjects,
                    "durability": relay_nats::assess_durability(&jetstream, &info).await.to_json(),
                }),
                StreamLookup::NotFound => json!({ "present": false }),
                StreamLookup::NotEnabled(e) | StreamLookup::Failed(e) => {
                    json!({ "error": e })
                }
            }
        }
        Err(e) => json!({ "error": format!("{e}") }),
    }
}

/// Where a running relay answers, and its `/status`.
async fn relay_state(config: &RelayConfig, relay: Option<String>) -> (Option<String>, Value) {
    let addr = relay_address(config, relay);
    let status = match &addr {
        None => Value::Null,
        Some(addr) => match crate::http::get_text(addr, "/status", Duration::from_secs(3)).await {
            Ok((200, body)) => serde_json::from_str(&body).unwrap_or(Value::Null),
            Ok((code, _)) => json!({ "error": format!("HTTP {code}") }),
            Err(e) => json!({ "error": format!("not running or unreachable: {e:#}") }),
        },
    };
    (addr, status)
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

/// Where a relay on this host answers: `--relay`, else `[http] listen` (any-address → loopback).
fn relay_address(config: &RelayConfig, relay: Option<String>) -> Option<String> {
    relay.or_else(|| {
        config.http.listen.as_ref().map(|l| {
            l.replace("0.0.0.0:", "127.0.0.1:")
                .replace("[::]:", "[::1]:")
        })
    })
}

/// `outbox-relay health [--ready]`: exit 0 when the relay answers 200 on `/livez` (`/readyz`).
pub async fn health(config: &RelayConfig, ready: bool, relay: Option<String>) -> Result<(), Exit> {
    let Some(addr) = relay_address(config, relay) else {
        return Err(Exit::config(anyhow::anyhow!(
            "no [http] listen configured and no --relay given"
        )));
    };
    let path = if ready { "/readyz" } else { "/livez" };
    match crate::http::get_text(&addr, path, Duration::from_secs(3)).await {
        Ok((200, body)) => {
            println!("{body}");
            Ok(())
        }
        Ok((code, body)) => Err(Exit::new(
            ExitKind::NotHealthy,
            anyhow::anyhow!("{addr}{path}: HTTP {code} {body}"),
        )),
        Err(e) => Err(Exit::new(ExitKind::NotHealthy, e)),
    }
}

/// Each outbox table: rows (estimate), size, the oldest row not yet confirmed, and what its
/// `[outbox.cleanup]` did (from a running relay's `/status`). Without a running relay, "not yet
/// confirmed" is measured from the newest commit the position map records behind the stored
/// checkpoint (see `relay_postgres::catalog::outbox_stats`).
async fn tables_state(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
    checkpoint: Option<relay_core::Lsn>,
    relay_status: &Value,
) -> Value {
    use relay_postgres::catalog::outbox_stats;
    let since = match checkpoint {
        Some(c) => outbox_stats::confirmed_since_from_map(client, &config.postgres.slot, c).await,
        None => None,
    };
    let mut out = serde_json::Map::new();
    for table in config.outbox.iter() {
        let (schema, name) = table.qualified_name();
        let qualified = table.display_name();
        let cleanup = config.outbox.cleanup_of(&schema, &name);
        let age = crate::config::age_spec_of(cleanup);
        let running = &relay_status["postgres"]["tables"][&qualified];
        let value = match outbox_stats::sample(client, &schema, &name, &age, since).await {
            Ok(None) => json!({ "error": "does not exist" }),
            Err(e) => json!({ "error": format!("cannot sample it: {e}") }),
            Ok(Some(sample)) => json!({
                "rows_estimate": sample.rows_estimate,
                "size_bytes": sample.size_bytes,
                // The running relay's own measure is the closer one.
                "oldest_unconfirmed_age_seconds": running["oldest_unconfirmed_age_seconds"]
                    .as_f64()
                    .or(sample.oldest_unconfirmed_age),
                "oldest_unconfirmed_measured_by": if running["oldest_unconfirmed_age_seconds"].is_number() {
                    "relay"
                } else if since.is_some() {
                    "position map"
                } else {
                    "oldest row (nothing known to be confirmed)"
                },
                "cleanup": cleanup.map(|c| json!({
                    "mode": c.mode.as_str(),
                    "retain_seconds": c.retain().as_secs(),
                    "running": running["cleanup"].clone(),
                })),
            }),
        };
        out.insert(qualified, value);
    }
    Value::Object(out)
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
