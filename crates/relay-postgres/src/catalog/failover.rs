//! Failover slots (PostgreSQL 17+): what makes the relay's slot survive a promotion, read from
//! the server `validate --connect` or `status` is pointed at, and assessed in one place.
//!
//! A logical slot lives on one server. From PostgreSQL 17 a slot created with `failover = true`
//! is copied to physical standbys that ask for it, and kept there as a *synchronized* slot
//! (`synced = true`, not usable until promotion). That takes, on the **primary**: the slot's
//! `failover` flag, and `synchronized_standby_slots` listing each standby's physical slot (so
//! that logical walsenders send nothing a standby has not flushed); on the **standby**:
//! `sync_replication_slots = on`, `hot_standby_feedback = on`, a physical `primary_slot_name`,
//! `dbname` in `primary_conninfo`, and `wal_level = logical`.
//!
//! The relay keeps its checkpoint in the database, so the checkpoint comes over with the
//! standby: after a promotion the relay resumes from the standby's copy of it, which never lies
//! past the standby's WAL. What can go wrong is a slot that did not come over (exit 65) and,
//! without `synchronized_standby_slots`, events the relay published for transactions the
//! standby never received (lost with the old primary).
//!
//! [`facts`] reads the server; [`assess`] turns the facts and `[postgres] failover` into
//! checks that `validate --connect` prints and `status` reports.

use std::str::FromStr;

use relay_core::Lsn;
use serde_json::{Value, json};
use tokio_postgres::Client;

use crate::settings::{FAILOVER_SLOTS_SINCE, FailoverSetting, version_text};

/// The relay's slot as far as failover goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotFailover {
    /// `failover` (false before PostgreSQL 17).
    pub failover: bool,
    /// `synced`: a slot synchronized from a primary (on a promoted server: it came over).
    pub synced: bool,
    /// `temporary`: a synchronized slot that is not yet persistent is dropped at promotion.
    pub temporary: bool,
    /// `invalidation_reason` (17+), or `lost` from `wal_status` before that.
    pub invalidated: Option<String>,
    /// `confirmed_flush_lsn`.
    pub confirmed_flush_lsn: Option<Lsn>,
}

/// A physical slot on the primary (a standby's `primary_slot_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalSlot {
    /// Its name.
    pub name: String,
    /// A standby streams through it now.
    pub active: bool,
    /// It holds an `xmin` or `catalog_xmin`: the standby sends `hot_standby_feedback`.
    pub holds_xmin: bool,
}

/// A physical walsender on the primary: a streaming standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamingStandby {
    /// `application_name` (the standby's `cluster_name`, or what its `primary_conninfo` says).
    pub name: String,
    /// `client_addr`, when the role may see it.
    pub client_addr: Option<String>,
    /// `state` (`streaming`, `catchup`, …).
    pub state: Option<String>,
    /// The physical slot it streams through, if any.
    pub slot: Option<String>,
}

/// The primary's side.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrimaryFacts {
    /// `synchronized_standby_slots` (PostgreSQL 17+), empty when unset.
    pub synchronized_standby_slots: Vec<String>,
    /// Physical slots.
    pub physical_slots: Vec<PhysicalSlot>,
    /// Streaming standbys.
    pub standbys: Vec<StreamingStandby>,
}

/// `primary_conninfo`, as far as slot synchronization needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conninfo {
    /// Not visible to this role (it may hold a password: superusers and `pg_read_all_settings`).
    Hidden,
    /// Empty: the standby does not stream from a primary.
    Empty,
    /// Set; its `dbname`, if any.
    Set {
        /// `dbname` (a database, not `replication`).
        dbname: Option<String>,
    },
}

/// A standby's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyFacts {
    /// `sync_replication_slots` (17+).
    pub sync_replication_slots: bool,
    /// `hot_standby_feedback`.
    pub hot_standby_feedback: bool,
    /// `primary_slot_name`, `None` when empty.
    pub primary_slot_name: Option<String>,
    /// `primary_conninfo`.
    pub primary_conninfo: Conninfo,
}

