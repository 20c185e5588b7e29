//! Signals from SQL: `outbox_relay.signal` (`migrations/0008_relay_signal.sql`). A row inserted
//! there asks the running relay to do something; the relay claims it, carries it out and writes
//! its progress, outcome or error back into the row. This module is the table's SQL and the
//! session that listens for new rows; what a kind means is the runtime's.
//!
//! The row is the durable state, not the notification: a `NOTIFY` sent while no relay listens
//! is gone, so a relay reads the open rows whenever it starts listening (at start, and after
//! every reconnection), then follows the notifications, which arrive in commit order.

use tokio_postgres::Client;

use relay_postgres::catalog::relay_tables::{TableAccess, signal_table_access};
use relay_postgres::{Notifications, PgError, PostgresSettings};

/// The migration that creates the table and its trigger (also shipped in `migrations/`).
pub const SIGNAL_MIGRATION: &str = include_str!("../../../migrations/0008_relay_signal.sql");

/// The channel the table's trigger notifies with each new row's id.
pub const SIGNAL_CHANNEL: &str = "outbox_relay_signal";

fn query_err(context: &'static str) -> impl Fn(tokio_postgres::Error) -> PgError {
    move |source| PgError::Query {
        context: context.into(),
        source,
    }
}

/// Creates `outbox_relay.signal` when missing; an error names the grant or migration to apply
/// when the relay's role cannot create or use it.
pub async fn ensure_signal_table(client: &Client) -> Result<(), PgError> {
    let access = signal_table_access(client)
        .await
        .map_err(query_err("cannot look up outbox_relay.signal"))?;
    match access {
        TableAccess::Usable => Ok(()),
        TableAccess::Missing => client.batch_execute(SIGNAL_MIGRATION).await.map_err(query_err(
            "outbox_relay.signal does not exist and the relay's role cannot create it: apply migrations/0008_relay_signal.sql as an administrator (or run `outbox-relay setup`), and GRANT SELECT, UPDATE ON outbox_relay.signal to the relay's role",
        )),
        TableAccess::NotGranted { role } => Err(PgError::RelayTableNotGranted {
            table: "outbox_relay.signal",
            role,
            grant: "SELECT, UPDATE",
        }),
    }
}

/// A session listening on [`SIGNAL_CHANNEL`]: its client for the table's SQL, and the ids of new
/// rows in commit order.
#[derive(Debug)]
pub struct SignalSession {
    pub client: Client,
    pub new_rows: Notifications,
}

impl SignalSession {
    /// Connects, makes sure the table is there and starts listening. Rows inserted before the
    /// `LISTEN` are not notified: read [`open_signals`] after this.
    pub async fn connect(settings: &PostgresSettings) -> Result<Self, PgError> {
        let (client, new_rows) = relay_postgres::connect_with_notifications(settings).await?;
        client
            .batch_execute("SET application_name = 'outbox-relay signals'")
            .await
            .map_err(query_err("cannot set up the signal session"))?;
        ensure_signal_table(&client).await?;
        client
            .batch_execute(&format!("LISTEN {SIGNAL_CHANNEL}"))
            .await
            .map_err(query_err("cannot LISTEN for signals"))?;
        Ok(Self { client, new_rows })
    }
}

/// The id a notification carries, when it is one of the table's.
pub fn notified_id(notification: &tokio_postgres::Notification) -> Option<i64> {
    (notification.channel() == SIGNAL_CHANNEL)
        .then(|| notification.payload().trim().parse().ok())
        .flatten()
}

