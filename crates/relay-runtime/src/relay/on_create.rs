//! The backfill at slot creation (`[[outbox]] backfill = "on-create"`, docs/replay.md): when
//! this relay creates its slot, the rows the tables already hold are published from the slot's
//! exported snapshot before the relay streams; a backfill a crash interrupted is finished by
//! the next start before it streams.
//!
//! **No gap, no overlap.** The exported snapshot sees exactly the transactions committed before
//! the slot's consistent point; the slot streams exactly those committed after it. Streaming
//! waits until every backfill finished, so consumers see the existing rows (in key order,
//! marked `Outbox-Backfill: true`) before the new ones (in commit order).
//!
//! **Crash safety.** Before the slot is created, its cursor rows are written without a
//! snapshot: a relay that dies before recording the snapshot leaves a slot nothing streamed
//! from (no checkpoint), which the next start drops and creates again. Once recorded, a
//! killed backfill resumes at its cursor in a new snapshot ([`relay_backfill::on_create`]).
//! One relay at a time does this work (an advisory lock on the checkpoint session).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use relay_backfill::{self as sql, BackfillError, CursorId, TableShape, on_create};
use relay_core::route::OutboxTableConfig;
use relay_postgres::bootstrap::ExportedSlot;
use relay_postgres::{PgError, PostgresSettings};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::SessionEnd;
use super::stop::{Step, Stop, postgres, retry};
use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};
use crate::table_backfill::{RunOptions, TableRun, checked_shape, mapping, run_pages};

/// Event ids of rows committed after the consistent point that a resumed backfill publishes
/// (and the slot streams), at most this many per table; the live pipeline skips them.
const MAX_STREAMED_IDS: usize = 100_000;

fn cursor_error(error: BackfillError) -> Stop {
    if error.is_transient() {
        retry(error)
    } else {
        Stop::Fail(Failure::new(FailureKind::Config, error))
    }
}

/// A catalog query that failed while `context`: a retry when transient, else a stop.
fn query_failed(context: String) -> impl FnOnce(tokio_postgres::Error) -> Stop {
    move |source| postgres(PgError::Query { context, source })
}

/// The tables with `backfill = "on-create"`, as `schema.table`.
fn tables(config: &RelayConfig) -> Vec<String> {
    config
        .outbox
        .backfill_on_create()
        .map(relay_core::route::OutboxTableConfig::display_name)
        .collect()
}

/// Before the start-up checks: whether the slot is to be created with an exported snapshot.
/// Takes the on-create lock on `client` (the checkpoint session) and, when the relay has no
/// checkpoint yet, drops a slot an earlier start created and died before recording its
/// snapshot, and marks the cursors of a slot about to be created.
pub(super) async fn before_prepare(config: &RelayConfig, client: &Client) -> Step<bool> {
    let tables = tables(config);
    if tables.is_empty() {
        return Ok(false);
    }
    let slot = config.postgres.slot.as_str();
    sql::ensure_cursor_table(client)
        .await
        .map_err(cursor_error)?;
    if !on_create::try_lock(client, slot)
        .await
        .map_err(cursor_error)?
    {
        return Err(retry(anyhow!(
            "another relay is creating slot {slot} or running its backfill at slot creation; waiting"
        )));
    }
    let checkpoint = relay_postgres::catalog::stored_checkpoint(client, slot)
        .await
        .map_err(query_failed(format!(
            "cannot read the checkpoint of slot {slot}"
        )))?;
    if checkpoint.is_some() {
        return Ok(true);
    }
    let existing = relay_postgres::catalog::slot(client, slot)
        .await
        .map_err(query_failed(format!(
            "cannot look up replication slot {slot}"
        )))?;
    let mut missing = existing.is_none();
    if let Some(info) = existing
        && info.active_pid.is_none()
        && on_create::unrecorded(client, slot)
            .await
            .map_err(cursor_error)?
    {
        tracing::warn!(
            slot,
            "slot {slot} was created for a backfill at slot creation by a relay that stopped before recording its snapshot, and nothing streamed from it (no checkpoint): dropping it to create it again with a snapshot"
        );
        on_create::drop_unrecorded_slot(client, slot)
            .await
            .map_err(cursor_error)?;
        missing = true;
    }
    if missing {
        on_create::mark_pending(client, slot, &tables)
            .await
            .map_err(cursor_error)?;
    } else if on_create::unfinished(client, slot)
        .await
        .map_err(cursor_error)?
        .is_empty()
    {
        tracing::info!(
            slot,
            "backfill = \"on-create\" applies when the relay creates the slot; slot {slot} exists already: publish older rows with `outbox-relay backfill --table …`"
        );
    }
    Ok(true)
}

