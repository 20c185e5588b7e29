//! `outbox-relay backfill --table T [--where COND]`: publishes the rows an outbox table already
//! held before the relay's slot existed, beside the running relay, resumably.
//!
//! Each row goes through the relay's own pipeline (route, limits, dead letters, publish with
//! retries, ack frontier) as an Insert of a pgoutput transaction of its page
//! ([`relay_postgres::backfill::PageSource`]), so it is published exactly as the relay would
//! publish it, plus `Outbox-Backfill: true`. The cursor (`outbox_relay.backfill`) moves over a
//! page only after JetStream acknowledged every row up to it, so a killed backfill resumes at
//! its cursor and re-sends at most the unacknowledged tail (deduplicated by event id). See
//! docs/replay.md. This command reads the cursor and decides where to start; the run itself is
//! [`relay_runtime::table_backfill`], which the relay's backfill at slot creation shares.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use relay_postgres::backfill::{self as sql, Cursor, CursorId, KeySource, TableShape};
use tokio_util::sync::CancellationToken;

use crate::exit::{Failure, pg_failure};
use relay_runtime::config::RelayConfig;
use relay_runtime::table_backfill::{
    RunOptions, TableRun, backfill_exit, checked_shape, mapping, run_pages,
};

/// How long counting the rows to backfill may take before the planner's estimate is used.
const COUNT_FOR: Duration = Duration::from_secs(5);

/// `outbox-relay backfill`'s options.
#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    /// The outbox table, `schema.table` or `table` (in `public`), as in `[[outbox]] table`.
    #[arg(long)]
    pub table: String,
    /// Only rows matching this SQL condition on the table, e.g.
    /// "created_at > now() - interval '7 days'". Each filter has its own cursor.
    #[arg(long = "where", value_name = "CONDITION")]
    pub filter: Option<String>,
    /// Rows per page (one SELECT each, on a connection of the backfill's own).
    #[arg(long, default_value_t = 1000)]
    pub page_size: usize,
    /// Messages published and not yet acknowledged by JetStream, at most.
    #[arg(long, default_value_t = 512)]
    pub max_in_flight: usize,
    /// Rows per second at most; 0: as fast as JetStream acknowledges.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Start from the first row again, even when a stored cursor says the backfill is under
    /// way or finished.
    #[arg(long)]
    pub restart: bool,
    /// Before publishing, read the event ids the stream holds for the table (headers only) and
    /// skip those rows, when the stream holds at most this many messages; also skip rows the
    /// relay publishes while the backfill runs. 0: neither.
    #[arg(long, default_value_t = 500_000)]
    pub skip_check_limit: u64,
    /// How often to print progress on stderr (not on a terminal, which shows a bar).
    #[arg(long, default_value = "5s", value_parser = relay_runtime::config::parse_duration)]
    pub progress_interval: Duration,
    /// `--log-format json`: progress lines even on a terminal.
    #[arg(skip)]
    pub log_json: bool,
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

/// Runs one backfill of `args.table` until it finished, was stopped, or failed.
// Long: the command's steps in order (arguments, sessions, shape, cursor, snapshot, run); each
// needs the previous one's result
pub async fn backfill(config: &RelayConfig, args: BackfillArgs) -> Result<(), Failure> {
    if args.page_size == 0 || args.max_in_flight == 0 {
        return Err(Failure::config(anyhow!(
            "--page-size and --max-in-flight must be at least 1"
        )));
    }
    let mapping = mapping(config, &args.table)?.clone();
    let filter = args
        .filter
        .as_deref()
        .map(str::trim)
        .filter(|f| !f.is_empty());
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "stop requested: waiting for outstanding acks, then storing the cursor",
        "second signal: exiting now; the next run re-sends what was not acknowledged",
    );

    // PostgreSQL: a read-only session for the pages, one for the cursor.
    let pg = &config.postgres;
    let reader = sql::connect_reader(pg).await.map_err(pg_failure)?;
    let cursor_client = relay_postgres::connect(pg).await.map_err(pg_failure)?;
    sql::prepare_cursor_session(&cursor_client)
        .await
        .map_err(backfill_exit)?;
    require_slot(&reader, &pg.slot).await?;
    let shape = checked_shape(config, &mapping, &reader, filter).await?;

    let id = CursorId {
        slot: pg.slot.clone(),
        table: shape.table.clone(),
        filter: filter.unwrap_or_default().to_owned(),
    };
    let described = match filter {
        Some(f) => format!("{} (where {f})", shape.table),
        None => shape.table.clone(),
    };
    let stored = sql::load_cursor(&cursor_client, &id)
        .await
        .map_err(backfill_exit)?;
    let Some(start) = start(
        &described,
        stored,
        &shape,
        &args,
        &reader,
        &cursor_client,
        &id,
    )
    .await?
    else {
        return Ok(());
    };
    let Some(end) = start.end else {
        sql::finish_cursor(&cursor_client, &id)
            .await
            .map_err(backfill_exit)?;
        eprintln!("backfill {described} finished: no rows to backfill");
        return Ok(());
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
        id,
        described,
        page_filter: filter.map(str::to_owned),
        after: start.after,
        end,
        done_before: start.done_before,
        estimate: start.estimate,
        live_until: Some(snapshot_lsn),
    };
    run_pages(run, &run_options(&args), &shutdown).await
}

