//! How durable a PubAck from the relay's stream is. The relay confirms the slot once JetStream
//! acknowledged, so an acknowledged event the broker loses later is lost for good. One
//! assessment — the stream's storage, replicas and persist mode, and whether the servers holding
//! it sync each write to disk before acknowledging (`sync_interval: always`) — feeds
//! `validate --connect`, `status` and the start-up log.
//!
//! nats-server reports its sync setting only to the system account (`/varz` and `/jsz` on the
//! monitoring port, `$SYS.REQ.SERVER.PING.JSZ`), never to a JetStream account. The relay asks
//! [`SYNC_PROBE_SUBJECT`] over its own connection, which is answered when the relay's account
//! imports that service from the system account; otherwise the setting is "unknown" and warned
//! about like a lazy one.

mod probe;

use std::time::Duration;

use async_nats::jetstream::stream;
use relay_core::check::{Check, CheckAspect, CheckReport, check_reports};
use serde::Serialize;
use serde_json::Value;

use crate::connection::JetStream;

/// The system-account service every server answers with its JetStream configuration
/// (`config.sync_always`, `config.sync_interval`).
pub const SYNC_PROBE_SUBJECT: &str = "$SYS.REQ.SERVER.PING.JSZ";
/// How long the probe waits for the servers holding the stream.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// nats-server's default background sync interval (2.10 and later).
const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(120);

/// Where the stream keeps its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// Files in the server's store directory.
    File,
    /// Memory only: gone when nats-server restarts.
    Memory,
}

/// A server holding the stream that syncs to disk in the background only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LazyServer {
    /// `server_name`.
    pub name: String,
    /// nats-server version.
    pub version: String,
    /// How often it syncs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Whether the version can sync on every write (`sync_interval: always`, 2.10 and later).
    pub configurable: bool,
}

/// Whether the servers holding the stream sync each write before acknowledging it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ServerSync {
    /// Every server holding the stream has `sync_interval: always`.
    Always {
        /// Their names.
        servers: Vec<String>,
    },
    /// These servers sync only every `interval`, after acknowledging.
    Interval {
        /// The lazy ones.
        servers: Vec<LazyServer>,
    },
    /// The relay could not learn it.
    Unknown {
        /// Why.
        reason: String,
    },
}

/// The assessment of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// The stream.
    pub stream: String,
    /// Its storage.
    pub storage: Storage,
    /// Its replica count.
    pub replicas: usize,
    /// `persist_mode: async` (nats-server 2.12+): acknowledged before written.
    pub async_persist: bool,
    /// Names of the servers holding it (leader first), as the stream info reports them.
    pub servers: Vec<String>,
    /// Their sync setting; `None` for memory storage, where it does not apply.
    pub sync: Option<ServerSync>,
}

/// One aspect of [`Durability`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aspect {
    /// File or memory storage.
    Storage,
    /// The replica count.
    Replicas,
    /// `persist_mode` (only checked when `async`).
    PersistMode,
    /// The servers' `sync_interval`.
    ServerSync,
}

impl CheckAspect for Aspect {
    fn name(self) -> &'static str {
        match self {
            Aspect::Storage => "storage",
            Aspect::Replicas => "replicas",
            Aspect::PersistMode => "persist_mode",
            Aspect::ServerSync => "server sync",
        }
    }
}

/// The verdict on one aspect: safe when `hint` is `None`, a warning with the fix otherwise.
pub type DurabilityCheck = Check<Aspect>;