/// What [`prepare`] found to do: the backfills to run, on a read session in their snapshot.
pub(super) struct Prepared {
    reader: Client,
    runs: Vec<(OutboxTableConfig, TableShape, Option<String>, String, i64)>,
    /// Event ids the live pipeline must not publish again.
    streamed: HashMap<String, u64>,
}

/// After the start-up checks, before the first checkpoint is stored (a stored checkpoint
/// with an unrecorded snapshot would look like a slot this relay streamed from): records the
/// snapshot of a slot just created, or finds the backfills an earlier start left unfinished.
/// `None`: nothing to do (the lock is released).
// Long: one `match` over what the slot's creation left (a snapshot to record, backfills to resume,
// nothing), under one lock
pub(super) async fn prepare(
    config: &RelayConfig,
    server: &PostgresSettings,
    client: &Client,
    exported: Option<ExportedSlot>,
) -> Step<Option<Prepared>> {
    let slot = server.slot.as_str();
    let mut streamed = HashMap::new();
    let mut runs = Vec::new();
    let reader = if let Some(exported) = exported {
        let reader = sql::connect_reader(server).await.map_err(postgres)?;
        let snapshot = on_create::import_snapshot(&reader, &exported.snapshot_name)
            .await
            .map_err(cursor_error)?;
        let consistent = exported.consistent_point;
        for table in tables(config) {
            let mapping = mapping(config, &table)?.clone();
            let shape = checked_shape(config, &mapping, &reader, None).await?;
            let end = shape.last_key(&reader, None).await.map_err(cursor_error)?;
            let id = cursor_id(slot, &shape.table);
            on_create::record(
                client,
                &id,
                &shape.key.name,
                end.as_deref(),
                &snapshot,
                consistent,
            )
            .await
            .map_err(cursor_error)?;
            tracing::info!(table = %shape.table, slot, consistent_point = %consistent, snapshot = %snapshot, last_key = end.as_deref().unwrap_or("none (empty)"), "backfill at slot creation: publishing the rows committed before the slot's consistent point, from its exported snapshot");
            if let Some(end) = end {
                runs.push((mapping, shape, None, end, 0));
            }
        }
        // The read transaction holds the snapshot from here on.
        exported.release();
        reader
    } else {
        let unfinished = on_create::unfinished(client, slot)
            .await
            .map_err(cursor_error)?;
        if unfinished.is_empty() {
            on_create::unlock(client, slot)
                .await
                .map_err(cursor_error)?;
            return Ok(None);
        }
        let reader = sql::connect_reader(server).await.map_err(postgres)?;
        on_create::begin_snapshot(&reader)
            .await
            .map_err(cursor_error)?;
        for job in unfinished {
            let mapping = mapping(config, &job.table).map_err(|e| {
                Failure::config(e.error.context(format!(
                    "the backfill at slot creation of {} is unfinished, and the table is no longer an [[outbox]] table: configure it again, or delete its row from outbox_relay.backfill to give it up",
                    job.table
                )))
            })?;
            let mapping = mapping.clone();
            let shape = checked_shape(config, &mapping, &reader, None).await?;
            let id = cursor_id(slot, &shape.table);
            let cursor = sql::load_cursor(client, &id)
                .await
                .map_err(cursor_error)?
                .ok_or_else(|| retry(anyhow!("the cursor of {} vanished", job.table)))?;
            let Some(end) = cursor.end_key else { continue };
            let ids = on_create::streamed_ids(
                &reader,
                &shape,
                cursor.last_key.as_deref(),
                &end,
                &job.snapshot,
                MAX_STREAMED_IDS,
            )
            .await
            .map_err(cursor_error)?;
            match &ids {
                Some(ids) => streamed.extend(ids.iter().map(|id| (id.clone(), 0))),
                None => {
                    tracing::warn!(table = %shape.table, limit = MAX_STREAMED_IDS, "more than {MAX_STREAMED_IDS} rows in the rest of the backfill committed after the slot's consistent point: the stream's copies of them are dropped by JetStream only within its duplicate window (consumers dedupe by event id)")
                }
            }
            tracing::info!(table = %shape.table, slot, consistent_point = %job.consistent_lsn, cursor = cursor.last_key.as_deref().unwrap_or("the first row"), rows_done = cursor.rows_done, committed_after_consistent_point = ?ids.map(|i| i.len()), "resuming the backfill at slot creation (its snapshot ended with the earlier relay): the rest of its key range in a new snapshot; rows of it the slot also streams are not published twice");
            runs.push((mapping, shape, cursor.last_key, end, cursor.rows_done));
        }
        reader
    };
    Ok(Some(Prepared {
        reader,
        runs,
        streamed,
    }))
}

