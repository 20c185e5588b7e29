//! `outbox-relay backfill --table T [--where COND]`: publishes the rows an outbox table already
//! held before the relay's slot existed, beside the running relay, resumably.
//!
//! Each row goes through the relay's own pipeline (route, limits, dead letters, publish with
//! retries, ack frontier) as an Insert of a pgoutput transaction of its page
//! ([`pages::PageSource`]), so it is published exactly as the relay would publish it, plus
//! `Outbox-Backfill: true`. The cursor (`outbox_relay.backfill`) moves over a page only after
//! JetStream acknowledged every row up to it, so a killed backfill resumes at its cursor and
//! re-sends at most the unacknowledged tail (deduplicated by event id). See docs/replay.md.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use relay_core::route::{OutboxTableConfig, Router};
use relay_postgres::backfill::{self as sql, BackfillError, CursorId, KeySource, TableShape};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::exit::pg_exit;
use crate::exit::{Exit, ExitKind};

mod pages;
mod publish;
mod table_run;

pub(crate) use table_run::{RunOptions, TableRun, run_pages};

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
    #[arg(long, default_value = "5s", value_parser = crate::humantime_duration)]
    pub progress_interval: Duration,
    /// `--log-format json`: progress lines even on a terminal.
    #[arg(skip)]
    pub log_json: bool,
}

fn backfill_exit(error: BackfillError) -> Exit {
    let kind = match &error {
        e if e.is_transient() => ExitKind::Unavailable,
        BackfillError::Query { .. } => ExitKind::Internal,
        _ => ExitKind::Config,
    };
    Exit::new(kind, error)
}

/// The `[[outbox]]` mapping of `table` (`schema.table` or `table`).
pub(crate) fn mapping<'a>(
    config: &'a RelayConfig,
    table: &str,
) -> Result<&'a OutboxTableConfig, Exit> {
    let wanted = relay_core::ident::TableName::parse(table)
        .map_err(|e| Exit::config(anyhow!("--table: {e}")))?;
    config
        .outbox
        .iter()
        .find(|o| o.is_table(&wanted.schema, &wanted.table))
        .ok_or_else(|| {
            let configured: Vec<String> = config
                .outbox
                .iter()
                .map(OutboxTableConfig::display_name)
                .collect();
            Exit::config(anyhow!(
                "table `{}` is not configured as an outbox table (configured: {}): add an [[outbox]] entry for it, or name one of those",
                wanted.display(),
                configured.join(", ")
            ))
        })
}

/// The table's shape, checked before anything is read: the mapping fits it (the relay's own
/// check of its Relation), `filter` is a valid condition, no row to read has a NULL key.
pub(crate) async fn checked_shape(
    config: &RelayConfig,
    mapping: &OutboxTableConfig,
    reader: &tokio_postgres::Client,
    filter: Option<&str>,
) -> Result<TableShape, Exit> {
    let pg = &config.postgres;
    let (schema, table) = mapping.qualified_name();
    let shape = sql::table_shape(reader, &schema, &table, &mapping.event_id, &pg.publication)
        .await
        .map_err(backfill_exit)?;
    // The pages keep what the publication keeps; with a row_filter that must be the configured
    // one, or rows the relay would never stream get published (or the reverse).
    if mapping.row_filter.is_some() {
        let unavailable = |e: tokio_postgres::Error| Exit::new(ExitKind::Unavailable, e);
        let version = relay_postgres::catalog::server(reader)
            .await
            .map_err(unavailable)?
            .version_num;
        let verdict = relay_postgres::catalog::row_filter::row_filter_verdict(
            reader,
            pg,
            version,
            &schema,
            &table,
            mapping.row_filter.as_deref(),
        )
        .await
        .map_err(unavailable)?;
        if let Some(problem) = verdict.problem() {
            return Err(Exit::config(anyhow!("{problem}")));
        }
    }
    if !shape.in_publication {
        tracing::warn!(table = %shape.table, publication = %pg.publication, "the table is not in the publication: the live relay does not publish its new rows");
    }
    // The mapping must fit the table before anything is read: the same check the relay makes
    // on the table's Relation message.
    let mut check = Router::new(std::slice::from_ref(mapping)).map_err(Exit::config)?;
    check
        .on_relation(shape.relation.clone(), None)
        .map_err(|e| {
            Exit::config(
                anyhow::Error::new(e).context("the [[outbox]] mapping does not fit the table"),
            )
        })?;
    if let Some(filter) = filter {
        shape
            .check_filter(reader, filter)
            .await
            .map_err(backfill_exit)?;
    }
    let nulls = shape
        .null_keys(reader, filter)
        .await
        .map_err(backfill_exit)?;
    if nulls > 0 {
        return Err(Exit::new(
            ExitKind::DataSafety,
            anyhow!(
                "{nulls} rows of {} have a NULL event id (`{}`): no message can be built for them (the relay refuses such rows too). Fix or delete them, or leave them out with --where \"{} IS NOT NULL\"",
                shape.table,
                shape.key.name,
                shape.key.name
            ),
        ));
    }

    Ok(shape)
}

