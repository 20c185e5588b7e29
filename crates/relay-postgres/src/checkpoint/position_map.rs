//! `outbox_relay.position_map`: where the relay's events are in its stream, one row per stored
//! checkpoint that moved past acknowledged events ([`PositionAnchor`]), written in the
//! checkpoint's transaction; and the lookup `outbox-relay position` starts from.
//!
//! The map is an aid, never a condition: a role that may not create or write it, or a failed
//! write, costs the lookup its anchors (it then searches the stream itself), never a checkpoint.

use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use relay_core::Lsn;
use relay_core::message::pg_time_to_system;
use relay_core::stage::PositionAnchor;
use tokio_postgres::{Client, GenericClient};

use super::TableAccess;

/// The migration that creates the table (also shipped in `migrations/`).
pub const POSITION_MAP_MIGRATION: &str =
    include_str!("../../../../migrations/0004_position_map.sql");

/// Default of `[relay] position_retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// At most this often the store prunes old rows, in the checkpoint's transaction.
const PRUNE_EVERY: Duration = Duration::from_secs(300);
/// Rows one prune deletes at most (a checkpoint per second adds 300 in `PRUNE_EVERY`).
const PRUNE_LIMIT: i64 = 2000;

/// The statements that let `role` write the map (DELETE: pruning).
pub fn position_map_grants(role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.position_map TO {role}"
    )
}

pub use crate::catalog::relay_tables::position_map_access;

/// The store's side of the map: whether it is written, and when it was last pruned.
#[derive(Debug)]
pub(super) struct MapWriter {
    pub(super) usable: bool,
    pub(super) retention: Duration,
    pruned_at: Option<Instant>,
    /// An anchor whose write failed: merged into the next, so no checkpoint's events go
    /// without one (anchors cover consecutive ranges; a gap would void the lookup before it).
    pending: Option<PositionAnchor>,
}

impl MapWriter {
    /// Makes sure the table exists (creating it when missing and allowed); a map that cannot be
    /// used is reported once and left out.
    pub(super) async fn open(client: &Client, slot: &str) -> Self {
        let problem = match position_map_access(client).await {
            Ok(TableAccess::Usable) => None,
            Ok(TableAccess::NotGranted { role }) => Some(position_map_grants(&role)),
            Ok(TableAccess::Missing) => match client.batch_execute(POSITION_MAP_MIGRATION).await {
                Ok(()) => None,
                Err(e) => Some(format!(
                    "it does not exist and cannot be created ({e}): apply migrations/0004_position_map.sql as an administrator"
                )),
            },
            Err(e) => Some(e.to_string()),
        };
        if let Some(problem) = &problem {
            tracing::warn!(
                slot,
                problem = %problem,
                "the position map (outbox_relay.position_map) is not written: `outbox-relay position` and `replay` will search the stream instead"
            );
        }
        Self {
            usable: problem.is_none(),
            retention: DEFAULT_RETENTION,
            pruned_at: None,
            pending: None,
        }
    }

    /// `anchor`, widened by one whose write failed: the earlier commit, the lower sequence.
    pub(super) fn merge_pending(&mut self, anchor: PositionAnchor) -> PositionAnchor {
        match self.pending.take() {
            Some(p) if p.stream == anchor.stream => PositionAnchor {
                stream: anchor.stream,
                commit_lsn: p.commit_lsn.min(anchor.commit_lsn),
                commit_time_micros: if p.commit_lsn <= anchor.commit_lsn {
                    p.commit_time_micros
                } else {
                    anchor.commit_time_micros
                },
                stream_seq: p.stream_seq.min(anchor.stream_seq),
                floor_unknown: p.floor_unknown || anchor.floor_unknown,
            },
            _ => anchor,
        }
    }

