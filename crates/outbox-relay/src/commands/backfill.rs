//! `outbox-relay backfill --table T [--where COND]`: publishes the rows an outbox table already
//! held before the relay's slot existed, beside the running relay, resumably.
//!
//! Each row goes through the relay's own pipeline (route, limits, dead letters, publish with
//! retries, ack frontier) as an Insert of a pgoutput transaction of its page
//! ([`relay_backfill::PageSource`]), so it is published exactly as the relay would
//! publish it, plus `Outbox-Backfill: true`. The cursor (`outbox_relay.backfill`) moves over a
//! page only after JetStream acknowledged every row up to it, so a killed backfill resumes at
//! its cursor and re-sends at most the unacknowledged tail (deduplicated by event id). See
//! docs/replay.md. This command reads the cursor and decides where to start; the run itself is
//! [`relay_runtime::table_backfill`], which the relay's backfill at slot creation and the
//! `backfill` signal from SQL share.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::exit::Failure;
use relay_runtime::config::RelayConfig;
use relay_runtime::table_backfill::{BackfillOutcome, BackfillRequest, RunOptions};

/// `outbox-relay backfill`'s options.
#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    /// The outbox table, `schema.table` or `table` (in `public`), as in `[[outbox]] table`.
    #[arg(long)]
    pub table: String,
    /// Only rows matching this SQL condition on the table, e.g.
    /// "created_at > now() - interval '7 days'". One condition: it closes every parenthesis it
    /// opens and none it did not open, with no `;` and no comment. Each filter has its own
    /// cursor.
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

/// Runs one backfill of `args.table` until it finished, was stopped, or failed.
pub async fn backfill(config: &RelayConfig, args: BackfillArgs) -> Result<(), Failure> {
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "stop requested: waiting for outstanding acks, then storing the cursor",
        "second signal: exiting now; the next run re-sends what was not acknowledged",
    );
    let request = BackfillRequest {
        table: args.table.clone(),
        filter: args.filter.clone(),
        restart: args.restart,
        options: run_options(&args),
    };
    match relay_runtime::table_backfill::backfill(config, &request, &shutdown).await? {
        // The run's own summary said it.
        BackfillOutcome::Finished { .. } => {}
        BackfillOutcome::FinishedBefore {
            described,
            finished_at,
            rows_done,
        } => eprintln!(
            "backfill {described} finished at {finished_at}: {rows_done} rows; --restart runs it again"
        ),
        no_rows @ BackfillOutcome::NoRows { .. } => eprintln!("{no_rows}"),
    }
    Ok(())
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