/// What the server says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverFacts {
    /// `server_version_num`.
    pub version_num: i32,
    /// `pg_is_in_recovery()`: a standby.
    pub in_recovery: bool,
    /// The current timeline (a primary only; above 1 after a promotion or a restore).
    pub timeline: Option<u32>,
    /// The relay's slot, `None` when it does not exist here.
    pub slot: Option<SlotFailover>,
    /// The stored checkpoint (on a standby: the copy replicated from the primary).
    pub checkpoint: Option<Lsn>,
    /// On a primary.
    pub primary: Option<PrimaryFacts>,
    /// On a standby.
    pub standby: Option<StandbyFacts>,
}

fn lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| Lsn::from_str(&t).ok())
}

/// `pg_is_in_recovery()`.
pub async fn in_recovery(client: &Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .get(0))
}

/// The timeline of a primary, from the name of its current WAL file; `None` on a standby.
pub async fn timeline(client: &Client) -> Result<Option<u32>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
                    ELSE pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()) END",
            &[],
        )
        .await?;
    let name: Option<String> = row.get(0);
    Ok(name.and_then(|n| u32::from_str_radix(n.get(..8)?, 16).ok()))
}

/// The slot `name` as far as failover goes, or `None` when it does not exist.
pub async fn slot(
    client: &Client,
    name: &str,
    version_num: i32,
) -> Result<Option<SlotFailover>, tokio_postgres::Error> {
    let sql = if version_num >= FAILOVER_SLOTS_SINCE {
        "SELECT failover, synced, temporary, \
                COALESCE(invalidation_reason, CASE WHEN wal_status = 'lost' THEN 'lost' END), \
                confirmed_flush_lsn::text \
         FROM pg_catalog.pg_replication_slots WHERE slot_name = $1"
    } else {
        "SELECT false, false, temporary, CASE WHEN wal_status = 'lost' THEN 'lost' END, \
                confirmed_flush_lsn::text \
         FROM pg_catalog.pg_replication_slots WHERE slot_name = $1"
    };
    let row = client.query_opt(sql, &[&name]).await?;
    Ok(row.map(|r| SlotFailover {
        failover: r.get(0),
        synced: r.get(1),
        temporary: r.get(2),
        invalidated: r.get(3),
        confirmed_flush_lsn: lsn(r.get(4)),
    }))
}

/// Splits a comma-separated list setting (`synchronized_standby_slots`), unquoting names.
fn list_setting(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The `dbname` of a libpq connection string (`key=value …`, values optionally in single
/// quotes with `\` escapes) or URI (`postgresql://…/db`).
pub fn conninfo_dbname(conninfo: &str) -> Option<String> {
    let text = conninfo.trim();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        let rest = text.split_once("://")?.1;
        let query = rest.split_once('?').map(|(_, q)| q);
        if let Some(db) = query.and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("dbname=").map(str::to_owned))
        }) {
            return Some(db);
        }
        let path = rest.split_once('/')?.1;
        let db = path.split('?').next().unwrap_or_default();
        return (!db.is_empty()).then(|| db.to_owned());
    }
    let mut chars = text.chars().peekable();
    let mut found = None;
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return found;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return found;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if key == "dbname" {
            found = Some(value);
        }
    }
}