fn duration(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

impl Durability {
    /// One check per aspect (persist mode only when it is `async`, server sync only for file
    /// storage), in a fixed order.
    pub fn checks(&self) -> Vec<DurabilityCheck> {
        let name = &self.stream;
        let mut checks = Vec::new();
        checks.push(match self.storage {
            Storage::File => Check::ok(Aspect::Storage, "file"),
            Storage::Memory => Check::warn(
                Aspect::Storage,
                "memory: acknowledged events are lost when nats-server restarts",
                format!(
                    "recreate the stream with file storage: nats stream add {name} --storage file ..."
                ),
            ),
        });
        checks.push(if self.replicas <= 1 {
            Check::warn(
                Aspect::Replicas,
                "1: each acknowledged event is on one server only; a failed disk, a corrupted file or (without `sync_interval: always`) a power loss of that server loses it",
                format!(
                    "run a JetStream cluster of 3 servers and `nats stream edit {name} --replicas 3`"
                ),
            )
        } else {
            Check::ok(Aspect::Replicas, self.replicas.to_string())
        });
        if self.async_persist {
            checks.push(Check::warn(
                Aspect::PersistMode,
                "async: the server acknowledges events before it has written them",
                "recreate the stream with the default persist_mode (it cannot be edited)",
            ));
        }
        if let Some(sync) = &self.sync {
            checks.push(self.sync_check(sync));
        }
        checks
    }

    /// The checks that are warnings.
    pub fn warnings(&self) -> Vec<DurabilityCheck> {
        self.checks()
            .into_iter()
            .filter(DurabilityCheck::is_warning)
            .collect()
    }

    fn sync_check(&self, sync: &ServerSync) -> DurabilityCheck {
        let loses = if self.replicas <= 1 {
            "a power loss or OS crash of that server loses events acknowledged in that time"
        } else {
            "a power loss or OS crash of several of the stream's servers at once (or of one, together with a partition or a pause) can lose events acknowledged in that time"
        };
        match sync {
            ServerSync::Always { servers } => Check::ok(
                Aspect::ServerSync,
                format!(
                    "sync_interval: always, each write synced before the ack ({})",
                    servers.join(", ")
                ),
            ),
            ServerSync::Interval { servers } => {
                let found: Vec<String> = servers
                    .iter()
                    .map(|s| {
                        format!(
                            "{} (nats-server {}) syncs to disk every {}, after acknowledging",
                            s.name,
                            s.version,
                            duration(s.interval)
                        )
                    })
                    .collect();
                let names = servers
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                let hint = if servers.iter().all(|s| s.configurable) {
                    format!(
                        "set `sync_interval: always` in the `jetstream {{}}` block of {names} and restart it"
                    )
                } else {
                    format!(
                        "upgrade {names} to nats-server 2.10 or later and set `sync_interval: always` in its `jetstream {{}}` block"
                    )
                };
                Check::warn(
                    Aspect::ServerSync,
                    format!("{}: {loses}", found.join("; ")),
                    hint,
                )
            }
            ServerSync::Unknown { reason } => Check::warn(
                Aspect::ServerSync,
                format!(
                    "unknown ({reason}); nats-server's default is to sync every {} after acknowledging, and then {loses}",
                    duration(DEFAULT_SYNC_INTERVAL)
                ),
                format!(
                    "make sure every nats-server holding the stream has `sync_interval: always` in its `jetstream {{}}` block (its monitoring endpoint shows it: /varz, jetstream.config.sync_always); to let the relay check, import the service {SYNC_PROBE_SUBJECT} from the system account into the relay's account (docs/guarantees.md)"
                ),
            ),
        }
    }

    /// For `status --json`: the assessment and its checks.
    #[must_use]
    pub fn report(&self) -> DurabilityReport {
        DurabilityReport {
            storage: self.storage,
            replicas: self.replicas,
            persist_mode: if self.async_persist {
                "async"
            } else {
                "default"
            }
            .to_owned(),
            servers: self.servers.clone(),
            server_sync: self.sync.clone(),
            checks: check_reports(&self.checks()),
        }
    }

    /// For `status --json`: the assessment and its checks.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }
}

/// A stream's durability as `status --json` shows it (see [`Durability`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DurabilityReport {
    /// Its storage.
    pub storage: Storage,
    /// Its replica count.
    pub replicas: usize,
    /// `async` or `default`.
    pub persist_mode: String,
    /// The servers holding it (leader first).
    pub servers: Vec<String>,
    /// Their sync setting; `None` for memory storage.
    pub server_sync: Option<ServerSync>,
    /// Each check.
    pub checks: Vec<CheckReport>,
}

/// Assesses the stream `info` describes; asks the servers for their sync setting over
/// `jetstream`'s connection (up to 2 s) unless the stream is in memory.
pub async fn assess_durability(jetstream: &JetStream, info: &stream::Info) -> Durability {
    let config = &info.config;
    let storage = match config.storage {
        stream::StorageType::File => Storage::File,
        stream::StorageType::Memory => Storage::Memory,
    };
    let mut servers = Vec::new();
    if let Some(cluster) = &info.cluster {
        servers.extend(cluster.leader.iter().filter(|l| !l.is_empty()).cloned());
        servers.extend(cluster.replicas.iter().map(|p| p.name.clone()));
    }
    let sync = match storage {
        Storage::Memory => None,
        Storage::File => Some(probe::probe_sync(jetstream, &servers).await),
    };
    Durability {
        stream: config.name.clone(),
        storage,
        replicas: config.num_replicas.max(1),
        async_persist: config.persist_mode == Some(stream::PersistenceMode::Async),
        servers,
        sync,
    }
}

#[cfg(test)]
mod tests;
