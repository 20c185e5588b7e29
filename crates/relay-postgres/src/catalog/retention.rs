//! The retention window: how long the relay may be down before PostgreSQL invalidates its slot
//! (`wal_status = lost`), after which the events committed since the last confirmed position
//! are gone from WAL and the relay refuses to start (exit 65, docs/operations.md "Slot lost").
//!
//! PostgreSQL invalidates a slot at a checkpoint for one of two reasons:
//!
//! - **WAL**: the slot's `restart_lsn` is more than `max_slot_wal_keep_size` behind the WAL
//!   insert position. `pg_replication_slots.safe_wal_size` is the WAL that can still be written
//!   before that happens (NULL when the setting is `-1`, unlimited: then the slot keeps WAL
//!   until the disk fills). At a WAL rate of `r` bytes per second a stopped relay has
//!   `safe_wal_size / r` seconds.
//! - **Idle** (PostgreSQL 18+): the slot was not streamed for `idle_replication_slot_timeout`
//!   (0 = off). `inactive_since` (17+) tells since when.
//!
//! A standby relay waiting on the slot takes over once PostgreSQL lets go of the active relay's
//! walsender: at once when that relay's process dies, but only after `wal_sender_timeout` when
//! its host or network vanished (and never, short of TCP keepalives, with
//! `wal_sender_timeout = 0`), plus up to `[relay] reconnect_max` until the standby retries.
//!
//! [`facts`] reads all of it; [`RetentionWindow::assess`] turns the facts, a WAL rate (a short
//! [`measure`] sample in `validate --connect` and `status`, a moving [`WalRateTracker`] in the
//! running relay's sampler) and the [`TakeoverPolicy`] into one assessment that
//! `validate --connect`, `status` and `/metrics` all report.

use std::collections::VecDeque;
use std::str::FromStr;
use std::time::{Duration, Instant};

use relay_core::Lsn;
use serde_json::{Value, json};
use tokio_postgres::Client;

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
fn setting_bytes(setting: &str, unit: Option<&str>) -> Option<i64> {
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
fn setting_duration(setting: &str, unit: Option<&str>) -> Option<Duration> {
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

/// Where a [`WalRate`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateSource {
    /// Two readings a few seconds apart (`validate --connect`, `status`): a short sample, which
    /// may miss bursts or catch one.
    ShortSample,
    /// The running relay's periodic samples over a moving window.
    Moving,
}

/// How fast the server writes WAL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WalRate {
    /// Bytes per second.
    pub bytes_per_second: f64,
    /// Over how long it was measured.
    pub over: Duration,
    /// How.
    pub source: RateSource,
}

impl WalRate {
    /// From two positions `over` apart (`None` when the WAL went backwards: another server).
    #[must_use]
    pub fn between(from: Lsn, to: Lsn, over: Duration, source: RateSource) -> Option<Self> {
        if over.is_zero() || to < from {
            return None;
        }
        Some(Self {
            bytes_per_second: (to.0 - from.0) as f64 / over.as_secs_f64(),
            over,
            source,
        })
    }

    /// E.g. `1.2 MB/s (a 2s sample)`.
    #[must_use]
    pub fn describe(&self) -> String {
        let over = seconds(self.over.as_secs_f64());
        let how = match self.source {
            RateSource::ShortSample => format!("a {over} sample"),
            RateSource::Moving => format!("moving, over the last {over}"),
        };
        format!("{}/s ({how})", bytes(self.bytes_per_second))
    }

    fn to_json(self) -> Value {
        json!({
            "bytes_per_second": self.bytes_per_second,
            "over_seconds": self.over.as_secs_f64(),
            "source": match self.source {
                RateSource::ShortSample => "short_sample",
                RateSource::Moving => "moving",
            },
        })
    }
}

/// The WAL rate over the last `window` of periodic position samples (fewer right after the
/// start); the metrics sampler feeds it.
#[derive(Debug, Clone)]
pub struct WalRateTracker {
    window: Duration,
    samples: VecDeque<(Instant, Lsn)>,
}

