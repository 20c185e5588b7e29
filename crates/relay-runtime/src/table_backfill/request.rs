//! A backfill asked for by name (`outbox-relay backfill --table T`, or a `backfill` signal from
//! SQL): reads the stored cursor, decides where to start (resume, start over, or nothing to do),
//! takes the page snapshot and runs the pages ([`super::run_pages`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use relay_backfill::{self as sql, Cursor, CursorId, KeySource, TableShape};
use tokio_util::sync::CancellationToken;

use super::{RunOptions, TableRun, backfill_exit, checked_shape, mapping, run_pages};
use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind, pg_failure};

/// How long counting the rows to backfill may take before the planner's estimate is used.
const COUNT_FOR: Duration = Duration::from_secs(5);

/// One backfill of one outbox table (and filter).
#[derive(Debug, Clone)]
pub struct BackfillRequest {
    /// The outbox table, `schema.table` or `table` (in `public`), as in `[[outbox]] table`.
    pub table: String,
    /// Only rows matching this SQL condition (`None`: all). Each filter has its own cursor.
    pub filter: Option<String>,
    /// Start from the first row again even when a stored cursor is under way or finished.
    pub restart: bool,
    pub options: RunOptions,
}

/// How a backfill that did not fail ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillOutcome {
    /// Every row up to the last key was published and acknowledged (`dead_lettered` of them
    /// to the dead-letter subject, as rows that cannot be routed).
    Finished {
        described: String,
        rows_done: i64,
        dead_lettered: u64,
    },
    /// A stored cursor says it finished before (`restart` runs it again).
    FinishedBefore {
        described: String,
        finished_at: String,
        rows_done: i64,
    },
    /// The table (with the filter) has no rows.
    NoRows { described: String },
}

impl std::fmt::Display for BackfillOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Finished {
                described,
                rows_done,
                dead_lettered: 0,
            } => write!(f, "backfill {described} finished: {rows_done} rows"),
            Self::Finished {
                described,
                rows_done,
                dead_lettered,
            } => write!(
                f,
                "backfill {described} finished: {rows_done} rows, {dead_lettered} of them dead-lettered again (they still cannot be routed)"
            ),
            Self::FinishedBefore {
                described,
                finished_at,
                rows_done,
            } => write!(
                f,
                "backfill {described} had finished at {finished_at}: {rows_done} rows; start it over to run it again"
            ),
            Self::NoRows { described } => {
                write!(f, "backfill {described} finished: no rows to backfill")
            }
        }
    }
}

/// Where a backfill starts.
struct Start {
    /// The stored cursor (`None`: from the first row).
    after: Option<String>,
    /// The last key to read (`None`: no rows).
    end: Option<String>,
    done_before: i64,
    estimate: Option<i64>,
}

impl BackfillRequest {
    /// The filter, `None` when not given or blank.
    fn filter(&self) -> Option<&str> {
        self.filter
            .as_deref()
            .map(str::trim)
            .filter(|f| !f.is_empty())
    }

    /// The cursor this backfill keeps for the relay of `config`, `None` when the table is not an
    /// outbox table (the backfill refuses it).
    pub fn cursor(&self, config: &RelayConfig) -> Option<CursorId> {
        let (schema, table) = mapping(config, &self.table).ok()?.qualified_name();
        Some(cursor_id(
            config,
            &relay_core::ident::display_relation(&schema, &table),
            self.filter(),
        ))
    }
}

/// The cursor a backfill of `table` (as the table's shape names it) with `filter` keeps.
fn cursor_id(config: &RelayConfig, table: &str, filter: Option<&str>) -> CursorId {
    CursorId {
        slot: config.postgres.slot.clone(),
        table: table.to_owned(),
        filter: filter.unwrap_or_default().to_owned(),
    }
}

/// Runs one backfill of `request.table` until it finished, was stopped (`shutdown`), or failed.
// Long: the steps in order (arguments, sessions, shape, cursor, snapshot, run); each needs the
// previous one's result
pub async fn backfill(
    config: &RelayConfig,
    request: &BackfillRequest,
    shutdown: &CancellationToken,
) -> Result<BackfillOutcome, Failure> {
    if request.options.page_size == 0 || request.options.max_in_flight == 0 {
        return Err(Failure::config(anyhow!(
            "the page size and the messages in flight must be at least 1"
        )));
    }
    let mapping = mapping(config, &request.table)?.clone();
    let filter = request.filter();

    // PostgreSQL: a read-only session for the pages, one for the cursor.
    let pg = &config.postgres;
    let reader = sql::connect_reader(pg).await.map_err(pg_failure)?;
    let cursor_client = relay_postgres::connect(pg).await.map_err(pg_failure)?;
    sql::prepare_cursor_session(&cursor_client)
        .await
        .map_err(backfill_exit)?;
    require_slot(&reader, &pg.slot).await?;
    let shape = checked_shape(config, &mapping, &reader, filter).await?;

    let id = cursor_id(config, &shape.table, filter);
    let described = match filter {
        Some(f) => format!("{} (where {f})", shape.table),
        None => shape.table.clone(),
    };
    let stored = sql::load_cursor(&cursor_client, &id)
        .await
        .map_err(backfill_exit)?;
    let start = match from_cursor(&described, stored, &shape, request.restart)? {
        FromCursor::Resume(start) => start,
        FromCursor::StartOver => new_cursor(&shape, &reader, &cursor_client, &id).await?,
        FromCursor::Done(before) => return Ok(before),
    };
    let Some(end) = start.end else {
        sql::finish_cursor(&cursor_client, &id)
            .await
            .map_err(backfill_exit)?;
        return Ok(BackfillOutcome::NoRows { described });
    };

    // Every page in one snapshot: rows committed from now on are the relay's (its slot exists).
    let snapshot_lsn = sql::begin_page_snapshot(&reader)
        .await
        .map_err(backfill_exit)?;
    let run = TableRun {
        config,
        mapping,
        shape,
        reader: Arc::new(reader),
        cursor_client,
        id: id.clone(),
        described: described.clone(),
        page_filter: filter.map(str::to_owned),
        after: start.after,
        end,
        done_before: start.done_before,
        estimate: start.estimate,
        live_until: Some(snapshot_lsn),
    };
    let dead_lettered = run_pages(run, &request.options, shutdown).await?;
    let rows_done = rows_done(config, &id).await;
    Ok(BackfillOutcome::Finished {
        described,
        rows_done,
        dead_lettered,
    })
}

