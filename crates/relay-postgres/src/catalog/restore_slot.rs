//! The copy of the relay's slot that `outbox-relay restore` decodes from: the main slot is
//! never read or moved by a restore. A named (not temporary) copy, because a temporary slot
//! belongs to the session that created it and the replication connection is another session.

use tokio_postgres::Client;

use crate::sqlstate::SqlStateKind;

/// PostgreSQL's limit on slot names (NAMEDATALEN - 1).
const MAX_SLOT_NAME: usize = 63;

/// The name of the restore copy of `slot`: `<slot>_restore`, the slot's part shortened to fit.
#[must_use]
pub fn copy_name(slot: &str) -> String {
    const SUFFIX: &str = "_restore";
    let keep = slot.len().min(MAX_SLOT_NAME - SUFFIX.len());
    format!("{}{SUFFIX}", &slot[..keep])
}

/// Copies the logical slot `source` to a new permanent slot `copy`, at the same restart and
/// confirmed positions (`pg_copy_logical_replication_slot`, PostgreSQL 12+).
pub async fn copy_slot(
    client: &Client,
    source: &str,
    copy: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2, false)",
            &[&source, &copy],
        )
        .await?;
    Ok(())
}

/// Drops the slot `name`, waiting up to `wait` while a walsender still holds it (the
/// replication session that streamed it ends a moment after its client stopped).
pub async fn drop_slot(
    client: &Client,
    name: &str,
    wait: std::time::Duration,
) -> Result<(), tokio_postgres::Error> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match client
            .execute("SELECT pg_drop_replication_slot($1)", &[&name])
            .await
        {
            Ok(_) => return Ok(()),
            Err(e)
                if tokio::time::Instant::now() < deadline
                    && e.code().is_some_and(|c| {
                        SqlStateKind::of(c.code()) == SqlStateKind::ObjectInUse
                    }) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_name;

    #[test]
    fn copy_names_fit() {
        assert_eq!(copy_name("outbox_relay"), "outbox_relay_restore");
        let long = "s".repeat(63);
        assert_eq!(copy_name(&long).len(), 63);
    }
}