/// Reads [`FailoverFacts`] for `slot`.
pub async fn facts(client: &Client, slot: &str) -> Result<FailoverFacts, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, pg_catalog.pg_is_in_recovery()",
            &[],
        )
        .await?;
    let (version_num, in_recovery): (i32, bool) = (row.get(0), row.get(1));
    let timeline = timeline(client).await?;
    let slot_info = self::slot(client, slot, version_num).await?;
    let checkpoint = super::stored_checkpoint(client, slot)
        .await?
        .map(|(lsn, _)| lsn);
    let (mut primary, mut standby) = (None, None);
    if in_recovery {
        // pg_settings hides primary_conninfo from roles that may not read it (it can hold a
        // password); missing settings (sync_replication_slots before 17) read as off.
        let rows = client
            .query(
                "SELECT name, setting FROM pg_catalog.pg_settings \
                 WHERE name IN ('sync_replication_slots', 'hot_standby_feedback', \
                                'primary_slot_name', 'primary_conninfo')",
                &[],
            )
            .await?;
        let mut facts = StandbyFacts {
            sync_replication_slots: false,
            hot_standby_feedback: false,
            primary_slot_name: None,
            primary_conninfo: Conninfo::Hidden,
        };
        for row in rows {
            let (name, setting): (String, Option<String>) = (row.get(0), row.get(1));
            let setting = setting.unwrap_or_default();
            match name.as_str() {
                "sync_replication_slots" => facts.sync_replication_slots = setting == "on",
                "hot_standby_feedback" => facts.hot_standby_feedback = setting == "on",
                "primary_slot_name" => {
                    facts.primary_slot_name = (!setting.is_empty()).then_some(setting);
                }
                "primary_conninfo" => {
                    facts.primary_conninfo = if setting.trim().is_empty() {
                        Conninfo::Empty
                    } else {
                        Conninfo::Set {
                            dbname: conninfo_dbname(&setting)
                                .filter(|d| !d.is_empty() && d != "replication"),
                        }
                    };
                }
                _ => {}
            }
        }
        standby = Some(facts);
    } else {
        let mut facts = PrimaryFacts::default();
        if version_num >= FAILOVER_SLOTS_SINCE {
            let value: Option<String> = client
                .query_one(
                    "SELECT current_setting('synchronized_standby_slots', true)",
                    &[],
                )
                .await?
                .get(0);
            facts.synchronized_standby_slots = list_setting(&value.unwrap_or_default());
        }
        facts.physical_slots = client
            .query(
                "SELECT slot_name::text, active, xmin IS NOT NULL OR catalog_xmin IS NOT NULL \
                 FROM pg_catalog.pg_replication_slots WHERE slot_type = 'physical' \
                 ORDER BY slot_name",
                &[],
            )
            .await?
            .iter()
            .map(|r| PhysicalSlot {
                name: r.get(0),
                active: r.get(1),
                holds_xmin: r.get(2),
            })
            .collect();
        // Logical walsenders (the relay's own) stream a logical slot; base backups are no
        // standbys.
        facts.standbys = client
            .query(
                "SELECT r.application_name, host(r.client_addr), r.state, s.slot_name::text \
                 FROM pg_catalog.pg_stat_replication r \
                 LEFT JOIN pg_catalog.pg_replication_slots s ON s.active_pid = r.pid \
                 WHERE (s.slot_type IS NULL OR s.slot_type = 'physical') \
                   AND r.state IS DISTINCT FROM 'backup' \
                 ORDER BY r.application_name",
                &[],
            )
            .await?
            .iter()
            .map(|r| StreamingStandby {
                name: r.get(0),
                client_addr: r.get(1),
                state: r.get(2),
                slot: r.get(3),
            })
            .collect();
        primary = Some(facts);
    }
    Ok(FailoverFacts {
        version_num,
        in_recovery,
        timeline,
        slot: slot_info,
        checkpoint,
        primary,
        standby,
    })
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverVerdict {
    /// Fine, or nothing to do.
    Pass,
    /// The relay runs, but a failover would cost something; the hint says what to set.
    Warn,
    /// The relay refuses to start (`failover = true` on a server without failover slots).
    Fail,
}

/// One line of the assessment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverCheck {
    /// What was checked, e.g. `synchronized_standby_slots`.
    pub check: String,
    /// The outcome.
    pub verdict: FailoverVerdict,
    /// What was found.
    pub detail: String,
    /// What to do, for warnings and failures.
    pub hint: Option<String>,
}

