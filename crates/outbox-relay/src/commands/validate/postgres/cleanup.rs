//! `validate --connect` for `[outbox.cleanup]`.

use super::*;

/// `[outbox.cleanup]` of each table that has one: the privileges its mode needs (with the
/// GRANT), the columns it uses, and for `drop-partitions` a table range-partitioned on one
/// column and the table that records detached partitions.
pub(super) async fn cleanup_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    use relay_postgres::cleanup::{self, PrivilegeNeed};

    use crate::config::CleanupMode;

    for (table, settings) in config.outbox.cleanup() {
        let (schema, name) = table.qualified_name();
        let (schema, name) = (schema.as_ref(), name.as_ref());
        let check = format!("cleanup {}", table.display_name());
        let Some(info) = catalog::table(client, schema, name).await? else {
            continue; // reported above
        };
        let has_column =
            |column: String| async move { catalog::column_exists(client, info.oid, &column).await };
        let mut columns = Vec::new();
        if !settings.retain().is_zero() {
            columns.push(settings.age_column.clone());
        }
        let marked: Vec<String> = [&settings.status_column, &settings.sent_at_column]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        if settings.mode == CleanupMode::Mark {
            columns.extend(marked.iter().cloned());
        }
        let mut missing = Vec::new();
        for column in columns {
            if !has_column(column.clone()).await? {
                missing.push(column);
            }
        }
        if !missing.is_empty() {
            r.fail(
                check,
                format!("no column {}", missing.join(", ")),
                "fix [outbox.cleanup] age_column / status_column / sent_at_column, or add the column",
            );
            continue;
        }
        if let Some(problem) = settings.time_column_problem(client, schema, name).await? {
            r.fail(
                check,
                "the time column's type does not fit age_unit / age_time_zone",
                problem,
            );
            continue;
        }
        let mut needs = vec![match settings.mode {
            CleanupMode::Delete => PrivilegeNeed::Delete,
            CleanupMode::Mark => PrivilegeNeed::Update(&marked),
            CleanupMode::DropPartitions => PrivilegeNeed::Own,
        }];
        if settings.delete_after.is_some() {
            needs.push(PrivilegeNeed::Delete);
        }
        let mut grants = Vec::new();
        for need in &needs {
            grants.extend(cleanup::privilege_problem(client, schema, name, need).await?);
        }
        if !grants.is_empty() {
            r.fail(
                check,
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
            );
            continue;
        }
        if settings.mode == CleanupMode::DropPartitions {
            let ranged = catalog::range_partitioned_on_one_column(client, info.oid).await?;
            if !ranged {
                r.fail(
                    check,
                    "mode = \"drop-partitions\" needs a table partitioned by RANGE on one time column",
                    "use mode = \"delete\" for this table, or partition it (PARTITION BY RANGE (created_at))",
                );
                continue;
            }
            let relation = relay_postgres::quote_relation(schema, name);
            if settings.create_ahead.is_some()
                && catalog::partitions::newest_range(client, &relation)
                    .await?
                    .is_none()
            {
                r.fail(
                    check,
                    "create_ahead takes the width of new partitions from the newest one, and the table has no range partition with both bounds",
                    format!("create the first partition by hand, e.g. CREATE TABLE {} PARTITION OF {relation} FOR VALUES FROM ('2030-01-01') TO ('2030-01-02')", relay_postgres::quote_relation(schema, &format!("{name}_p1"))),
                );
                continue;
            }
        }
        match cleanup::cleanup_tables_access(client).await? {
            TableAccess::Usable => {}
            TableAccess::NotGranted { role } => {
                r.fail(
                    check,
                    format!(
                        "role `{role}` cannot write outbox_relay.cleanup_fence and outbox_relay.cleanup_detached"
                    ),
                    cleanup::cleanup_tables_grants(&role),
                );
                continue;
            }
            TableAccess::Missing => {
                let may_create = catalog::may_create_relay_tables(client).await?;
                if !may_create {
                    r.fail(
                        check,
                        "outbox_relay.cleanup_fence and outbox_relay.cleanup_detached are missing and cannot be created",
                        "apply migrations/0006_outbox_cleanup.sql as an owner",
                    );
                    continue;
                }
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