/// The rows the finished cursor `id` counts (0 when it cannot be read: the run is done anyway).
async fn rows_done(config: &RelayConfig, id: &CursorId) -> i64 {
    let Ok(client) = relay_postgres::connect(&config.postgres).await else {
        return 0;
    };
    match sql::load_cursor(&client, id).await {
        Ok(Some(cursor)) => cursor.rows_done,
        _ => 0,
    }
}

/// The backfill publishes the rows committed before it starts; rows committed later are the
/// relay's, and without its slot they would be published by neither.
async fn require_slot(reader: &tokio_postgres::Client, slot: &str) -> Result<(), Failure> {
    let found = relay_postgres::catalog::slot(reader, slot)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    if found.is_none() {
        return Err(Failure::config(anyhow!(
            "replication slot `{slot}` does not exist: start the relay (or run `outbox-relay setup`) first. The backfill publishes the rows committed before it starts; rows committed later are the relay's, and without its slot they would be published by neither"
        )));
    }
    Ok(())
}

/// What the stored cursor says to do.
enum FromCursor {
    /// Resume it.
    Resume(Start),
    /// Start a new one (`restart`, or none stored).
    StartOver,
    /// It finished before: nothing to do.
    Done(BackfillOutcome),
}

/// Where to start from the stored cursor.
fn from_cursor(
    described: &str,
    stored: Option<Cursor>,
    shape: &TableShape,
    restart: bool,
) -> Result<FromCursor, Failure> {
    if let Some(c) = stored
        .as_ref()
        .filter(|c| c.on_create && c.finished_at.is_none())
    {
        return Err(Failure::config(anyhow!(
            "the relay's backfill of {described} at slot creation (backfill = \"on-create\") is under way since {}: the relay finishes it (a restart resumes it) before it streams; this backfill would read it outside the slot's snapshot",
            c.started_at
        )));
    }
    match stored.filter(|_| !restart) {
        Some(c) if c.finished_at.is_some() => {
            Ok(FromCursor::Done(BackfillOutcome::FinishedBefore {
                described: described.to_owned(),
                finished_at: c.finished_at.unwrap_or_default(),
                rows_done: c.rows_done,
            }))
        }
        Some(c) if c.key_column != shape.key.name => Err(Failure::config(anyhow!(
            "the stored backfill cursor of {described} pages by column `{}`, the table's key is now `{}`: start it over (--restart, or \"restart\": true in a signal)",
            c.key_column,
            shape.key.name
        ))),
        Some(c) => {
            tracing::info!(
                table = %shape.table,
                rows_done = c.rows_done,
                started_at = %c.started_at,
                "resuming at {}: {} rows done by an earlier run",
                c.last_key.as_deref().unwrap_or("the first row"),
                c.rows_done
            );
            Ok(FromCursor::Resume(Start {
                after: c.last_key,
                end: c.end_key,
                done_before: c.rows_done,
                estimate: c.rows_estimate,
            }))
        }
        None => Ok(FromCursor::StartOver),
    }
}

/// Starts cursor `id` at the first row, with the table's last key and an estimate of its rows.
async fn new_cursor(
    shape: &TableShape,
    reader: &tokio_postgres::Client,
    cursor_client: &tokio_postgres::Client,
    id: &CursorId,
) -> Result<Start, Failure> {
    let filter = Some(id.filter.as_str()).filter(|f| !f.is_empty());
    let end = shape
        .last_key(reader, filter)
        .await
        .map_err(backfill_exit)?;
    let estimate = match &end {
        Some(end) => shape
            .count_rows(reader, filter, None, end, COUNT_FOR)
            .await
            .map_err(backfill_exit)?
            .map(|(n, _)| i64::try_from(n).unwrap_or(i64::MAX)),
        None => Some(0),
    };
    sql::start_cursor(cursor_client, id, &shape.key.name, end.as_deref(), estimate)
        .await
        .map_err(backfill_exit)?;
    tracing::info!(
        table = %shape.table,
        filter = %id.filter,
        key = %shape.key.name,
        key_is = match shape.key.source {
            KeySource::PrimaryKey => "primary key",
            KeySource::UniqueEventId => "event id (unique index)",
        },
        last_key = end.as_deref().unwrap_or("none"),
        rows_estimate = ?estimate,
        "starting from the first row"
    );
    Ok(Start {
        after: None,
        end,
        done_before: 0,
        estimate,
    })
}