fn run_options(args: &BackfillArgs) -> RunOptions {
    RunOptions {
        page_size: args.page_size,
        max_in_flight: args.max_in_flight,
        rate: args.rate,
        skip_check_limit: args.skip_check_limit,
        progress_interval: args.progress_interval,
        log_progress: false,
        progress_mode: relay_runtime::progress::Mode::for_stderr(args.log_json),
    }
}

/// The backfill publishes the rows committed before it starts; rows committed later are the
/// relay's, and without its slot they would be published by neither.
async fn require_slot(reader: &tokio_postgres::Client, slot: &str) -> Result<(), Failure> {
    let found = relay_postgres::catalog::slot(reader, slot)
        .await
        .map_err(|e| Failure::new(crate::exit::FailureKind::Unavailable, e))?;
    if found.is_none() {
        return Err(Failure::config(anyhow!(
            "replication slot `{slot}` does not exist: start the relay (or run `outbox-relay setup`) first. The backfill publishes the rows committed before it starts; rows committed later are the relay's, and without its slot they would be published by neither"
        )));
    }
    Ok(())
}

/// Where to start from the stored cursor: resume it, or start a new one (`--restart`, or none
/// stored). `None`: the backfill finished before and there is nothing to do.
async fn start(
    described: &str,
    stored: Option<Cursor>,
    shape: &TableShape,
    args: &BackfillArgs,
    reader: &tokio_postgres::Client,
    cursor_client: &tokio_postgres::Client,
    id: &CursorId,
) -> Result<Option<Start>, Failure> {
    if let Some(c) = stored
        .as_ref()
        .filter(|c| c.on_create && c.finished_at.is_none())
    {
        return Err(Failure::config(anyhow!(
            "the relay's backfill of {described} at slot creation (backfill = \"on-create\") is under way since {}: the relay finishes it (a restart resumes it) before it streams; this command would read it outside the slot's snapshot",
            c.started_at
        )));
    }
    match stored.filter(|_| !args.restart) {
        Some(c) if c.finished_at.is_some() => {
            eprintln!(
                "backfill {described} finished at {}: {} rows; --restart runs it again",
                c.finished_at.as_deref().unwrap_or("?"),
                c.rows_done
            );
            Ok(None)
        }
        Some(c) if c.key_column != shape.key.name => Err(Failure::config(anyhow!(
            "the stored backfill cursor of {described} pages by column `{}`, the table's key is now `{}`: rerun with --restart",
            c.key_column,
            shape.key.name
        ))),
        Some(c) => {
            tracing::info!(
                table = %shape.table,
                filter = %id.filter,
                rows_done = c.rows_done,
                started_at = %c.started_at,
                "resuming at {}: {} rows done by an earlier run",
                c.last_key.as_deref().unwrap_or("the first row"),
                c.rows_done
            );
            Ok(Some(Start {
                after: c.last_key,
                end: c.end_key,
                done_before: c.rows_done,
                estimate: c.rows_estimate,
            }))
        }
        None => new_cursor(shape, reader, cursor_client, id).await.map(Some),
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
