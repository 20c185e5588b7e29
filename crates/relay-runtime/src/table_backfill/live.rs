//! What a backfill leaves out: the rows the stream already holds and those the running relay
//! publishes meanwhile (event ids read and watched with relay-nats' backfill helpers), and when
//! the watch may end.

use std::collections::HashSet;
use std::time::Duration;

use relay_core::Lsn;
use relay_core::id_digest::{IdDigest, SharedIds};
use relay_nats::{JetStream, StreamIds, StreamReport};
use relay_postgres::PostgresSettings;
use tokio_util::sync::CancellationToken;

/// The watch of the relay's live messages: the ids it noted, and its tasks.
pub(super) struct LiveWatch {
    pub(super) ids: SharedIds,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl LiveWatch {
    /// No watch (`--skip-check-limit 0`).
    pub(super) fn none() -> Self {
        Self {
            ids: SharedIds::default(),
            tasks: Vec::new(),
            stop: CancellationToken::new(),
        }
    }

    /// Watches `table`'s messages on the stream's subjects; with `live_until`, until the relay's
    /// checkpoint reached it. Started before the stream's ids are read: no gap between.
    pub(super) async fn start(
        postgres: &PostgresSettings,
        client: &async_nats::Client,
        report: &StreamReport,
        table: &str,
        live_until: Option<Lsn>,
    ) -> Self {
        let stop = CancellationToken::new();
        let (ids, tasks) = relay_nats::watch_live(client, &report.subjects, table, &stop).await;
        if let Some(snapshot_lsn) = live_until {
            tokio::spawn(end_watch_when_relay_passes(
                postgres.clone(),
                snapshot_lsn,
                client.clone(),
                stop.clone(),
            ));
        }
        Self { ids, tasks, stop }
    }

    /// Ends the watch.
    pub(super) fn end(self) {
        self.stop.cancel();
        for task in self.tasks {
            task.abort();
        }
    }
}

/// The event ids the stream holds for `table`, when it holds at most `limit` messages; none
/// (with a warning naming what that costs) when it holds more or cannot be read.
pub(super) async fn stream_ids(
    jetstream: &JetStream,
    stream: &str,
    table: &str,
    limit: u64,
    duplicate_window: Duration,
) -> HashSet<IdDigest> {
    match relay_nats::stream_ids(jetstream, stream, table, limit).await {
        Ok(StreamIds::Read(ids)) => {
            tracing::info!(
                stream,
                events = ids.len(),
                "read the event ids the stream holds for the table: those rows are skipped"
            );
            ids
        }
        Ok(StreamIds::TooLarge(messages)) => {
            tracing::warn!(
                stream,
                messages,
                limit,
                ?duplicate_window,
                "the stream is too large to read its event ids: a row it already holds is dropped by JetStream only if stored within the duplicate window, else stored again (consumers dedupe by event id); raise --skip-check-limit to read them"
            );
            HashSet::new()
        }
        // E.g. no permission to create a consumer: the check is lost, not the backfill.
        Err(e) => {
            tracing::warn!(
                stream,
                error = %e,
                ?duplicate_window,
                "cannot read the stream's event ids: a row it already holds is dropped by JetStream only if stored within the duplicate window, else stored again (consumers dedupe by event id)"
            );
            HashSet::new()
        }
    }
}

/// How often [`end_watch_when_relay_passes`] reads the relay's checkpoint.
const CHECKPOINT_POLL: Duration = Duration::from_millis(250);

/// Ends the watch of the relay's live messages (cancels `stop`) once the relay's stored
/// checkpoint of `slot` reached `snapshot_lsn`, the WAL position after the backfill's read
/// snapshot: the relay has then published every row the pages can return that it will ever
/// publish (what it publishes later was committed after the snapshot, and the pages do not see
/// it), so watching on would only cost a copy of every message the backfill sends, which the
/// subscription receives too. Before it ends, a round trip to the server, so that the relay's
/// messages the server sent before are noted. Keeps watching if the checkpoint cannot be read.
async fn end_watch_when_relay_passes(
    postgres: PostgresSettings,
    snapshot_lsn: Lsn,
    client: async_nats::Client,
    stop: CancellationToken,
) {
    let session = match relay_postgres::connect(&postgres).await {
        Ok(session) => session,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the relay's checkpoint: watching its live messages until the backfill ends");
            return;
        }
    };
    let reached = loop {
        match relay_postgres::catalog::stored_checkpoint(&session, &postgres.slot).await {
            Ok(Some((checkpoint, _))) if checkpoint >= snapshot_lsn => break checkpoint,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(slot = %postgres.slot, error = %e, "cannot read the relay's checkpoint: watching its live messages until the backfill ends");
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(CHECKPOINT_POLL) => {}
            () = stop.cancelled() => return,
        }
    };
    if let Err(e) = client.flush().await {
        tracing::warn!(error = %e, "cannot confirm the relay's last live messages: watching them until the backfill ends");
        return;
    }
    tracing::info!(
        slot = %postgres.slot,
        checkpoint = %reached,
        snapshot_lsn = %snapshot_lsn,
        "the relay's checkpoint passed the backfill's snapshot: no longer watching its live messages"
    );
    stop.cancel();
}
