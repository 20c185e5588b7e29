//! Every catalog query about the server, the outbox tables, the publication, the slot and the
//! stored checkpoint, in one place; only the reads that one concern alone makes live beside it,
//! in that concern's crate (`relay-backfill`: a table's shape; `relay-cleanup`: range
//! partitions, table privileges).
//!
//! Enforcing (`setup` and the start-up checks), reporting (`validate --connect`, `status`),
//! watching (the publication drift check) and observing (the metrics sampler) all read the
//! catalog through these functions, so they cannot disagree about what they see. They only
//! read; what to do about a finding is the caller's business.

mod age_column;
pub mod failover;
pub mod outbox_stats;
pub mod partitions;
pub(crate) mod publication_age;
mod publication_problem;
pub mod relay_tables;
pub mod restore_slot;
pub mod retention;
pub mod row_filter;

use std::str::FromStr;

use relay_core::Lsn;
use tokio_postgres::Client;

use crate::PgError;

mod slot_holder;
mod slot_report;
pub use publication_problem::publication_problem;
pub use slot_holder::slot_holder;
pub use slot_report::SlotReport;

fn lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| Lsn::from_str(&t).ok())
}

/// The server and the session's role, as far as the relay cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `wal_level`.
    pub wal_level: String,
    /// The connected database.
    pub database: String,
    /// The session's role.
    pub user: String,
    /// `server_version` (text).
    pub version: String,
    /// `server_version_num` (e.g. 150019).
    pub version_num: i32,
    /// `max_replication_slots`, and how many slots exist.
    pub replication_slots: (i32, i32),
    /// `max_wal_senders`, and how many are streaming.
    pub wal_senders: (i32, i32),
    /// Whether the role has REPLICATION (or is a superuser).
    pub can_replicate: bool,
    /// Whether the role may CREATE in the database (schemas: the checkpoint table).
    pub can_create_in_database: bool,
}

/// Reads [`ServerInfo`].
pub async fn server(client: &Client) -> Result<ServerInfo, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_setting('wal_level'), current_database()::text, current_user::text, \
                    current_setting('server_version'), \
                    current_setting('server_version_num')::int, \
                    current_setting('max_replication_slots')::int, \
                    (SELECT count(*)::int FROM pg_catalog.pg_replication_slots), \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*)::int FROM pg_catalog.pg_stat_replication), \
                    (SELECT rolreplication OR rolsuper FROM pg_catalog.pg_roles \
                      WHERE rolname = current_user), \
                    has_database_privilege(current_database(), 'CREATE')",
            &[],
        )
        .await?;
    Ok(ServerInfo {
        wal_level: row.get(0),
        database: row.get(1),
        user: row.get(2),
        version: row.get(3),
        version_num: row.get(4),
        replication_slots: (row.get(5), row.get(6)),
        wal_senders: (row.get(7), row.get(8)),
        can_replicate: row.get::<_, Option<bool>>(9).unwrap_or(false),
        can_create_in_database: row.get(10),
    })
}

/// An outbox table as the catalog has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    /// Relation OID.
    pub oid: u32,
    /// Whether the session's role may SELECT from it.
    pub readable: bool,
    /// A partitioned table (`relkind = 'p'`).
    pub partitioned: bool,
}

/// The table `schema.table` (ordinary or partitioned), or `None`.
pub async fn table(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<TableInfo>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT c.oid, has_table_privilege(c.oid, 'SELECT'), c.relkind = 'p' \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&schema, &table],
        )
        .await?;
    Ok(row.map(|r| TableInfo {
        oid: r.get(0),
        readable: r.get(1),
        partitioned: r.get(2),
    }))
}

/// Tables (ordinary or partitioned, not partitions) whose name is close to `schema.table`,
/// which does not exist: the same parts in another case (`OutboxEvent` configured for the
/// catalog's `outboxevent`, or the reverse), the same name in another schema, and the whole
/// text as one table name in `public` (`a.b` written for the table `"a.b"`). `(schema, table)`,
/// at most five.
pub async fn table_lookalikes(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let joined = format!("{schema}.{table}");
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
               AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND (lower(c.relname) = lower($2) \
                    OR (n.nspname = 'public' AND lower(c.relname) = lower($3))) \
             ORDER BY lower(n.nspname) = lower($1) DESC, n.nspname, c.relname LIMIT 5",
            &[&schema, &table, &joined],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// What to tell about [`table_lookalikes`]: `""` for none, else `; the catalog has …: write …`.
#[must_use]
pub fn lookalikes_hint(found: &[(String, String)]) -> String {
    if found.is_empty() {
        return String::new();
    }
    let lines: Vec<String> = found
        .iter()
        .map(|(schema, table)| {
            format!(
                "`{}` ({})",
                crate::sql::display_relation(schema, table),
                relay_core::ident::toml_line("table", &crate::sql::display_relation(schema, table))
            )
        })
        .collect();
    format!(
        "; the catalog has {}: write that line ([[outbox]] table names each part exactly as the catalog stores it, without folding case as SQL does; a part holding a dot is double-quoted)",
        lines.join(" or ")
    )
}

/// The outbox tables' relation OIDs as the catalog has them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxOids {
    /// `(schema, table, oid)` of each configured table that exists.
    pub tables: Vec<(String, String, u32)>,
    /// The WAL insert position read just before the catalog: a transaction that committed
    /// before it was decoded with an older (or the same) catalog.
    pub read_at: Lsn,
}

