//! The tasks that run beside the relay's sessions: the publication drift check, the progress
//! log and the sampler behind `/metrics`, `/readyz` and `/status`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use relay_core::Lsn;
use relay_core::pipeline::PipelineStats;
use relay_postgres::catalog::publication_problem;
use relay_postgres::catalog::retention::{self, RetentionWindow, TakeoverPolicy, WalRateTracker};
use relay_postgres::session::{KeptSession, Ticks};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::inspect::{self, StreamLookup};
use relay_telemetry::{StreamSample, Telemetry, WAL_RATE_WINDOW};

/// Every `[relay] publication_check_interval`, checks on a plain session that the publication
/// still delivers inserts of every outbox table; if not, records why and cancels `stop`.
pub(super) fn spawn_publication_check(
    config: RelayConfig,
    stop: CancellationToken,
    drift: Arc<std::sync::Mutex<Option<String>>>,
) {
    tokio::spawn(async move {
        let mut session = KeptSession::new(config.postgres.clone(), "publication check", None);
        let mut ticks =
            Ticks::every_after(config.relay.publication_check_interval, stop.clone()).await;
        let tables = config.tables();
        while ticks.next().await {
            let Some(c) = session.get().await else {
                continue;
            };
            match publication_problem(c, &config.postgres.publication, &tables).await {
                Ok(None) => {}
                Ok(Some(problem)) => {
                    tracing::error!(publication = %config.postgres.publication, "{problem}");
                    if let Ok(mut d) = drift.lock() {
                        *d = Some(problem);
                    }
                    stop.cancel();
                    return;
                }
                Err(error) => {
                    tracing::debug!(error = %error, "cannot check the publication");
                    session.drop_session();
                }
            }
        }
    });
}

/// Logs throughput and position every 30 s, so an operator sees progress without metrics.
pub(super) fn spawn_progress_log(stats: Arc<PipelineStats>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut ticks = Ticks::every_after(Duration::from_secs(30), shutdown).await;
        while ticks.next().await {
            tracing::info!(
                events_published = stats.events_published.load(Ordering::Relaxed),
                duplicates = stats.duplicates.load(Ordering::Relaxed),
                publish_retries = stats.publish_retries.load(Ordering::Relaxed),
                in_flight = stats.in_flight.load(Ordering::Relaxed),
                confirmed_lsn = %Lsn(stats.confirmed_lsn.load(Ordering::Relaxed)),
                "progress"
            );
        }
    });
}

/// Samples the slot (lag, `wal_status`, retention window) and the stream every
/// `[http] sample_interval`, for `/metrics`, `/readyz` and `/status`. Uses its own plain
/// PostgreSQL session. The WAL rate behind the retention window is a moving rate over the
/// WAL positions of the last [`WAL_RATE_WINDOW`] of samples.
pub(super) fn spawn_sampler(
    config: RelayConfig,
    telemetry: Arc<Telemetry>,
    context: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut session = KeptSession::new(config.postgres.clone(), "sampler", None);
        let mut ticks = Ticks::every(config.http.sample_interval, shutdown.clone());
        let slot = config.postgres.slot.as_str();
        let policy = TakeoverPolicy {
            budget: config.relay.takeover_budget,
            standby_poll: config.relay.standby_poll_interval,
        };
        let mut wal_rate = WalRateTracker::new(WAL_RATE_WINDOW);
        while ticks.next().await {
            // The slot sample and the retention window are published together, after both
            // queries, so that one scrape never shows a new safe_wal_size beside an old rate.
            let mut slot_sample = None;
            if let Some(c) = session.get().await {
                match inspect::slot(c, slot).await {
                    Ok(sample) => slot_sample = Some(sample),
                    Err(error) => {
                        tracing::debug!(error = %error, "cannot sample the slot");
                        session.drop_session();
                    }
                }
            }
            let mut window = None;
            if let Some(c) = session.get().await {
                match retention::facts(c, slot).await {
                    Ok(facts) => {
                        if let Some(position) = facts.wal_position {
                            wal_rate.push(Instant::now(), position);
                        }
                        window = Some(RetentionWindow::assess(facts, wal_rate.rate(), policy));
                    }
                    Err(error) => {
                        tracing::debug!(error = %error, "cannot sample the retention window");
                        session.drop_session();
                    }
                }
            }
            telemetry.set_slot_and_retention(slot_sample, window);
            let lookup = tokio::time::timeout(
                Duration::from_secs(2),
                inspect::stream(&context, &config.nats.stream),
            )
            .await;
            match lookup {
                Ok(StreamLookup::Found(info)) => telemetry.set_stream(StreamSample {
                    present: true,
                    last_seq: info.state.last_sequence,
                    messages: info.state.messages,
                }),
                Ok(StreamLookup::NotFound) => telemetry.set_stream_present(false),
                // No answer: NATS readiness already shows it; keep the last sample.
                _ => {}
            }
        }
    });
}

/// How often the outbox tables are sampled for `/metrics` and `/status` (at least; more often
/// the sample is not worth its queries).
const TABLE_SAMPLE_EVERY: Duration = Duration::from_secs(15);

