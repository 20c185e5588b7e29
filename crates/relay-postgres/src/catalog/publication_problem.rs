//! What the publication drift check says when the publication stopped delivering an outbox
//! table's inserts: the catalog facts and the fix, in words an operator can act on.

use tokio_postgres::Client;

use super::partitions::{self, Membership};
use super::{PublicationGap, publication_gap};
use crate::sql::quote_displayed;

/// Why the publication no longer delivers inserts of every outbox table, if it does not.
pub async fn publication_problem(
    client: &Client,
    publication: &str,
    tables: &[(String, String)],
) -> Result<Option<String>, tokio_postgres::Error> {
    // A partitioned table published as its partitions, or a partition published as its parent,
    // is not "missing": say what is wrong instead.
    let gap = publication_gap(client, publication, tables).await?;
    if let Some(PublicationGap::MissingTable(_)) = &gap
        && let Some((table, membership)) =
            partitions::first_problem(client, publication, tables).await?
        && membership != Membership::NotInPublication
    {
        return Ok(membership.problem(publication, &table));
    }
    Ok(gap.map(|gap| gap.drift_problem(publication)))
}

impl PublicationGap {
    /// The gap as found after start-up: it was fine then, so it was changed since.
    #[must_use]
    pub fn drift_problem(&self, publication: &str) -> String {
        match self {
            Self::Missing => format!(
                "publication `{publication}` no longer exists: outbox inserts would silently stop arriving. Re-create it (CREATE PUBLICATION {publication} FOR TABLE … WITH (publish = 'insert', publish_via_partition_root = true)) and check the slot"
            ),
            Self::NoInserts => format!(
                "publication `{publication}` no longer publishes inserts: ALTER PUBLICATION {publication} SET (publish = 'insert')"
            ),
            Self::MissingTable(table) => format!(
                "outbox table `{table}` is no longer in publication `{publication}` (dropped and re-created, or removed from the publication): its inserts would silently stop arriving. ALTER PUBLICATION {publication} ADD TABLE {}",
                quote_displayed(table)
            ),
        }
    }
}
