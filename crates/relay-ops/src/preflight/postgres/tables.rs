//! The outbox tables: each exists, is readable, and has the columns its mapping reads.

use super::*;

/// Each published table: its columns (when it exists), then whether the role can read it.
pub(super) async fn table_checks(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let (config, client) = (c.config, c.client);
    let (user, database) = (&c.server.user, &c.server.database);
    for (index, t) in config.published_tables().iter().enumerate() {
        let name = format!("table {}", t.name());
        let info = catalog::table(client, &t.schema, &t.table).await?;
        if let Some(info) = &info {
            column_checks(config, client, index, &t.name(), info.oid, r).await?;
        }
        match info.map(|t| t.readable) {
            Some(true) => r.pass(name, "exists, readable"),
            Some(false) => r.fail(
                name,
                format!("role `{user}` lacks SELECT"),
                format!("GRANT SELECT ON {} TO {user}", t.relation()),
            ),
            None => {
                let lookalikes = catalog::table_lookalikes(client, &t.schema, &t.table).await?;
                r.fail(
                    name,
                    format!("does not exist in database `{database}`"),
                    PgError::TableMissing {
                        table: t.name(),
                        database: database.clone(),
                        lookalikes: catalog::lookalikes_hint(&lookalikes),
                    }
                    .to_string(),
                );
            }
        }
    }
    Ok(())
}

/// Whether the table of `[[outbox]]` entry `index` has every column its mapping reads, naming
/// the key (and the preset that set it) of each one it lacks.
async fn column_checks(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
    index: usize,
    table: &str,
    oid: u32,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let Some(mapping) = config.outbox.get(index) else {
        return Ok(());
    };
    let mut missing = Vec::new();
    let mut presets = std::collections::BTreeSet::new();
    for (key, column) in mapping.mapped_columns() {
        if !catalog::column_exists(client, oid, &column).await? {
            match config.outbox.preset_of(index, &key) {
                Some(preset) => {
                    presets.insert(preset.to_owned());
                    missing.push(format!("`{column}` ({key}, from preset {preset})"));
                }
                None => missing.push(format!("`{column}` ({key})")),
            }
        }
    }
    let check = format!("columns of {table}");
    if missing.is_empty() {
        r.pass(check, "every column the mapping reads exists");
        return Ok(());
    }
    let hint = if presets.is_empty() {
        "fix the [[outbox]] mapping (column names are exact, case included) or the table".to_owned()
    } else {
        format!(
            "the table does not have the shape preset {} expects (the framework's current release, docs/frameworks.md): set those keys in the [[outbox]] entry to the table's own column names, or check that the framework created the table",
            presets.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    r.fail(check, format!("no column {}", missing.join(", ")), hint);
    Ok(())
}
