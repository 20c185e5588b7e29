//! Reading an outbox table's existing rows, beside the replication stream: `outbox-relay
//! backfill`, the relay's backfill at slot creation ([`on_create`]), and the signals from SQL
//! that ask a running relay for one.
//!
//! - the crate root: the backfill's SQL (below), its cursor in `outbox_relay.backfill`, and the
//!   page source and cursor store the pipeline runs over ([`PageSource`], [`CursorStore`]);
//! - [`condition`]: whether a condition given as SQL text (a backfill's `--where`, a signal's
//!   `"where"`, `[[outbox]] row_filter`) is one condition that cannot leave the query it is put
//!   in; read by `sqlparser`'s PostgreSQL tokenizer, which no other crate needs;
//! - [`signal`]: the rows of `outbox_relay.signal`, their claim and their written-back progress,
//!   and the session that listens for new ones. The table's first kind is a backfill (its
//!   `"where"` is checked by [`condition`], its progress read from the backfill's cursor); the
//!   runtime carries out its other kinds (replay, restore) on the NATS side.
//!
//! Its own crate because it changes for reasons of its own (page queries, the cursor table, the
//! filter's lexer, the signals table) that the streaming path never meets. It depends on
//! `relay-postgres` for sessions, `PgError`, SQLSTATE classes, quoting and the shared catalog
//! reads; `relay-postgres` never depends on it. The catalog reads only the backfill makes (a
//! table's columns, replica identity, published columns, page key) are its own (module `catalog`).
//!
//! # The backfill's SQL
//!
//! An outbox table read in keyset pages, each row turned into the pgoutput `Relation` +
//! `Insert` the relay would have decoded for it, and the backfill's cursor in
//! `outbox_relay.backfill`.
//!
//! **Same text as the WAL.** pgoutput sends each value as its type's output function renders
//! it, in the walsender's session settings. Pages are read with the simple query protocol,
//! whose values are exactly that text (a `::text` cast is not: `true::text` is `true` where
//! the output function says `t`, `char(n)` loses its padding, `inet` gains a netmask), in a
//! session with the replication session's settings (hex bytea, ISO dates, UTC,
//! `extra_float_digits = 3`). The `Relation` has the columns pgoutput would send: attnum
//! order, no dropped or generated columns, the publication's column list (PostgreSQL 15+),
//! with their type OIDs; the publication's row filter (15+) is applied to the pages too.
//!
//! **Keyset pages.** `WHERE key > last AND key <= end ORDER BY key LIMIT n` on the table's
//! single-column primary key, or else on the event id column when a unique index covers it.
//! `end` is the last key when the backfill started.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

use pgoutput::{Column, Insert, LogicalMessage, Relation, TupleValue};
use relay_core::Lsn;
use relay_core::stage::SourceEvent;
use tokio_postgres::Client;

use crate::catalog::table_shape;

mod catalog;
pub mod condition;
mod cursor;
pub mod on_create;
mod pages;
mod queries;
pub mod signal;

#[cfg(test)]
use queries::plan_rows;
use queries::simple_rows;
mod snapshot;

pub use cursor::{
    Cursor, CursorId, CursorStatus, ensure_cursor_table, finish_cursor, list_cursors, load_cursor,
    prepare_cursor_session, save_cursor, start_cursor,
};
pub use pages::{CursorStore, PageProgress, PageReader, PageSource};
pub use snapshot::begin_page_snapshot;

/// A backfill filter (`--where`) selecting the rows whose `column` holds one of `ids`, quoted
/// whatever the session's `standard_conforming_strings` (escape-string literals).
pub fn event_id_filter(column: &str, ids: &[String]) -> String {
    let literals: Vec<String> = ids
        .iter()
        .map(|id| relay_postgres::sql::quote_literal(id))
        .collect();
    format!(
        "{} IN ({})",
        relay_postgres::sql::quote_ident(column),
        literals.join(", ")
    )
}