/// The server's WAL insert position now (`pg_current_wal_lsn()`): every transaction committed
/// so far ends at or before it.
pub async fn current_wal_lsn(client: &Client) -> Result<Lsn, PgError> {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(|source| PgError::Query {
            context: "cannot read the current WAL position".into(),
            source,
        })?;
    let text: String = row.get(0);
    Lsn::from_str(&text).map_err(|_| {
        PgError::Settings(format!(
            "pg_current_wal_lsn() returned `{text}`, not an LSN"
        ))
    })
}

/// The relation OID of each configured outbox table (`(schema, table)`), as the catalog names
/// it now; a table that does not exist is left out (start-up checks report it).
///
/// The router binds these OIDs so that a table renamed before the relay read its first row of
/// the session is still recognised as the outbox, and refused, instead of being skipped.
pub async fn outbox_table_oids(
    client: &Client,
    tables: &[(String, String)],
) -> Result<OutboxOids, PgError> {
    let read_at = current_wal_lsn(client).await?;
    let mut found = Vec::with_capacity(tables.len());
    for (schema, name) in tables {
        let info = table(client, schema, name)
            .await
            .map_err(|source| PgError::Query {
                context: format!(
                    "cannot look up table {}",
                    crate::sql::display_relation(schema, name)
                ),
                source,
            })?;
        if let Some(info) = info {
            found.push((schema.clone(), name.clone(), info.oid));
        }
    }
    Ok(OutboxOids {
        tables: found,
        read_at,
    })
}

/// A publication as the catalog has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicationInfo {
    /// `pubinsert`.
    pub publishes_inserts: bool,
    /// `pubviaroot`: partitions' rows published as the partitioned root's.
    pub via_root: bool,
}

/// The publication `name`, or `None`.
pub async fn publication(
    client: &Client,
    name: &str,
) -> Result<Option<PublicationInfo>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT pubinsert, pubviaroot FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await?;
    Ok(row.map(|r| PublicationInfo {
        publishes_inserts: r.get(0),
        via_root: r.get(1),
    }))
}

/// Whether publication `name` publishes `schema.table`.
pub async fn publication_has_table(
    client: &Client,
    name: &str,
    schema: &str,
    table: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&name, &schema, &table],
        )
        .await?
        .is_some())
}

/// Why a publication does not deliver the inserts of every outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationGap {
    /// It does not exist.
    Missing,
    /// It does not publish inserts.
    NoInserts,
    /// This outbox table (`schema.table`) is not in it.
    MissingTable(String),
}

/// The first reason the publication does not deliver inserts of every table, if any.
pub async fn publication_gap(
    client: &Client,
    name: &str,
    tables: &[(String, String)],
) -> Result<Option<PublicationGap>, tokio_postgres::Error> {
    match publication(client, name).await? {
        None => return Ok(Some(PublicationGap::Missing)),
        Some(p) if !p.publishes_inserts => return Ok(Some(PublicationGap::NoInserts)),
        Some(_) => {}
    }
    for (schema, table) in tables {
        if !publication_has_table(client, name, schema, table).await? {
            return Ok(Some(PublicationGap::MissingTable(
                crate::sql::display_relation(schema, table),
            )));
        }
    }
    Ok(None)
}

/// A row of `pg_replication_slots`, with lag computed against the server's WAL position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// `logical` or `physical`.
    pub slot_type: String,
    /// Output plugin.
    pub plugin: Option<String>,
    /// Database the slot belongs to.
    pub database: Option<String>,
    /// Backend pid streaming from it now.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved`, `lost`.
    pub wal_status: Option<String>,
    /// Confirmed position.
    pub confirmed_flush_lsn: Option<Lsn>,
    /// Oldest WAL kept.
    pub restart_lsn: Option<Lsn>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: Option<i64>,
    /// `pg_current_wal_lsn() - restart_lsn`.
    pub retained_bytes: Option<i64>,
    /// `safe_wal_size` (NULL when `max_slot_wal_keep_size = -1`).
    pub safe_wal_size: Option<i64>,
}