impl FailoverCheck {
    fn pass(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            verdict: FailoverVerdict::Pass,
            detail: detail.into(),
            hint: None,
        }
    }
    fn warn(check: impl Into<String>, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            check: check.into(),
            verdict: FailoverVerdict::Warn,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }

    /// For `status --json`.
    pub fn to_json(&self) -> Value {
        json!({
            "check": self.check,
            "verdict": match self.verdict {
                FailoverVerdict::Pass => "pass",
                FailoverVerdict::Warn => "warn",
                FailoverVerdict::Fail => "fail",
            },
            "detail": self.detail,
            "hint": self.hint,
        })
    }
}

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

/// The checks for `slot` in database `database` under `setting`.
pub fn assess(
    facts: &FailoverFacts,
    setting: FailoverSetting,
    slot: &str,
    database: &str,
) -> Vec<FailoverCheck> {
    if facts.in_recovery {
        return assess_standby(facts, slot);
    }
    let mut checks = Vec::new();
    let version = version_text(facts.version_num);
    let supported = facts.version_num >= FAILOVER_SLOTS_SINCE;
    let primary = facts.primary.clone().unwrap_or_default();
    let has_standbys = !primary.standbys.is_empty() || !primary.physical_slots.is_empty();
    let promoted = facts.timeline.filter(|t| *t > 1);
    let wanted = match setting.wanted(facts.version_num) {
        Ok(wanted) => wanted,
        Err(e) => {
            checks.push(FailoverCheck {
                check: "failover slot".into(),
                verdict: FailoverVerdict::Fail,
                detail: format!("postgres.failover = true, but PostgreSQL {version} has none"),
                hint: Some(e.to_string()),
            });
            return checks;
        }
    };
    let unprotected = format!(
        "after a failover to a standby the slot is missing there and the relay stops (exit 65); the recovery procedure is in {DOCS}"
    );
    match (&facts.slot, wanted) {
        _ if !supported => {
            let detail = format!(
                "not available: PostgreSQL {version} has no failover slots (since 17), the slot stays on this server"
            );
            if has_standbys {
                checks.push(FailoverCheck::warn(
                    "failover slot",
                    detail,
                    format!("{unprotected}; upgrade to PostgreSQL 17 or later for failover slots"),
                ));
            } else {
                checks.push(FailoverCheck::pass(
                    "failover slot",
                    format!("{detail} (no standby streams from it)"),
                ));
            }
        }
        (_, false) => {
            let detail = "off (postgres.failover = false): the slot stays on this server";
            if has_standbys {
                checks.push(FailoverCheck::warn(
                    "failover slot",
                    detail,
                    format!(
                        "{unprotected}; remove postgres.failover (or set it true) and add the failover flag: {}",
                        alter_slot_hint(slot, database)
                    ),
                ));
            } else {
                checks.push(FailoverCheck::pass("failover slot", detail));
            }
        }
        (None, true) => checks.push(FailoverCheck::pass(
            "failover slot",
            format!("slot {slot} will be created with failover = true"),
        )),
        (Some(info), true) if !info.failover => checks.push(FailoverCheck::warn(
            "failover slot",
            format!(
                "slot {slot} has failover = false: standbys do not synchronize it; {unprotected}"
            ),
            alter_slot_hint(slot, database),
        )),
        (Some(info), true) => checks.push(FailoverCheck::pass(
            "failover slot",
            format!(
                "slot {slot} has failover = true{}",
                if info.synced {
                    "; it came over from the former primary (synced = true)"
                } else {
                    ""
                }
            ),
        )),
    }
    if let Some(timeline) = promoted {
        checks.push(FailoverCheck::pass(
            "timeline",
            format!(
                "{timeline}: this server was promoted from a standby (or restored from a backup)"
            ),
        ));
    }
    let failover_slot = facts.slot.as_ref().is_some_and(|s| s.failover);
    if supported && (wanted || failover_slot) {
        let physical: Vec<&str> = primary
            .physical_slots
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        if primary.synchronized_standby_slots.is_empty() {
            let suggestion = if physical.is_empty() {
                "'<the physical slot of each standby that may be promoted>'".to_owned()
            } else {
                format!("'{}'", physical.join(","))
            };
            checks.push(FailoverCheck::warn(
                "synchronized_standby_slots",
                "empty: the relay may be sent changes before any standby has them",
                format!(
                    "ALTER SYSTEM SET synchronized_standby_slots = {suggestion}; SELECT pg_reload_conf(); (on the primary). {WITHOUT_SYNCHRONIZED_STANDBY_SLOTS}. See {DOCS}"
                ),
            ));
        } else {
            let mut ok = Vec::new();
            for name in &primary.synchronized_standby_slots {
                match primary.physical_slots.iter().find(|s| &s.name == name) {
                    None => checks.push(FailoverCheck::warn(
                        "synchronized_standby_slots",
                        format!("lists `{name}`, which is no physical slot on this server"),
                        format!(
                            "logical walsenders, the relay's included, wait for every listed slot and send nothing meanwhile: create it (SELECT pg_create_physical_replication_slot('{name}')) and use it as that standby's primary_slot_name, or remove it from the list"
                        ),
                    )),
                    Some(s) if !s.active => checks.push(FailoverCheck::warn(
                        "synchronized_standby_slots",
                        format!("lists `{name}`, whose standby is not streaming now"),
                        format!(
                            "the relay receives nothing past that slot's position until its standby streams again: bring it back, or remove `{name}` from synchronized_standby_slots (ALTER SYSTEM SET …; SELECT pg_reload_conf();) while it is gone"
                        ),
                    )),
                    Some(_) => ok.push(name.as_str()),
                }
            }
            if !ok.is_empty() {
                checks.push(FailoverCheck::pass(
                    "synchronized_standby_slots",
                    format!(
                        "{} (streaming): the relay is sent only what these standbys have flushed",
                        ok.join(", ")
                    ),
                ));
            }
        }
    }
    if primary.standbys.is_empty() {
        checks.push(FailoverCheck::pass(
            "standbys",
            "no standby streams from this server now",
        ));
    }
    for standby in &primary.standbys {
        let name = format!(
            "standby {}{}",
            standby.name,
            standby
                .client_addr
                .as_deref()
                .map(|a| format!(" ({a})"))
                .unwrap_or_default()
        );
        let state = standby.state.as_deref().unwrap_or("unknown state");
        match &standby.slot {
            None => checks.push(FailoverCheck::warn(
                name,
                format!("{state}, without a replication slot"),
                "slot synchronization needs a physical slot: SELECT pg_create_physical_replication_slot('<name>') here, primary_slot_name = '<name>' on that standby, and the name in synchronized_standby_slots here",
            )),
            Some(slot_name) => {
                let holds_xmin = primary
                    .physical_slots
                    .iter()
                    .any(|s| &s.name == slot_name && s.holds_xmin);
                if holds_xmin || !supported {
                    checks.push(FailoverCheck::pass(
                        name,
                        format!(
                            "{state} through slot {slot_name}{}",
                            if holds_xmin {
                                ", hot_standby_feedback on (the slot holds an xmin)"
                            } else {
                                ""
                            }
                        ),
                    ));
                } else {
                    checks.push(FailoverCheck::warn(
                        name,
                        format!(
                            "{state} through slot {slot_name}, which holds no xmin: hot_standby_feedback looks off on that standby"
                        ),
                        "set hot_standby_feedback = on on the standby: without it vacuum here can remove catalog rows its synchronized slot needs, and the slot is invalidated there",
                    ));
                }
            }
        }
    }
    checks
}