    /// Writing `anchor` failed with `error` (rolled back): it is kept for the next write; a
    /// refusal that retrying cannot cure (permissions, a dropped table) stops the map.
    pub(super) fn failed(
        &mut self,
        slot: &str,
        anchor: PositionAnchor,
        error: &tokio_postgres::Error,
    ) {
        self.pending = Some(anchor);
        if crate::is_transient_query_error(error) {
            tracing::warn!(slot, error = %error, "cannot write the position map now; the next checkpoint writes this anchor too");
        } else {
            self.usable = false;
            tracing::warn!(
                slot,
                error = %error,
                "cannot write the position map; checkpoints are stored without it from now on (`outbox-relay position` and `replay` search the stream instead)"
            );
        }
    }

    /// Records `anchor` (and, every few minutes, prunes old rows) inside the checkpoint's
    /// transaction `tx`. A failure is the caller's to roll back to before this.
    pub(super) async fn record(
        &mut self,
        tx: &impl GenericClient,
        slot: &str,
        anchor: &PositionAnchor,
    ) -> Result<(), tokio_postgres::Error> {
        let seq = i64::try_from(anchor.stream_seq).unwrap_or(i64::MAX);
        let time = pg_time_to_system(anchor.commit_time_micros);
        tx.execute(
            "INSERT INTO outbox_relay.position_map \
                 (slot_name, stream, commit_lsn, commit_time, stream_seq) \
             SELECT $1, $2, $3::text::pg_lsn, $4, CASE WHEN $6 THEN LEAST($5, COALESCE( \
                 (SELECT p.stream_seq FROM outbox_relay.position_map p \
                  WHERE p.slot_name = $1 AND p.stream = $2 \
                  ORDER BY p.commit_lsn DESC LIMIT 1), 0)) ELSE $5 END \
             ON CONFLICT (slot_name, stream, commit_lsn) DO UPDATE \
             SET stream_seq = LEAST(outbox_relay.position_map.stream_seq, EXCLUDED.stream_seq), \
                 recorded_at = now()",
            &[
                &slot,
                &anchor.stream.as_ref(),
                &anchor.commit_lsn.to_string(),
                &time,
                &seq,
                &anchor.floor_unknown,
            ],
        )
        .await?;
        if self.pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let micros = i64::try_from(self.retention.as_micros()).unwrap_or(i64::MAX);
            let pruned = tx
                .execute(
                    "DELETE FROM outbox_relay.position_map WHERE ctid IN ( \
                       SELECT ctid FROM outbox_relay.position_map \
                       WHERE slot_name = $1 AND stream = $2 \
                         AND recorded_at < now() - $3::bigint * interval '1 microsecond' \
                         AND commit_lsn < $4::text::pg_lsn \
                       LIMIT $5)",
                    &[
                        &slot,
                        &anchor.stream.as_ref(),
                        &micros,
                        &anchor.commit_lsn.to_string(),
                        &PRUNE_LIMIT,
                    ],
                )
                .await?;
            self.pruned_at = Some(Instant::now());
            if pruned > 0 {
                tracing::debug!(slot, pruned, "position map: pruned old rows");
            }
        }
        Ok(())
    }
}

/// What a lookup is for: the first event committed at or after an LSN, or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapTarget {
    /// A commit LSN.
    Lsn(Lsn),
    /// A commit time.
    Time(SystemTime),
}

/// Where a lookup starts according to the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapStart {
    /// The anchor it starts from: the last one committed before the target.
    pub anchor_lsn: Lsn,
    /// Its commit time.
    pub anchor_time: SystemTime,
    /// The lowest sequence of that anchor and every later one: every event committed at or
    /// after the anchor has a copy at or after it.
    pub start_seq: u64,
    /// The slots whose maps it combines (one, or every shard's: [`map_start_all_slots`]).
    pub slots: Vec<String>,
}