/// Runs one backfill of `args.table` until it finished, was stopped, or failed.
pub async fn backfill(config: &RelayConfig, args: BackfillArgs) -> Result<(), Exit> {
    if args.page_size == 0 || args.max_in_flight == 0 {
        return Err(Exit::config(anyhow!(
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
    let reader = sql::connect_reader(pg).await.map_err(pg_exit)?;
    let cursor_client = relay_postgres::connect(pg).await.map_err(pg_exit)?;
    sql::prepare_cursor_session(&cursor_client)
        .await
        .map_err(backfill_exit)?;
    let slot = relay_postgres::catalog::slot(&reader, &pg.slot)
        .await
        .map_err(|e| Exit::new(ExitKind::Unavailable, e))?;
    if slot.is_none() {
        return Err(Exit::config(anyhow!(
            "replication slot `{}` does not exist: start the relay (or run `outbox-relay setup`) first. The backfill publishes the rows committed before it starts; rows committed later are the relay's, and without its slot they would be published by neither",
            pg.slot
        )));
    }
    let shape = checked_shape(config, &mapping, &reader, filter).await?;

    // The cursor: resume, or start from the first row.
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
    if let Some(c) = stored
        .as_ref()
        .filter(|c| c.on_create && c.finished_at.is_none())
    {
        return Err(Exit::config(anyhow!(
            "the relay's backfill of {described} at slot creation (backfill = \"on-create\") is under way since {}: the relay finishes it (a restart resumes it) before it streams; this command would read it outside the slot's snapshot",
            c.started_at
        )));
    }
    let (after, end, done_before, estimate) = match stored.filter(|_| !args.restart) {
        Some(c) if c.finished_at.is_some() => {
            eprintln!(
                "backfill {described} finished at {}: {} rows; --restart runs it again",
                c.finished_at.as_deref().unwrap_or("?"),
                c.rows_done
            );
            return Ok(());
        }
        Some(c) if c.key_column != shape.key.name => {
            return Err(Exit::config(anyhow!(
                "the stored backfill cursor of {described} pages by column `{}`, the table's key is now `{}`: rerun with --restart",
                c.key_column,
                shape.key.name
            )));
        }
        Some(c) => {
            tracing::info!(
                table = %shape.table,
                filter = filter.unwrap_or(""),
                rows_done = c.rows_done,
                started_at = %c.started_at,
                "resuming at {}: {} rows done by an earlier run",
                c.last_key.as_deref().unwrap_or("the first row"),
                c.rows_done
            );
            (c.last_key, c.end_key, c.rows_done, c.rows_estimate)
        }
        None => {
            let end = shape
                .last_key(&reader, filter)
                .await
                .map_err(backfill_exit)?;
            let estimate = match &end {
                Some(end) => shape
                    .count_rows(&reader, filter, None, end, COUNT_FOR)
                    .await
                    .map_err(backfill_exit)?
                    .map(|(n, _)| i64::try_from(n).unwrap_or(i64::MAX)),
                None => Some(0),
            };
            sql::start_cursor(
                &cursor_client,
                &id,
                &shape.key.name,
                end.as_deref(),
                estimate,
            )
            .await
            .map_err(backfill_exit)?;
            tracing::info!(
                table = %shape.table,
                filter = filter.unwrap_or(""),
                key = %shape.key.name,
                key_is = match shape.key.source {
                    KeySource::PrimaryKey => "primary key",
                    KeySource::UniqueEventId => "event id (unique index)",
                },
                last_key = end.as_deref().unwrap_or("none"),
                rows_estimate = ?estimate,
                "starting from the first row"
            );
            (None, end, 0, estimate)
        }
    };
    let Some(end) = end else {
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
    run_pages(
        TableRun {
            config,
            mapping,
            shape,
            reader: Arc::new(reader),
            cursor_client,
            id,
            described,
            page_filter: filter.map(str::to_owned),
            after,
            end,
            done_before,
            estimate,
            live_until: Some(snapshot_lsn),
        },
        &RunOptions {
            page_size: args.page_size,
            max_in_flight: args.max_in_flight,
            rate: args.rate,
            skip_check_limit: args.skip_check_limit,
            progress_interval: args.progress_interval,
            log_progress: false,
            progress_mode: super::progress::Mode::for_stderr(args.log_json),
        },
        &shutdown,
    )
    .await
}
