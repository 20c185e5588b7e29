//! Route: outbox row → JetStream message.
//!
//! A mapping ([`OutboxTableConfig`]) names the event-id column, a subject template, the payload
//! column and the header columns of one outbox table. It is compiled against each pgoutput
//! Relation message (sent before a table's first row in a session and again after DDL), so
//! columns are found by name and a dropped or renamed mapped column is reported by name.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{Insert, Lsn, Oid, Relation, TupleValue};

use crate::message::{
    HEADER_COMMIT_LSN, HEADER_COMMIT_TIME, HEADER_TABLE, HEADER_TX_INDEX, HEADER_XID,
    OutboundMessage, TxContext,
};
use crate::subject::{Segment, SubjectTemplate, push_escaped_token};
use crate::value::{self, oid};

mod config;
mod error;
mod limits;

use config::OPTIONAL_SUFFIX;
pub use config::{ConfigError, OutboxTableConfig, PAYLOAD_WHOLE_ROW, PayloadFormat};
pub use error::RouteError;
pub use limits::{Limit, MessageLimits, Oversize, Part};

/// Where a message's payload comes from.
#[derive(Debug, Clone)]
enum PayloadPlan {
    Column {
        index: usize,
        type_oid: u32,
        json: bool,
    },
    WholeRow,
}

/// A mapping compiled against one Relation message.
#[derive(Debug, Clone)]
struct CompiledRoute {
    table: Arc<str>,
    relation: Arc<Relation>,
    event_id: usize,
    subject: Vec<SubjectPart>,
    payload: PayloadPlan,
    headers: Vec<(Arc<str>, usize)>,
}

#[derive(Debug, Clone)]
enum SubjectPart {
    Literal(String),
    Column(usize),
}

/// What the router knows about one relation OID.
#[derive(Debug)]
enum RelationRoute {
    /// Not an outbox table: its rows are ignored.
    Ignored,
    /// An outbox table; the error says why its rows cannot be routed.
    Outbox {
        /// The relation as last announced (for the raw row of a dead letter).
        relation: Arc<Relation>,
        /// Index of the event id column, when the table has it.
        event_id: Option<usize>,
        /// The compiled mapping, or why the table's rows cannot be routed.
        route: Result<CompiledRoute, RouteError>,
    },
}

/// One configured table, validated.
#[derive(Debug)]
struct TableRoute {
    config: OutboxTableConfig,
    subject: SubjectTemplate,
}

/// Turns decoded Relation and Insert messages into outbound messages.
#[derive(Debug)]
pub struct Router {
    tables: Vec<TableRoute>,
    relations: HashMap<Oid, RelationRoute>,
    /// Type OID of each mapped column when the table was first compiled, per `schema.table`.
    first_types: HashMap<String, Vec<(String, &'static str, u32)>>,
    /// Relation OID → index in `tables`: from the catalog at start-up and from every Relation
    /// message that carried a configured name.
    outbox_oids: HashMap<Oid, usize>,
    /// The OIDs the catalog gave the configured tables at start-up, and the WAL position then.
    catalog_oids: HashMap<Oid, usize>,
    catalog_lsn: Lsn,
}

impl Router {
    /// A router for the configured outbox tables.
    pub fn new(configs: &[OutboxTableConfig]) -> Result<Self, ConfigError> {
        let mut tables: Vec<TableRoute> = Vec::with_capacity(configs.len());
        for config in configs {
            let subject = config.validate()?;
            if tables
                .iter()
                .any(|t| t.config.qualified_name() == config.qualified_name())
            {
                return Err(ConfigError::DuplicateTable(config.table.clone()));
            }
            tables.push(TableRoute {
                config: config.clone(),
                subject,
            });
        }
        Ok(Self {
            tables,
            relations: HashMap::new(),
            first_types: HashMap::new(),
            outbox_oids: HashMap::new(),
            catalog_oids: HashMap::new(),
            catalog_lsn: Lsn(0),
        })
    }

