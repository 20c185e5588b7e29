//! [`PgError`]: what can go wrong on the PostgreSQL side outside the replication stream, and
//! whether waiting can help.

use relay_core::Lsn;

use crate::{sql, sqlstate};
/// Failures of the PostgreSQL side outside the replication stream.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The connection string does not parse.
    #[error("postgres.url is not a valid PostgreSQL connection URL: {0}")]
    BadUrl(String),
    /// A slot or publication name that could not safely go into SQL.
    #[error("{what} name `{name}` is invalid: use 1-63 lower-case letters, digits and underscores")]
    InvalidName {
        /// `slot` or `publication`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A setting is unusable (a secret file, TLS files, a combination of settings).
    #[error("{0}")]
    Settings(String),
    /// The server could not be reached (the authentication probe).
    #[error("cannot connect to PostgreSQL at {target}: {reason}")]
    Unreachable {
        /// host:port/db.
        target: String,
        /// Why.
        reason: String,
    },
    /// TLS could not be set up or the server's certificate was not accepted.
    #[error(
        "TLS with PostgreSQL at {target} failed: {reason} (check postgres.sslmode, postgres.sslrootcert and that the server certificate names the host in postgres.url)"
    )]
    Tls {
        /// host:port/db.
        target: String,
        /// Why.
        reason: String,
    },
    /// The server refused the login before any password was sent (pg_hba, role, database).
    #[error("PostgreSQL at {target} refused the connection: {message}")]
    Auth {
        /// host:port/db.
        target: String,
        /// The server's message.
        message: String,
    },
    /// The server asked for a cleartext or MD5 password and that is not allowed.
    #[error(
        "PostgreSQL at {target} asked for {method}; the relay does not send such passwords: use SCRAM (set password_encryption = 'scram-sha-256', re-set the role's password, and use scram-sha-256 in pg_hba.conf), or, over verified TLS only, set postgres.allow_insecure_password = true"
    )]
    InsecurePassword {
        /// host:port/db.
        target: String,
        /// What the server asked for.
        method: &'static str,
    },
    /// The server could not be reached or refused the login.
    #[error("cannot connect to PostgreSQL at {target}")]
    Connect {
        /// host:port/db.
        target: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
    /// `wal_level` is not `logical`.
    #[error(
        "wal_level is `{actual}`, logical replication needs `logical`: set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
    )]
    WalLevel {
        /// The current value.
        actual: String,
    },
    /// A configured outbox table does not exist.
    #[error(
        "outbox table `{table}` does not exist in database `{database}`{lookalikes}: create it (see migrations/0001_outbox.sql) or fix [[outbox]] table"
    )]
    TableMissing {
        /// The table.
        table: String,
        /// The database.
        database: String,
        /// Tables of a similar name and the line that names them
        /// ([`crate::catalog::lookalikes_hint`]), or empty.
        lookalikes: String,
    },
    /// The publication is missing and may not be created.
    #[error(
        "publication `{publication}` does not exist: CREATE PUBLICATION {publication} FOR TABLE {tables} WITH (publish = 'insert', publish_via_partition_root = true), or set postgres.create_publication = true"
    )]
    PublicationMissing {
        /// The publication.
        publication: String,
        /// Tables it should hold.
        tables: String,
    },
    /// The publication does not publish inserts.
    #[error(
        "publication `{publication}` does not publish inserts: ALTER PUBLICATION {publication} SET (publish = 'insert')"
    )]
    PublicationNoInsert {
        /// The publication.
        publication: String,
    },
    /// An outbox table is not in the publication.
    #[error(
        "outbox table `{table}` is not in publication `{publication}`: ALTER PUBLICATION {publication} ADD TABLE {}",
        sql::quote_displayed(table)
    )]
    PublicationMissingTable {
        /// The publication.
        publication: String,
        /// The table, as the configuration writes it.
        table: String,
    },
    /// The slot is missing and may not be created.
    #[error(
        "replication slot `{slot}` does not exist: SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'), or set postgres.create_slot = true"
    )]
    SlotMissing {
        /// The slot.
        slot: String,
    },
    /// The slot is gone although the relay has a checkpoint for it: events may have been lost.
    #[error(
        "replication slot `{slot}` is gone, but the relay stored checkpoint {checkpoint} for it: a new slot would skip every event committed since. See docs/operations.md, \"Slot lost\": reconcile from the outbox table, then delete the checkpoint row to start fresh"
    )]
    SlotLost {
        /// The slot.
        slot: String,
        /// The stored checkpoint.
        checkpoint: Lsn,
    },
    /// The slot is missing on a server that was promoted from a standby (or restored), although
    /// the relay stored a checkpoint for it: it did not come over with the failover.
    #[error(
        "replication slot `{slot}` does not exist on this server, which is on timeline {timeline} (it was promoted from a standby, or restored from a backup), but the relay stored checkpoint {checkpoint} for it: {why}. A new slot would skip every event committed since the checkpoint. See docs/operations.md, \"Failover\" (\"Recovery without a failover slot\"): publish the outbox rows committed since the checkpoint with `outbox-relay backfill`, then delete the checkpoint row and start the relay"
    )]
    SlotMissingAfterPromotion {
        /// The slot.
        slot: String,
        /// The stored checkpoint (it came over with the database).
        checkpoint: Lsn,
        /// The server's timeline.
        timeline: u32,
        /// Why the slot did not come over, as far as the relay can tell.
        why: String,
    },
    /// None of the URL's hosts is a read-write server (a failover under way, or all down).
    #[error(
        "no read-write PostgreSQL server among {targets}: {tried} (during a failover this lasts until a standby is promoted)"
    )]
    NoPrimary {
        /// The URL's hosts.
        targets: String,
        /// What each host answered.
        tried: String,
    },
    /// The slot was invalidated (`wal_status = lost`): WAL it needed is gone.
    #[error(
        "replication slot `{slot}` was invalidated (wal_status = lost: it fell behind max_slot_wal_keep_size); events committed since it was last read are gone from WAL. See docs/operations.md, \"Slot lost\""
    )]
    SlotInvalidated {
        /// The slot.
        slot: String,
    },
    /// Another relay created the slot while this one was about to: this one starts over and
    /// waits as the other's standby.
    #[error(
        "replication slot `{slot}` was created by another relay a moment ago; starting over as its standby"
    )]
    SlotCreatedConcurrently {
        /// The slot.
        slot: String,
    },
    /// Creating the slot with an exported snapshot (`backfill = "on-create"`) failed.
    #[error("cannot create replication slot `{slot}` with an exported snapshot: {detail}")]
    SlotExport {
        /// The slot.
        slot: String,
        /// Why.
        detail: String,
        /// Whether the connection failed (retrying can help) rather than the server refusing.
        transient: bool,
    },
    /// The publication is newer than the slot's position: rows committed in between cannot be
    /// read through the slot.
    #[error(
        "publication `{publication}` is newer than replication slot `{slot}` (at {slot_lsn}): the slot decodes its WAL with the catalog of that time, so outbox rows committed after {slot_lsn} and before the publication was created cannot be read through it (PostgreSQL 18 skips them with only a \"skipped loading publication\" warning in the server log, 15-17 stop decoding). Publish those rows from the outbox table (docs/operations.md, \"Publication newer than the slot\"), then create the slot after the publication: SELECT pg_drop_replication_slot('{slot}'); DELETE FROM outbox_relay.checkpoint WHERE slot_name = '{slot}'; then `outbox-relay setup` (or start the relay with postgres.create_slot = true)"
    )]
    PublicationNewerThanSlot {
        /// The slot.
        slot: String,
        /// The publication.
        publication: String,
        /// The slot's confirmed_flush_lsn.
        slot_lsn: Lsn,
    },
    /// The slot exists but cannot serve this relay.
    #[error("replication slot `{slot}` cannot be used: {reason}")]
    SlotUnusable {
        /// The slot.
        slot: String,
        /// Why, with the fix.
        reason: String,
    },
    /// The slot's confirmed position is past the relay's checkpoint: events in between were
    /// never delivered by this relay.
    #[error(
        "replication slot `{slot}` is at {slot_lsn} but the relay's checkpoint is {checkpoint}: transactions committed in between were confirmed without being published (slot advanced by hand, or checkpoint reset). Reconcile from the outbox table, then rerun with --accept-slot-position to continue from {slot_lsn}"
    )]
    SlotAhead {
        /// The slot.
        slot: String,
        /// Its confirmed_flush_lsn.
        slot_lsn: Lsn,
        /// The stored checkpoint.
        checkpoint: Lsn,
    },
    /// A catalog query failed.
    /// The relay's role may not use one of the relay's own tables.
    #[error(
        "role `{role}` may not use {table}: GRANT USAGE ON SCHEMA outbox_relay, and {grant} ON {table}, to it"
    )]
    RelayTableNotGranted {
        table: &'static str,
        role: String,
        grant: &'static str,
    },
    #[error("{context}")]
    Query {
        /// What was being done.
        context: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl PgError {
    /// Whether waiting and retrying can help (connection problems) or an operator must act.
    pub fn is_transient(&self) -> bool {
        match self {
            PgError::Unreachable { .. }
            | PgError::SlotCreatedConcurrently { .. }
            | PgError::NoPrimary { .. }
            | PgError::SlotExport {
                transient: true, ..
            } => true,
            // A wrong password, a refused role or database, or a TLS failure needs an operator.
            PgError::Connect { source, .. } => !is_login_refusal(source),
            PgError::Query { source, .. } => sqlstate::is_transient_query_error(source),
            _ => false,
        }
    }

    /// Whether this error means events may have been lost and the relay must not continue.
    pub fn is_data_safety_stop(&self) -> bool {
        matches!(
            self,
            PgError::SlotLost { .. }
                | PgError::SlotMissingAfterPromotion { .. }
                | PgError::SlotAhead { .. }
                | PgError::SlotInvalidated { .. }
        )
    }
}

/// Whether a connect error is the server refusing the login (SQLSTATE class 28, unknown
/// database) or a TLS failure (a rustls error in its causes), as opposed to the server being
/// unreachable.
fn is_login_refusal(error: &tokio_postgres::Error) -> bool {
    if let Some(db) = error.as_db_error() {
        return sqlstate::SqlStateKind::of(db.code().code())
            == sqlstate::SqlStateKind::LoginRefused;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        // An io::Error does not report the error it wraps as its source: look inside.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        if e.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        cause = e.source();
    }
    false
}