/// Checks that a backfill filter (`--where`) is one condition that cannot leave the query it is
/// put in ([`crate::condition`]), before anything is asked of the server.
pub fn check_one_condition(filter: &str) -> Result<(), BackfillError> {
    crate::condition::check_condition(filter).map_err(|problem| BackfillError::NotOneCondition {
        filter: filter.to_owned(),
        problem,
    })
}

/// The migration that creates the cursor table (also shipped in `migrations/`).
pub const BACKFILL_MIGRATION: &str = include_str!("../../../migrations/0003_relay_backfill.sql");

/// The migration that adds the on-create backfill's columns (also shipped in `migrations/`).
pub const BACKFILL_ON_CREATE_MIGRATION: &str =
    include_str!("../../../migrations/0007_backfill_on_create.sql");

/// Session settings of the read session: the replication session's text forms, nothing
/// written (a `--where` filter cannot change data), and string literals read as
/// [`crate::condition`] reads a filter's (a backslash in `'…'` is a character).
const READ_SESSION: &str = "SET application_name = 'outbox-relay backfill'; \
     SET bytea_output = hex; SET DateStyle = ISO; SET TimeZone = UTC; \
     SET IntervalStyle = postgres; SET extra_float_digits = 3; SET default_transaction_read_only = on; \
     SET standard_conforming_strings = on";

/// `sql` (one page's SELECT) run so that it walks the page key's index: sequential scans, bitmap
/// scans and sorts off for that statement only (set before, reset after, in the same round
/// trip). With random keys (UUIDs) and no statistics yet (a table just loaded), the planner
/// prices a sequential scan plus a top-N sort below the index scan for `key > last ORDER BY key
/// LIMIT n`, and that plan reads the whole table for every page: quadratic (a 200,000-row table
/// read at 20,000 rows/s, a 1,000,000-row one far slower). Walking the index is linear over the
/// whole backfill, whatever `--where` adds. Only the pages: a `count(*)` walking the index of a
/// table never vacuumed visits the heap row by row.
pub fn walk_index(sql: &str) -> String {
    format!(
        "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off; {sql}; \
         RESET enable_seqscan; RESET enable_bitmapscan; RESET enable_sort"
    )
}

/// Failures of the backfill's SQL.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    /// The table does not exist.
    #[error("outbox table `{table}` does not exist in this database")]
    TableMissing {
        /// `schema.table`.
        table: String,
    },
    /// The role may not read the table.
    #[error(
        "the relay's role may not read outbox table `{table}`: GRANT SELECT ON {table} TO <role>"
    )]
    NotReadable {
        /// `schema.table`.
        table: String,
    },
    /// No unique, non-null single column to page by.
    #[error(
        "outbox table `{table}` has no single-column primary key, and no unique index covers its event id column `{event_id}` alone: backfill pages by a unique key (e.g. CREATE UNIQUE INDEX CONCURRENTLY ON {table} ({event_id}))"
    )]
    NoKey {
        /// `schema.table`.
        table: String,
        /// The mapping's event id column.
        event_id: String,
    },
    /// The `--where` filter is not one condition: it would leave the parentheses it is put in
    /// (and with them the page's key range) or the statement.
    #[error(
        "--where `{filter}` {problem}: give one condition on the table's columns, e.g. `aggregateid = '1' OR aggregateid = '2'`"
    )]
    NotOneCondition {
        /// The filter.
        filter: String,
        /// Why.
        problem: crate::condition::ConditionError,
    },
    /// The `--where` filter is not a valid condition on the table.
    #[error("--where `{filter}` is not a valid condition on `{table}`")]
    Filter {
        /// The filter.
        filter: String,
        /// `schema.table`.
        table: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A query failed.
    #[error("{context}")]
    Query {
        /// What was being done.
        context: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl BackfillError {
    /// Whether the database was unreachable or went away (retrying later can help).
    pub fn is_transient(&self) -> bool {
        match self {
            BackfillError::Query { source, .. } => relay_postgres::is_transient_query_error(source),
            _ => false,
        }
    }
}

fn query_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> BackfillError {
    let context = context.into();
    move |source| BackfillError::Query { context, source }
}

use relay_postgres::sql::{quote_ident, quote_literal};

/// Why the backfill pages by this column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The table's primary key (one column).
    PrimaryKey,
    /// The event id column, covered by a unique index.
    UniqueEventId,
}

/// The column pages are ordered and bounded by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageKey {
    /// Column name.
    pub name: String,
    /// Its type as SQL (`format_type`), to cast a stored key back.
    pub type_sql: String,
    /// Whether NULL is allowed (a unique index does not forbid it; rows with a NULL key are
    /// not in any page).
    pub nullable: bool,
    /// Why this column.
    pub source: KeySource,
}

