//! The facts `outbox-relay status` prints, gathered as one JSON document: where the slot, the
//! stored checkpoint and the stream are, how long a stopped relay has before the slot is
//! invalidated (the retention window, at the WAL rate of a short sample), each outbox table and
//! backfill, failover readiness, and what a running relay says about itself (its `/status`).
//! The document's types are in [`report`].

pub mod report;

use std::collections::BTreeMap;
use std::time::Duration;

use relay_backfill::{CursorStatus, list_cursors};
use relay_postgres::catalog::failover;
use relay_postgres::catalog::retention::{self, SHORT_SAMPLE, TakeoverPolicy};
use relay_telemetry::RelayStatus;

use relay_runtime::config::RelayConfig;
use relay_runtime::failure::{Failure, FailureKind, pg_failure};
use relay_runtime::inspect::{self, StreamLookup};

use report::{
    BackfillReport, BackfillState, CheckpointReport, RelayAnswer, Section, StatusDoc, StreamFound,
    StreamState, TableCleanup, TableReport,
};

/// The status document, and whether it shows a data-safety problem.
#[derive(Debug)]
pub struct StatusReport {
    /// The document `status --json` prints.
    pub doc: StatusDoc,
    /// The slot is lost (or gone while a checkpoint is stored).
    pub lost: bool,
    /// The slot is ahead of the stored checkpoint.
    pub ahead: bool,
}

/// Gathers the status document; `relay` is where a running relay answers ([`relay_address`]).
// Long: builds the one JSON document `status` prints, a section after the other, each a few lines
///
/// `pipeline` names a fleet's pipeline: the running relay's document is its `/status/{name}`.
pub async fn gather(
    config: &RelayConfig,
    relay: Option<String>,
    pipeline: Option<&str>,
) -> Result<StatusReport, Failure> {
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
            Section::Read(failover::report(&facts, &checks))
        }
        Err(e) => failed(format!("cannot read what failover needs: {e}")),
    };

    let policy = TakeoverPolicy {
        budget: config.relay.takeover_budget,
        standby_poll: config.relay.standby_poll_interval,
    };
    // The WAL rate sample takes a moment: look at the stream and the relay meanwhile.
    let (retention, stream, (relay_addr, relay_status)) = tokio::join!(
        retention::measure(&client, &pg.slot, SHORT_SAMPLE, policy),
        stream_state(config),
        relay_state(relay, pipeline),
    );
    let retention = match retention {
        Ok(window) => Section::Read(window.report()),
        Err(e) => failed(format!("cannot read the retention window: {e}")),
    };

    let replay_window = match relay_postgres::checkpoint::replay_window(&client, &pg.slot).await {
        Ok(window) => Section::Read(window.report(config.relay.replay_retention_bytes())),
        Err(e) => failed(format!("cannot read the replay window: {e}")),
    };

    let backfills = backfills_state(&client, &pg.slot).await;
    let tables = tables_state(
        config,
        &client,
        checkpoint.map(|(lsn, _)| lsn),
        relay_status.as_ref().and_then(RelayAnswer::status),
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
    let doc = StatusDoc {
        slot: pg.slot.clone(),
        slot_state: slot.as_ref().map(|s| s.report()),
        checkpoint: checkpoint.map(|(lsn, age)| CheckpointReport {
            lsn: lsn.to_string(),
            stored_seconds_ago: age,
        }),
        slot_minus_checkpoint_bytes: behind.map(|d| d as i64),
        retention,
        replay_window,
        failover,
        stream: config.nats.stream.clone(),
        stream_state: stream,
        relay: relay_addr,
        relay_status,
        tables,
        backfills,
    };
    Ok(StatusReport { doc, lost, ahead })
}

/// A section that could not be read, and why.
fn failed<T>(error: String) -> Section<T> {
    Section::Failed { error }
}

/// The stream's state, or why it is unknown.
async fn stream_state(config: &RelayConfig) -> StreamState {
    match relay_nats::connect(&config.nats).await {
        Ok(connection) => {
            let jetstream = connection.jetstream();
            match inspect::stream(jetstream.context(), &config.nats.stream).await {
                StreamLookup::Found(info) => StreamState::Found(Box::new(StreamFound {
                    present: true,
                    last_sequence: info.state.last_sequence,
                    messages: info.state.messages,
                    subjects: info.config.subjects.clone(),
                    durability: relay_nats::assess_durability(&jetstream, &info)
                        .await
                        .report(),
                })),
                StreamLookup::NotFound => StreamState::Missing { present: false },
                StreamLookup::NotEnabled(e) | StreamLookup::Failed(e) => {
                    StreamState::Failed { error: e }
                }
            }
        }
        Err(e) => StreamState::Failed {
            error: format!("{e}"),
        },
    }
}

