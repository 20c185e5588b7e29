//! The event's outbox row: the table that holds it (read as the relay would read it from the
//! WAL), its columns, and the subject and headers today's mapping gives it.

use outbox_contract::{HEADER_COMMIT_LSN, HEADER_COMMIT_TIME, HEADER_TX_INDEX, HEADER_XID};
use pgoutput::{Insert, Relation};
use relay_core::Lsn;
use relay_core::message::TxContext;
use relay_core::route::OutboxTableConfig;
use serde::Serialize;
use tokio_postgres::Client;

use relay_runtime::config::{RelayConfig, age_spec_of};

/// One column of the row.
#[derive(Debug, Clone, Serialize)]
pub struct ColumnValue {
    pub name: String,
    /// The text form; `None` for NULL.
    pub value: Option<String>,
}

/// What the outbox tables hold for the event.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RowStep {
    /// One table holds it.
    Found {
        /// `schema.table`.
        table: String,
        columns: Vec<ColumnValue>,
        /// The subject today's mapping gives it, unless it cannot be routed.
        subject: Option<String>,
        /// The headers the mapping gives it (those of its transaction's commit left out).
        headers: Vec<(String, String)>,
        /// Why it cannot be routed, when it cannot.
        route_error: Option<String>,
        /// Its time column's value (microseconds since 1970), when the column holds a time.
        time_unix_micros: Option<i64>,
    },
    /// No outbox table holds it: cleaned up, never there, or left out by a row filter.
    Missing {
        /// The tables searched.
        searched: Vec<String>,
        /// Tables that could not be read, with why.
        unreadable: Vec<String>,
    },
    /// More than one row has this id: the relay publishes the first and drops the copies.
    NotUnique {
        /// Where the rows are (a table twice: twice in that table).
        tables: Vec<String>,
    },
}

impl RowStep {
    /// The subject and time to search the stream by.
    pub fn subject_and_time(&self) -> (Option<&str>, Option<i64>) {
        match self {
            RowStep::Found {
                subject,
                time_unix_micros,
                ..
            } => (subject.as_deref(), *time_unix_micros),
            _ => (None, None),
        }
    }
}

/// A row found, with its table.
struct Hit<'a> {
    mapping: &'a OutboxTableConfig,
    relation: Relation,
    insert: Insert,
}

/// Looks for `event_id` in every outbox table.
pub async fn find(config: &RelayConfig, client: &Client, event_id: &str) -> RowStep {
    let mut hits = Vec::new();
    let (mut searched, mut unreadable) = (Vec::new(), Vec::new());
    for mapping in config.outbox.iter() {
        let name = mapping.display_name();
        let (schema, table) = mapping.qualified_name();
        let shape = match relay_backfill::table_shape(
            client,
            &schema,
            &table,
            &mapping.event_id,
            &config.postgres.publication,
        )
        .await
        {
            Ok(shape) => shape,
            Err(e) => {
                unreadable.push(format!("{name}: {e}"));
                continue;
            }
        };
        searched.push(name.clone());
        match shape
            .rows_with_event_id(client, &mapping.event_id, event_id)
            .await
        {
            Ok(rows) => hits.extend(rows.into_iter().map(|insert| Hit {
                mapping,
                relation: shape.relation.clone(),
                insert,
            })),
            Err(e) => unreadable.push(format!("{name}: {e}")),
        }
    }
    match hits.len() {
        0 => RowStep::Missing {
            searched,
            unreadable,
        },
        1 => {
            let hit = hits.remove(0);
            found(config, client, event_id, hit).await
        }
        _ => RowStep::NotUnique {
            tables: hits.iter().map(|h| h.mapping.display_name()).collect(),
        },
    }
}

/// The row `hit` as the relay would route it now.
async fn found(config: &RelayConfig, client: &Client, event_id: &str, hit: Hit<'_>) -> RowStep {
    let (schema, table) = hit.mapping.qualified_name();
    let age = age_spec_of(config.outbox.cleanup_of(&schema, &table));
    let time = relay_postgres::catalog::outbox_stats::row_time(
        client,
        &schema,
        &table,
        &age,
        &hit.mapping.event_id,
        event_id,
    )
    .await
    .ok()
    .flatten();
    let columns = hit
        .relation
        .columns
        .iter()
        .zip(&hit.insert.new.values)
        .map(|(column, value)| ColumnValue {
            name: column.name.clone(),
            value: value
                .as_bytes()
                .map(|b| String::from_utf8_lossy(b).into_owned()),
        })
        .collect();
    let (subject, headers, route_error) = match route(config, hit.relation, &hit.insert, time) {
        Ok((subject, headers)) => (Some(subject), headers, None),
        Err(e) => (None, Vec::new(), Some(e)),
    };
    RowStep::Found {
        table: hit.mapping.display_name(),
        columns,
        subject,
        headers,
        route_error,
        time_unix_micros: time,
    }
}

/// The subject and headers the mapping gives `insert`, or why it cannot be routed.
fn route(
    config: &RelayConfig,
    relation: Relation,
    insert: &Insert,
    time: Option<i64>,
) -> Result<(String, Vec<(String, String)>), String> {
    let mut router = config
        .router()
        .map_err(|e| format!("outbox mapping: {e}"))?;
    router
        .on_relation(relation, None)
        .map_err(|e| e.to_string())?;
    // The row's commit is not known here: the headers that name it are left out below.
    // Microseconds since 2000-01-01 UTC, as pgoutput sends commit times.
    let micros = time.map_or(0, |t| t - 946_684_800_000_000);
    let tx = TxContext::new(0, Lsn(0), micros);
    let message = router
        .route_insert(insert, &tx, 0)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the table is not routed as an outbox table".to_owned())?;
    let commit_headers = [
        HEADER_COMMIT_LSN,
        HEADER_COMMIT_TIME,
        HEADER_XID,
        HEADER_TX_INDEX,
    ];
    let headers = message
        .headers
        .iter()
        .filter(|(name, _)| !commit_headers.contains(&name.as_ref()))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    Ok((message.subject, headers))
}
