//! Refuses a publication newer than the slot's position.
//!
//! A slot decodes its WAL with the catalog as it was when that WAL was written, so changes
//! committed after the slot's position but before the publication existed cannot be read
//! through it: PostgreSQL 15–17 stop decoding (ERROR 42704 "publication does not exist"), 18
//! skips them with only a warning (WARNING 55000 "skipped loading publication", in the server
//! log; the replication session drops it). The catalog records no creation position, so:
//!
//! 1. Transaction ids, cheap: the publication's oldest trace — the `xmin` of its
//!    `pg_publication` row (rewritten by `ALTER PUBLICATION … SET`, `OWNER`, `RENAME`), of its
//!    `pg_publication_rel` rows (`CREATE … FOR TABLE`, `ADD TABLE`) and of its
//!    `pg_publication_namespace` rows — against the slot's `catalog_xmin`, the oldest
//!    transaction still running at the oldest WAL the slot decodes from. Older: the
//!    publication existed before the slot's position, nothing to do. Otherwise it may be newer,
//!    or the slot's `catalog_xmin` is only stale (a slot not yet read past its creation keeps
//!    the horizon of any transaction open then).
//! 2. Then decoding decides: the slot is peeked from its position (nothing consumed or
//!    confirmed) up to its first change published through the publication, on a session that
//!    collects the server's warnings. Refused when pgoutput reports the publication missing at
//!    a decoded change (the ERROR or the WARNING above, by SQLSTATE).

use relay_core::Lsn;
use tokio_postgres::Client;

use crate::sqlstate::SqlStateKind;
use crate::{PgError, PostgresSettings};

/// `Ok` when the publication of `settings` is older than its slot's position `slot_lsn`, or
/// when no change decoded after that position predates it; `PublicationNewerThanSlot`
/// otherwise. `slot_active`: another process streams the slot; it cannot be peeked then, and
/// this session cannot stream it either (a standby): the session that finds it free checks.
pub(crate) async fn check(
    client: &Client,
    settings: &PostgresSettings,
    slot_lsn: Lsn,
    slot_active: bool,
    server_version_num: i32,
) -> Result<(), PgError> {
    let (slot, publication) = (settings.slot.as_str(), settings.publication.as_str());
    if !crate::catalog::publication_age::maybe_newer_than_slot(
        client,
        slot,
        publication,
        server_version_num,
    )
    .await?
    {
        return Ok(());
    }
    if slot_active {
        tracing::info!(
            slot,
            publication,
            "the publication may be newer than the slot; checked once the slot is free"
        );
        return Ok(());
    }
    tracing::info!(
        slot,
        publication,
        "the publication may be newer than the slot: decoding the slot from {slot_lsn} to check"
    );
    let refused = || PgError::PublicationNewerThanSlot {
        slot: slot.to_owned(),
        publication: publication.to_owned(),
        slot_lsn,
    };
    let (peeker, mut notices) = crate::connect::connect_with_notices(settings).await?;
    let peek = peeker
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_logical_slot_peek_binary_changes(\
                $1, NULL, 1, 'proto_version', '1', 'publication_names', $2)",
            &[&slot, &publication],
        )
        .await;
    let kind = |e: &tokio_postgres::error::DbError| SqlStateKind::of(e.code().code());
    match peek {
        Ok(_) => {}
        Err(error) => match error.as_db_error().map(kind) {
            Some(SqlStateKind::UndefinedObject) => return Err(refused()),
            // Another process started streaming it meanwhile (see `slot_active`).
            Some(SqlStateKind::ObjectInUse) => return Ok(()),
            _ => {
                return Err(PgError::Query {
                    context: format!(
                        "cannot decode replication slot {slot} to check that publication {publication} is older than it"
                    ),
                    source: error,
                });
            }
        },
    }
    // The session hands a notice over before the result of the statement it belongs to.
    while let Ok(notice) = notices.try_recv() {
        if matches!(
            kind(&notice),
            SqlStateKind::NotInPrerequisiteState | SqlStateKind::UndefinedObject
        ) {
            tracing::warn!(slot, publication, warning = %notice, "decoding the slot skipped the publication");
            return Err(refused());
        }
    }
    Ok(())
}
