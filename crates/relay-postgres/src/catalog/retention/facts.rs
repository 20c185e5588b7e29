//! The server's and the slot's retention facts, read from the catalog.

use super::*;

/// How long `validate --connect` and `status` sample the WAL rate: short, so they answer
/// quickly, and therefore only a glimpse (it may miss a burst, or catch one).
pub const SHORT_SAMPLE: Duration = Duration::from_secs(2);

/// The settings the window depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// `max_slot_wal_keep_size` in bytes; `None` for `-1` (unlimited).
    pub max_slot_wal_keep_size: Option<u64>,
    /// `wal_sender_timeout`; zero means off.
    pub wal_sender_timeout: Duration,
    /// `idle_replication_slot_timeout` (PostgreSQL 18+); `None` when the server has no such
    /// setting, zero when it is off.
    pub idle_replication_slot_timeout: Option<Duration>,
}

/// The slot as far as its retention goes.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRetention {
    /// `reserved`, `extended`, `unreserved`, `lost` (NULL on very old slots).
    pub wal_status: Option<String>,
    /// `safe_wal_size`: bytes of WAL that can still be written before the slot is in danger;
    /// NULL when the slot is lost or `max_slot_wal_keep_size = -1`. Negative when the slot is
    /// already past the limit (`unreserved`).
    pub safe_wal_size: Option<i64>,
    /// A walsender streams it now.
    pub active: bool,
    /// `inactive_since` (PostgreSQL 17+) as text; `None` while streamed or before 17.
    pub inactive_since: Option<String>,
    /// Seconds since `inactive_since`.
    pub inactive_seconds: Option<f64>,
}

/// What the server says now.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionFacts {
    /// The settings.
    pub settings: RetentionSettings,
    /// The WAL insert position (the replay position on a standby), `None` if unknown.
    pub wal_position: Option<Lsn>,
    /// The slot, `None` when it does not exist.
    pub slot: Option<SlotRetention>,
}

/// A size setting in bytes, from `pg_settings` (`setting` in multiples of `unit`, e.g. `MB`).
pub(super) fn setting_bytes(setting: &str, unit: Option<&str>) -> Option<i64> {
    let value: i64 = setting.parse().ok()?;
    if value < 0 {
        return Some(value);
    }
    let unit = unit.unwrap_or("B");
    let digits = unit.chars().take_while(char::is_ascii_digit).count();
    let factor: i64 = if digits == 0 {
        1
    } else {
        unit[..digits].parse().ok()?
    };
    let scale: i64 = match &unit[digits..] {
        "B" | "" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    value.checked_mul(factor)?.checked_mul(scale)
}

/// A time setting, from `pg_settings` (`setting` in `unit`, e.g. `ms`); negative means off.
pub(super) fn setting_duration(setting: &str, unit: Option<&str>) -> Option<Duration> {
    let value: i64 = setting.parse().ok()?;
    let Ok(value) = u64::try_from(value) else {
        return Some(Duration::ZERO);
    };
    Some(match unit.unwrap_or("s") {
        "ms" => Duration::from_millis(value),
        "s" => Duration::from_secs(value),
        "min" => Duration::from_secs(value.saturating_mul(60)),
        "h" => Duration::from_secs(value.saturating_mul(3600)),
        "d" => Duration::from_secs(value.saturating_mul(86400)),
        _ => return None,
    })
}

/// Reads [`RetentionSettings`]; a setting this server does not have is left out.
pub async fn settings(client: &Client) -> Result<RetentionSettings, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT name, setting, unit FROM pg_catalog.pg_settings \
             WHERE name IN ('max_slot_wal_keep_size', 'wal_sender_timeout', \
                            'idle_replication_slot_timeout')",
            &[],
        )
        .await?;
    let mut settings = RetentionSettings {
        max_slot_wal_keep_size: None,
        wal_sender_timeout: Duration::ZERO,
        idle_replication_slot_timeout: None,
    };
    for row in rows {
        let (name, setting, unit): (String, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let unit = unit.as_deref();
        match name.as_str() {
            "max_slot_wal_keep_size" => {
                // -1 (unlimited) does not fit a u64: None.
                settings.max_slot_wal_keep_size =
                    setting_bytes(&setting, unit).and_then(|b| u64::try_from(b).ok());
            }
            "wal_sender_timeout" => {
                settings.wal_sender_timeout =
                    setting_duration(&setting, unit).unwrap_or(Duration::ZERO);
            }
            "idle_replication_slot_timeout" => {
                settings.idle_replication_slot_timeout = setting_duration(&setting, unit);
            }
            _ => {}
        }
    }
    Ok(settings)
}

/// The WAL insert position (the replay position on a standby).
pub async fn wal_position(client: &Client) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text",
            &[],
        )
        .await?;
    Ok(row
        .get::<_, Option<String>>(0)
        .and_then(|t| Lsn::from_str(&t).ok()))
}

/// Reads the settings, the WAL position and slot `slot`.
pub async fn facts(client: &Client, slot: &str) -> Result<RetentionFacts, tokio_postgres::Error> {
    let settings = settings(client).await?;
    // `inactive_since` exists from PostgreSQL 17 on: read through to_jsonb so that one query
    // serves every version (NULL where the column is missing).
    let row = client
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text, \
                    s.slot_name IS NOT NULL, s.wal_status, s.safe_wal_size, \
                    coalesce(s.active, false), \
                    to_jsonb(s) ->> 'inactive_since', \
                    greatest(0, extract(epoch FROM clock_timestamp() \
                        - (to_jsonb(s) ->> 'inactive_since')::timestamptz))::float8 \
             FROM (SELECT 1) AS one \
             LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = $1",
            &[&slot],
        )
        .await?;
    let wal_position = row
        .get::<_, Option<String>>(0)
        .and_then(|t| Lsn::from_str(&t).ok());
    let slot = row.get::<_, bool>(1).then(|| SlotRetention {
        wal_status: row.get(2),
        safe_wal_size: row.get(3),
        active: row.get(4),
        inactive_since: row.get(5),
        inactive_seconds: row.get(6),
    });
    Ok(RetentionFacts {
        settings,
        wal_position,
        slot,
    })
}
