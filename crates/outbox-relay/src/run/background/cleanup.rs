//! The cleanup task of one `[outbox.cleanup]` table: a session of its own, rounds every
//! `interval`, small batches with a pause between them. What may be cleaned and why it is safe
//! is `relay_postgres::cleanup`'s business; this drives it and reports.
//!
//! Pause points (`RELAY_PAUSE`, `failpoints` feature): `cleanup_selected` (a batch selected, its
//! horizon read), `cleanup_confirmed` (the stored checkpoint seen past the horizon, nothing
//! applied yet), `cleanup_detached` (a round of drop-partitions done).

use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_postgres::PostgresSettings;
use relay_postgres::cleanup::{AgeColumn, Applied, Batch, DropPlan, RowPlan, stored_checkpoint};
use tokio_util::sync::CancellationToken;

use super::super::failpoint;
use crate::telemetry::Telemetry;

/// One table's cleanup.
#[derive(Debug)]
pub(super) struct CleanupTask {
    pub(super) slot: String,
    pub(super) publication: String,
    /// `schema.table`, as the configuration writes it.
    pub(super) table: String,
    /// The catalog's schema and table.
    pub(super) schema: String,
    pub(super) name: String,
    pub(super) interval: Duration,
    pub(super) batch_pause: Duration,
    /// How long a batch waits for the checkpoint to pass its horizon before it is dropped (and
    /// selected again next round).
    pub(super) max_wait: Duration,
    /// Run in this order each round (`mark`, then `delete_after`'s delete).
    pub(super) rows: Vec<RowPlan>,
    pub(super) drops: Option<DropPlan>,
}

/// Batches of `batch_size` selected at once: they share one wait for the checkpoint (on a quiet
/// database that is an idle checkpoint interval), and are applied one by one.
const BATCHES_PER_SELECT: i64 = 10;

/// Why a round ended early.
enum RoundEnd {
    Shutdown,
}

impl CleanupTask {
    // Long: one `select!` loop of cleanup rounds; its arms share the session, the backoff and the
    // shutdown
    pub(super) async fn run(
        self,
        postgres: PostgresSettings,
        telemetry: Arc<Telemetry>,
        shutdown: CancellationToken,
    ) {
        let mut session = relay_postgres::session::KeptSession::new(postgres, "cleanup", None);
        let mut ticks = relay_postgres::session::Ticks::every(self.interval, shutdown.clone());
        let mut tables_ready = false;
        while ticks.next().await {
            let Some(c) = session.get().await else {
                continue;
            };
            if !tables_ready {
                match relay_postgres::cleanup::ensure_tables(c).await {
                    Ok(()) => tables_ready = true,
                    Err(problem) => {
                        self.failed(&telemetry, format!("cleanup is off: {problem}"));
                        continue;
                    }
                }
            }
            let round = async {
                let (schema, name) = (&self.schema, &self.name);
                let Some(fence) =
                    relay_postgres::cleanup::fence(c, &self.slot, schema, name, &self.publication)
                        .await?
                else {
                    tracing::debug!(table = %self.table, "no cleanup fence yet (the slot, its checkpoint or the table's publication is missing): nothing is cleaned");
                    return Ok(None);
                };
                for plan in &self.rows {
                    // Read every round: a column whose type no longer fits cleans nothing.
                    let age = match plan.age_column(c).await? {
                        Ok(age) => age,
                        Err(problem) => {
                            self.failed(&telemetry, problem);
                            continue;
                        }
                    };
                    if let Some(end) = self
                        .rows_round(c, plan, age.as_ref(), &fence, &telemetry, &shutdown)
                        .await?
                    {
                        return Ok(Some(end));
                    }
                }
                if let Some(plan) = &self.drops {
                    let report = plan.round(c, &self.slot, &fence).await?;
                    for name in &report.detached {
                        tracing::info!(table = %self.table, partition = %name, "partition detached by cleanup");
                    }
                    for name in &report.dropped {
                        tracing::info!(table = %self.table, partition = %name, "partition dropped by cleanup: every row of it is behind the stored checkpoint");
                    }
                    for problem in [&report.ahead_problem, &report.key_problem]
                        .into_iter()
                        .flatten()
                    {
                        self.failed(&telemetry, problem.clone());
                    }
                    telemetry.update_table(&self.table, |t| {
                        t.dropped_partitions += report.dropped.len() as u64;
                        t.waiting = report.waiting as u64;
                    });
                    failpoint::pause("cleanup_detached").await;
                }
                Ok::<_, tokio_postgres::Error>(None)
            };
            match round.await {
                Ok(Some(RoundEnd::Shutdown)) => return,
                Ok(None) => {}
                Err(error) => {
                    let transient = relay_postgres::is_transient_query_error(&error);
                    self.failed(
                        &telemetry,
                        format!(
                            "{error}{}",
                            error
                                .as_db_error()
                                .map(|db| format!(": {}", db.message()))
                                .unwrap_or_default()
                        ),
                    );
                    if transient || c.is_closed() {
                        session.drop_session();
                    }
                }
            }
        }
    }