/// Where the lookup for `target` starts: the anchor with the largest commit LSN below it (for a
/// time: the one with the latest commit time before it), and the lowest sequence of it and of
/// every anchor after it. `None` when the map has no anchor before the target (empty, pruned,
/// or the target precedes it).
pub async fn map_start(
    client: &impl GenericClient,
    slot: &str,
    stream: &str,
    target: MapTarget,
) -> Result<Option<MapStart>, tokio_postgres::Error> {
    const REST: &str = "SELECT lo.commit_lsn::text, lo.commit_time, \
           (SELECT min(m.stream_seq) FROM outbox_relay.position_map m \
            WHERE m.slot_name = $1 AND m.stream = $2 AND m.commit_lsn >= lo.commit_lsn) \
         FROM lo";
    let row = match target {
        MapTarget::Lsn(lsn) => {
            let sql = format!(
                "WITH lo AS (SELECT commit_lsn, commit_time FROM outbox_relay.position_map \
                   WHERE slot_name = $1 AND stream = $2 AND commit_lsn < $3::text::pg_lsn \
                   ORDER BY commit_lsn DESC LIMIT 1) {REST}"
            );
            client
                .query_opt(&sql, &[&slot, &stream, &lsn.to_string()])
                .await?
        }
        MapTarget::Time(time) => {
            let sql = format!(
                "WITH lo AS (SELECT commit_lsn, commit_time FROM outbox_relay.position_map \
                   WHERE slot_name = $1 AND stream = $2 AND commit_time < $3 \
                   ORDER BY commit_time DESC, commit_lsn DESC LIMIT 1) {REST}"
            );
            client.query_opt(&sql, &[&slot, &stream, &time]).await?
        }
    };
    Ok(row.and_then(|row| {
        let lsn = Lsn::from_str(&row.get::<_, String>(0)).ok()?;
        let start: i64 = row.get(2);
        Some(MapStart {
            anchor_lsn: lsn,
            anchor_time: row.get(1),
            start_seq: u64::try_from(start).unwrap_or(0),
            slots: vec![slot.to_owned()],
        })
    }))
}

/// [`map_start`] over every slot of this database that records anchors for `stream`: shards
/// (`[postgres] shard`) publish into one stream and each records its own anchors, so one shard's
/// map says nothing of the events another shard stored earlier in the stream (a shard that was
/// down publishes its part of a window after the others). The start is the lowest of every
/// slot's; `None` unless every such slot has an anchor before the target (then the stream
/// search answers, which holds whatever the order between shards). Slots that no longer exist
/// are left out: their anchors are never pruned, and they publish nothing any more.
pub async fn map_start_all_slots(
    client: &impl GenericClient,
    stream: &str,
    target: MapTarget,
) -> Result<Option<MapStart>, tokio_postgres::Error> {
    let slots = crate::catalog::relay_tables::slots_mapping_stream(client, stream).await?;
    let mut combined: Option<MapStart> = None;
    for slot in &slots {
        let Some(start) = map_start(client, slot, stream, target).await? else {
            return Ok(None);
        };
        combined = Some(match combined {
            None => start,
            Some(mut c) => {
                c.slots.push(slot.clone());
                if start.start_seq < c.start_seq {
                    (c.anchor_lsn, c.anchor_time, c.start_seq) =
                        (start.anchor_lsn, start.anchor_time, start.start_seq);
                }
                c
            }
        });
    }
    Ok(combined)
}

/// One row of the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAnchor {
    /// Earliest commit behind its checkpoint.
    pub commit_lsn: Lsn,
    /// Its commit time.
    pub commit_time: SystemTime,
    /// The sequence (see the migration).
    pub stream_seq: u64,
}

/// What the map holds for a slot and stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSummary {
    /// Rows.
    pub rows: u64,
    /// The oldest and the newest anchor.
    pub range: Option<(StoredAnchor, StoredAnchor)>,
}

