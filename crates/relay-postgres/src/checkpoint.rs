//! The checkpoint store: `outbox_relay.checkpoint` in the source database.
//!
//! Writing progress into the source database keeps the relay free of any other state store.
//! The write must be durable before the relay confirms the position to the slot, so the
//! session commits with `synchronous_commit = on` when the server, database or role set it
//! `off`: an asynchronous commit lost in a crash would leave the slot ahead of the checkpoint.
//!
//! With each checkpoint that moved past acknowledged events, the same transaction records where
//! those events are in the stream in `outbox_relay.position_map` ([`position_map`]).

use std::str::FromStr;
use std::time::Duration;

use relay_core::Lsn;
use relay_core::stage::{CheckpointStore, ErrorClass, PositionAnchor, StoreError};
use tokio_postgres::Client;

mod position_map;
mod replay_window;

use position_map::MapWriter;
pub use position_map::{
    DEFAULT_RETENTION, MapStart, MapSummary, MapTarget, POSITION_MAP_MIGRATION, StoredAnchor,
    anchor_at_or_before, anchor_older_than, anchor_past_sequence, map_start, map_start_all_slots,
    map_summary, position_map_access, position_map_grants,
};
pub use replay_window::{ReplayWindow, ReplayWindowReport, replay_window};

/// The migration that creates the checkpoint table (also shipped in `migrations/`).
pub const CHECKPOINT_MIGRATION: &str =
    include_str!("../../../migrations/0002_relay_checkpoint.sql");

/// Durable relay progress for one slot.
#[derive(Debug)]
pub struct PgCheckpointStore {
    client: Client,
    slot: String,
    map: MapWriter,
}

fn store_err(message: String) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |source| {
        let class = if crate::is_transient_query_error(&source) {
            ErrorClass::Transient
        } else {
            ErrorClass::Fatal
        };
        StoreError::new(class, message).with_source(source)
    }
}

pub use crate::catalog::relay_tables::{TableAccess, checkpoint_table_access};

/// The statements that let `role` use the checkpoint table (DELETE: `checkpoint reset`).
pub fn checkpoint_grants(role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.checkpoint TO {role}"
    )
}

impl PgCheckpointStore {
    /// A store for `slot`. Runs [`CHECKPOINT_MIGRATION`] only when the table is missing, so a
    /// role without CREATE on the database works once an administrator has applied it; the
    /// same for [`POSITION_MAP_MIGRATION`], except that a position map that cannot be created or
    /// written is only reported (checkpoints are stored without it).
    pub async fn new(client: Client, slot: &str) -> Result<Self, StoreError> {
        let access = checkpoint_table_access(&client)
            .await
            .map_err(store_err("cannot look up outbox_relay.checkpoint".into()))?;
        match access {
            TableAccess::Usable => {}
            TableAccess::NotGranted { role } => {
                return Err(StoreError {
                    class: ErrorClass::Fatal,
                    message: format!(
                        "role `{role}` may not use outbox_relay.checkpoint: {}",
                        checkpoint_grants(&role)
                    ),
                    source: None,
                });
            }
            TableAccess::Missing => client.batch_execute(CHECKPOINT_MIGRATION).await.map_err(store_err(
                "outbox_relay.checkpoint does not exist and cannot be created: apply migrations/0002_relay_checkpoint.sql as an administrator, or GRANT CREATE ON DATABASE to the relay's role".into(),
            ))?,
        }
        // Stronger settings (local, remote_write, remote_apply) also flush locally: keep them.
        client
            .batch_execute(
                "SELECT set_config('synchronous_commit', 'on', false) \
                 WHERE current_setting('synchronous_commit') = 'off'",
            )
            .await
            .map_err(store_err(
                "cannot set synchronous_commit = on for the checkpoint session".into(),
            ))?;
        let map = MapWriter::open(&client, slot).await;
        Ok(Self {
            client,
            slot: slot.to_owned(),
            map,
        })
    }

    /// How long rows of the position map are kept (`[relay] position_retention`; default
    /// [`DEFAULT_RETENTION`]). The newest row of a stream is always kept.
    #[must_use]
    pub fn with_position_retention(mut self, retention: Duration) -> Self {
        self.map.retention = retention;
        self
    }

