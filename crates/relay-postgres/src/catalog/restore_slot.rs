//! The copy of the relay's slot that `outbox-relay restore` decodes from: the main slot is
//! never read or moved by a restore. A named (not temporary) copy, because a temporary slot
//! belongs to the session that created it and the replication connection is another session.

use std::time::Duration;

use relay_core::Lsn;
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

/// Why the restore's copy of a slot cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum SlotCopyError {
    /// Looking up a slot failed.
    #[error("cannot look up replication slot {copy}")]
    Lookup {
        copy: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The copy a previous restore left is still streamed: another restore runs.
    #[error(
        "slot `{copy}` (the restore's copy of `{slot}`) is being streamed: another restore is running; wait for it, or stop it"
    )]
    InUse { slot: String, copy: String },
    /// Dropping the copy a previous restore left failed.
    #[error("cannot drop the leftover slot {copy}")]
    DropLeftover {
        copy: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// `pg_copy_logical_replication_slot` failed.
    #[error(
        "cannot copy replication slot {slot} to {copy} (pg_copy_logical_replication_slot: PostgreSQL 12+, the REPLICATION attribute)"
    )]
    Copy {
        slot: String,
        copy: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl SlotCopyError {
    /// The failed query, when one failed (for whether it may be retried).
    #[must_use]
    pub fn query_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Self::Lookup { source, .. }
            | Self::DropLeftover { source, .. }
            | Self::Copy { source, .. } => Some(source),
            Self::InUse { .. } => None,
        }
    }
}

/// The restore's copy of a slot, from [`SlotCopy::make`] until [`SlotCopy::drop`]. The copy
/// pins WAL: drop it on every path (a value dropped without it logs how to drop the copy).
#[must_use = "the copy pins WAL until SlotCopy::drop drops it"]
#[derive(Debug)]
pub struct SlotCopy {
    name: String,
    kept_from: Option<Lsn>,
    dropped: bool,
}

impl SlotCopy {
    /// Drops the copy a killed restore left (refusing while another restore streams it), copies
    /// `slot` to [`copy_name`]`(slot)` and reads the copy back. `wait`: how long a drop waits
    /// for the walsender that streamed the copy to let go.
    pub async fn make(client: &Client, slot: &str, wait: Duration) -> Result<Self, SlotCopyError> {
        let copy = copy_name(slot);
        let lookup = |copy: &str| {
            let copy = copy.to_owned();
            move |source| SlotCopyError::Lookup { copy, source }
        };
        if super::slot(client, &copy)
            .await
            .map_err(lookup(&copy))?
            .is_some()
        {
            tracing::warn!(copy = %copy, "a previous restore left its copy of the slot (it was killed?): dropping it");
            // A walsender of a killed restore lets go a moment later; one still streaming
            // after the wait belongs to a restore that runs.
            drop_slot(client, &copy, wait).await.map_err(|source| {
                if source
                    .code()
                    .is_some_and(|c| SqlStateKind::of(c.code()) == SqlStateKind::ObjectInUse)
                {
                    SlotCopyError::InUse {
                        slot: slot.to_owned(),
                        copy: copy.clone(),
                    }
                } else {
                    SlotCopyError::DropLeftover {
                        copy: copy.clone(),
                        source,
                    }
                }
            })?;
        }
        copy_slot(client, slot, &copy)
            .await
            .map_err(|source| SlotCopyError::Copy {
                slot: slot.to_owned(),
                copy: copy.clone(),
                source,
            })?;
        tracing::info!(slot, copy = %copy, "copied the slot; the copy is dropped at the end (a killed restore leaves it: the next restore drops it)");
        let mut made = Self {
            name: copy,
            kept_from: None,
            dropped: false,
        };
        match super::slot(client, &made.name).await {
            Ok(row) => {
                made.kept_from = row.and_then(|r| r.confirmed_flush_lsn);
                Ok(made)
            }
            Err(source) => {
                let error = lookup(&made.name)(source);
                let name = made.name.clone();
                if let Err(e) = made.drop(client, wait).await {
                    tracing::warn!(copy = %name, error = %e, "cannot drop the restore's copy of the slot; it keeps WAL until dropped: SELECT pg_drop_replication_slot('{name}') (the next restore drops it too)");
                }
                Err(error)
            }
        }
    }

    /// The copy's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the copy keeps the WAL from (its confirmed position), when the server says.
    #[must_use]
    pub fn kept_from(&self) -> Option<Lsn> {
        self.kept_from
    }

    /// Drops the copy, waiting up to `wait` for the walsender that streamed it to let go.
    pub async fn drop(
        mut self,
        client: &Client,
        wait: Duration,
    ) -> Result<(), tokio_postgres::Error> {
        self.dropped = true;
        drop_slot(client, &self.name, wait).await
    }
}

impl Drop for SlotCopy {
    fn drop(&mut self) {
        if !self.dropped {
            tracing::warn!(copy = %self.name, "the restore's copy of the slot was not dropped; it keeps WAL until dropped: SELECT pg_drop_replication_slot('{}') (the next restore drops it too)", self.name);
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
