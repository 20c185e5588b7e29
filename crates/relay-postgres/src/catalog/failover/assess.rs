//! The facts of a server turned into checks, each a pass or a warning with its fix.

use super::{Aspect, Conninfo, FailoverCheck, FailoverFacts, PrimaryFacts};
use crate::PgError;
use crate::server_version::version_text;
use crate::settings::{FAILOVER_SLOTS_SINCE, FailoverSetting};

const DOCS: &str = "docs/operations.md, \"Failover\"";

/// The fix for a slot without the failover flag: a replication command, since PostgreSQL 17
/// and 18 have no SQL function for it, on a replication connection while nobody streams it.
pub fn alter_slot_hint(slot: &str, database: &str) -> String {
    format!(
        "stop the relay (the slot must be free), then, as a role with REPLICATION: psql \"dbname={database} replication=database\" -c 'ALTER_REPLICATION_SLOT {slot} (FAILOVER true)'; or set postgres.failover = false to keep it on this server"
    )
}

/// What happens without `synchronized_standby_slots`, for its warning.
const WITHOUT_SYNCHRONIZED_STANDBY_SLOTS: &str = "Without it the primary may send the relay changes no standby has received; if it fails then, the promoted standby lacks those transactions while the relay has already published their events (they stay in the stream for transactions that no longer exist), and the standby's synchronized slot may never have become usable (the relay then stops, exit 65). The relay resumes from the standby's copy of its checkpoint, so nothing the standby has is skipped";

/// The checks for `slot` in database `database` under `setting`; an error when the setting
/// asks for failover slots the server does not have (the relay refuses to start then, 78).
pub fn assess(
    facts: &FailoverFacts,
    setting: FailoverSetting,
    slot: &str,
    database: &str,
) -> Result<Vec<FailoverCheck>, PgError> {
    if facts.in_recovery {
        return Ok(assess_standby(facts, slot));
    }
    let wanted = setting.wanted(facts.version_num)?;
    let primary = facts.primary.clone().unwrap_or_default();
    let mut checks = vec![failover_slot(facts, &primary, wanted, slot, database)];
    if let Some(timeline) = facts.timeline.filter(|t| *t > 1) {
        checks.push(FailoverCheck::ok(
            Aspect::Timeline,
            format!(
                "{timeline}: this server was promoted from a standby (or restored from a backup)"
            ),
        ));
    }
    let failover_slot = facts.slot.as_ref().is_some_and(|s| s.failover);
    if facts.version_num >= FAILOVER_SLOTS_SINCE && (wanted || failover_slot) {
        checks.extend(synchronized_standby_slots(&primary));
    }
    checks.extend(standbys(
        &primary,
        facts.version_num >= FAILOVER_SLOTS_SINCE,
    ));
    Ok(checks)
}

/// The slot's failover flag, or why there is none.
fn failover_slot(
    facts: &FailoverFacts,
    primary: &PrimaryFacts,
    wanted: bool,
    slot: &str,
    database: &str,
) -> FailoverCheck {
    let has_standbys = !primary.standbys.is_empty() || !primary.physical_slots.is_empty();
    let unprotected = format!(
        "after a failover to a standby the slot is missing there and the relay stops (exit 65); the recovery procedure is in {DOCS}"
    );
    if facts.version_num < FAILOVER_SLOTS_SINCE {
        let detail = format!(
            "not available: PostgreSQL {} has no failover slots (since 17), the slot stays on this server",
            version_text(facts.version_num)
        );
        return if has_standbys {
            FailoverCheck::warn(
                Aspect::FailoverSlot,
                detail,
                format!("{unprotected}; upgrade to PostgreSQL 17 or later for failover slots"),
            )
        } else {
            FailoverCheck::ok(
                Aspect::FailoverSlot,
                format!("{detail} (no standby streams from it)"),
            )
        };
    }
    match (&facts.slot, wanted) {
        (_, false) => {
            let detail = "off (postgres.failover = false): the slot stays on this server";
            if has_standbys {
                FailoverCheck::warn(
                    Aspect::FailoverSlot,
                    detail,
                    format!(
                        "{unprotected}; remove postgres.failover (or set it true) and add the failover flag: {}",
                        alter_slot_hint(slot, database)
                    ),
                )
            } else {
                FailoverCheck::ok(Aspect::FailoverSlot, detail)
            }
        }
        (None, true) => FailoverCheck::ok(
            Aspect::FailoverSlot,
            format!("slot {slot} will be created with failover = true"),
        ),
        (Some(info), true) if !info.failover => FailoverCheck::warn(
            Aspect::FailoverSlot,
            format!(
                "slot {slot} has failover = false: standbys do not synchronize it; {unprotected}"
            ),
            alter_slot_hint(slot, database),
        ),
        (Some(info), true) => FailoverCheck::ok(
            Aspect::FailoverSlot,
            format!(
                "slot {slot} has failover = true{}",
                if info.synced {
                    "; it came over from the former primary (synced = true)"
                } else {
                    ""
                }
            ),
        ),
    }
}

