//! How the router learns tables from Relation messages: outbox tables known by relation OID,
//! renames and shape changes told apart from other tables.

use std::sync::Arc;

use pgoutput::{Lsn, Oid, Relation};

use super::{RelationRoute, RouteError, Router, compile};

impl Router {
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
                .position(|t| t.config.is_table(schema, table))
            {
                self.outbox_oids.insert(*oid, index);
                self.catalog_oids.insert(*oid, index);
            }
        }
        self.catalog_lsn = at;
    }

    /// Binds the partitions of partitioned outbox tables, at every level, as the catalog has
    /// them at the start of the session: `(schema, table, partition oid)`, the configured
    /// table's name with the partition's OID.
    ///
    /// With `publish_via_partition_root` pgoutput sends a partition's rows under the root's OID
    /// (and announces the partition beside the root); without it, or for rows committed before
    /// the publication was altered to it, they arrive under the partition's own OID and name.
    /// A bound partition's rows are routed as the configured table's either way; a partition
    /// the session does not know is ignored like any other table, which is why the start-up
    /// checks and the publication check refuse a publication without the option.
    pub fn bind_partitions(&mut self, partitions: &[(String, String, Oid)]) {
        for (schema, table, oid) in partitions {
            if let Some(index) = self
                .tables
                .iter()
                .position(|t| t.config.is_table(schema, table))
            {
                self.partition_oids.insert(*oid, index);
            }
        }
    }

    /// Learns (or re-learns, after DDL) a relation's shape; `commit_lsn` is the commit LSN of
    /// the transaction that announces it.
    ///
    /// Outbox tables are known by relation OID, not only by name: a publication follows the
    /// table through `RENAME` and `SET SCHEMA`, so an outbox relation announced under another
    /// name, or whose mapped columns are gone, renamed or retyped, is an error here, before any
    /// row of the transaction that announces it is routed: the relay stops instead of counting
    /// the table's rows as "not an outbox".
    // Long: one `match` over how the relation is known (by name, by OID, as a partition), then the
    // checks of that one case
    pub fn on_relation(
        &mut self,
        relation: Relation,
        commit_lsn: Option<Lsn>,
    ) -> Result<(), RouteError> {
        let id = relation.id;
        let by_name = self
            .tables
            .iter()
            .position(|t| t.config.is_table(&relation.namespace, &relation.name));
        let partition_of = self.partition_oids.get(&id).copied();
        let index = match (by_name, self.outbox_oids.get(&id).copied(), partition_of) {
            (None, None, Some(index)) => {
                tracing::debug!(
                    table = %self.tables[index].config.table,
                    partition = %format!("{}.{}", relation.namespace, relation.name),
                    oid = id,
                    "partition of a partitioned outbox table announced; its rows are the table's"
                );
                index
            }
            (by_name, Some(known), _) if by_name != Some(known) => {
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
            (Some(index), _, _) => index,
            (None, _, _) => {
                self.relations.insert(id, RelationRoute::Ignored);
                return Ok(());
            }
        };
        // A name seen once as an outbox keeps its OID: an older incarnation of the table (dropped
        // and re-created while the relay was behind) is still an outbox for its WAL. A
        // partition stays a partition (it is not the table, renamed).
        if partition_of.is_none() {
            self.outbox_oids.insert(id, index);
        }
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
