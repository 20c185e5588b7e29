//! The relay's router bound to the catalog: the relay's sessions and `restore` build it the
//! same way, so a restore routes the rows of a window exactly as the relay did.

use relay_core::route::Router;
use relay_postgres::{PgError, catalog};

use crate::config::{ConfigError, RelayConfig};

/// Why the router could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The outbox mapping is wrong.
    #[error("outbox mapping")]
    Mapping(#[source] ConfigError),
    /// The catalog could not be read.
    #[error(transparent)]
    Postgres(#[from] PgError),
}

/// The router of `config`, with the outbox tables bound to the OIDs (and partitions) the
/// catalog gives them now.
pub async fn bound_router(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
) -> Result<Router, RouterError> {
    let mut router = config.router().map_err(RouterError::Mapping)?;
    let tables = config.tables();
    let oids = catalog::outbox_table_oids(client, &tables).await?;
    router.bind_catalog(&oids.tables, oids.read_at);
    catalog::partitions::bind(client, &tables, &mut router).await?;
    Ok(router)
}