    /// Binds the configured tables to the relation OIDs the catalog gives them at `at` (the WAL
    /// position when the catalog was read): `(schema, table, oid)`.
    ///
    /// A bound table is recognised by OID even when its first Relation message of the session
    /// carries another name. Such a name from a transaction committed before `at` is history
    /// (the table was renamed and renamed back before this session): its rows are the outbox's
    /// and are routed under the configured name. From a later transaction it is a live rename.
    pub fn bind_catalog(&mut self, tables: &[(String, String, Oid)], at: Lsn) {
        for (schema, table, oid) in tables {
            if let Some(index) = self
                .tables
                .iter()
                .position(|t| t.config.qualified_name() == (schema.as_str(), table.as_str()))
            {
                self.outbox_oids.insert(*oid, index);
                self.catalog_oids.insert(*oid, index);
            }
        }
        self.catalog_lsn = at;
    }

    /// Learns (or re-learns, after DDL) a relation's shape; `commit_lsn` is the commit LSN of
    /// the transaction that announces it.
    ///
    /// Outbox tables are known by relation OID, not only by name: a publication follows the
    /// table through `RENAME` and `SET SCHEMA`, so an outbox relation announced under another
    /// name, or whose mapped columns are gone, renamed or retyped, is an error here, before any
    /// row of the transaction that announces it is routed: the relay stops instead of counting
    /// the table's rows as "not an outbox".
    pub fn on_relation(
        &mut self,
        relation: Relation,
        commit_lsn: Option<Lsn>,
    ) -> Result<(), RouteError> {
        let id = relation.id;
        let by_name = self.tables.iter().position(|t| {
            t.config.qualified_name() == (relation.namespace.as_str(), relation.name.as_str())
        });
        let index = match (by_name, self.outbox_oids.get(&id).copied()) {
            (by_name, Some(known)) if by_name != Some(known) => {
                let historic = self.catalog_oids.get(&id) == Some(&known)
                    && commit_lsn.is_some_and(|lsn| lsn < self.catalog_lsn);
                let now = format!("{}.{}", relation.namespace, relation.name);
                if !historic {
                    let error = RouteError::OutboxRenamed {
                        configured: self.tables[known].config.table.clone(),
                        now,
                        oid: id,
                    };
                    // Its rows stay outbox rows that fail, never "not an outbox".
                    self.relations.insert(
                        id,
                        RelationRoute::Outbox {
                            relation: Arc::new(relation),
                            event_id: None,
                            route: Err(error.clone()),
                        },
                    );
                    return Err(error);
                }
                tracing::warn!(
                    table = %self.tables[known].config.table,
                    name_then = %now,
                    oid = id,
                    "outbox table had another name when these rows were written; routing them as the configured table"
                );
                known
            }
            (Some(index), _) => index,
            (None, _) => {
                self.relations.insert(id, RelationRoute::Ignored);
                return Ok(());
            }
        };
        // A name seen once as an outbox keeps its OID: an older incarnation of the table (dropped
        // and re-created while the relay was behind) is still an outbox for its WAL.
        self.outbox_oids.insert(id, index);
        let table = &self.tables[index];
        let previous = match self.relations.get(&id) {
            Some(RelationRoute::Outbox { relation, .. }) => Some(relation.clone()),
            _ => None,
        };
        let relation = Arc::new(relation);
        let route = compile(table, relation.clone())
            .map_err(|e| renamed_column(e, previous.as_deref(), &relation))
            .and_then(|route| {
                let now = route.mapped_types();
                match self.first_types.get(route.table.as_ref()) {
                    None => {
                        self.first_types.insert(route.table.to_string(), now);
                        Ok(route)
                    }
                    Some(first) => check_types(&route.table, first, &now).map(|()| route),
                }
            });
        let event_id = relation
            .columns
            .iter()
            .position(|c| c.name == table.config.event_id);
        let failed = route.as_ref().err().cloned();
        self.relations.insert(
            id,
            RelationRoute::Outbox {
                relation,
                event_id,
                route,
            },
        );
        failed.map_or(Ok(()), Err)
    }

    /// Whether `relation_id` is a configured outbox table.
    pub fn is_outbox(&self, relation_id: Oid) -> bool {
        matches!(
            self.relations.get(&relation_id),
            Some(RelationRoute::Outbox { .. })
        )
    }

    /// The event id of an outbox Insert, when its table has the column and the value is not
    /// NULL or empty (for error reports; control characters escaped).
    pub fn event_id_of(&self, insert: &Insert) -> Option<String> {
        let Some(RelationRoute::Outbox {
            event_id: Some(index),
            ..
        }) = self.relations.get(&insert.relation_id)
        else {
            return None;
        };
        match insert.new.values.get(*index) {
            Some(TupleValue::Text(b)) if !b.is_empty() => {
                Some(String::from_utf8_lossy(b).escape_debug().to_string())
            }
            _ => None,
        }
    }

