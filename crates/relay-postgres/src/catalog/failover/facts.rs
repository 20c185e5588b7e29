//! Reading what a failover needs from the server `validate --connect` or `status` is pointed
//! at: the relay's slot, and the primary's or the standby's settings.

use std::str::FromStr;

use relay_core::Lsn;
use tokio_postgres::Client;

use super::{
    Conninfo, FailoverFacts, PhysicalSlot, PrimaryFacts, SlotFailover, StandbyFacts,
    StreamingStandby,
};
use crate::settings::FAILOVER_SLOTS_SINCE;

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
    let checkpoint = crate::catalog::stored_checkpoint(client, slot)
        .await?
        .map(|(lsn, _)| lsn);
    let (primary, standby) = if in_recovery {
        (None, Some(standby_facts(client).await?))
    } else {
        (Some(primary_facts(client, version_num).await?), None)
    };
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

/// What a standby's settings say about following the primary's slots.
async fn standby_facts(client: &Client) -> Result<StandbyFacts, tokio_postgres::Error> {
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
    Ok(facts)
}

/// The primary's standbys and physical slots, and which of them failover slots wait for.
async fn primary_facts(
    client: &Client,
    version_num: i32,
) -> Result<PrimaryFacts, tokio_postgres::Error> {
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
    Ok(facts)
}
