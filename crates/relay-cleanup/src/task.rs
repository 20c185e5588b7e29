//! The cleanup task of one `[outbox.cleanup]` table: a session of its own, rounds every
//! `interval`, small batches with a pause between them. What may be cleaned and why it is safe
//! is the plans' business ([`RowPlan`], [`DropPlan`]); this drives them and reports through
//! [`CleanupReport`], so that the telemetry model stays out of this crate.
//!
//! Pause points (`RELAY_PAUSE`, `failpoints` feature, [`relay_core::failpoint::pause`]):
//! `cleanup_selected` (a batch selected, its horizon read), `cleanup_confirmed` (the stored
//! checkpoint seen past the horizon, nothing applied yet), `cleanup_detached` (a round of
//! drop-partitions done).

use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_core::failpoint;
use tokio_util::sync::CancellationToken;

use super::{AgeColumn, Applied, Batch, DropPlan, RowPlan, stored_checkpoint};
use relay_postgres::PostgresSettings;
use relay_postgres::session::{KeptSession, Ticks};

/// What a cleanup task tells whoever watches it (`/metrics`, `/status`), per table.
pub trait CleanupReport: Send + Sync {
    /// `rows` rows of a batch of `batch` cleaned: they no longer wait.
    fn cleaned(&self, table: &str, rows: u64, batch: u64);
    /// `dropped` partitions dropped this round; `waiting` detached ones still wait for the
    /// checkpoint.
    fn partitions_dropped(&self, table: &str, dropped: u64, waiting: u64);
    /// Rows selected and waiting for the checkpoint.
    fn waiting(&self, table: &str, rows: u64);
    /// A round failed, and why (counted, and kept as the last error).
    fn failed(&self, table: &str, problem: String);
}

/// One table's cleanup.
#[derive(Debug)]
pub struct CleanupTask {
    /// The relay's slot, whose stored checkpoint decides what is behind it.
    pub slot: String,
    /// The relay's publication (the fence needs the table in it).
    pub publication: String,
    /// `schema.table`, as the configuration writes it.
    pub table: String,
    /// The catalog's schema.
    pub schema: String,
    /// The catalog's table.
    pub name: String,
    /// How often a round starts.
    pub interval: Duration,
    /// The pause between two applied batches.
    pub batch_pause: Duration,
    /// How long a batch waits for the checkpoint to pass its horizon before it is dropped (and
    /// selected again next round).
    pub max_wait: Duration,
    /// Run in this order each round (`mark`, then `delete_after`'s delete).
    pub rows: Vec<RowPlan>,
    /// Drop-partitions, when the table is cleaned by partition.
    pub drops: Option<DropPlan>,
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
    /// Runs rounds until `shutdown`, on a session of its own.
    pub async fn run(
        self,
        postgres: PostgresSettings,
        report: Arc<dyn CleanupReport>,
        shutdown: CancellationToken,
    ) {
        let mut session = KeptSession::new(postgres, "cleanup", None);
        let mut ticks = Ticks::every(self.interval, shutdown.clone());
        let mut tables_ready = false;
        while ticks.next().await {
            let Some(c) = session.get().await else {
                continue;
            };
            if !tables_ready {
                match super::ensure_tables(c).await {
                    Ok(()) => tables_ready = true,
                    Err(problem) => {
                        self.failed(&*report, format!("cleanup is off: {problem}"));
                        continue;
                    }
                }
            }
            let round = async {
                let (schema, name) = (&self.schema, &self.name);
                let Some(fence) =
                    super::fence(c, &self.slot, schema, name, &self.publication).await?
                else {
                    tracing::debug!(table = %self.table, "no cleanup fence yet (the slot, its checkpoint or the table's publication is missing): nothing is cleaned");
                    return Ok(None);
                };
                for plan in &self.rows {
                    // Read every round: a column whose type no longer fits cleans nothing.
                    let age = match plan.age_column(c).await? {
                        Ok(age) => age,
                        Err(problem) => {
                            self.failed(&*report, problem);
                            continue;
                        }
                    };
                    if let Some(end) = self
                        .rows_round(c, plan, age.as_ref(), &fence, &*report, &shutdown)
                        .await?
                    {
                        return Ok(Some(end));
                    }
                }
                if let Some(plan) = &self.drops {
                    let dropped = plan.round(c, &self.slot, &fence).await?;
                    for name in &dropped.detached {
                        tracing::info!(table = %self.table, partition = %name, "partition detached by cleanup");
                    }
                    for name in &dropped.dropped {
                        tracing::info!(table = %self.table, partition = %name, "partition dropped by cleanup: every row of it is behind the stored checkpoint");
                    }
                    for problem in [&dropped.ahead_problem, &dropped.key_problem]
                        .into_iter()
                        .flatten()
                    {
                        self.failed(&*report, problem.clone());
                    }
                    report.partitions_dropped(
                        &self.table,
                        dropped.dropped.len() as u64,
                        dropped.waiting as u64,
                    );
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
                        &*report,
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

    fn failed(&self, report: &dyn CleanupReport, problem: String) {
        tracing::warn!(table = %self.table, problem = %problem, "outbox cleanup round failed; nothing past the stored checkpoint was touched. `outbox-relay validate --connect` checks the privileges cleanup needs");
        report.failed(&self.table, problem);
    }

    /// Batches until one comes back short, the checkpoint does not pass a batch in time, or
    /// shutdown.
    async fn rows_round(
        &self,
        client: &mut tokio_postgres::Client,
        plan: &RowPlan,
        age: Option<&AgeColumn>,
        fence: &str,
        report: &dyn CleanupReport,
        shutdown: &CancellationToken,
    ) -> Result<Option<RoundEnd>, tokio_postgres::Error> {
        loop {
            let limit = plan.batch_size * BATCHES_PER_SELECT;
            let selected = plan.select(client, limit, fence, age).await?;
            report.waiting(&self.table, selected.len() as u64);
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
                        report.cleaned(&self.table, n, batch.len() as u64);
                        tracing::debug!(table = %self.table, rows = n, horizon = %batch.horizon, "cleaned rows behind the stored checkpoint");
                    }
                    Applied::NotConfirmed(_) => return Ok(None),
                }
                tokio::select! {
                    () = tokio::time::sleep(self.batch_pause) => {}
                    () = shutdown.cancelled() => return Ok(Some(RoundEnd::Shutdown)),
                }
            }
            report.waiting(&self.table, 0);
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
