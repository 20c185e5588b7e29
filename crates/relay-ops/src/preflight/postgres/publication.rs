//! The publication: it exists and publishes inserts, has each outbox table as itself, and
//! filters the rows the configuration says.

use relay_postgres::bootstrap::PublishedTable;
use relay_postgres::catalog::partitions::{self, Membership};

use super::*;

pub(super) async fn publication_checks(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let pg = &c.config.postgres;
    let publication = &pg.publication;
    let tables = c.config.published_tables();
    let found = catalog::publication(c.client, publication).await?;
    let name = format!("publication {publication}");
    match found.map(|p| p.publishes_inserts) {
        None if pg.create_publication => r.pass(
            name,
            "missing; will be created at start (create_publication = true) or by `outbox-relay setup`",
        ),
        None => r.fail(
            name,
            "does not exist",
            PgError::PublicationMissing {
                publication: publication.clone(),
                tables: tables
                    .iter()
                    .map(PublishedTable::relation)
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .to_string(),
        ),
        Some(false) => r.fail(
            name,
            "does not publish inserts",
            PgError::PublicationNoInsert {
                publication: publication.clone(),
            }
            .to_string(),
        ),
        Some(true) => {
            r.pass(name.clone(), "exists, publishes inserts");
            for t in &tables {
                if membership_check(c, &name, t, r).await? {
                    row_filter_check(pg, c.client, c.server.version_num, t, r).await?;
                }
            }
        }
    }
    Ok(())
}

/// Whether the publication has `t` as itself (not as its partitions or its parent's);
/// returns whether it does.
async fn membership_check(
    c: &Catalog<'_>,
    name: &str,
    t: &PublishedTable,
    r: &mut Report,
) -> Result<bool, tokio_postgres::Error> {
    let publication = &c.config.postgres.publication;
    let membership = partitions::membership(c.client, publication, &t.schema, &t.table).await?;
    let qualified = t.name();
    let check = format!("{name} has {qualified}");
    let member = membership == Membership::Member;
    match membership {
        Membership::Member => r.pass(check, "member"),
        Membership::NotInPublication => r.fail(
            check,
            "not in the publication",
            PgError::PublicationMissingTable {
                publication: publication.clone(),
                table: qualified,
            }
            .to_string(),
        ),
        other => r.fail(
            check,
            match other {
                Membership::PublishedAsPartitions => {
                    "partitioned, published as its partitions (publish_via_partition_root is off)"
                        .to_owned()
                }
                _ => "published as its partitioned parent's".to_owned(),
            },
            other.problem(publication, &qualified).unwrap_or_default(),
        ),
    }
    Ok(member)
}

/// The publication's row filter on the table, judged as the relay judges it at start.
async fn row_filter_check(
    pg: &PostgresSettings,
    client: &Client,
    version_num: i32,
    t: &PublishedTable,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    use relay_postgres::RowFilterVerdict;
    let check = format!("publication {} rows of {}", pg.publication, t.name());
    if t.row_filter.is_some()
        && let Some(problem) = relay_postgres::row_filters_unsupported(&[t.name()], version_num)
    {
        r.fail(check, "row_filter needs PostgreSQL 15 or later", problem);
        return Ok(());
    }
    let verdict = relay_postgres::catalog::row_filter::row_filter_verdict(
        client,
        pg,
        version_num,
        &t.schema,
        &t.table,
        t.row_filter.as_deref(),
    )
    .await?;
    match &verdict {
        RowFilterVerdict::Unfiltered => {}
        RowFilterVerdict::Shard(shard) => {
            r.pass(check, format!("shard {} (row filter)", shard.describe()));
        }
        RowFilterVerdict::Configured { filter } => {
            r.pass(check, format!("row_filter ({filter})"));
        }
        RowFilterVerdict::FilteredWithoutShard { filter, .. } => r.hinted(
            Verdict::Warn,
            check,
            format!("row filter ({filter}): rows it does not keep are never relayed"),
            verdict.warning().unwrap_or_default(),
        ),
        RowFilterVerdict::NotTheShard { .. } => r.fail(
            check,
            "row filter is not the configured shard's",
            verdict.problem().unwrap_or_default(),
        ),
        RowFilterVerdict::NotTheConfigured { .. } => r.fail(
            check,
            "row filter is not the configured row_filter",
            verdict.problem().unwrap_or_default(),
        ),
        RowFilterVerdict::InvalidFilter { .. } | RowFilterVerdict::CannotCheck { .. } => r.fail(
            check,
            "row_filter cannot be checked",
            verdict.problem().unwrap_or_default(),
        ),
    }
    Ok(())
}