impl WalRateTracker {
    /// A tracker averaging over `window`.
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Adds the position read at `at`. A position behind the last one (the relay now talks to
    /// another server) starts over.
    pub fn push(&mut self, at: Instant, position: Lsn) {
        if self
            .samples
            .back()
            .is_some_and(|&(_, last)| position < last)
        {
            self.samples.clear();
        }
        self.samples.push_back((at, position));
        // Keep one sample at or before the window's start as the base.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(t, _)| at.duration_since(t) >= self.window)
        {
            self.samples.pop_front();
        }
    }

    /// The rate between the oldest and the newest sample kept; `None` before two samples.
    #[must_use]
    pub fn rate(&self) -> Option<WalRate> {
        let (&(t0, p0), &(t1, p1)) = (self.samples.front()?, self.samples.back()?);
        WalRate::between(p0, p1, t1.duration_since(t0), RateSource::Moving)
    }
}

/// How long the operator needs the slot to survive a stopped relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeoverPolicy {
    /// `[relay] takeover_budget`: the longest outage planned for (a standby taking over, or
    /// someone restoring the relay); a shorter window is warned about.
    pub budget: Duration,
    /// `[relay] reconnect_max`: how long a waiting standby may take to retry.
    pub reconnect_max: Duration,
}

/// What one check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aspect {
    /// The window against the budget (and unlimited retention).
    Window,
    /// Whether a standby relay can take over inside the window.
    Takeover,
    /// `idle_replication_slot_timeout` (PostgreSQL 18+).
    IdleTimeout,
}

impl Aspect {
    /// The name used in check lines.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Aspect::Window => "retention window",
            Aspect::Takeover => "standby takeover",
            Aspect::IdleTimeout => "idle_replication_slot_timeout",
        }
    }
}

/// The verdict on one aspect: fine when `hint` is `None`, a warning with the fix otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionCheck {
    /// What was checked.
    pub aspect: Aspect,
    /// What was found, with the numbers.
    pub detail: String,
    /// How to fix it; `Some` makes this a warning.
    pub hint: Option<String>,
}

impl RetentionCheck {
    fn ok(aspect: Aspect, detail: String) -> Self {
        Self {
            aspect,
            detail,
            hint: None,
        }
    }

    fn warn(aspect: Aspect, detail: String, hint: String) -> Self {
        Self {
            aspect,
            detail,
            hint: Some(hint),
        }
    }

    /// Whether this is a warning.
    #[must_use]
    pub fn is_warning(&self) -> bool {
        self.hint.is_some()
    }
}

/// The assessment: how long a stopped relay has before its slot is invalidated.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionWindow {
    /// The facts it was made from.
    pub facts: RetentionFacts,
    /// The WAL rate used, if known.
    pub wal_rate: Option<WalRate>,
    /// The policy it was judged by.
    pub policy: TakeoverPolicy,
}

const DOCS: &str = "docs/operations.md, \"Retention window\"";

impl RetentionWindow {
    /// Judges `facts` at `wal_rate` against `policy`.
    #[must_use]
    pub fn assess(
        facts: RetentionFacts,
        wal_rate: Option<WalRate>,
        policy: TakeoverPolicy,
    ) -> Self {
        Self {
            facts,
            wal_rate,
            policy,
        }
    }

