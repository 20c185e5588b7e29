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
//! `wal_sender_timeout = 0`), plus up to `[relay] standby_poll_interval` until the standby
//! sees the slot free.
//!
//! [`facts`] reads all of it; [`RetentionWindow::assess`] turns the facts, a WAL rate (a short
//! [`measure`] sample in `validate --connect` and `status`, a moving [`WalRateTracker`] in the
//! running relay's sampler) and the [`TakeoverPolicy`] into one assessment that
//! `validate --connect`, `status` and `/metrics` all report.

use std::collections::VecDeque;
use std::str::FromStr;
use std::time::{Duration, Instant};

use relay_core::Lsn;
use relay_core::check::{Check, CheckAspect};
use serde_json::Value;
use tokio_postgres::Client;

mod facts;
mod format;
mod rate;
mod report;
#[cfg(test)]
mod tests;

pub use facts::*;
use format::*;
pub(crate) use format::{bytes, duration};
pub use rate::*;
pub use report::{RetentionReport, WalRateReport};

/// How long the operator needs the slot to survive a stopped relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeoverPolicy {
    /// `[relay] takeover_budget`: the longest outage planned for (a standby taking over, or
    /// someone restoring the relay); a shorter window is warned about.
    pub budget: Duration,
    /// `[relay] standby_poll_interval`: how often a waiting standby looks whether the slot is
    /// free.
    pub standby_poll: Duration,
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

impl CheckAspect for Aspect {
    fn name(self) -> &'static str {
        match self {
            Aspect::Window => "retention window",
            Aspect::Takeover => "standby takeover",
            Aspect::IdleTimeout => "idle_replication_slot_timeout",
        }
    }
}

/// The verdict on one aspect: fine when `hint` is `None`, a warning with the fix otherwise.
pub type RetentionCheck = Check<Aspect>;

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
    pub(crate) fn wal_seconds(&self) -> Option<f64> {
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
    pub(crate) fn is_unbounded(&self) -> bool {
        self.limit().is_none() && self.idle_timeout().is_none() && !self.is_lost()
    }

    /// How long a waiting standby relay needs at most to take over from a relay whose host
    /// vanished: `wal_sender_timeout` + `standby_poll_interval`; `None` when
    /// `wal_sender_timeout = 0`.
    #[must_use]
    pub fn takeover(&self) -> Option<Duration> {
        let timeout = self.facts.settings.wal_sender_timeout;
        (!timeout.is_zero()).then(|| timeout + self.policy.standby_poll)
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
            return Check::warn(
                Aspect::Window,
                "none: the slot is already invalidated (wal_status lost)",
                "docs/operations.md, \"Slot lost\"",
            );
        }
        if self.limit().is_none() {
            return Check::warn(
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
                Check::warn(
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
            Some(s) => Check::ok(
                Aspect::Window,
                format!(
                    "about {} ({safe} of WAL left{at}); [relay] takeover_budget {}",
                    seconds(s),
                    duration(budget)
                ),
            ),
            None => {
                let threshold = self.safe_wal_bytes().unwrap_or(0) as f64 / budget.as_secs_f64();
                Check::ok(
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
            return Check::warn(
                Aspect::Takeover,
                "wal_sender_timeout = 0: when the active relay's host or network vanishes, its walsender keeps the slot until TCP keepalives end it, and a standby relay cannot take over until then",
                "set wal_sender_timeout (the default is 60s): ALTER SYSTEM SET wal_sender_timeout = '60s'; SELECT pg_reload_conf()",
            );
        };
        let estimate = format!(
            "within about {} after the active relay's host vanished (wal_sender_timeout {} + [relay] standby_poll_interval {}; at its next look when only its process died)",
            duration(takeover),
            duration(wst),
            duration(self.policy.standby_poll)
        );
        match self.seconds() {
            Some(s) if s < takeover.as_secs_f64() && !self.is_lost() => Check::warn(
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
            _ => Check::ok(Aspect::Takeover, estimate),
        }
    }

    fn idle_check(&self, timeout: Duration) -> RetentionCheck {
        if timeout.is_zero() {
            return Check::ok(
                Aspect::IdleTimeout,
                "0 (off): an idle slot is not invalidated",
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
            Check::warn(
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
            Check::ok(Aspect::IdleTimeout, detail)
        }
    }

    /// For `status --json` and `/status`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.report()).unwrap_or_default()
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
