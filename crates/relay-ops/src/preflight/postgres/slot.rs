//! The replication slot, against the stored checkpoint: missing (and whether that lost
//! events), then for an existing slot each aspect of [`SLOT_CHECKS`].

use relay_core::Lsn;

use super::*;

/// What the checks of an existing slot judge.
struct SlotFacts<'a> {
    /// `slot <name>`, the start of every line.
    name: String,
    slot: &'a str,
    database: &'a str,
    info: &'a SlotInfo,
    /// The stored checkpoint's LSN.
    checkpoint: Option<Lsn>,
}

/// Judges one aspect of an existing slot.
type SlotCheck = fn(&SlotFacts<'_>, &mut Report);

/// The checks of an existing slot, in the order they are reported.
const SLOT_CHECKS: &[SlotCheck] = &[kind, wal_status, active, position];

pub(super) async fn slot_checks(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let pg = &c.config.postgres;
    let checkpoint = catalog::stored_checkpoint(c.client, &pg.slot).await?;
    let name = format!("slot {}", pg.slot);
    let Some(info) = &c.slot else {
        missing(pg, name, checkpoint.map(|(lsn, _)| lsn), r);
        return Ok(());
    };
    let facts = SlotFacts {
        name,
        slot: &pg.slot,
        database: &c.server.database,
        info,
        checkpoint: checkpoint.map(|(lsn, _)| lsn),
    };
    for check in SLOT_CHECKS {
        check(&facts, r);
    }
    Ok(())
}

fn missing(pg: &PostgresSettings, name: String, checkpoint: Option<Lsn>, r: &mut Report) {
    match checkpoint {
        Some(lsn) => r.hinted(
            DATA_SAFETY,
            name,
            format!("missing, but a checkpoint {lsn} is stored for it: the slot was dropped or lost"),
            "docs/operations.md, \"Slot lost\": reconcile from the outbox table, then DELETE FROM outbox_relay.checkpoint WHERE slot_name = '<slot>'",
        ),
        None if pg.create_slot => r.pass(
            name,
            "missing; will be created at start (create_slot = true) or by `outbox-relay setup`",
        ),
        None => r.fail(
            name,
            "does not exist",
            PgError::SlotMissing {
                slot: pg.slot.clone(),
            }
            .to_string(),
        ),
    }
}

/// A logical pgoutput slot of this database.
fn kind(f: &SlotFacts<'_>, r: &mut Report) {
    let (info, database) = (f.info, f.database);
    if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
        r.fail(
            f.name.clone(),
            format!(
                "{} slot with plugin {:?}",
                info.slot_type,
                info.plugin.as_deref().unwrap_or("none")
            ),
            "the relay needs a logical slot with plugin pgoutput: use another postgres.slot name",
        );
    } else if info.database.as_deref() != Some(database) {
        r.fail(
            f.name.clone(),
            format!(
                "belongs to database {:?}, not {database:?}",
                info.database.as_deref().unwrap_or("")
            ),
            "point postgres.url at that database or use another postgres.slot name",
        );
    } else {
        r.pass(
            f.name.clone(),
            format!("logical, pgoutput, database {database}"),
        );
    }
}

fn wal_status(f: &SlotFacts<'_>, r: &mut Report) {
    let check = format!("{} wal_status", f.name);
    match f.info.wal_status.as_deref() {
        Some("lost") => r.hinted(
            DATA_SAFETY,
            check,
            "lost: invalidated, WAL it needed was removed (max_slot_wal_keep_size)",
            "docs/operations.md, \"Slot lost\"",
        ),
        Some("unreserved") => r.hinted(
            Verdict::Warn,
            check,
            "unreserved: the slot is about to be invalidated",
            "start the relay now, or raise max_slot_wal_keep_size",
        ),
        other => r.pass(check, other.unwrap_or("unknown").to_owned()),
    }
}

fn active(f: &SlotFacts<'_>, r: &mut Report) {
    let check = format!("{} active", f.name);
    match f.info.active_pid {
        // The other relay of an active/standby pair: this one will wait as its standby, so
        // a preflight before start (the systemd unit's ExecStartPre) must not refuse it.
        Some(pid) => r.hinted(
            Verdict::Warn,
            check,
            format!("streaming to another process (pid {pid}); a relay started now waits as its standby"),
            format!(
                "expected with an active/standby pair; if that process is not a relay of this pair, stop it or SELECT pg_terminate_backend({pid})"
            ),
        ),
        None => r.pass(check, "not in use by another process"),
    }
}