/// An outbox table as the backfill reads it.
#[derive(Debug, Clone)]
pub struct TableShape {
    /// `schema.table`.
    pub table: String,
    /// The Relation pgoutput would send for it.
    pub relation: Relation,
    /// The page key.
    pub key: PageKey,
    /// The publication's row filter (PostgreSQL 15+), if the table is in it with one.
    pub row_filter: Option<String>,
    /// Whether the publication holds the table (if not, the live relay does not see its rows).
    pub in_publication: bool,
    /// Index of the mapping's event id column in `relation`, if the table has it.
    event_id: Option<usize>,
    /// `ONLY schema.table` (`schema.table` for a partitioned table).
    from: String,
}

/// Connects the read session: the replication session's text forms, read-only.
pub async fn connect_reader(
    settings: &relay_postgres::PostgresSettings,
) -> Result<Client, relay_postgres::PgError> {
    let client = relay_postgres::connect(settings).await?;
    client
        .batch_execute(READ_SESSION)
        .await
        .map_err(|source| relay_postgres::PgError::Query {
            context: "cannot set up the backfill's read session".into(),
            source,
        })?;
    Ok(client)
}

/// The table's shape: columns as pgoutput sends them, its page key, the publication's column
/// list and row filter.
pub async fn table_shape(
    client: &Client,
    schema: &str,
    table: &str,
    event_id: &str,
    publication: &str,
) -> Result<TableShape, BackfillError> {
    let name = relay_postgres::sql::display_relation(schema, table);
    let info = relay_postgres::catalog::table(client, schema, table)
        .await
        .map_err(query_err(format!("cannot look up table {name}")))?
        .ok_or_else(|| BackfillError::TableMissing {
            table: name.clone(),
        })?;
    if !info.readable {
        return Err(BackfillError::NotReadable { table: name });
    }
    let published = published(client, publication, schema, table).await?;
    let in_publication = published.is_some();
    let (column_list, row_filter) = published.unwrap_or_default();
    let columns: Vec<Column> = table_shape::columns(client, info.oid)
        .await
        .map_err(query_err(format!("cannot read the columns of {name}")))?
        .into_iter()
        .map(|c| Column {
            flags: if c.in_replica_identity {
                Column::FLAG_KEY
            } else {
                0
            },
            name: c.name,
            type_oid: c.type_oid,
            type_modifier: c.type_modifier,
        })
        .filter(|c| {
            column_list
                .as_ref()
                .is_none_or(|list| list.contains(&c.name))
        })
        .collect();
    let replica_identity = table_shape::replica_identity(client, info.oid)
        .await
        .map_err(query_err(format!("cannot read {name}")))?;
    let key = page_key(client, info.oid, event_id)
        .await
        .map_err(query_err(format!("cannot read the indexes of {name}")))?
        .ok_or_else(|| BackfillError::NoKey {
            table: name.clone(),
            event_id: event_id.to_owned(),
        })?;
    let from = format!(
        "{}{}",
        if info.partitioned { "" } else { "ONLY " },
        relay_postgres::sql::quote_relation(schema, table)
    );
    let event_id = columns.iter().position(|c| c.name == event_id);
    Ok(TableShape {
        table: name,
        event_id,
        relation: Relation {
            id: info.oid,
            namespace: schema.to_owned(),
            name: table.to_owned(),
            replica_identity: replica_identity as u8,
            columns,
        },
        key,
        row_filter,
        in_publication,
        from,
    })
}