/// Where a running relay answers, and its `/status` (`None` when it answered something else).
async fn relay_state(
    addr: Option<String>,
    pipeline: Option<&str>,
) -> (Option<String>, Option<RelayAnswer>) {
    let path = pipeline.map_or_else(|| "/status".to_owned(), |name| format!("/status/{name}"));
    let status = match &addr {
        None => None,
        Some(addr) => match crate::client::get_text(addr, &path, Duration::from_secs(3)).await {
            Ok((200, body)) => serde_json::from_str::<RelayStatus>(&body)
                .ok()
                .map(|status| RelayAnswer::Status(Box::new(status))),
            Ok((code, _)) => Some(RelayAnswer::Failed {
                error: format!("HTTP {code}"),
            }),
            Err(e) => Some(RelayAnswer::Failed {
                error: format!("not running or unreachable: {e:#}"),
            }),
        },
    };
    (addr, status)
}

/// Where a relay on this host answers: `--relay`, else `[http] listen` (any-address → loopback).
pub fn relay_address(
    http: &relay_runtime::config::HttpSettings,
    relay: Option<String>,
) -> Option<String> {
    relay.or_else(|| {
        http.listen.as_ref().map(|l| {
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
    relay_status: Option<&RelayStatus>,
) -> BTreeMap<String, Section<TableReport>> {
    use relay_postgres::catalog::outbox_stats;
    let since = match checkpoint {
        Some(c) => outbox_stats::confirmed_since_from_map(client, &config.postgres.slot, c).await,
        None => None,
    };
    let mut out = BTreeMap::new();
    for table in config.outbox.iter() {
        let (schema, name) = table.qualified_name();
        let qualified = table.display_name();
        let cleanup = config.outbox.cleanup_of(&schema, &name);
        let age = relay_runtime::config::age_spec_of(cleanup);
        let running = relay_status.and_then(|s| s.postgres.tables.get(&qualified));
        // The running relay's own measure is the closer one.
        let relay_age = running.and_then(|t| t.oldest_unconfirmed_age_seconds);
        let value = match outbox_stats::sample(client, &schema, &name, &age, since).await {
            Ok(None) => failed("does not exist".to_owned()),
            Err(e) => failed(format!("cannot sample it: {e}")),
            Ok(Some(sample)) => Section::Read(TableReport {
                rows_estimate: sample.rows_estimate,
                size_bytes: sample.size_bytes,
                oldest_unconfirmed_age_seconds: relay_age.or(sample.oldest_unconfirmed_age),
                oldest_unconfirmed_measured_by: if relay_age.is_some() {
                    "relay"
                } else if since.is_some() {
                    "position map"
                } else {
                    "oldest row (nothing known to be confirmed)"
                }
                .to_owned(),
                cleanup: cleanup.map(|c| TableCleanup {
                    mode: c.mode.as_str().to_owned(),
                    retain_seconds: c.retain().as_secs(),
                    running: running.and_then(|t| t.cleanup.clone()),
                }),
            }),
        };
        out.insert(qualified, value);
    }
    out
}

/// A cursor that has not moved for this long while unfinished is reported as stopped: the
/// backfill stores its cursor every checkpoint interval while it runs.
const STOPPED_AFTER_SECS: f64 = 60.0;

/// The backfills of `slot` (why not, when they cannot be read).
async fn backfills_state(
    client: &tokio_postgres::Client,
    slot: &str,
) -> Section<Vec<BackfillReport>> {
    match list_cursors(client, slot).await {
        Ok(cursors) => Section::Read(cursors.iter().map(backfill_report).collect()),
        Err(e) => failed(format!("cannot read the backfills: {e}")),
    }
}

fn backfill_report(c: &CursorStatus) -> BackfillReport {
    let cursor = &c.cursor;
    let state = match (&cursor.finished_at, c.updated_secs_ago) {
        (Some(_), _) => BackfillState::Finished,
        (None, ago) if ago > STOPPED_AFTER_SECS => BackfillState::Stopped,
        (None, _) => BackfillState::Running,
    };
    BackfillReport {
        table: c.id.table.clone(),
        filter: (!c.id.filter.is_empty()).then(|| c.id.filter.clone()),
        on_create: cursor.on_create,
        state,
        rows_done: cursor.rows_done,
        rows_estimate: cursor.rows_estimate,
        percent: cursor.rows_estimate.filter(|t| *t > 0).map(|total| {
            (cursor.rows_done as f64 * 100.0 / total as f64)
                .min(100.0)
                .round()
        }),
        key_column: cursor.key_column.clone(),
        last_key: cursor.last_key.clone(),
        end_key: cursor.end_key.clone(),
        started_at: cursor.started_at.clone(),
        finished_at: cursor.finished_at.clone(),
        updated_seconds_ago: c.updated_secs_ago.round(),
    }
}