/// `synchronized_standby_slots`: set, and each listed slot a streaming physical slot.
fn synchronized_standby_slots(primary: &PrimaryFacts) -> Vec<FailoverCheck> {
    let aspect = Aspect::SynchronizedStandbySlots;
    let has_standbys = !primary.standbys.is_empty() || !primary.physical_slots.is_empty();
    if primary.synchronized_standby_slots.is_empty() && !has_standbys {
        return vec![FailoverCheck::ok(
            aspect,
            "empty, and no standby streams from this server: set it to the standby's physical slot when you add one",
        )];
    }
    if primary.synchronized_standby_slots.is_empty() {
        let physical: Vec<&str> = primary
            .physical_slots
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let suggestion = if physical.is_empty() {
            "'<the physical slot of each standby that may be promoted>'".to_owned()
        } else {
            format!("'{}'", physical.join(","))
        };
        return vec![FailoverCheck::warn(
            aspect,
            "empty: the relay may be sent changes before any standby has them",
            format!(
                "ALTER SYSTEM SET synchronized_standby_slots = {suggestion}; SELECT pg_reload_conf(); (on the primary). {WITHOUT_SYNCHRONIZED_STANDBY_SLOTS}. See {DOCS}"
            ),
        )];
    }
    let mut checks = Vec::new();
    let mut ok = Vec::new();
    for name in &primary.synchronized_standby_slots {
        match primary.physical_slots.iter().find(|s| &s.name == name) {
            None => checks.push(FailoverCheck::warn(
                aspect,
                format!("lists `{name}`, which is no physical slot on this server"),
                format!(
                    "logical walsenders, the relay's included, wait for every listed slot and send nothing meanwhile: create it (SELECT pg_create_physical_replication_slot('{name}')) and use it as that standby's primary_slot_name, or remove it from the list"
                ),
            )),
            Some(s) if !s.active => checks.push(FailoverCheck::warn(
                aspect,
                format!("lists `{name}`, whose standby is not streaming now"),
                format!(
                    "the relay receives nothing past that slot's position until its standby streams again: bring it back, or remove `{name}` from synchronized_standby_slots (ALTER SYSTEM SET …; SELECT pg_reload_conf();) while it is gone"
                ),
            )),
            Some(_) => ok.push(name.as_str()),
        }
    }
    if !ok.is_empty() {
        checks.push(FailoverCheck::ok(
            aspect,
            format!(
                "{} (streaming): the relay is sent only what these standbys have flushed",
                ok.join(", ")
            ),
        ));
    }
    checks
}

/// Each standby streaming from the primary: through a slot, with `hot_standby_feedback`.
fn standbys(primary: &PrimaryFacts, failover_slots: bool) -> Vec<FailoverCheck> {
    if primary.standbys.is_empty() {
        return vec![FailoverCheck::ok(
            Aspect::Standbys,
            "no standby streams from this server now",
        )];
    }
    primary
        .standbys
        .iter()
        .map(|standby| {
            let who = format!(
                "{}{}",
                standby.name,
                standby
                    .client_addr
                    .as_deref()
                    .map(|a| format!(" ({a})"))
                    .unwrap_or_default()
            );
            let state = standby.state.as_deref().unwrap_or("unknown state");
            let Some(slot_name) = &standby.slot else {
                return FailoverCheck::warn(
                    Aspect::Standby,
                    format!("{who}: {state}, without a replication slot"),
                    "slot synchronization needs a physical slot: SELECT pg_create_physical_replication_slot('<name>') here, primary_slot_name = '<name>' on that standby, and the name in synchronized_standby_slots here",
                );
            };
            let holds_xmin = primary
                .physical_slots
                .iter()
                .any(|s| &s.name == slot_name && s.holds_xmin);
            if holds_xmin || !failover_slots {
                FailoverCheck::ok(
                    Aspect::Standby,
                    format!(
                        "{who}: {state} through slot {slot_name}{}",
                        if holds_xmin {
                            ", hot_standby_feedback on (the slot holds an xmin)"
                        } else {
                            ""
                        }
                    ),
                )
            } else {
                FailoverCheck::warn(
                    Aspect::Standby,
                    format!(
                        "{who}: {state} through slot {slot_name}, which holds no xmin: hot_standby_feedback looks off on that standby"
                    ),
                    "set hot_standby_feedback = on on the standby: without it vacuum here can remove catalog rows its synchronized slot needs, and the slot is invalidated there",
                )
            }
        })
        .collect()
}