/// How many anchors the map holds for `slot` and `stream`, and the oldest and newest.
pub async fn map_summary(
    client: &impl GenericClient,
    slot: &str,
    stream: &str,
) -> Result<MapSummary, tokio_postgres::Error> {
    let rows = client
        .query(
            "(SELECT commit_lsn::text, commit_time, stream_seq FROM outbox_relay.position_map \
              WHERE slot_name = $1 AND stream = $2 ORDER BY commit_lsn LIMIT 1) \
             UNION ALL \
             (SELECT commit_lsn::text, commit_time, stream_seq FROM outbox_relay.position_map \
              WHERE slot_name = $1 AND stream = $2 ORDER BY commit_lsn DESC LIMIT 1)",
            &[&slot, &stream],
        )
        .await?;
    let anchor = |row: &tokio_postgres::Row| {
        Some(StoredAnchor {
            commit_lsn: Lsn::from_str(&row.get::<_, String>(0)).ok()?,
            commit_time: row.get(1),
            stream_seq: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        })
    };
    let count = client
        .query_one(
            "SELECT count(*) FROM outbox_relay.position_map WHERE slot_name = $1 AND stream = $2",
            &[&slot, &stream],
        )
        .await?
        .get::<_, i64>(0);
    let range = match rows.as_slice() {
        [oldest, newest] => anchor(oldest).zip(anchor(newest)),
        _ => None,
    };
    Ok(MapSummary {
        rows: u64::try_from(count).unwrap_or(0),
        range,
    })
}

/// The commit LSN of the newest anchor of `slot` (any stream) committed at least `age` ago by
/// the server's clock: every event committed since has a commit LSN at or after it. Where a
/// relay with `[relay] replay_retention` may confirm its slot to when it starts (it knows no
/// checkpoint of its own that old yet). `None` without such an anchor.
pub async fn anchor_older_than(
    client: &impl GenericClient,
    slot: &str,
    age: Duration,
) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let micros = i64::try_from(age.as_micros()).unwrap_or(i64::MAX);
    let row = client
        .query_opt(
            "SELECT commit_lsn::text FROM outbox_relay.position_map \
             WHERE slot_name = $1 AND commit_time <= now() - $2::bigint * interval '1 microsecond' \
             ORDER BY commit_lsn DESC LIMIT 1",
            &[&slot, &micros],
        )
        .await?;
    Ok(row.and_then(|r| Lsn::from_str(&r.get::<_, String>(0)).ok()))
}

/// The newest anchor of `slot` (any stream) committed at or before `lsn`: when the slot's
/// confirmed position was committed, for `status`. `None` without one.
pub async fn anchor_at_or_before(
    client: &impl GenericClient,
    slot: &str,
    lsn: Lsn,
) -> Result<Option<StoredAnchor>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT commit_lsn::text, commit_time, stream_seq FROM outbox_relay.position_map \
             WHERE slot_name = $1 AND commit_lsn <= $2::text::pg_lsn \
             ORDER BY commit_lsn DESC LIMIT 1",
            &[&slot, &lsn.to_string()],
        )
        .await?;
    Ok(row.and_then(|row| {
        Some(StoredAnchor {
            commit_lsn: Lsn::from_str(&row.get::<_, String>(0)).ok()?,
            commit_time: row.get(1),
            stream_seq: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        })
    }))
}

/// The earliest anchor of `slot` in `stream` whose sequence is past `last_seq`: the stream held
/// a copy of its events at or after that sequence when the checkpoint was stored, so a stream
/// whose last sequence is now `last_seq` went back (re-created, reset, or a lost tail).
pub async fn anchor_past_sequence(
    client: &impl GenericClient,
    slot: &str,
    stream: &str,
    last_seq: u64,
) -> Result<Option<StoredAnchor>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT commit_lsn::text, commit_time, stream_seq FROM outbox_relay.position_map \
             WHERE slot_name = $1 AND stream = $2 AND stream_seq > $3 \
             ORDER BY commit_lsn LIMIT 1",
            &[&slot, &stream, &i64::try_from(last_seq).unwrap_or(i64::MAX)],
        )
        .await?;
    Ok(row.and_then(|row| {
        Some(StoredAnchor {
            commit_lsn: Lsn::from_str(&row.get::<_, String>(0)).ok()?,
            commit_time: row.get(1),
            stream_seq: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        })
    }))
}
