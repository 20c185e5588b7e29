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
//! [`facts`] reads the server (`facts.rs`); [`assess`] turns the facts and `[postgres] failover`
//! into [`FailoverCheck`]s (`assess.rs`) that `validate --connect` prints and `status` reports.

use relay_core::Lsn;
use relay_core::check::{Check, CheckAspect};
use serde_json::Value;

mod assess;
mod facts;
mod report;
#[cfg(test)]
mod tests;

pub use assess::{alter_slot_hint, assess};
pub use facts::{conninfo_dbname, facts, in_recovery, slot, timeline};
pub use report::{FailoverReport, SlotFailoverReport, StandbyReport, report};

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

/// What a failover check is about (its name in `validate --connect` lines and JSON); the
/// standby or slot it concerns is named in the detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aspect {
    /// The relay's slot has (or will have) the failover flag.
    FailoverSlot,
    /// The server was promoted (timeline above 1).
    Timeline,
    /// `synchronized_standby_slots` on the primary.
    SynchronizedStandbySlots,
    /// No standby streams from the primary.
    Standbys,
    /// One streaming standby, as the primary sees it.
    Standby,
    /// The server is a standby.
    Server,
    /// Slot synchronization exists on this version (17+).
    SlotSynchronization,
    /// `sync_replication_slots` on the standby.
    SyncReplicationSlots,
    /// `hot_standby_feedback` on the standby.
    HotStandbyFeedback,
    /// `primary_slot_name` on the standby.
    PrimarySlotName,
    /// `dbname` in the standby's `primary_conninfo`.
    PrimaryConninfo,
    /// The relay's slot on the standby: synchronized, persistent, valid.
    SynchronizedSlot,
}

impl CheckAspect for Aspect {
    fn name(self) -> &'static str {
        match self {
            Aspect::FailoverSlot => "failover slot",
            Aspect::Timeline => "timeline",
            Aspect::SynchronizedStandbySlots => "synchronized_standby_slots",
            Aspect::Standbys => "standbys",
            Aspect::Standby => "standby",
            Aspect::Server => "server",
            Aspect::SlotSynchronization => "slot synchronization",
            Aspect::SyncReplicationSlots => "sync_replication_slots",
            Aspect::HotStandbyFeedback => "hot_standby_feedback",
            Aspect::PrimarySlotName => "primary_slot_name",
            Aspect::PrimaryConninfo => "primary_conninfo",
            Aspect::SynchronizedSlot => "synchronized slot",
        }
    }
}

/// One finding: fine, or a warning with its fix.
pub type FailoverCheck = Check<Aspect>;

/// For `status --json` and `/status`: the facts that matter and every check (or why there are
/// none: `postgres.failover = true` on a server without failover slots).
pub fn to_json(
    facts: &FailoverFacts,
    checks: &Result<Vec<FailoverCheck>, crate::PgError>,
) -> Value {
    serde_json::to_value(report(facts, checks)).unwrap_or_default()
}