/// The open rows the relay of `slot` may carry out, oldest first: requested for it or for any
/// relay, and those it claimed and did not finish (it stopped while they ran).
pub async fn open_signals(client: &Client, slot: &str) -> Result<Vec<i64>, PgError> {
    let rows = client
        .query(
            "SELECT id FROM outbox_relay.signal \
             WHERE (state = 'requested' AND (slot_name IS NULL OR slot_name = $1)) \
                OR (state = 'running' AND claimed_by = $1) \
             ORDER BY id",
            &[&slot],
        )
        .await
        .map_err(query_err("cannot read the open signals"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// A signal the relay claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedSignal {
    pub id: i64,
    pub kind: String,
    /// `args` as JSON text.
    pub args: String,
    /// It was running before: the relay stopped while carrying it out and resumes it now.
    pub resumed: bool,
    /// When a relay first claimed it, `YYYY-MM-DDTHH:MM:SSZ` (UTC).
    pub started_at: String,
    /// When it was inserted, microseconds since the Unix epoch.
    pub requested_at_unix_micros: i64,
}

/// Claims row `id` for the relay of `slot` (state `running`), unless another relay took it,
/// it names another slot, or it is finished: then `None`.
pub async fn claim(client: &Client, id: i64, slot: &str) -> Result<Option<ClaimedSignal>, PgError> {
    let row = client
        .query_opt(
            "WITH before AS ( \
                 SELECT id, state FROM outbox_relay.signal WHERE id = $1 \
                 AND ((state = 'requested' AND (slot_name IS NULL OR slot_name = $2)) \
                      OR (state = 'running' AND claimed_by = $2)) \
                 FOR UPDATE) \
             UPDATE outbox_relay.signal s SET state = 'running', claimed_by = $2, \
                    started_at = coalesce(s.started_at, now()), updated_at = now(), \
                    progress = NULL \
             FROM before WHERE s.id = before.id \
             RETURNING s.kind, s.args::text, before.state = 'running', \
                       to_char(s.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                       (extract(epoch FROM s.requested_at) * 1000000)::bigint",
            &[&id, &slot],
        )
        .await
        .map_err(query_err("cannot claim a signal"))?;
    Ok(row.map(|r| ClaimedSignal {
        id,
        kind: r.get(0),
        args: r.get(1),
        resumed: r.get(2),
        started_at: r.get(3),
        requested_at_unix_micros: r.get(4),
    }))
}

/// Writes `progress` (a JSON object's text) into row `id`, while the relay of `slot` runs it.
pub async fn record_progress(
    client: &Client,
    id: i64,
    slot: &str,
    progress: &str,
) -> Result<(), PgError> {
    client
        .execute(
            "UPDATE outbox_relay.signal SET progress = $2::text::jsonb, updated_at = now() \
             WHERE id = $1 AND state = 'running' AND claimed_by = $3",
            &[&id, &progress, &slot],
        )
        .await
        .map_err(query_err("cannot record a signal's progress"))?;
    Ok(())
}

/// Notes in row `id`, while it waits for the relay of `slot`, that signal `behind` runs first.
/// A row for another relay, or already claimed, is left alone.
pub async fn note_waiting(
    client: &Client,
    id: i64,
    slot: &str,
    behind: i64,
) -> Result<(), PgError> {
    client
        .execute(
            "UPDATE outbox_relay.signal \
             SET progress = jsonb_build_object('waiting_behind', $3::bigint), updated_at = now() \
             WHERE id = $1 AND state = 'requested' AND (slot_name IS NULL OR slot_name = $2)",
            &[&id, &slot, &behind],
        )
        .await
        .map_err(query_err("cannot note that a signal waits"))?;
    Ok(())
}

/// How a signal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalEnd {
    /// Carried out; what it did.
    Done { outcome: String },
    /// Not carried out (or not to the end); why, and what to do.
    Failed { error: String },
}

/// Marks row `id` finished (`done` or `failed`), with its last progress (JSON text) if any.
pub async fn finish(
    client: &Client,
    id: i64,
    end: &SignalEnd,
    progress: Option<&str>,
) -> Result<(), PgError> {
    let (state, outcome, error) = match end {
        SignalEnd::Done { outcome } => ("done", Some(outcome.as_str()), None),
        SignalEnd::Failed { error } => ("failed", None, Some(error.as_str())),
    };
    client
        .execute(
            "UPDATE outbox_relay.signal SET state = $2, outcome = $3, error = $4, \
                    progress = coalesce($5::text::jsonb, progress), \
                    finished_at = now(), updated_at = now() \
             WHERE id = $1",
            &[&id, &state, &outcome, &error, &progress],
        )
        .await
        .map_err(query_err("cannot record how a signal ended"))?;
    Ok(())
}

/// A signal row as the console shows it.
#[derive(Debug, Clone)]
pub struct SignalRow {
    pub id: i64,
    pub kind: String,
    /// `args` as JSON text.
    pub args: String,
    pub slot_name: Option<String>,
    pub requested_by: String,
    pub requested_at: String,
    pub state: String,
    pub claimed_by: Option<String>,
    pub finished_at: Option<String>,
    /// `progress` as JSON text.
    pub progress: Option<String>,
    pub outcome: Option<String>,
    pub error: Option<String>,
}

/// The newest `limit` signal rows, newest first; empty when the table does not exist.
pub async fn recent_signals(client: &Client, limit: i64) -> Result<Vec<SignalRow>, PgError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('outbox_relay.signal') IS NOT NULL", &[])
        .await
        .map_err(query_err("cannot look up outbox_relay.signal"))?
        .get(0);
    if !exists {
        return Ok(Vec::new());
    }
    const TIME: &str = "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'";
    let rows = client
        .query(
            &format!(
                "SELECT id, kind, args::text, slot_name, requested_by, \
                        to_char(requested_at AT TIME ZONE 'UTC', {TIME}), state, claimed_by, \
                        to_char(finished_at AT TIME ZONE 'UTC', {TIME}), progress::text, \
                        outcome, error \
                 FROM outbox_relay.signal ORDER BY id DESC LIMIT $1"
            ),
            &[&limit],
        )
        .await
        .map_err(query_err("cannot read outbox_relay.signal"))?;
    Ok(rows
        .iter()
        .map(|r| SignalRow {
            id: r.get(0),
            kind: r.get(1),
            args: r.get(2),
            slot_name: r.get(3),
            requested_by: r.get(4),
            requested_at: r.get(5),
            state: r.get(6),
            claimed_by: r.get(7),
            finished_at: r.get(8),
            progress: r.get(9),
            outcome: r.get(10),
            error: r.get(11),
        })
        .collect())
}

/// Inserts a signal (`args`: a JSON object's text) for the relay of `slot`, in the name of
/// `requested_by`; its id.
pub async fn insert_signal(
    client: &Client,
    kind: &str,
    args: &str,
    slot: &str,
    requested_by: &str,
) -> Result<i64, PgError> {
    Ok(client
        .query_one(
            "INSERT INTO outbox_relay.signal (kind, args, slot_name, requested_by) \
             VALUES ($1, $2::text::jsonb, $3, $4) RETURNING id",
            &[&kind, &args, &slot, &requested_by],
        )
        .await
        .map_err(query_err("cannot insert a signal"))?
        .get(0))
}
