//! The facts `outbox-relay status` prints, gathered as one JSON document: where the slot, the
//! stored checkpoint and the stream are, how long a stopped relay has before the slot is
//! invalidated (the retention window, at the WAL rate of a short sample), each outbox table and
//! backfill, failover readiness, and what a running relay says about itself (its `/status`).

use std::time::Duration;

use relay_backfill::{CursorStatus, list_cursors};
use relay_postgres::catalog::failover;
use relay_postgres::catalog::retention::{self, SHORT_SAMPLE, TakeoverPolicy};
use serde_json::{Value, json};

use relay_runtime::config::RelayConfig;
use relay_runtime::failure::{Failure, FailureKind, pg_failure};
use relay_runtime::inspect::{self, StreamLookup};

/// The status document, and whether it shows a data-safety problem.
#[derive(Debug)]
pub struct StatusReport {
    /// The document `status --json` prints.
    pub doc: Value,
    /// The slot is lost (or gone while a checkpoint is stored).
    pub lost: bool,
    /// The slot is ahead of the stored checkpoint.
    pub ahead: bool,
}

/// Gathers the status document; `relay` is where a running relay answers ([`relay_address`]).
// Long: builds the one JSON document `status` prints, a section after the other, each a few lines
pub async fn gather(config: &RelayConfig, relay: Option<String>) -> Result<StatusReport, Failure> {
    let pg = &config.postgres;
    let client = relay_postgres::connect(pg).await.map_err(pg_failure)?;
    let unavailable = |e: tokio_postgres::Error| Failure::new(FailureKind::Unavailable, e);
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
        relay_state(relay),
    );
    let retention = match retention {
        Ok(window) => window.to_json(),
        Err(e) => json!({ "error": format!("cannot read the retention window: {e}") }),
    };

    let replay_window = match relay_postgres::checkpoint::replay_window(&client, &pg.slot).await {
        Ok(window) => window.to_json(config.relay.replay_retention_bytes()),
        Err(e) => json!({ "error": format!("cannot read the replay window: {e}") }),
    };

    let backfills = backfills_state(&client, &pg.slot).await;
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
    Ok(StatusReport { doc, lost, ahead })
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
async fn relay_state(addr: Option<String>) -> (Option<String>, Value) {
    let status = match &addr {
        None => Value::Null,
        Some(addr) => {
            match crate::client::get_text(addr, "/status", Duration::from_secs(3)).await {
                Ok((200, body)) => serde_json::from_str(&body).unwrap_or(Value::Null),
                Ok((code, _)) => json!({ "error": format!("HTTP {code}") }),
                Err(e) => json!({ "error": format!("not running or unreachable: {e:#}") }),
            }
        }
    };
    (addr, status)
}

/// Where a relay on this host answers: `--relay`, else `[http] listen` (any-address → loopback).
pub fn relay_address(config: &RelayConfig, relay: Option<String>) -> Option<String> {
    relay.or_else(|| {
        config.http.listen.as_ref().map(|l| {
            l.replace("0.0.0.0:", "127.0.0.1:")
                .replace("[::]:", "[::1]:")
        })
    })
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
        let age = relay_runtime::config::age_spec_of(cleanup);
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

/// A cursor that has not moved for this long while unfinished is reported as stopped: the
/// backfill stores its cursor every checkpoint interval while it runs.
const STOPPED_AFTER_SECS: f64 = 60.0;

/// The backfills of `slot` as JSON (an `error` object when they cannot be read).
async fn backfills_state(client: &tokio_postgres::Client, slot: &str) -> Value {
    match list_cursors(client, slot).await {
        Ok(cursors) => Value::Array(cursors.iter().map(to_json).collect()),
        Err(e) => json!({ "error": format!("cannot read the backfills: {e}") }),
    }
}

fn to_json(c: &CursorStatus) -> Value {
    let cursor = &c.cursor;
    let state = match (&cursor.finished_at, c.updated_secs_ago) {
        (Some(_), _) => "finished",
        (None, ago) if ago > STOPPED_AFTER_SECS => "stopped",
        (None, _) => "running",
    };
    json!({
        "table": c.id.table,
        "filter": (!c.id.filter.is_empty()).then_some(&c.id.filter),
        "on_create": cursor.on_create,
        "state": state,
        "rows_done": cursor.rows_done,
        "rows_estimate": cursor.rows_estimate,
        "percent": cursor.rows_estimate.filter(|t| *t > 0).map(|total| {
            (cursor.rows_done as f64 * 100.0 / total as f64).min(100.0).round()
        }),
        "key_column": cursor.key_column,
        "last_key": cursor.last_key,
        "end_key": cursor.end_key,
        "started_at": cursor.started_at,
        "finished_at": cursor.finished_at,
        "updated_seconds_ago": c.updated_secs_ago.round(),
    })
}