/// What `publication` publishes of `schema.table`: its column list and row filter (PostgreSQL
/// 15+; before, neither exists); `None` when the table is not in it.
async fn published(
    client: &Client,
    publication: &str,
    schema: &str,
    table: &str,
) -> Result<Option<(Option<Vec<String>>, Option<String>)>, BackfillError> {
    let version = relay_postgres::catalog::server_version_num(client)
        .await
        .map_err(query_err("cannot read server_version_num"))?;
    let context = || format!("cannot read publication {publication}");
    if version >= 150_000 {
        table_shape::published_columns(client, publication, schema, table)
            .await
            .map_err(query_err(context()))
    } else {
        Ok(
            relay_postgres::catalog::publication_has_table(client, publication, schema, table)
                .await
                .map_err(query_err(context()))?
                .then_some((None, None)),
        )
    }
}

/// The single-column primary key, else the event id column if a unique index (not partial, no
/// expressions) covers it alone.
async fn page_key(
    client: &Client,
    oid: u32,
    event_id: &str,
) -> Result<Option<PageKey>, tokio_postgres::Error> {
    let key = table_shape::single_column_key(client, oid, event_id).await?;
    Ok(key.map(|k| PageKey {
        name: k.name,
        type_sql: k.type_sql,
        nullable: k.nullable,
        source: if k.primary {
            KeySource::PrimaryKey
        } else {
            KeySource::UniqueEventId
        },
    }))
}

impl TableShape {
    /// The SELECT of [`TableShape::page`] (public so that tests can EXPLAIN it).
    pub fn page_sql(
        &self,
        filter: Option<&str>,
        after: Option<&str>,
        upto: &str,
        limit: usize,
    ) -> String {
        let key = quote_ident(&self.key.name);
        let columns: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect();
        format!(
            "SELECT {key}, {} FROM {}{} ORDER BY {key} LIMIT {limit}",
            columns.join(", "),
            self.rows(filter),
            self.key_range(after, Some(upto))
        )
    }

    /// The event id of a row of [`TableShape::page`], when the table has the column and the
    /// value is not NULL.
    pub fn event_id_of<'a>(&self, insert: &'a Insert) -> Option<&'a str> {
        match insert.new.values.get(self.event_id?) {
            Some(TupleValue::Text(id)) => std::str::from_utf8(id).ok(),
            _ => None,
        }
    }

    /// The transaction pgoutput would send for one page of rows, had they been inserted by one
    /// transaction whose commit is unknown: Begin (xid 0, commit LSN `0/0`, `commit_time`), the
    /// table's Relation when `with_relation`, one Insert per row, and a Commit whose end
    /// position is `page` (the page's number: the ack frontier moves over pages in order).
    pub fn page_transaction(
        &self,
        page: u64,
        rows: Vec<Insert>,
        with_relation: bool,
        commit_time_micros: i64,
    ) -> Vec<SourceEvent> {
        let mut events = Vec::with_capacity(rows.len() + 3);
        events.push(SourceEvent::Begin {
            xid: 0,
            final_lsn: Lsn(0),
            commit_time_micros,
        });
        if with_relation {
            events.push(SourceEvent::Message(LogicalMessage::Relation(
                self.relation.clone(),
            )));
        }
        events.extend(
            rows.into_iter()
                .map(|insert| SourceEvent::Message(LogicalMessage::Insert(insert))),
        );
        events.push(SourceEvent::Commit {
            commit_lsn: Lsn(0),
            end_lsn: Lsn(page),
        });
        events
    }
}

#[cfg(test)]
mod tests;