impl SlotInfo {
    /// Whether the slot was invalidated (`wal_status = lost`): the WAL it needs is gone.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }

    /// The slot as `/status` and `status --json` show it.
    #[must_use]
    pub fn report(&self) -> SlotReport {
        SlotReport {
            slot_type: self.slot_type.clone(),
            plugin: self.plugin.clone(),
            database: self.database.clone(),
            active_pid: self.active_pid,
            wal_status: self.wal_status.clone(),
            confirmed_flush_lsn: self.confirmed_flush_lsn.map(|l| l.to_string()),
            restart_lsn: self.restart_lsn.map(|l| l.to_string()),
            lag_bytes: self.lag_bytes,
            retained_wal_bytes: self.retained_bytes,
            safe_wal_size: self.safe_wal_size,
        }
    }

    /// For `/status` and `status --json`.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }
}

/// The slot `name`, or `None` when it does not exist.
pub async fn slot(client: &Client, name: &str) -> Result<Option<SlotInfo>, tokio_postgres::Error> {
    // pg_current_wal_lsn() fails during recovery (a standby): lag is then unknown.
    let row = client
        .query_opt(
            "SELECT slot_type, plugin, database::text, active_pid, wal_status, \
                    confirmed_flush_lsn::text, restart_lsn::text, \
                    CASE WHEN pg_is_in_recovery() THEN NULL \
                         ELSE (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint END, \
                    CASE WHEN pg_is_in_recovery() THEN NULL \
                         ELSE (pg_current_wal_lsn() - restart_lsn)::bigint END, \
                    safe_wal_size \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    Ok(row.map(|r| SlotInfo {
        slot_type: r.get(0),
        plugin: r.get(1),
        database: r.get(2),
        active_pid: r.get(3),
        wal_status: r.get(4),
        confirmed_flush_lsn: lsn(r.get(5)),
        restart_lsn: lsn(r.get(6)),
        lag_bytes: r.get(7),
        retained_bytes: r.get(8),
        safe_wal_size: r.get(9),
    }))
}

/// The stored checkpoint of `slot`: position and seconds since it was stored. `Ok(None)` when
/// the table or the row does not exist.
pub async fn stored_checkpoint(
    client: &Client,
    slot: &str,
) -> Result<Option<(Lsn, f64)>, tokio_postgres::Error> {
    // Missing: nothing stored yet. Not granted: the query below says so.
    if crate::catalog::relay_tables::checkpoint_table_access(client).await?
        == crate::catalog::relay_tables::TableAccess::Missing
    {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT confirmed_lsn::text, extract(epoch FROM now() - updated_at)::float8 \
             FROM outbox_relay.checkpoint WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.and_then(|r| lsn(r.get(0)).map(|l| (l, r.get::<_, f64>(1)))))
}

/// The WAL insert position now (`pg_current_wal_insert_lsn()`).
pub async fn wal_insert_position(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Lsn, tokio_postgres::Error> {
    let text: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    Ok(Lsn::from_str(&text).unwrap_or_default())
}

/// The connected database's name.
/// Whether both helpers of the table-free outbox exist: `outbox_relay.emit_event` and
/// `outbox_relay.emit_envelope` (`migrations/0005_emit_outbox_message.sql`).
pub async fn emit_functions_present(client: &Client) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT count(DISTINCT p.proname) = 2 FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'outbox_relay' AND p.proname IN ('emit_event', 'emit_envelope')",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// `server_version_num` (e.g. 150019).
pub async fn server_version_num(client: &Client) -> Result<i32, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?
        .get(0))
}

/// Drops the replication slot `name` if it exists (nothing when it does not).
pub async fn drop_slot_if_exists(client: &Client, name: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_catalog.pg_drop_replication_slot(slot_name) \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    Ok(())
}

/// The connected database.
pub async fn current_database(client: &Client) -> Result<String, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT current_database()::text", &[])
        .await?
        .get(0))
}

/// Whether the relation `table_oid` has a (live, user) column named `column`.
pub async fn column_exists(
    client: &Client,
    table_oid: u32,
    column: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attname = $2 \
               AND attnum > 0 AND NOT attisdropped",
            &[&table_oid, &column],
        )
        .await?
        .is_some())
}

/// Whether the session's role may create the relay's tables: CREATE on the database (for the
/// `outbox_relay` schema) or on that schema.
pub async fn may_create_relay_tables(client: &Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT has_database_privilege(current_database(), 'CREATE') \
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_namespace \
                           WHERE nspname = 'outbox_relay' \
                             AND has_schema_privilege(oid, 'CREATE'))",
            &[],
        )
        .await?
        .get(0))
}

#[cfg(test)]
mod tests;