/// The tasks that look after the outbox tables: the per-table sampler behind `/metrics` and
/// `/status` (when `[http] listen` is set), and one cleanup task per `[outbox.cleanup]`.
pub(super) fn spawn_outbox_upkeep(
    config: RelayConfig,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
) {
    for (table, cleanup) in config.outbox.cleanup() {
        let (schema, name) = table.qualified_name();
        let qualified = table.display_name();
        telemetry.update_table(&qualified, |t| t.cleanup_mode = Some(cleanup.mode.as_str()));
        let task = relay_cleanup::CleanupTask {
            slot: config.postgres.slot.clone(),
            publication: config.postgres.publication.clone(),
            table: qualified,
            schema: schema.to_string(),
            name: name.to_string(),
            interval: cleanup.interval,
            batch_pause: cleanup.batch_pause,
            max_wait: config.relay.idle_checkpoint_interval * 3
                + config.relay.checkpoint_interval
                + Duration::from_secs(10),
            rows: cleanup.row_plans(&schema, &name, table.row_filter.as_deref()),
            drops: cleanup.drop_plan(&schema, &name),
        };
        tokio::spawn(task.run(config.postgres.clone(), telemetry.clone(), shutdown.clone()));
    }
    if config.http.listen.is_some() {
        let every = config.http.sample_interval.max(TABLE_SAMPLE_EVERY);
        tokio::spawn(table_sampler(config, telemetry, shutdown, every));
    }
}

/// Samples each outbox table every `every`: rows (estimate) and size, and how old its oldest
/// row not yet confirmed is.
///
/// "Not yet confirmed", without reading every row's transaction: each sample notes the pair
/// (time T, WAL insert position W), W read before T. A row created after T (its transaction
/// started after T, so it commits after W) is behind the stored checkpoint C only if C is past
/// W. So with (T*, W*) the newest pair with W* at or behind C, the rows created after T* are the
/// candidates, and the oldest of them is the age reported. It errs by at most one sample
/// interval on the late side (rows created between T* and when C passed W*), and a row of a
/// transaction that stayed open longer than that counts from its `created_at`, not its commit.
/// Right after a start, before C passed the first W, the position map's newest commit behind C
/// stands in for T*; without one, the first sample's time (nothing since is confirmed: a lower
/// bound).
async fn table_sampler(
    config: RelayConfig,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
    every: Duration,
) {
    // A big table without an index on its time column must not hold the sampler.
    let mut session = KeptSession::new(
        config.postgres.clone(),
        "outbox table sampler",
        Some("SET statement_timeout = 5000"),
    );
    let mut ticks = Ticks::every(every, shutdown);
    let mut pairs: std::collections::VecDeque<(f64, Lsn)> = std::collections::VecDeque::new();
    while ticks.next().await {
        let Some(c) = session.get().await else {
            continue;
        };
        if let Err(error) = sample_tables(c, &config, &telemetry, &mut pairs).await {
            tracing::debug!(error = %error, "cannot sample the outbox tables");
            session.drop_session();
        }
    }
}

async fn sample_tables(
    client: &tokio_postgres::Client,
    config: &RelayConfig,
    telemetry: &Telemetry,
    pairs: &mut std::collections::VecDeque<(f64, Lsn)>,
) -> Result<(), tokio_postgres::Error> {
    use relay_postgres::catalog::outbox_stats;
    pairs.push_back(outbox_stats::position_now(client).await?);
    let slot = &config.postgres.slot;
    let checkpoint = relay_cleanup::stored_checkpoint(client, slot)
        .await
        .ok()
        .flatten();
    // The newest pair behind the checkpoint, and every later one, are all that can matter.
    let behind = |lsn: Lsn| checkpoint.is_some_and(|c| lsn <= c);
    while pairs.len() > 1 && pairs.get(1).is_some_and(|(_, w)| behind(*w)) {
        pairs.pop_front();
    }
    let mut since = pairs.front().filter(|(_, w)| behind(*w)).map(|(t, _)| *t);
    if since.is_none()
        && let Some(c) = checkpoint
    {
        since = outbox_stats::confirmed_since_from_map(client, slot, c).await;
    }
    // Nothing known behind the checkpoint: nothing written since the first sample is confirmed,
    // so the oldest row since then is a lower bound (older rows may wait too).
    let since = since.or(pairs.front().map(|(t, _)| *t));
    for table in config.outbox.iter() {
        let (schema, name) = table.qualified_name();
        let age = crate::config::age_spec_of(config.outbox.cleanup_of(&schema, &name));
        let Some(sample) = outbox_stats::sample(client, &schema, &name, &age, since).await? else {
            continue;
        };
        telemetry.update_table(&table.display_name(), |t| {
            t.rows_estimate = Some(sample.rows_estimate);
            t.size_bytes = Some(sample.size_bytes);
            t.oldest_unconfirmed_age = sample.oldest_unconfirmed_age;
        });
    }
    Ok(())
}
