//! `validate --connect` for `[outbox.cleanup]`: per table, the gates of [`CLEANUP_GATES`] in
//! order; the first that finds a problem fails the table's line, and a table past all of them
//! passes. Adding a condition of cleanup is adding a gate.

use relay_cleanup::PrivilegeNeed;

use super::*;
use relay_runtime::config::{CleanupMode, CleanupSettings};

/// One table with `[outbox.cleanup]`, as the gates judge it.
struct CleanupTable<'a> {
    client: &'a Client,
    schema: &'a str,
    name: &'a str,
    oid: u32,
    settings: &'a CleanupSettings,
    /// `status_column` and `sent_at_column`, as far as set.
    marked: Vec<String>,
}

/// What stops cleanup of a table: what was found, and the fix.
type Problem = Option<(String, String)>;

/// One condition of cleanup: `Some` problem when the table does not meet it.
type CleanupGate =
    for<'a> fn(&'a CleanupTable<'a>) -> BoxFuture<'a, Result<Problem, tokio_postgres::Error>>;

/// The conditions, in the order they are judged.
const CLEANUP_GATES: &[CleanupGate] = &[
    |t| Box::pin(columns(t)),
    |t| Box::pin(time_column(t)),
    |t| Box::pin(privileges(t)),
    |t| Box::pin(partitioning(t)),
    |t| Box::pin(relay_tables(t)),
];

/// `[outbox.cleanup]` of each table that has one: the privileges its mode needs (with the
/// GRANT), the columns it uses, and for `drop-partitions` a table range-partitioned on one
/// column and the table that records detached partitions.
pub(super) async fn cleanup_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    'tables: for (table, settings) in config.outbox.cleanup() {
        let (schema, name) = table.qualified_name();
        let (schema, name) = (schema.as_ref(), name.as_ref());
        let check = format!("cleanup {}", table.display_name());
        let Some(info) = catalog::table(client, schema, name).await? else {
            continue; // reported above
        };
        let marked = [&settings.status_column, &settings.sent_at_column]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let t = CleanupTable {
            client,
            schema,
            name,
            oid: info.oid,
            settings,
            marked,
        };
        for gate in CLEANUP_GATES {
            if let Some((detail, hint)) = gate(&t).await? {
                r.fail(check, detail, hint);
                continue 'tables;
            }
        }
        r.pass(
            check,
            format!(
                "mode = \"{}\", retain {}, every {}",
                settings.mode.as_str(),
                humantime_serde::re::humantime::format_duration(settings.retain()),
                humantime_serde::re::humantime::format_duration(settings.interval)
            ),
        );
    }
    Ok(())
}

fn problem(detail: impl Into<String>, hint: impl Into<String>) -> Problem {
    Some((detail.into(), hint.into()))
}

/// The age column (when rows are kept a while) and, for `mark`, the marked columns exist.
async fn columns(t: &CleanupTable<'_>) -> Result<Problem, tokio_postgres::Error> {
    let settings = t.settings;
    let mut columns = Vec::new();
    if !settings.retain().is_zero() {
        columns.push(settings.age_column.clone());
    }
    if settings.mode == CleanupMode::Mark {
        columns.extend(t.marked.iter().cloned());
    }
    let mut missing = Vec::new();
    for column in columns {
        if !catalog::column_exists(t.client, t.oid, &column).await? {
            missing.push(column);
        }
    }
    if missing.is_empty() {
        return Ok(None);
    }
    Ok(problem(
        format!("no column {}", missing.join(", ")),
        "fix [outbox.cleanup] age_column / status_column / sent_at_column, or add the column",
    ))
}

async fn time_column(t: &CleanupTable<'_>) -> Result<Problem, tokio_postgres::Error> {
    let found = t
        .settings
        .time_column_problem(t.client, t.schema, t.name)
        .await?;
    Ok(found.and_then(|fix| {
        problem(
            "the time column's type does not fit age_unit / age_time_zone",
            fix,
        )
    }))
}

/// The privileges the mode (and `delete_after`) needs, with the GRANTs.
async fn privileges(t: &CleanupTable<'_>) -> Result<Problem, tokio_postgres::Error> {
    let settings = t.settings;
    let mut needs = vec![match settings.mode {
        CleanupMode::Delete => PrivilegeNeed::Delete,
        CleanupMode::Mark => PrivilegeNeed::Update(&t.marked),
        CleanupMode::DropPartitions => PrivilegeNeed::Own,
    }];
    if settings.delete_after.is_some() {
        needs.push(PrivilegeNeed::Delete);
    }
    let mut grants = Vec::new();
    for need in &needs {
        grants.extend(relay_cleanup::privilege_problem(t.client, t.schema, t.name, need).await?);
    }
    if grants.is_empty() {
        return Ok(None);
    }
    Ok(problem(
        format!(
            "mode = \"{}\"{} needs privileges the role lacks",
            settings.mode.as_str(),
            if settings.delete_after.is_some() {
                " with delete_after"
            } else {
                ""
            }
        ),
        grants.join("; "),
    ))
}

/// `drop-partitions`: a table range-partitioned on one column, with a partition to take the
/// width of new ones from when `create_ahead` is set.
async fn partitioning(t: &CleanupTable<'_>) -> Result<Problem, tokio_postgres::Error> {
    if t.settings.mode != CleanupMode::DropPartitions {
        return Ok(None);
    }
    if !relay_cleanup::catalog::range_partitioned_on_one_column(t.client, t.oid).await? {
        return Ok(problem(
            "mode = \"drop-partitions\" needs a table partitioned by RANGE on one time column",
            "use mode = \"delete\" for this table, or partition it (PARTITION BY RANGE (created_at))",
        ));
    }
    let relation = relay_postgres::quote_relation(t.schema, t.name);
    if t.settings.create_ahead.is_some()
        && relay_cleanup::catalog::newest_range(t.client, &relation)
            .await?
            .is_none()
    {
        return Ok(problem(
            "create_ahead takes the width of new partitions from the newest one, and the table has no range partition with both bounds",
            format!(
                "create the first partition by hand, e.g. CREATE TABLE {} PARTITION OF {relation} FOR VALUES FROM ('2030-01-01') TO ('2030-01-02')",
                relay_postgres::quote_relation(t.schema, &format!("{}_p1", t.name))
            ),
        ));
    }
    Ok(None)
}

/// The relay's cleanup tables are writable, or can be created.
async fn relay_tables(t: &CleanupTable<'_>) -> Result<Problem, tokio_postgres::Error> {
    Ok(
        match relay_cleanup::cleanup_tables_access(t.client).await? {
            TableAccess::Usable => None,
            TableAccess::NotGranted { role } => problem(
                format!(
                    "role `{role}` cannot write outbox_relay.cleanup_fence and outbox_relay.cleanup_detached"
                ),
                relay_cleanup::cleanup_tables_grants(&role),
            ),
            TableAccess::Missing if catalog::may_create_relay_tables(t.client).await? => None,
            TableAccess::Missing => problem(
                "outbox_relay.cleanup_fence and outbox_relay.cleanup_detached are missing and cannot be created",
                "apply migrations/0006_outbox_cleanup.sql as an owner",
            ),
        },
    )
}
