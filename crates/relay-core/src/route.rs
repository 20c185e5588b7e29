//! Route: outbox row → JetStream message.
//!
//! A mapping ([`OutboxTableConfig`]) names the event-id column, a subject template, the payload
//! column and the header columns of one outbox table, and optionally a JSON header-object
//! column and JSON Pointers into envelope columns (`json`). It is compiled against each pgoutput
//! Relation message (sent before a table's first row in a session and again after DDL), so
//! columns are found by name and a dropped or renamed mapped column is reported by name.

use std::collections::HashMap;
use std::sync::Arc;

use pgoutput::{Insert, Lsn, Oid, Relation};

use crate::message::{OutboundMessage, TxContext};
use crate::subject::{Segment, SubjectTemplate};
use crate::value;

mod build;
mod config;
mod contract;
mod dead_letter;
mod error;
mod header_size;
mod json;
mod limits;
mod messages;
mod native;
mod relations;

use config::OPTIONAL_SUFFIX;
pub use config::{
    CloudEventsConfig, ConfigError, ContractFile, ContractsConfig, OutboxTableConfig,
    PAYLOAD_WHOLE_ROW, PayloadFormat, TypeSource,
};
pub use contract::{ContractRefusal, LoadedContract, RefusedEvent, TableContracts};
pub use dead_letter::dead_letter_collision;
pub use error::RouteError;
pub use json::{HeaderObjectError, JsonPointer, MemberError};
pub use limits::{Limit, MessageLimits, Oversize, Part};
pub use messages::{
    HEADER_MESSAGE_PREFIX, MessageConfigError, MessagePolicy, MessageRouteConfig,
    non_transactional_context, non_transactional_end,
};
pub use native::{BrokerFeature, BrokerNeed};

/// Where a message's payload comes from.
#[derive(Debug, Clone)]
enum PayloadPlan {
    Column {
        index: usize,
        type_oid: u32,
        json: bool,
        /// `payload_pointer`: the payload is this member of the column's JSON value.
        pointer: Option<JsonPointer>,
    },
    WholeRow,
}

/// `headers_json`: a column whose JSON object's members become headers.
#[derive(Debug, Clone)]
struct HeaderObjectPlan {
    index: usize,
    /// `headers_json_pointer`: the object is this member of the column's JSON value.
    pointer: Option<JsonPointer>,
    /// `[outbox.cloudevents]` is on: its `ce-*` headers are the mapping's.
    cloudevents: bool,
    /// The object is a member of the payload column under `payload_pointer` too (CAP's
    /// `Content`): both members are found in one pass over the column, with the payload.
    in_payload_envelope: bool,
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
    /// `headers_json`; `None` (the usual case) costs nothing per row.
    header_object: Option<Box<HeaderObjectPlan>>,
    /// `ttl_column`, `schedule_column`, `[outbox.cloudevents]`; `None` (the usual case) costs
    /// nothing per row.
    native: Option<Box<native::NativePlan>>,
    /// `[outbox.contracts]`; `None` costs nothing per row.
    contracts: Option<Box<ContractPlan>>,
}

/// `[outbox.contracts]` compiled against a relation.
#[derive(Debug, Clone)]
struct ContractPlan {
    set: Arc<TableContracts>,
    /// The event type column (`type_column`); `None` with `type_header`.
    type_index: Option<usize>,
}

#[derive(Debug, Clone)]
enum SubjectPart {
    Literal(String),
    /// A column under the token rule.
    Column(usize),
    /// A column under the levels rule (`{levels:column}`).
    Levels(usize),
}

impl SubjectPart {
    /// The column the part reads, if any.
    fn column(&self) -> Option<usize> {
        match self {
            Self::Column(index) | Self::Levels(index) => Some(*index),
            Self::Literal(_) => None,
        }
    }
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
    /// `payload_pointer`, parsed.
    payload_pointer: Option<JsonPointer>,
    /// `headers_json_pointer`, parsed.
    headers_pointer: Option<JsonPointer>,
    /// `[outbox.contracts]`, compiled (see [`Router::with_contracts`]).
    contracts: Option<Arc<TableContracts>>,
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
    /// Partition OID → index in `tables`, for partitioned outbox tables (see
    /// [`Router::bind_partitions`]).
    partition_oids: HashMap<Oid, usize>,
    /// The `[[messages]]` prefixes (see [`Router::with_messages`]).
    messages: messages::MessageRoutes,
}