    /// The row of an outbox Insert as a JSON object (column name → text value or `null`) and
    /// its table, for a dead letter; `None` when the relation is unknown or not an outbox.
    pub fn raw_row(&self, insert: &Insert) -> Option<(Arc<str>, Bytes)> {
        let Some(RelationRoute::Outbox { relation, .. }) = self.relations.get(&insert.relation_id)
        else {
            return None;
        };
        let table: Arc<str> = format!("{}.{}", relation.namespace, relation.name).into();
        let mut row = serde_json::Map::new();
        for (i, value) in insert.new.values.iter().enumerate() {
            let name = relation
                .columns
                .get(i)
                .map_or_else(|| format!("#{i}"), |c| c.name.clone());
            let value = match value {
                TupleValue::Text(b) => serde_json::Value::String(String::from_utf8_lossy(b).into()),
                _ => serde_json::Value::Null,
            };
            row.insert(name, value);
        }
        let bytes = serde_json::to_vec(&serde_json::Value::Object(row)).unwrap_or_default();
        Some((table, Bytes::from(bytes)))
    }

    /// Routes one Insert: `Ok(None)` when the table is not an outbox table.
    pub fn route_insert(
        &self,
        insert: &Insert,
        tx: &TxContext,
        tx_index: u64,
    ) -> Result<Option<OutboundMessage>, RouteError> {
        let route = match self.relations.get(&insert.relation_id) {
            None => return Err(RouteError::UnknownRelation(insert.relation_id)),
            Some(RelationRoute::Ignored) => return Ok(None),
            Some(RelationRoute::Outbox { route: Err(e), .. }) => return Err(e.clone()),
            Some(RelationRoute::Outbox {
                route: Ok(route), ..
            }) => route,
        };
        route.build(insert, tx, tx_index).map(Some)
    }
}

fn compile(table: &TableRoute, relation: Arc<Relation>) -> Result<CompiledRoute, RouteError> {
    // The configured name, not the relation's: rows written under an earlier name of the same
    // table (see `Router::bind_catalog`) are the configured table's events.
    let (schema, table_name) = table.config.qualified_name();
    let name: Arc<str> = format!("{schema}.{table_name}").into();
    let find = |column: &str, role: &'static str| -> Result<usize, RouteError> {
        relation
            .columns
            .iter()
            .position(|c| c.name == column)
            .ok_or_else(|| RouteError::MissingColumn {
                table: name.to_string(),
                column: column.to_owned(),
                role,
            })
    };
    let config = &table.config;
    let event_id = find(&config.event_id, "event_id")?;
    let subject = table
        .subject
        .segments()
        .iter()
        .map(|s| match s {
            Segment::Literal(l) => Ok(SubjectPart::Literal(l.clone())),
            Segment::Column(c) => find(c, "subject").map(SubjectPart::Column),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let payload = if config.payload == PAYLOAD_WHOLE_ROW {
        PayloadPlan::WholeRow
    } else {
        let index = find(&config.payload, "payload")?;
        let type_oid = relation.columns.get(index).map_or(0, |c| c.type_oid);
        PayloadPlan::Column {
            index,
            type_oid,
            json: config.payload_format == PayloadFormat::Json,
        }
    };
    let mut headers = Vec::with_capacity(config.headers.len());
    for (header, column) in &config.headers {
        let (column, optional) = match column.strip_suffix(OPTIONAL_SUFFIX) {
            Some(c) => (c, true),
            None => (column.as_str(), false),
        };
        match find(column, "header") {
            Ok(index) => headers.push((Arc::from(header.as_str()), index)),
            Err(_) if optional => {}
            Err(e) => return Err(e),
        }
    }
    Ok(CompiledRoute {
        table: name,
        relation,
        event_id,
        subject,
        payload,
        headers,
    })
}

/// A mapped column missing from a relation that had it at the same position, with the same
/// number of columns and the same type, was renamed: say so, with both names.
fn renamed_column(error: RouteError, previous: Option<&Relation>, now: &Relation) -> RouteError {
    let RouteError::MissingColumn {
        table,
        column,
        role,
    } = error
    else {
        return error;
    };
    let renamed_to = previous.and_then(|previous| {
        let index = previous.columns.iter().position(|c| c.name == column)?;
        if previous.columns.len() != now.columns.len() {
            return None;
        }
        let (was, is) = (previous.columns.get(index)?, now.columns.get(index)?);
        (was.type_oid == is.type_oid && was.name != is.name).then(|| is.name.clone())
    });
    match renamed_to {
        Some(now) => RouteError::ColumnRenamed {
            table,
            column,
            now,
            role,
        },
        None => RouteError::MissingColumn {
            table,
            column,
            role,
        },
    }
}

/// Fails when a mapped column's type differs from the first compile of the session.
fn check_types(
    table: &str,
    first: &[(String, &'static str, u32)],
    now: &[(String, &'static str, u32)],
) -> Result<(), RouteError> {
    for (column, role, was) in first {
        if let Some((_, _, type_now)) = now.iter().find(|(c, _, _)| c == column)
            && type_now != was
        {
            return Err(RouteError::ColumnTypeChanged {
                table: table.to_owned(),
                column: column.clone(),
                role,
                was: *was,
                now: *type_now,
            });
        }
    }
    Ok(())
}

/// Text bytes of a value, `None` for NULL; other kinds are unusable in an INSERT.
fn text_of(value: &TupleValue) -> Result<Option<&Bytes>, &'static str> {
    match value {
        TupleValue::Null => Ok(None),
        TupleValue::Text(b) => Ok(Some(b)),
        TupleValue::UnchangedToast => Err("unchanged TOAST value in an insert"),
        TupleValue::Binary(_) => Err("binary-format value (binary mode is not requested)"),
    }
}

impl CompiledRoute {
    /// `(column, role, type oid)` of every mapped column.
    fn mapped_types(&self) -> Vec<(String, &'static str, u32)> {
        let mut out = Vec::new();
        let mut push = |index: usize, role: &'static str| {
            if let Some(c) = self.relation.columns.get(index)
                && !out.iter().any(|(n, _, _): &(String, _, _)| *n == c.name)
            {
                out.push((c.name.clone(), role, c.type_oid));
            }
        };
        push(self.event_id, "event_id");
        for part in &self.subject {
            if let SubjectPart::Column(i) = part {
                push(*i, "subject");
            }
        }
        if let PayloadPlan::Column { index, .. } = &self.payload {
            push(*index, "payload");
        }
        for (_, i) in &self.headers {
            push(*i, "header");
        }
        out
    }

    fn invalid_payload(&self, event_id: &str, index: usize, reason: String) -> RouteError {
        RouteError::InvalidPayload {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(index),
            reason,
        }
    }

    fn column_name(&self, index: usize) -> String {
        self.relation
            .columns
            .get(index)
            .map_or_else(|| format!("#{index}"), |c| c.name.clone())
    }

    fn build(
        &self,
        insert: &Insert,
        tx: &TxContext,
        tx_index: u64,
    ) -> Result<OutboundMessage, RouteError> {
        let values = &insert.new.values;
        if values.len() != self.relation.columns.len() {
            return Err(RouteError::ColumnCount {
                table: self.table.to_string(),
                got: values.len(),
                expected: self.relation.columns.len(),
            });
        }
        let unusable = |event_id: &str, index: usize, reason| RouteError::UnusableValue {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(index),
            reason,
        };
        // Every index below was resolved against this relation, and the length is checked
        // above, so `get` only fails on a bug; treat that like a NULL.
        let text = |index: usize, event_id: &str| -> Result<Option<&[u8]>, RouteError> {
            match values.get(index) {
                None => Ok(None),
                Some(v) => text_of(v)
                    .map(|b| b.map(|b| &b[..]))
                    .map_err(|reason| unusable(event_id, index, reason)),
            }
        };

        let event_id = match text(self.event_id, "?")? {
            Some(b) if !b.is_empty() => String::from_utf8_lossy(b).into_owned(),
            _ => {
                return Err(RouteError::MissingEventId {
                    table: self.table.to_string(),
                    column: self.column_name(self.event_id),
                });
            }
        };
        if event_id.chars().any(char::is_control) {
            return Err(RouteError::InvalidHeaderValue {
                table: self.table.to_string(),
                event_id: event_id.escape_debug().to_string(),
                column: self.column_name(self.event_id),
                header: crate::message::HEADER_MSG_ID.to_owned(),
            });
        }

        let mut subject = String::with_capacity(64);
        for part in &self.subject {
            match part {
                SubjectPart::Literal(l) => subject.push_str(l),
                SubjectPart::Column(index) => match text(*index, &event_id)? {
                    Some(b) if !b.is_empty() => {
                        push_escaped_token(&mut subject, &String::from_utf8_lossy(b))
                    }
                    _ => {
                        return Err(RouteError::EmptySubjectValue {
                            table: self.table.to_string(),
                            event_id,
                            column: self.column_name(*index),
                        });
                    }
                },
            }
        }

        let payload = match &self.payload {
            PayloadPlan::WholeRow => {
                let mut cols = Vec::with_capacity(values.len());
                for (i, c) in self.relation.columns.iter().enumerate() {
                    cols.push((c.name.as_str(), c.type_oid, text(i, &event_id)?));
                }
                value::row_to_json(cols.into_iter())
            }
            PayloadPlan::Column {
                index,
                type_oid,
                json,
            } => {
                let body = match values.get(*index) {
                    Some(TupleValue::Text(b)) if *type_oid == oid::BYTEA => {
                        value::decode_bytea_hex(b)
                            .map_err(|_| unusable(&event_id, *index, "bytea not in hex format"))?
                    }
                    Some(TupleValue::Text(b)) => b.clone(),
                    Some(TupleValue::Null) | None if *json => {
                        return Err(self.invalid_payload(&event_id, *index, "NULL".into()));
                    }
                    Some(TupleValue::Null) | None => Bytes::new(),
                    Some(other) => {
                        return Err(unusable(
                            &event_id,
                            *index,
                            text_of(other).err().unwrap_or("unexpected value"),
                        ));
                    }
                };
                if *json {
                    let text = std::str::from_utf8(&body).map_err(|e| {
                        self.invalid_payload(&event_id, *index, format!("not valid UTF-8 ({e})"))
                    })?;
                    serde_json::from_str::<serde::de::IgnoredAny>(text)
                        .map_err(|e| self.invalid_payload(&event_id, *index, e.to_string()))?;
                }
                body
            }
        };

        let [commit_lsn, xid, commit_time, table, index_name] = &*RELAY_HEADER_NAMES;
        let mut headers: Vec<(Arc<str>, Arc<str>)> = Vec::with_capacity(5 + self.headers.len());
        headers.push((commit_lsn.clone(), tx.commit_lsn_text.clone()));
        headers.push((xid.clone(), tx.xid_text.clone()));
        headers.push((commit_time.clone(), tx.commit_time_text.clone()));
        headers.push((table.clone(), self.table.clone()));
        headers.push((index_name.clone(), tx_index.to_string().into()));
        for (header, index) in &self.headers {
            let Some(raw) = text(*index, &event_id)? else {
                continue;
            };
            let mut value = String::from_utf8_lossy(raw);
            if header.eq_ignore_ascii_case("traceparent") {
                value = extract_traceparent(&value).into();
            }
            if value.chars().any(char::is_control) {
                return Err(RouteError::InvalidHeaderValue {
                    table: self.table.to_string(),
                    event_id,
                    column: self.column_name(*index),
                    header: header.to_string(),
                });
            }
            headers.push((header.clone(), value.as_ref().into()));
        }

        Ok(OutboundMessage {
            subject,
            event_id,
            headers,
            shared_headers: SHARED_HEADERS,
            payload,
            table: self.table.clone(),
            commit_lsn: tx.commit_lsn,
            commit_time_micros: tx.commit_time_micros,
        })
    }
}

/// The leading headers of a routed event that are the same for its whole transaction and table.
const SHARED_HEADERS: usize = 4;

/// The relay's own header names, allocated once: every event carries all five.
static RELAY_HEADER_NAMES: std::sync::LazyLock<[Arc<str>; 5]> = std::sync::LazyLock::new(|| {
    [
        HEADER_COMMIT_LSN.into(),
        HEADER_XID.into(),
        HEADER_COMMIT_TIME.into(),
        HEADER_TABLE.into(),
        HEADER_TX_INDEX.into(),
    ]
});

/// Debezium stores the span context as Java properties text (`traceparent=00-…` lines); a bare
/// W3C value is taken as is.
fn extract_traceparent(value: &str) -> String {
    value
        .lines()
        .find_map(|l| l.trim().strip_prefix("traceparent="))
        .unwrap_or(value)
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests;