    /// Whether the slot is already invalidated.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.facts
            .slot
            .as_ref()
            .is_some_and(|s| s.wal_status.as_deref() == Some("lost"))
    }

    /// `max_slot_wal_keep_size` in bytes, `None` when unlimited.
    #[must_use]
    pub fn limit(&self) -> Option<u64> {
        self.facts.settings.max_slot_wal_keep_size
    }

    /// WAL that can still be written before the slot is invalidated: the slot's
    /// `safe_wal_size`, or `max_slot_wal_keep_size` for a slot not created yet; `None` when
    /// unlimited; 0 when the slot is lost or already past the limit.
    #[must_use]
    pub fn safe_wal_bytes(&self) -> Option<i64> {
        if self.is_lost() {
            return Some(0);
        }
        let limit = i64::try_from(self.limit()?).unwrap_or(i64::MAX);
        let safe = self
            .facts
            .slot
            .as_ref()
            .and_then(|s| s.safe_wal_size)
            .unwrap_or(limit);
        Some(safe.max(0))
    }

    /// Seconds until the WAL limit is reached at the WAL rate; `None` when unlimited or when
    /// no WAL was written (no estimate).
    #[must_use]
    pub fn wal_seconds(&self) -> Option<f64> {
        let safe = self.safe_wal_bytes()?;
        if safe == 0 {
            return Some(0.0);
        }
        let rate = self.wal_rate?.bytes_per_second;
        (rate > 0.0).then(|| safe as f64 / rate)
    }

    /// `idle_replication_slot_timeout` when it is on.
    #[must_use]
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.facts
            .settings
            .idle_replication_slot_timeout
            .filter(|d| !d.is_zero())
    }

    /// Seconds until the idle timeout invalidates the slot if it is not streamed from now on
    /// (less the time it has been inactive already); `None` when that timeout is off.
    #[must_use]
    pub fn idle_seconds(&self) -> Option<f64> {
        let timeout = self.idle_timeout()?.as_secs_f64();
        let inactive = self
            .facts
            .slot
            .as_ref()
            .filter(|s| !s.active)
            .and_then(|s| s.inactive_seconds)
            .unwrap_or(0.0);
        Some((timeout - inactive).max(0.0))
    }

    /// The window: the sooner of the WAL and the idle bound. `None` when neither bounds it (or
    /// the WAL bound is unknown and there is no idle bound).
    #[must_use]
    pub fn seconds(&self) -> Option<f64> {
        if self.is_lost() {
            return Some(0.0);
        }
        match (self.wal_seconds(), self.idle_seconds()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Neither `max_slot_wal_keep_size` nor `idle_replication_slot_timeout` limits the slot.
    #[must_use]
    pub fn is_unbounded(&self) -> bool {
        self.limit().is_none() && self.idle_timeout().is_none() && !self.is_lost()
    }

    /// How long a waiting standby relay needs at most to take over from a relay whose host
    /// vanished: `wal_sender_timeout` + `reconnect_max`; `None` when `wal_sender_timeout = 0`.
    #[must_use]
    pub fn takeover(&self) -> Option<Duration> {
        let timeout = self.facts.settings.wal_sender_timeout;
        (!timeout.is_zero()).then(|| timeout + self.policy.reconnect_max)
    }

    /// One line: how long, e.g. `about 12s before slot s is invalidated if the relay stops`.
    #[must_use]
    pub fn headline(&self) -> String {
        if self.is_lost() {
            return "none: the slot is already invalidated (wal_status lost)".into();
        }
        if self.limit().is_none() {
            let mut text = "unbounded: the slot keeps WAL until the disk fills \
                            (max_slot_wal_keep_size = -1)"
                .to_owned();
            if let Some(s) = self.idle_seconds() {
                text.push_str(&format!(
                    "; idle_replication_slot_timeout invalidates it in about {} if the relay stops",
                    seconds(s)
                ));
            }
            return text;
        }
        match self.seconds() {
            Some(s) => format!(
                "about {} before the slot is invalidated if the relay stops",
                seconds(s)
            ),
            None => format!(
                "{} of WAL before the slot is invalidated; no WAL written while sampling, so no time estimate",
                bytes(self.safe_wal_bytes().unwrap_or(0) as f64)
            ),
        }
    }

    /// The numbers behind [`Self::headline`], e.g. `max_slot_wal_keep_size 64 MB,
    /// safe_wal_size 60 MB, WAL rate 1 MB/s (a 2s sample)`.
    #[must_use]
    pub fn numbers(&self) -> String {
        let mut parts = vec![match self.limit() {
            Some(l) => format!("max_slot_wal_keep_size {}", bytes(l as f64)),
            None => "max_slot_wal_keep_size -1 (unlimited)".to_owned(),
        }];
        match (&self.facts.slot, self.safe_wal_bytes()) {
            (None, Some(_)) => parts.push("slot not created yet".into()),
            (Some(_), Some(safe)) => parts.push(format!("safe_wal_size {}", bytes(safe as f64))),
            _ => {}
        }
        parts.push(match &self.wal_rate {
            Some(rate) => format!("WAL rate {}", rate.describe()),
            None => "WAL rate unknown".into(),
        });
        if let Some(slot) = &self.facts.slot {
            match (&slot.inactive_since, slot.inactive_seconds, slot.active) {
                (_, _, true) => parts.push("slot streamed now".into()),
                (Some(since), Some(ago), false) => parts.push(format!(
                    "slot inactive since {since} ({} ago)",
                    seconds(ago)
                )),
                _ => parts.push("slot not streamed now".into()),
            }
        }
        parts.join(", ")
    }

    /// One check per aspect (the idle timeout only where the server has the setting).
    #[must_use]
    pub fn checks(&self) -> Vec<RetentionCheck> {
        let mut checks = vec![self.window_check(), self.takeover_check()];
        if let Some(timeout) = self.facts.settings.idle_replication_slot_timeout {
            checks.push(self.idle_check(timeout));
        }
        checks
    }

    /// The checks that are warnings.
    #[must_use]
    pub fn warnings(&self) -> Vec<RetentionCheck> {
        self.checks()
            .into_iter()
            .filter(RetentionCheck::is_warning)
            .collect()
    }

    /// `ALTER SYSTEM` for a `max_slot_wal_keep_size` that covers the budget at the WAL rate.
    fn sizing_hint(&self) -> String {
        let budget = duration(self.policy.budget);
        match self.wal_rate.filter(|r| r.bytes_per_second > 0.0) {
            Some(rate) => {
                let needed = rate.bytes_per_second * self.policy.budget.as_secs_f64();
                let mb = (needed / f64::from(1 << 20)).ceil().max(1.0) as u64;
                // PostgreSQL's units: MB up to 10 GB, whole GB (rounded up) above.
                let setting = if mb > 10 * 1024 {
                    format!("{}GB", mb.div_ceil(1024))
                } else {
                    format!("{mb}MB")
                };
                format!(
                    "set max_slot_wal_keep_size to at least the WAL written in [relay] takeover_budget ({budget}): {}/s × {budget} ≈ {} (more for bursts), and keep that much disk free for pg_wal: ALTER SYSTEM SET max_slot_wal_keep_size = '{setting}'; SELECT pg_reload_conf(); see {DOCS}",
                    bytes(rate.bytes_per_second),
                    bytes(needed),
                )
            }
            None => format!(
                "set max_slot_wal_keep_size to the WAL your busiest {budget} ([relay] takeover_budget) writes, and keep that much disk free for pg_wal: ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf(); see {DOCS}"
            ),
        }
    }

    fn window_check(&self) -> RetentionCheck {
        let budget = self.policy.budget;
        let at = self
            .wal_rate
            .map(|r| format!(" at {}", r.describe()))
            .unwrap_or_default();
        if self.is_lost() {
            return RetentionCheck::warn(
                Aspect::Window,
                "none: the slot is already invalidated (wal_status lost)".into(),
                "docs/operations.md, \"Slot lost\"".into(),
            );
        }
        if self.limit().is_none() {
            return RetentionCheck::warn(
                Aspect::Window,
                format!(
                    "unbounded: the slot keeps WAL until the disk fills (max_slot_wal_keep_size = -1); a stopped relay makes pg_wal grow{at} until PostgreSQL runs out of disk"
                ),
                self.sizing_hint(),
            );
        }
        let safe = bytes(self.safe_wal_bytes().unwrap_or(0) as f64);
        match self.seconds() {
            Some(s) if s < budget.as_secs_f64() => {
                let bound = if self
                    .idle_seconds()
                    .is_some_and(|idle| self.wal_seconds().is_none_or(|w| idle < w))
                {
                    "idle_replication_slot_timeout".to_owned()
                } else {
                    format!("{safe} of WAL left{at}")
                };
                RetentionCheck::warn(
                    Aspect::Window,
                    format!(
                        "about {} ({bound}): shorter than [relay] takeover_budget ({})",
                        seconds(s),
                        duration(budget)
                    ),
                    format!(
                        "{}; or lower [relay] takeover_budget if the relay is surely back sooner",
                        self.sizing_hint()
                    ),
                )
            }
            Some(s) => RetentionCheck::ok(
                Aspect::Window,
                format!(
                    "about {} ({safe} of WAL left{at}); [relay] takeover_budget {}",
                    seconds(s),
                    duration(budget)
                ),
            ),
            None => {
                let threshold = self.safe_wal_bytes().unwrap_or(0) as f64 / budget.as_secs_f64();
                RetentionCheck::ok(
                    Aspect::Window,
                    format!(
                        "{safe} of WAL left; no WAL written while sampling{at}, so no time estimate: the window is shorter than [relay] takeover_budget ({}) above {}/s",
                        duration(budget),
                        bytes(threshold)
                    ),
                )
            }
        }
    }

    fn takeover_check(&self) -> RetentionCheck {
        let wst = self.facts.settings.wal_sender_timeout;
        let Some(takeover) = self.takeover() else {
            return RetentionCheck::warn(
                Aspect::Takeover,
                "wal_sender_timeout = 0: when the active relay's host or network vanishes, its walsender keeps the slot until TCP keepalives end it, and a standby relay cannot take over until then".into(),
                "set wal_sender_timeout (the default is 60s): ALTER SYSTEM SET wal_sender_timeout = '60s'; SELECT pg_reload_conf()".into(),
            );
        };
        let estimate = format!(
            "within about {} after the active relay's host vanished (wal_sender_timeout {} + [relay] reconnect_max {}; at once when only its process died)",
            duration(takeover),
            duration(wst),
            duration(self.policy.reconnect_max)
        );
        match self.seconds() {
            Some(s) if s < takeover.as_secs_f64() && !self.is_lost() => RetentionCheck::warn(
                Aspect::Takeover,
                format!(
                    "a standby relay takes over {estimate}, but the slot lasts only about {}",
                    seconds(s)
                ),
                format!(
                    "{}; or lower wal_sender_timeout so a vanished relay's walsender ends sooner",
                    self.sizing_hint()
                ),
            ),
            _ => RetentionCheck::ok(Aspect::Takeover, estimate),
        }
    }

    fn idle_check(&self, timeout: Duration) -> RetentionCheck {
        if timeout.is_zero() {
            return RetentionCheck::ok(
                Aspect::IdleTimeout,
                "0 (off): an idle slot is not invalidated".into(),
            );
        }
        let left = match self.idle_seconds() {
            Some(left) if left < timeout.as_secs_f64() => {
                format!("; the slot has been inactive, about {} left", seconds(left))
            }
            _ => String::new(),
        };
        let detail = format!(
            "{}: a slot not streamed for that long is invalidated at the next checkpoint{left}",
            duration(timeout)
        );
        if timeout < self.policy.budget {
            RetentionCheck::warn(
                Aspect::IdleTimeout,
                format!(
                    "{detail}; shorter than [relay] takeover_budget ({})",
                    duration(self.policy.budget)
                ),
                format!(
                    "raise it above the takeover budget, or turn it off: ALTER SYSTEM SET idle_replication_slot_timeout = '{}'; SELECT pg_reload_conf() (0 = off); see {DOCS}",
                    duration(self.policy.budget)
                ),
            )
        } else {
            RetentionCheck::ok(Aspect::IdleTimeout, detail)
        }
    }

    /// For `status --json` and `/status`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let s = &self.facts.settings;
        json!({
            "headline": self.headline(),
            "numbers": self.numbers(),
            "unbounded": self.is_unbounded(),
            "seconds": self.seconds(),
            "wal_seconds": self.wal_seconds(),
            "idle_seconds": self.idle_seconds(),
            "max_slot_wal_keep_size_bytes": self.limit(),
            "safe_wal_bytes": self.safe_wal_bytes(),
            "wal_rate": self.wal_rate.map(WalRate::to_json),
            "wal_sender_timeout_seconds": s.wal_sender_timeout.as_secs_f64(),
            "idle_replication_slot_timeout_seconds":
                s.idle_replication_slot_timeout.map(|d| d.as_secs_f64()),
            "slot_wal_status": self.facts.slot.as_ref().and_then(|s| s.wal_status.clone()),
            "slot_active": self.facts.slot.as_ref().map(|s| s.active),
            "inactive_since": self.facts.slot.as_ref().and_then(|s| s.inactive_since.clone()),
            "inactive_seconds": self.facts.slot.as_ref().and_then(|s| s.inactive_seconds),
            "takeover_seconds": self.takeover().map(|d| d.as_secs_f64()),
            "takeover_budget_seconds": self.policy.budget.as_secs_f64(),
            "checks": self.checks().iter().map(|c| json!({
                "check": c.aspect.name(),
                "verdict": if c.is_warning() { "warn" } else { "pass" },
                "detail": c.detail,
                "hint": c.hint,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Measures the WAL rate over a short `sample` (two readings of the WAL position) and assesses
/// slot `slot`: what `validate --connect` and `status` report.
pub async fn measure(
    client: &Client,
    slot: &str,
    sample: Duration,
    policy: TakeoverPolicy,
) -> Result<RetentionWindow, tokio_postgres::Error> {
    let first = wal_position(client).await?;
    let started = Instant::now();
    tokio::time::sleep(sample).await;
    let facts = facts(client, slot).await?;
    let rate = match (first, facts.wal_position) {
        (Some(a), Some(b)) => WalRate::between(a, b, started.elapsed(), RateSource::ShortSample),
        _ => None,
    };
    Ok(RetentionWindow::assess(facts, rate, policy))
}

fn duration(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

/// Whole seconds as a duration, e.g. `1h 2m 3s`.
fn seconds(s: f64) -> String {
    if !s.is_finite() || s > 1e12 {
        return "forever".into();
    }
    duration(Duration::from_secs(s.max(0.0).round() as u64))
}

/// Bytes in PostgreSQL's units (1 kB = 1024 bytes), e.g. `64 MB`, `1.5 GB`.
fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n.abs() < 1024.0 {
        return format!("{n:.0} bytes");
    }
    let mut value = n / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value.abs() < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if (value - value.round()).abs() < 0.05 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn policy() -> TakeoverPolicy {
        TakeoverPolicy {
            budget: Duration::from_secs(3600),
            reconnect_max: Duration::from_secs(10),
        }
    }

    fn facts(limit: Option<u64>, safe: Option<i64>) -> RetentionFacts {
        RetentionFacts {
            settings: RetentionSettings {
                max_slot_wal_keep_size: limit,
                wal_sender_timeout: Duration::from_secs(60),
                idle_replication_slot_timeout: None,
            },
            wal_position: Some(Lsn(1000)),
            slot: Some(SlotRetention {
                wal_status: Some("reserved".into()),
                safe_wal_size: safe,
                active: true,
                inactive_since: None,
                inactive_seconds: None,
            }),
        }
    }

    fn rate(bps: f64) -> Option<WalRate> {
        Some(WalRate {
            bytes_per_second: bps,
            over: Duration::from_secs(2),
            source: RateSource::ShortSample,
        })
    }

    #[test]
    fn settings_are_read_in_their_units() {
        assert_eq!(setting_bytes("64", Some("MB")), Some(64 << 20));
        assert_eq!(setting_bytes("-1", Some("MB")), Some(-1));
        assert_eq!(setting_bytes("2", Some("8kB")), Some(16384));
        assert_eq!(setting_bytes("x", Some("MB")), None);
        assert_eq!(
            setting_duration("60000", Some("ms")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            setting_duration("30", Some("min")),
            Some(Duration::from_secs(1800))
        );
        assert_eq!(setting_duration("0", Some("s")), Some(Duration::ZERO));
        assert_eq!(setting_duration("-1", Some("ms")), Some(Duration::ZERO));
    }

    #[test]
    fn window_is_safe_wal_size_over_the_rate() {
        let w = RetentionWindow::assess(
            facts(Some(64 * MB), Some(60 * MB as i64)),
            rate(MB as f64 / 2.0),
            policy(),
        );
        assert_eq!(w.safe_wal_bytes(), Some(60 * MB as i64));
        assert_eq!(w.seconds(), Some(120.0));
        assert!(!w.is_unbounded());
        let warnings = w.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].aspect, Aspect::Window);
        assert_eq!(
            warnings[0].detail,
            "about 2m (60 MB of WAL left at 512 kB/s (a 2s sample)): shorter than [relay] takeover_budget (1h)"
        );
        // 0.5 MB/s for an hour: 1800 MB.
        let hint = warnings[0].hint.as_deref().unwrap_or_default();
        assert!(hint.contains("'1800MB'"), "{hint}");
        // 4.5 MB/s for an hour: 15.8 GB, rounded up to whole GB.
        let fast = RetentionWindow::assess(
            facts(Some(64 * MB), Some(60 * MB as i64)),
            rate(4.5 * MB as f64),
            policy(),
        );
        let hint = fast.warnings()[0].hint.clone().unwrap_or_default();
        assert!(hint.contains("'16GB'"), "{hint}");
        assert_eq!(
            w.headline(),
            "about 2m before the slot is invalidated if the relay stops"
        );
        assert_eq!(
            w.numbers(),
            "max_slot_wal_keep_size 64 MB, safe_wal_size 60 MB, WAL rate 512 kB/s (a 2s sample), slot streamed now"
        );
    }

    #[test]
    fn a_long_window_passes_and_a_standby_that_cannot_make_it_warns() {
        let w = RetentionWindow::assess(
            facts(Some(64 * MB), Some(64 * MB as i64)),
            rate(1024.0),
            policy(),
        );
        assert_eq!(w.seconds(), Some(65536.0));
        assert!(w.warnings().is_empty(), "{:?}", w.warnings());

        // 30 s of WAL left, a standby needs 70 s.
        let w = RetentionWindow::assess(
            facts(Some(64 * MB), Some(30 * MB as i64)),
            rate(MB as f64),
            policy(),
        );
        assert_eq!(w.takeover(), Some(Duration::from_secs(70)));
        let aspects: Vec<Aspect> = w.warnings().iter().map(|c| c.aspect).collect();
        assert_eq!(aspects, [Aspect::Window, Aspect::Takeover]);
    }

    #[test]
    fn unlimited_retention_is_unbounded_with_a_hint() {
        let w = RetentionWindow::assess(facts(None, None), rate(2048.0), policy());
        assert!(w.is_unbounded());
        assert_eq!(w.seconds(), None);
        assert_eq!(w.safe_wal_bytes(), None);
        assert!(w.headline().starts_with(
            "unbounded: the slot keeps WAL until the disk fills (max_slot_wal_keep_size = -1)"
        ));
        let warnings = w.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].detail.starts_with("unbounded: "));
        // 2 kB/s for an hour: 7.03 MB, rounded up.
        assert!(
            warnings[0]
                .hint
                .as_deref()
                .unwrap_or_default()
                .contains("'8MB'"),
            "{warnings:?}"
        );
    }

    #[test]
    fn no_wal_means_no_estimate_and_a_lost_slot_means_none() {
        let w = RetentionWindow::assess(
            facts(Some(64 * MB), Some(64 * MB as i64)),
            rate(0.0),
            policy(),
        );
        assert_eq!(w.seconds(), None);
        assert!(w.warnings().is_empty());
        let detail = &w.checks()[0].detail;
        // 64 MB over an hour: 18.2 kB/s.
        assert!(detail.contains("above 18.2 kB/s"), "{detail}");

        let mut lost = facts(Some(64 * MB), None);
        if let Some(s) = lost.slot.as_mut() {
            s.wal_status = Some("lost".into());
        }
        let w = RetentionWindow::assess(lost, rate(1.0), policy());
        assert_eq!(w.seconds(), Some(0.0));
        assert_eq!(w.safe_wal_bytes(), Some(0));

        // Past the limit (unreserved): safe_wal_size is negative, nothing left.
        let w = RetentionWindow::assess(facts(Some(64 * MB), Some(-5)), rate(1.0), policy());
        assert_eq!(w.seconds(), Some(0.0));
    }

    #[test]
    fn idle_timeout_bounds_an_inactive_slot() {
        let mut f = facts(None, None);
        f.settings.idle_replication_slot_timeout = Some(Duration::from_secs(1800));
        if let Some(s) = f.slot.as_mut() {
            s.active = false;
            s.inactive_since = Some("2025-01-01T00:00:00+00:00".into());
            s.inactive_seconds = Some(600.0);
        }
        let w = RetentionWindow::assess(f, rate(1.0), policy());
        assert!(!w.is_unbounded());
        assert_eq!(w.idle_seconds(), Some(1200.0));
        assert_eq!(w.seconds(), Some(1200.0));
        let aspects: Vec<Aspect> = w.warnings().iter().map(|c| c.aspect).collect();
        assert_eq!(aspects, [Aspect::Window, Aspect::IdleTimeout]);
        let idle = &w.warnings()[1];
        assert!(
            idle.detail.starts_with(
                "30m: a slot not streamed for that long is invalidated at the next checkpoint; the slot has been inactive, about 20m left"
            ),
            "{}",
            idle.detail
        );

        // Off: reported, not warned.
        let mut f = facts(Some(64 * MB), Some(64 * MB as i64));
        f.settings.idle_replication_slot_timeout = Some(Duration::ZERO);
        let w = RetentionWindow::assess(f, rate(1.0), policy());
        let idle = &w.checks()[2];
        assert_eq!(idle.aspect, Aspect::IdleTimeout);
        assert!(!idle.is_warning());
    }

    #[test]
    fn wal_sender_timeout_off_means_no_takeover() {
        let mut f = facts(Some(64 * MB), Some(64 * MB as i64));
        f.settings.wal_sender_timeout = Duration::ZERO;
        let w = RetentionWindow::assess(f, rate(1.0), policy());
        assert_eq!(w.takeover(), None);
        let warnings = w.warnings();
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].aspect, Aspect::Takeover);
    }

    #[test]
    fn the_tracker_averages_over_its_window() {
        let t0 = Instant::now();
        let mut tracker = WalRateTracker::new(Duration::from_secs(60));
        tracker.push(t0, Lsn(0));
        assert_eq!(tracker.rate(), None);
        for i in 1..=120u64 {
            // 1 kB/s for 60 s, then 10 kB/s.
            let at = t0 + Duration::from_secs(i);
            let pos = if i <= 60 {
                i * 1024
            } else {
                60 * 1024 + (i - 60) * 10240
            };
            tracker.push(at, Lsn(pos));
            if i == 60 {
                let r = tracker.rate().expect("rate");
                assert!((r.bytes_per_second - 1024.0).abs() < 1e-6, "{r:?}");
            }
        }
        let r = tracker.rate().expect("rate");
        assert_eq!(r.over, Duration::from_secs(60));
        assert!((r.bytes_per_second - 10240.0).abs() < 1e-6, "{r:?}");
        // Another server: WAL went backwards, start over.
        tracker.push(t0 + Duration::from_secs(121), Lsn(5));
        assert_eq!(tracker.rate(), None);
    }

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(512.0), "512 bytes");
        assert_eq!(bytes(64.0 * MB as f64), "64 MB");
        assert_eq!(bytes(1.5 * (1u64 << 30) as f64), "1.5 GB");
        assert_eq!(seconds(3723.4), "1h 2m 3s");
    }
}