impl Router {
    /// A router for the configured outbox tables.
    pub fn new(configs: &[OutboxTableConfig]) -> Result<Self, ConfigError> {
        let mut tables: Vec<TableRoute> = Vec::with_capacity(configs.len());
        for config in configs {
            let subject = config.validate()?;
            let (payload_pointer, headers_pointer) = config.pointers()?;
            if tables
                .iter()
                .any(|t| t.config.qualified_name() == config.qualified_name())
            {
                return Err(ConfigError::DuplicateTable(config.table.clone()));
            }
            tables.push(TableRoute {
                config: config.clone(),
                subject,
                payload_pointer,
                headers_pointer,
                contracts: None,
            });
        }
        Ok(Self {
            tables,
            relations: HashMap::new(),
            first_types: HashMap::new(),
            outbox_oids: HashMap::new(),
            catalog_oids: HashMap::new(),
            catalog_lsn: Lsn(0),
            partition_oids: HashMap::new(),
            messages: messages::MessageRoutes::default(),
        })
    }

    /// The router with each table's `[outbox.contracts]` compiled by `build` (which reads the
    /// files): without this, contracts are not checked.
    pub fn with_contracts<E>(
        mut self,
        mut build: impl FnMut(&OutboxTableConfig, &ContractsConfig) -> Result<Arc<TableContracts>, E>,
    ) -> Result<Self, E> {
        for table in &mut self.tables {
            if let Some(config) = &table.config.contracts {
                table.contracts = Some(build(&table.config, config)?);
            }
        }
        Ok(self)
    }

    /// `(table, contract)` for every contract of every table.
    pub fn contracts(&self) -> Vec<(String, Arc<LoadedContract>)> {
        self.tables
            .iter()
            .filter_map(|t| Some((t.config.display_name(), t.contracts.as_ref()?)))
            .flat_map(|(name, set)| set.contracts().into_iter().map(move |c| (name.clone(), c)))
            .collect()
    }

    /// The compiled contracts of the table `config.table` names, if it has any.
    pub fn table_contracts(&self, table: &str) -> Option<&Arc<TableContracts>> {
        self.tables
            .iter()
            .find(|t| t.config.table == table)
            .and_then(|t| t.contracts.as_ref())
    }

    /// Whether `relation_id` is a configured outbox table.
    pub fn is_outbox(&self, relation_id: Oid) -> bool {
        matches!(
            self.relations.get(&relation_id),
            Some(RelationRoute::Outbox { .. })
        )
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

// Long: every mapped column is looked up with one shared `find` closure over the relation; each
// mapping is a few lines
fn compile(table: &TableRoute, relation: Arc<Relation>) -> Result<CompiledRoute, RouteError> {
    // The configured name, not the relation's: rows written under an earlier name of the same
    // table (see `Router::bind_catalog`) are the configured table's events.
    let name: Arc<str> = table.config.display_name().into();
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
            Segment::Levels(c) => find(c, "subject").map(SubjectPart::Levels),
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
            pointer: table.payload_pointer.clone(),
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
    let header_object = match &config.headers_json {
        None => None,
        Some(column) => {
            let index = find(column, "headers_json")?;
            let type_oid = relation.columns.get(index).map_or(0, |c| c.type_oid);
            if type_oid == value::oid::BYTEA {
                return Err(RouteError::ColumnType {
                    table: name.to_string(),
                    column: column.clone(),
                    role: "headers_json",
                    type_oid,
                    expected: "json, jsonb or a text type",
                });
            }
            let in_payload_envelope = table.headers_pointer.is_some()
                && matches!(
                    &payload,
                    PayloadPlan::Column { index: p, pointer: Some(_), .. } if *p == index
                );
            Some(Box::new(HeaderObjectPlan {
                index,
                pointer: table.headers_pointer.clone(),
                cloudevents: config.cloudevents.is_some(),
                in_payload_envelope,
            }))
        }
    };
    let native = native::compile(config, &name, &relation)?.map(Box::new);
    let contracts = match &table.contracts {
        None => None,
        Some(set) => {
            let type_index = match set.type_source() {
                TypeSource::Column(column) => Some(find(column, "contracts.type_column")?),
                TypeSource::Header(_) => None,
            };
            Some(Box::new(ContractPlan {
                set: set.clone(),
                type_index,
            }))
        }
    };
    Ok(CompiledRoute {
        table: name,
        header_object,
        native,
        contracts,
        relation,
        event_id,
        subject,
        payload,
        headers,
    })
}

#[cfg(test)]
mod tests;
