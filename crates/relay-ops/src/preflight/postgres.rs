//! The PostgreSQL half of the preflight: connection, server settings, privileges, outbox
//! tables, publication and slot, then what failover and the retention window need.
//!
//! The catalog checks are [`CATALOG_CHECKS`], one entry per concern, each reading what it
//! judges and adding its lines; what several of them judge ([`Catalog`]) is read once before.
//! Adding a check is adding an entry (and, for a new concern, a function in a submodule).

use futures::future::BoxFuture;
use relay_core::check::CheckAspect as _;
use relay_postgres::PgError;
use relay_postgres::catalog::{ServerInfo, SlotInfo};
use relay_postgres::checkpoint::TableAccess;
use tokio_postgres::Client;

mod cleanup;
mod failover;
mod publication;
mod server;
mod slot;
mod tables;

use super::{DATA_SAFETY, FAIL, Report, UNAVAILABLE, Verdict, error_chain};
use relay_postgres::PostgresSettings;
use relay_postgres::catalog;
use relay_runtime::config::RelayConfig;

pub(super) async fn postgres_checks(config: &RelayConfig, r: &mut Report) {
    let pg = &config.postgres;
    let target = pg.display_target();
    let (client, server) = match relay_postgres::connect_primary(pg).await {
        Ok(c) => c,
        Err(e) => {
            let verdict = if e.is_transient() { UNAVAILABLE } else { FAIL };
            r.hinted(
                verdict,
                "postgres connection",
                format!("{e}: {}", error_chain(&e)),
                "check postgres.url / RELAY_POSTGRES__URL, RELAY_POSTGRES__PASSWORD, pg_hba.conf and that the server is up",
            );
            return;
        }
    };
    if server.is_pinned() {
        r.pass(
            "postgres connection",
            format!(
                "connected to {}, the read-write server of {target}",
                server.display_target()
            ),
        );
    } else {
        r.pass("postgres connection", format!("connected to {target}"));
    }
    if let Err(e) = catalog_checks(config, &client, r).await {
        r.hinted(
            UNAVAILABLE,
            "postgres catalog",
            format!("query failed: {e}"),
            "the connection broke during the preflight; run it again",
        );
        return;
    }
    failover::failover_and_retention_checks(config, &client, &server, r).await;
}

/// What several catalog checks judge: the server's settings and the role, and the slot.
struct Catalog<'a> {
    config: &'a RelayConfig,
    client: &'a Client,
    server: ServerInfo,
    /// `None`: the slot does not exist.
    slot: Option<SlotInfo>,
}

/// One concern of the catalog: reads what it needs through `client` and adds its lines.
type CatalogCheck =
    for<'a> fn(&'a Catalog<'a>, &'a mut Report) -> BoxFuture<'a, Result<(), tokio_postgres::Error>>;

/// The catalog checks, in the order they are reported.
const CATALOG_CHECKS: &[CatalogCheck] = &[
    |c, r| {
        server::setting_checks(c, r);
        Box::pin(std::future::ready(Ok(())))
    },
    |c, r| Box::pin(server::privilege_checks(c, r)),
    |c, r| Box::pin(server::position_map_check(c, r)),
    |c, r| Box::pin(server::emit_functions_check(c, r)),
    |c, r| Box::pin(tables::table_checks(c, r)),
    |c, r| Box::pin(cleanup::cleanup_checks(c.config, c.client, r)),
    |c, r| Box::pin(publication::publication_checks(c, r)),
    |c, r| Box::pin(slot::slot_checks(c, r)),
];

async fn catalog_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let catalog = Catalog {
        config,
        client,
        server: catalog::server(client).await?,
        slot: catalog::slot(client, &config.postgres.slot).await?,
    };
    for check in CATALOG_CHECKS {
        check(&catalog, r).await?;
    }
    Ok(())
}