/// The slot is not ahead of the stored checkpoint (events between them would be skipped).
fn position(f: &SlotFacts<'_>, r: &mut Report) {
    let check = format!("{} position", f.name);
    match (f.checkpoint, f.info.confirmed_flush_lsn) {
        (Some(stored), Some(slot_lsn)) if slot_lsn > stored => r.hinted(
            DATA_SAFETY,
            check,
            format!("slot at {slot_lsn} is ahead of the checkpoint {stored}"),
            PgError::SlotAhead {
                slot: f.slot.to_owned(),
                slot_lsn,
                checkpoint: stored,
            }
            .to_string(),
        ),
        (Some(stored), Some(slot_lsn)) => {
            r.pass(check, format!("slot at {slot_lsn}, checkpoint {stored}"))
        }
        (None, Some(slot_lsn)) => r.pass(
            check,
            format!("slot at {slot_lsn}, no checkpoint yet (first start)"),
        ),
        (_, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> SlotInfo {
        SlotInfo {
            slot_type: "logical".into(),
            plugin: Some("pgoutput".into()),
            database: Some("app".into()),
            active_pid: None,
            wal_status: Some("reserved".into()),
            confirmed_flush_lsn: Some(Lsn(200)),
            restart_lsn: Some(Lsn(100)),
            lag_bytes: None,
            retained_bytes: None,
            safe_wal_size: None,
        }
    }

    /// The lines of [`SLOT_CHECKS`] for `info` against a checkpoint, as (verdict, line).
    fn judged(info: &SlotInfo, checkpoint: Option<Lsn>) -> Vec<(Verdict, String)> {
        let facts = SlotFacts {
            name: "slot relay_slot".into(),
            slot: "relay_slot",
            database: "app",
            info,
            checkpoint,
        };
        let mut r = Report::default();
        for check in SLOT_CHECKS {
            check(&facts, &mut r);
        }
        r.0.into_iter()
            .map(|c| (c.verdict, c.to_string()))
            .collect()
    }

    #[test]
    fn a_sound_slot_passes_each_aspect_in_order() {
        let lines = judged(&info(), Some(Lsn(300)));
        assert_eq!(
            lines,
            [
                (
                    Verdict::Pass,
                    "PASS  slot relay_slot: logical, pgoutput, database app".to_owned()
                ),
                (
                    Verdict::Pass,
                    "PASS  slot relay_slot wal_status: reserved".to_owned()
                ),
                (
                    Verdict::Pass,
                    "PASS  slot relay_slot active: not in use by another process".to_owned()
                ),
                (
                    Verdict::Pass,
                    format!(
                        "PASS  slot relay_slot position: slot at {}, checkpoint {}",
                        Lsn(200),
                        Lsn(300)
                    )
                ),
            ]
        );
    }

    #[test]
    fn a_slot_ahead_of_the_checkpoint_or_lost_is_a_data_safety_failure() {
        let mut lost = info();
        lost.wal_status = Some("lost".into());
        let verdicts: Vec<Verdict> = judged(&lost, Some(Lsn(100)))
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        assert_eq!(
            verdicts,
            [Verdict::Pass, DATA_SAFETY, Verdict::Pass, DATA_SAFETY]
        );
    }

    #[test]
    fn another_plugin_fails_and_a_streaming_slot_only_warns() {
        let mut other = info();
        other.plugin = Some("wal2json".into());
        other.active_pid = Some(4242);
        other.confirmed_flush_lsn = None;
        let lines = judged(&other, None);
        assert_eq!(
            lines.len(),
            3,
            "no position line without confirmed_flush_lsn: {lines:?}"
        );
        assert_eq!(lines[0].0, FAIL);
        assert!(
            lines[0].1.contains("logical slot with plugin \"wal2json\""),
            "{lines:?}"
        );
        assert_eq!(lines[2].0, Verdict::Warn);
        assert!(
            lines[2].1.contains("pg_terminate_backend(4242)"),
            "{lines:?}"
        );
    }
}