/// A standby as a failover target: the settings slot synchronization needs, and the slot.
fn assess_standby(facts: &FailoverFacts, slot: &str) -> Vec<FailoverCheck> {
    let mut checks = vec![FailoverCheck::ok(
        Aspect::Server,
        format!("a standby (in recovery): checked as a failover target of slot {slot}"),
    )];
    if facts.version_num < FAILOVER_SLOTS_SINCE {
        checks.push(FailoverCheck::warn(
            Aspect::SlotSynchronization,
            format!(
                "not available: PostgreSQL {} does not synchronize slots (since 17)",
                version_text(facts.version_num)
            ),
            format!(
                "after a promotion of this standby the slot is missing and the relay stops (exit 65); the recovery procedure is in {DOCS}"
            ),
        ));
        return checks;
    }
    let Some(standby) = &facts.standby else {
        return checks;
    };
    let reload = "(on this standby; SELECT pg_reload_conf();)";
    checks.push(if standby.sync_replication_slots {
        FailoverCheck::ok(Aspect::SyncReplicationSlots, "on")
    } else {
        FailoverCheck::warn(
            Aspect::SyncReplicationSlots,
            "off: this standby does not synchronize failover slots",
            format!("ALTER SYSTEM SET sync_replication_slots = on {reload}"),
        )
    });
    checks.push(if standby.hot_standby_feedback {
        FailoverCheck::ok(Aspect::HotStandbyFeedback, "on")
    } else {
        FailoverCheck::warn(
            Aspect::HotStandbyFeedback,
            "off: slot synchronization needs it",
            format!("ALTER SYSTEM SET hot_standby_feedback = on {reload}"),
        )
    });
    checks.push(match &standby.primary_slot_name {
        Some(name) => FailoverCheck::ok(
            Aspect::PrimarySlotName,
            format!("{name} (list it in the primary's synchronized_standby_slots)"),
        ),
        None => FailoverCheck::warn(
            Aspect::PrimarySlotName,
            "empty: slot synchronization needs a physical slot on the primary",
            format!(
                "on the primary SELECT pg_create_physical_replication_slot('<name>') and add it to synchronized_standby_slots; here ALTER SYSTEM SET primary_slot_name = '<name>' {reload}"
            ),
        ),
    });
    checks.push(match &standby.primary_conninfo {
        Conninfo::Set { dbname: Some(db) } => {
            FailoverCheck::ok(Aspect::PrimaryConninfo, format!("names dbname={db}"))
        }
        Conninfo::Set { dbname: None } => FailoverCheck::warn(
            Aspect::PrimaryConninfo,
            "names no dbname: the slot sync worker connects to a database of the primary",
            format!("add dbname=<any database> to primary_conninfo {reload}"),
        ),
        Conninfo::Empty => FailoverCheck::warn(
            Aspect::PrimaryConninfo,
            "empty: this standby does not stream from a primary",
            "set primary_conninfo (with dbname=…) to the primary",
        ),
        Conninfo::Hidden => FailoverCheck::warn(
            Aspect::PrimaryConninfo,
            "not visible to this role (it may hold a password)",
            "check by hand that it names dbname=…, or run the preflight as a role with pg_read_all_settings",
        ),
    });
    checks.push(synchronized_slot(facts, slot));
    checks
}

/// The relay's slot on a standby: synchronized, persistent and valid, or why not.
fn synchronized_slot(facts: &FailoverFacts, slot: &str) -> FailoverCheck {
    let aspect = Aspect::SynchronizedSlot;
    let checkpoint = facts
        .checkpoint
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    match &facts.slot {
        None => FailoverCheck::warn(
            aspect,
            format!("{slot}: does not exist on this standby"),
            format!(
                "it is synchronized only when the primary's slot has failover = true and the settings above are right; the standby's log says why not (\"slot sync worker\"). Promoted without it, the relay stops (exit 65): {DOCS}"
            ),
        ),
        Some(s) if !s.synced => FailoverCheck::warn(
            aspect,
            format!(
                "{slot}: exists but was not synchronized from the primary (synced = false): slot synchronization will not replace it"
            ),
            format!("SELECT pg_drop_replication_slot('{slot}') on this standby"),
        ),
        Some(s) if s.invalidated.is_some() => FailoverCheck::warn(
            aspect,
            format!(
                "{slot}: synchronized but invalidated ({}): unusable after a promotion",
                s.invalidated.as_deref().unwrap_or_default()
            ),
            format!(
                "the relay would stop (exit 65) after a promotion; see {DOCS} and \"Slot lost\""
            ),
        ),
        Some(s) if s.temporary => FailoverCheck::warn(
            aspect,
            format!(
                "{slot}: synchronized, but not persistent yet (temporary): a promotion now drops it"
            ),
            "it becomes persistent once the primary's slot needs no older WAL or catalog rows than this standby keeps, which takes the relay streaming and the primary logging running transactions (every 15 s, or SELECT pg_log_standby_snapshot() there): check again",
        ),
        Some(s) => FailoverCheck::ok(
            aspect,
            format!(
                "{slot}: synchronized and persistent: usable after a promotion (confirmed_flush_lsn {}, the checkpoint here {checkpoint})",
                s.confirmed_flush_lsn
                    .map_or_else(|| "?".to_owned(), |l| l.to_string())
            ),
        ),
    }
}