fn assess_standby(facts: &FailoverFacts, slot: &str) -> Vec<FailoverCheck> {
    let version = version_text(facts.version_num);
    let mut checks = vec![FailoverCheck::pass(
        "server",
        format!("a standby (in recovery): checked as a failover target of slot {slot}"),
    )];
    if facts.version_num < FAILOVER_SLOTS_SINCE {
        checks.push(FailoverCheck::warn(
            "slot synchronization",
            format!("not available: PostgreSQL {version} does not synchronize slots (since 17)"),
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
        FailoverCheck::pass("sync_replication_slots", "on")
    } else {
        FailoverCheck::warn(
            "sync_replication_slots",
            "off: this standby does not synchronize failover slots",
            format!("ALTER SYSTEM SET sync_replication_slots = on {reload}"),
        )
    });
    checks.push(if standby.hot_standby_feedback {
        FailoverCheck::pass("hot_standby_feedback", "on")
    } else {
        FailoverCheck::warn(
            "hot_standby_feedback",
            "off: slot synchronization needs it",
            format!("ALTER SYSTEM SET hot_standby_feedback = on {reload}"),
        )
    });
    checks.push(match &standby.primary_slot_name {
        Some(name) => FailoverCheck::pass(
            "primary_slot_name",
            format!("{name} (list it in the primary's synchronized_standby_slots)"),
        ),
        None => FailoverCheck::warn(
            "primary_slot_name",
            "empty: slot synchronization needs a physical slot on the primary",
            format!(
                "on the primary SELECT pg_create_physical_replication_slot('<name>') and add it to synchronized_standby_slots; here ALTER SYSTEM SET primary_slot_name = '<name>' {reload}"
            ),
        ),
    });
    checks.push(match &standby.primary_conninfo {
        Conninfo::Set { dbname: Some(db) } => {
            FailoverCheck::pass("primary_conninfo", format!("names dbname={db}"))
        }
        Conninfo::Set { dbname: None } => FailoverCheck::warn(
            "primary_conninfo",
            "names no dbname: the slot sync worker connects to a database of the primary",
            format!("add dbname=<any database> to primary_conninfo {reload}"),
        ),
        Conninfo::Empty => FailoverCheck::warn(
            "primary_conninfo",
            "empty: this standby does not stream from a primary",
            "set primary_conninfo (with dbname=…) to the primary",
        ),
        Conninfo::Hidden => FailoverCheck::warn(
            "primary_conninfo",
            "not visible to this role (it may hold a password)",
            "check by hand that it names dbname=…, or run the preflight as a role with pg_read_all_settings",
        ),
    });
    let checkpoint = facts
        .checkpoint
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    checks.push(match &facts.slot {
        None => FailoverCheck::warn(
            format!("slot {slot}"),
            "does not exist on this standby",
            format!(
                "it is synchronized only when the primary's slot has failover = true and the settings above are right; the standby's log says why not (\"slot sync worker\"). Promoted without it, the relay stops (exit 65): {DOCS}"
            ),
        ),
        Some(s) if !s.synced => FailoverCheck::warn(
            format!("slot {slot}"),
            "exists but was not synchronized from the primary (synced = false): slot synchronization will not replace it",
            format!("SELECT pg_drop_replication_slot('{slot}') on this standby"),
        ),
        Some(s) if s.invalidated.is_some() => FailoverCheck::warn(
            format!("slot {slot}"),
            format!(
                "synchronized but invalidated ({}): unusable after a promotion",
                s.invalidated.as_deref().unwrap_or_default()
            ),
            format!(
                "the relay would stop (exit 65) after a promotion; see {DOCS} and \"Slot lost\""
            ),
        ),
        Some(s) if s.temporary => FailoverCheck::warn(
            format!("slot {slot}"),
            "synchronized, but not persistent yet (temporary): a promotion now drops it",
            "it becomes persistent once the primary's slot moves past the oldest WAL this standby can reserve: let the relay stream and check again",
        ),
        Some(s) => FailoverCheck::pass(
            format!("slot {slot}"),
            format!(
                "synchronized and persistent: usable after a promotion (confirmed_flush_lsn {}, the checkpoint here {checkpoint})",
                s.confirmed_flush_lsn
                    .map_or_else(|| "?".to_owned(), |l| l.to_string())
            ),
        ),
    });
    checks
}

/// For `status --json` and `/status`: the facts that matter and every check.
pub fn to_json(facts: &FailoverFacts, checks: &[FailoverCheck]) -> Value {
    json!({
        "server": if facts.in_recovery { "standby" } else { "primary" },
        "version_num": facts.version_num,
        "timeline": facts.timeline,
        "slot": facts.slot.as_ref().map(|s| json!({
            "failover": s.failover,
            "synced": s.synced,
            "temporary": s.temporary,
            "invalidated": s.invalidated,
            "confirmed_flush_lsn": s.confirmed_flush_lsn.map(|l| l.to_string()),
        })),
        "synchronized_standby_slots": facts.primary.as_ref().map(|p| &p.synchronized_standby_slots),
        "standbys": facts.primary.as_ref().map(|p| p.standbys.iter().map(|s| json!({
            "name": s.name,
            "client_addr": s.client_addr,
            "state": s.state,
            "slot": s.slot,
        })).collect::<Vec<_>>()),
        "checks": checks.iter().map(FailoverCheck::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn primary(version_num: i32) -> FailoverFacts {
        FailoverFacts {
            version_num,
            in_recovery: false,
            timeline: Some(1),
            slot: None,
            checkpoint: None,
            primary: Some(PrimaryFacts::default()),
            standby: None,
        }
    }

    fn verdicts(checks: &[FailoverCheck]) -> Vec<(String, FailoverVerdict)> {
        checks
            .iter()
            .map(|c| (c.check.clone(), c.verdict))
            .collect()
    }

    #[test]
    fn conninfo_dbname_is_found_in_both_forms() {
        assert_eq!(
            conninfo_dbname("host=10.0.0.1 port=5432 user=rep dbname=app application_name=s1")
                .as_deref(),
            Some("app")
        );
        assert_eq!(
            conninfo_dbname("user=rep password='a b\\'c' dbname = 'my db'").as_deref(),
            Some("my db")
        );
        assert_eq!(conninfo_dbname("host=a user=rep"), None);
        assert_eq!(
            conninfo_dbname("postgresql://rep@a:5432/app?sslmode=require").as_deref(),
            Some("app")
        );
        assert_eq!(conninfo_dbname("postgres://rep@a"), None);
    }

    #[test]
    fn before_17_only_a_note_unless_standbys_stream() {
        let facts = primary(150_019);
        let checks = assess(&facts, FailoverSetting::Auto, "s", "app");
        assert_eq!(
            verdicts(&checks),
            [
                ("failover slot".into(), FailoverVerdict::Pass),
                ("standbys".into(), FailoverVerdict::Pass)
            ]
        );
        let mut with_standby = primary(150_019);
        with_standby.primary = Some(PrimaryFacts {
            standbys: vec![StreamingStandby {
                name: "walreceiver".into(),
                client_addr: None,
                state: Some("streaming".into()),
                slot: Some("standby1".into()),
            }],
            ..PrimaryFacts::default()
        });
        let checks = assess(&with_standby, FailoverSetting::Auto, "s", "app");
        assert_eq!(checks[0].verdict, FailoverVerdict::Warn);
        assert!(checks[0].hint.as_deref().unwrap().contains("exit 65"));
        let refused = assess(&facts, FailoverSetting::On, "s", "app");
        assert_eq!(refused[0].verdict, FailoverVerdict::Fail);
    }

    #[test]
    fn on_17_the_slot_flag_and_synchronized_standby_slots_are_checked() {
        let mut facts = primary(180_001);
        facts.slot = Some(SlotFailover {
            failover: false,
            synced: false,
            temporary: false,
            invalidated: None,
            confirmed_flush_lsn: None,
        });
        facts.primary = Some(PrimaryFacts {
            synchronized_standby_slots: vec![],
            physical_slots: vec![PhysicalSlot {
                name: "standby1".into(),
                active: true,
                holds_xmin: false,
            }],
            standbys: vec![StreamingStandby {
                name: "s1".into(),
                client_addr: Some("10.0.0.2/32".into()),
                state: Some("streaming".into()),
                slot: Some("standby1".into()),
            }],
        });
        let checks = assess(&facts, FailoverSetting::Auto, "relay", "app");
        assert_eq!(
            verdicts(&checks),
            [
                ("failover slot".into(), FailoverVerdict::Warn),
                ("synchronized_standby_slots".into(), FailoverVerdict::Warn),
                ("standby s1 (10.0.0.2/32)".into(), FailoverVerdict::Warn),
            ]
        );
        assert!(
            checks[0]
                .hint
                .as_deref()
                .unwrap()
                .contains("ALTER_REPLICATION_SLOT relay (FAILOVER true)")
        );
        assert!(
            checks[1]
                .hint
                .as_deref()
                .unwrap()
                .contains("synchronized_standby_slots = 'standby1'")
        );

        let mut good = facts.clone();
        good.slot.as_mut().unwrap().failover = true;
        let p = good.primary.as_mut().unwrap();
        p.synchronized_standby_slots = vec!["standby1".into()];
        p.physical_slots[0].holds_xmin = true;
        let checks = assess(&good, FailoverSetting::Auto, "relay", "app");
        assert!(
            checks.iter().all(|c| c.verdict == FailoverVerdict::Pass),
            "{checks:#?}"
        );

        let mut waiting = good.clone();
        waiting.primary.as_mut().unwrap().physical_slots[0].active = false;
        waiting
            .primary
            .as_mut()
            .unwrap()
            .synchronized_standby_slots
            .push("gone".into());
        let checks = assess(&waiting, FailoverSetting::Auto, "relay", "app");
        let sss: Vec<&FailoverCheck> = checks
            .iter()
            .filter(|c| c.check == "synchronized_standby_slots")
            .collect();
        assert_eq!(sss.len(), 2);
        assert!(sss.iter().all(|c| c.verdict == FailoverVerdict::Warn));
    }

    #[test]
    fn a_standby_is_checked_as_a_failover_target() {
        let mut facts = FailoverFacts {
            version_num: 180_001,
            in_recovery: true,
            timeline: None,
            slot: Some(SlotFailover {
                failover: true,
                synced: true,
                temporary: false,
                invalidated: None,
                confirmed_flush_lsn: Some(Lsn(0x100)),
            }),
            checkpoint: Some(Lsn(0x200)),
            primary: None,
            standby: Some(StandbyFacts {
                sync_replication_slots: true,
                hot_standby_feedback: true,
                primary_slot_name: Some("standby1".into()),
                primary_conninfo: Conninfo::Set {
                    dbname: Some("app".into()),
                },
            }),
        };
        let checks = assess(&facts, FailoverSetting::Auto, "relay", "app");
        assert!(
            checks.iter().all(|c| c.verdict == FailoverVerdict::Pass),
            "{checks:#?}"
        );
        facts.slot.as_mut().unwrap().temporary = true;
        facts.standby = Some(StandbyFacts {
            sync_replication_slots: false,
            hot_standby_feedback: false,
            primary_slot_name: None,
            primary_conninfo: Conninfo::Set { dbname: None },
        });
        let checks = assess(&facts, FailoverSetting::Auto, "relay", "app");
        assert_eq!(
            checks
                .iter()
                .filter(|c| c.verdict == FailoverVerdict::Warn)
                .count(),
            5,
            "{checks:#?}"
        );
    }
}