    fn failed(&self, telemetry: &Telemetry, problem: String) {
        tracing::warn!(table = %self.table, problem = %problem, "outbox cleanup round failed; nothing past the stored checkpoint was touched. `outbox-relay validate --connect` checks the privileges cleanup needs");
        telemetry.update_table(&self.table, |t| {
            t.cleanup_errors += 1;
            t.last_cleanup_error = Some(problem);
        });
    }

    /// Batches until one comes back short, the checkpoint does not pass a batch in time, or
    /// shutdown.
    async fn rows_round(
        &self,
        client: &mut tokio_postgres::Client,
        plan: &RowPlan,
        age: Option<&AgeColumn>,
        fence: &str,
        telemetry: &Telemetry,
        shutdown: &CancellationToken,
    ) -> Result<Option<RoundEnd>, tokio_postgres::Error> {
        loop {
            let limit = plan.batch_size * BATCHES_PER_SELECT;
            let selected = plan.select(client, limit, fence, age).await?;
            telemetry.update_table(&self.table, |t| t.waiting = selected.len() as u64);
            if selected.is_empty() {
                return Ok(None);
            }
            failpoint::pause("cleanup_selected").await;
            match self
                .wait_for_checkpoint(client, &selected, shutdown)
                .await?
            {
                Wait::Passed => {}
                Wait::TimedOut => return Ok(None),
                Wait::Shutdown => return Ok(Some(RoundEnd::Shutdown)),
            }
            failpoint::pause("cleanup_confirmed").await;
            let chunk = usize::try_from(plan.batch_size).unwrap_or(usize::MAX);
            for batch in selected.chunks(chunk) {
                match plan.apply(client, &self.slot, &batch, age).await? {
                    Applied::Done(n) => {
                        telemetry.update_table(&self.table, |t| {
                            t.cleaned_rows += n;
                            t.waiting = t.waiting.saturating_sub(batch.len() as u64);
                        });
                        tracing::debug!(table = %self.table, rows = n, horizon = %batch.horizon, "cleaned rows behind the stored checkpoint");
                    }
                    Applied::NotConfirmed(_) => return Ok(None),
                }
                tokio::select! {
                    () = tokio::time::sleep(self.batch_pause) => {}
                    () = shutdown.cancelled() => return Ok(Some(RoundEnd::Shutdown)),
                }
            }
            telemetry.update_table(&self.table, |t| t.waiting = 0);
            if (selected.len() as i64) < limit {
                return Ok(None);
            }
        }
    }

    /// Waits until the stored checkpoint is at or past the batch's horizon.
    async fn wait_for_checkpoint(
        &self,
        client: &tokio_postgres::Client,
        batch: &Batch,
        shutdown: &CancellationToken,
    ) -> Result<Wait, tokio_postgres::Error> {
        let deadline = Instant::now() + self.max_wait;
        loop {
            let checkpoint = stored_checkpoint(client, &self.slot).await?;
            if checkpoint.is_some_and(|c| c >= batch.horizon) {
                return Ok(Wait::Passed);
            }
            if Instant::now() >= deadline {
                tracing::debug!(
                    table = %self.table,
                    horizon = %batch.horizon,
                    checkpoint = ?checkpoint.map(|c| c.to_string()),
                    "the stored checkpoint did not pass the batch in time; selecting it again next round"
                );
                return Ok(Wait::TimedOut);
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
                () = shutdown.cancelled() => return Ok(Wait::Shutdown),
            }
        }
    }
}

enum Wait {
    Passed,
    TimedOut,
    Shutdown,
}