/// Runs the backfills [`prepare`] found, one table after the other, then releases the lock.
/// Returns the event ids the live pipeline must not publish again (rows a resumed backfill
/// published that the slot streams too, each with stream sequence 0: not known).
pub(super) async fn run(
    config: &RelayConfig,
    server: &PostgresSettings,
    client: &Client,
    prepared: Prepared,
    stop: &CancellationToken,
) -> Step<HashMap<String, u64>> {
    let slot = server.slot.as_str();
    let Prepared {
        reader,
        runs,
        streamed,
    } = prepared;
    let reader = Arc::new(reader);
    for (mapping, shape, after, end, done_before) in runs {
        let cursor_client = relay_postgres::connect(server).await.map_err(postgres)?;
        sql::prepare_cursor_session(&cursor_client)
            .await
            .map_err(cursor_error)?;
        let id = cursor_id(slot, &shape.table);
        let described = format!("{} (at slot creation)", shape.table);
        let result = run_pages(
            TableRun {
                config,
                mapping,
                shape,
                reader: reader.clone(),
                cursor_client,
                id,
                described,
                page_filter: None,
                after,
                end,
                done_before,
                estimate: None,
                // Nothing streams this slot before its backfill ended.
                live_until: None,
            },
            &run_options(config),
            stop,
        )
        .await;
        ended(result, stop)?;
    }
    on_create::end_snapshot(&reader)
        .await
        .map_err(cursor_error)?;
    on_create::unlock(client, slot)
        .await
        .map_err(cursor_error)?;
    Ok(streamed)
}

fn cursor_id(slot: &str, table: &str) -> CursorId {
    CursorId {
        slot: slot.to_owned(),
        table: table.to_owned(),
        filter: String::new(),
    }
}

fn run_options(config: &RelayConfig) -> RunOptions {
    RunOptions {
        page_size: 500,
        max_in_flight: config.relay.max_in_flight,
        rate: config.relay.backfill_rate,
        skip_check_limit: 500_000,
        progress_interval: Duration::from_secs(5),
        log_progress: true,
        progress_mode: crate::progress::Mode::Lines,
    }
}

/// A backfill run's end as the session sees it: stopped on request is a shutdown, unavailable
/// a retry (the next session resumes at the cursor), anything else an exit.
fn ended(result: Result<u64, Failure>, stop: &CancellationToken) -> Step<()> {
    match result {
        Ok(_dead_lettered) => Ok(()),
        Err(_) if stop.is_cancelled() => Err(Stop::End(SessionEnd::Shutdown)),
        Err(exit) if exit.kind == FailureKind::Unavailable => Err(retry(exit.error)),
        Err(exit) => Err(Stop::Fail(exit)),
    }
}