    /// The plain session, for catalog queries.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Where the slot's relay resumes: the stored checkpoint `stored`, or on the slot's first
    /// run the slot's position `slot_lsn`, stored now so that a lost slot is detected from then
    /// on. The second value says whether it was stored now. `run` and `setup` both start here.
    pub async fn resume_position(
        &mut self,
        stored: Option<Lsn>,
        slot_lsn: Lsn,
    ) -> Result<(Lsn, bool), StoreError> {
        match stored {
            Some(lsn) => Ok((lsn, false)),
            None => {
                self.save(slot_lsn).await?;
                Ok((slot_lsn, true))
            }
        }
    }

    /// Deletes the stored checkpoint (operator reset after reconciling a lost slot).
    pub async fn reset(&mut self) -> Result<(), StoreError> {
        self.client
            .execute(
                "DELETE FROM outbox_relay.checkpoint WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(store_err(format!(
                "cannot reset checkpoint of slot {}",
                self.slot
            )))?;
        Ok(())
    }

    /// Stores `lsn` even if it is behind the stored one (operator override only).
    pub async fn overwrite(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        self.upsert(lsn, true).await
    }

    async fn upsert(&mut self, lsn: Lsn, allow_backwards: bool) -> Result<(), StoreError> {
        let sql = Self::upsert_sql(allow_backwards);
        self.client
            .execute(sql, &[&self.slot, &lsn.to_string()])
            .await
            .map_err(store_err(format!(
                "cannot store checkpoint {lsn} for slot {}",
                self.slot
            )))?;
        Ok(())
    }

    /// Stores `lsn` and records `anchor` in one transaction. A map row that cannot be written
    /// is rolled back alone (to a savepoint) and merged into the next one: the checkpoint commits
    /// as it would without it.
    async fn upsert_anchored(
        &mut self,
        lsn: Lsn,
        anchor: PositionAnchor,
    ) -> Result<(), StoreError> {
        let failed = || {
            store_err(format!(
                "cannot store checkpoint {lsn} for slot {}",
                self.slot
            ))
        };
        let anchor = self.map.merge_pending(anchor);
        let mut tx = self.client.transaction().await.map_err(failed())?;
        tx.execute(Self::upsert_sql(false), &[&self.slot, &lsn.to_string()])
            .await
            .map_err(failed())?;
        let map = tx.savepoint("position_map").await.map_err(failed())?;
        match self.map.record(&map, &self.slot, &anchor).await {
            Ok(()) => map.commit().await.map_err(failed())?,
            Err(e) => {
                // A lost connection shows here, as it would on the checkpoint's own commit.
                map.rollback().await.map_err(failed())?;
                self.map.failed(&self.slot, anchor, &e);
            }
        }
        tx.commit().await.map_err(failed())
    }

    fn upsert_sql(allow_backwards: bool) -> &'static str {
        if allow_backwards {
            "INSERT INTO outbox_relay.checkpoint (slot_name, confirmed_lsn) VALUES ($1, $2::text::pg_lsn) \
             ON CONFLICT (slot_name) DO UPDATE SET confirmed_lsn = EXCLUDED.confirmed_lsn, updated_at = now()"
        } else {
            // Never move backwards, even if two relays raced.
            "INSERT INTO outbox_relay.checkpoint (slot_name, confirmed_lsn) VALUES ($1, $2::text::pg_lsn) \
             ON CONFLICT (slot_name) DO UPDATE SET confirmed_lsn = EXCLUDED.confirmed_lsn, updated_at = now() \
             WHERE outbox_relay.checkpoint.confirmed_lsn < EXCLUDED.confirmed_lsn"
        }
    }
}

impl CheckpointStore for PgCheckpointStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_lsn::text FROM outbox_relay.checkpoint WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(store_err(format!(
                "cannot read checkpoint of slot {}",
                self.slot
            )))?;
        Ok(row
            .and_then(|r| r.get::<_, Option<String>>(0))
            .and_then(|t| Lsn::from_str(&t).ok()))
    }

    async fn save(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        self.upsert(lsn, false).await
    }

    async fn save_with_anchor(
        &mut self,
        lsn: Lsn,
        anchor: Option<PositionAnchor>,
    ) -> Result<(), StoreError> {
        match anchor {
            Some(anchor) if self.map.usable => self.upsert_anchored(lsn, anchor).await,
            _ => self.upsert(lsn, false).await,
        }
    }
}
