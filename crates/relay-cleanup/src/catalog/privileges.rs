//! What the current role may do with a table: its owner and whether the role is (a member
//! of) it, and the table and column privileges the cleanup's modes need. The statements that
//! grant what is missing are the caller's (`cleanup::privilege_problem`).

use tokio_postgres::Client;

/// A table and the current role's relation to its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableOwnership {
    /// The table.
    pub(crate) oid: u32,
    /// The current role.
    pub(crate) user: String,
    /// The table's owner.
    pub(crate) owner: String,
    /// Whether the current role has the owner's privileges (`pg_has_role … USAGE`).
    pub(crate) acts_as_owner: bool,
}

/// [`TableOwnership`] of `schema.table`; `None` when there is no such table.
pub(crate) async fn table_ownership(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<TableOwnership>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT c.oid, current_user::text, pg_catalog.pg_get_userbyid(c.relowner)::text, \
                    pg_catalog.pg_has_role(c.relowner, 'USAGE') \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await?;
    Ok(row.map(|r| TableOwnership {
        oid: r.get(0),
        user: r.get(1),
        owner: r.get(2),
        acts_as_owner: r.get(3),
    }))
}

/// Whether the current role may `SELECT` and `DELETE` the table `oid`.
pub(crate) async fn may_select_and_delete(
    client: &Client,
    oid: u32,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        // (A list of privileges asks whether any of them is held: one call each.)
        .query_one(
            "SELECT has_table_privilege($1::oid, 'SELECT') \
                AND has_table_privilege($1::oid, 'DELETE')",
            &[&oid],
        )
        .await?
        .get(0))
}

/// Whether the current role may `UPDATE` the column `column` of the table `oid`.
pub(crate) async fn may_update_column(
    client: &Client,
    oid: u32,
    column: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT has_column_privilege($1::oid, $2::text, 'UPDATE')",
            &[&oid, &column],
        )
        .await?
        .get(0))
}

#[cfg(test)]
mod tests;
