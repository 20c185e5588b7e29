//! Spreading one fleet's pipelines over several processes, with no coordinator of our own.
//!
//! Safety never rests on this: a slot admits one reader, so a pipeline streams in one process
//! whatever the processes believe. This only decides who *tries first*:
//!
//! - Every process of the fleet (`[fleet] name`) says it is alive on a NATS subject every
//!   `[fleet] heartbeat_interval`, and hears the others; one not heard for three intervals is
//!   gone.
//! - Each pipeline is placed on one of them by rendezvous hashing with bounded loads: in name
//!   order, each pipeline goes to the process whose hash with its name is highest among those
//!   holding fewer than `ceil(pipelines / processes)`. Every process computes the same
//!   placement from the same members and pipelines, and none is given more than its share
//!   plus one.
//! - A free slot is taken at once by the process it is placed on; any other waits
//!   `grace` (three intervals) first, so a fleet with a silent NATS still takes over.
//! - A process streaming a pipeline placed elsewhere, once the members held still for two
//!   intervals, drains it and waits as a standby: the process it is placed on takes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::relay::SlotClaim;

/// This process's view of the fleet's live processes.
#[derive(Debug)]
pub struct Members {
    me: String,
    heartbeat: Duration,
    state: Mutex<Seen>,
}

#[derive(Debug)]
struct Seen {
    /// The fleet's pipelines (every process of the fleet has the same configuration).
    pipelines: Vec<String>,
    /// Other processes, when each was last heard.
    others: HashMap<String, Instant>,
    /// When the set of live processes last changed.
    changed: Instant,
}

impl Members {
    /// A fleet of this process alone until others are heard.
    pub fn new(me: String, heartbeat: Duration) -> Self {
        Self {
            me,
            heartbeat,
            state: Mutex::new(Seen {
                pipelines: Vec::new(),
                others: HashMap::new(),
                changed: Instant::now(),
            }),
        }
    }

    /// This process's id.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// How often this process says it is alive.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    /// The fleet's pipelines, as configured (again at each reload).
    pub fn set_pipelines(&self, mut pipelines: Vec<String>) {
        pipelines.sort();
        self.lock().pipelines = pipelines;
    }

    /// Records a heartbeat of `member` (`leaving`: its clean stop).
    pub fn heard(&self, member: &str, leaving: bool) {
        if member == self.me {
            return;
        }
        let mut seen = self.lock();
        self.expire(&mut seen);
        let known = seen.others.contains_key(member);
        if leaving {
            if seen.others.remove(member).is_some() {
                seen.changed = Instant::now();
            }
        } else {
            seen.others.insert(member.to_owned(), Instant::now());
            if !known {
                seen.changed = Instant::now();
            }
        }
    }

    /// Live processes, this one included, sorted.
    pub fn live(&self) -> Vec<String> {
        let mut seen = self.lock();
        self.expire(&mut seen);
        let mut live: Vec<String> = seen.others.keys().cloned().collect();
        live.push(self.me.clone());
        live.sort();
        live
    }

    /// The live process `pipeline` is placed on.
    pub fn placed_on(&self, pipeline: &str) -> String {
        let live = self.live();
        let pipelines = self.lock().pipelines.clone();
        placement(&pipelines, &live)
            .remove(pipeline)
            .unwrap_or_else(|| self.me.clone())
    }

    /// Whether the live processes held still for two heartbeats (placement is settled).
    fn settled(&self) -> bool {
        let mut seen = self.lock();
        self.expire(&mut seen);
        seen.changed.elapsed() >= self.heartbeat * 2
    }

    /// Forgets processes not heard for three heartbeats.
    fn expire(&self, seen: &mut Seen) {
        let gone = self.heartbeat * 3;
        let before = seen.others.len();
        seen.others.retain(|_, at| at.elapsed() < gone);
        if seen.others.len() != before {
            seen.changed = Instant::now();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SlotClaim for Members {
    fn placed_here(&self, pipeline: &str) -> bool {
        self.placed_on(pipeline) == self.me
    }

    fn grace(&self) -> Duration {
        self.heartbeat * 3
    }

    fn hand_over(&self, pipeline: &str) -> bool {
        self.settled() && !self.placed_here(pipeline)
    }
}

/// Where each of `pipelines` runs among `members`: rendezvous (highest random weight) hashing
/// with bounded loads, so no member gets more than `ceil(pipelines / members)`. A stable hash
/// (xxh3), so processes of different builds agree.
pub fn placement(pipelines: &[String], members: &[String]) -> HashMap<String, String> {
    let mut placed = HashMap::new();
    if members.is_empty() {
        return placed;
    }
    let capacity = pipelines.len().div_ceil(members.len());
    let mut load: HashMap<&str, usize> = HashMap::new();
    let mut ordered: Vec<&String> = pipelines.iter().collect();
    ordered.sort();
    ordered.dedup();
    for pipeline in ordered {
        let mut ranked: Vec<&String> = members.iter().collect();
        ranked.sort_by_key(|m| {
            let key = format!("{pipeline}\u{0}{m}");
            std::cmp::Reverse((xxhash_rust::xxh3::xxh3_64(key.as_bytes()), (*m).clone()))
        });
        if let Some(member) = ranked
            .into_iter()
            .find(|m| load.get(m.as_str()).copied().unwrap_or(0) < capacity)
        {
            *load.entry(member.as_str()).or_default() += 1;
            placed.insert(pipeline.clone(), member.clone());
        }
    }
    placed
}

/// This process's id among the fleet's: host, pid and a start time.
pub(super) fn member_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000);
    format!("{host}-{}-{started}", std::process::id())
}

/// The subject a fleet's processes say they are alive on.
pub fn heartbeat_subject(fleet: &str) -> String {
    format!("_outbox_relay.fleet.{fleet}.heartbeat")
}

/// Says this process is alive every heartbeat and listens to the others, until `stop`; then
/// says it leaves. Without NATS (or without the permission to use the subject) it logs why
/// and the fleet runs on the slots alone (others take over after `grace`).
pub async fn spawn_heartbeat(
    members: Arc<Members>,
    settings: relay_nats::NatsSettings,
    fleet: String,
    stop: CancellationToken,
) {
    let subject = heartbeat_subject(&fleet);
    let connection = match relay_nats::connect(&settings).await {
        Ok(connection) => connection,
        Err(error) => {
            tracing::warn!(error = %error, subject, "fleet: cannot reach NATS to hear the other processes; pipelines are taken by whoever finds their slot free (others wait [fleet] heartbeat_interval x 3 first)");
            return;
        }
    };
    let client = connection.client().clone();
    let mut heard = match client.subscribe(subject.clone()).await {
        Ok(subscription) => subscription,
        Err(error) => {
            tracing::warn!(error = %error, subject, "fleet: cannot subscribe to the heartbeat subject (permissions?); pipelines are not spread");
            return;
        }
    };
    let me = members.me().to_owned();
    // One round of the others' heartbeats before placing anything: a process starting beside
    // running ones sees them first.
    let _ = client.publish(subject.clone(), me.clone().into()).await;
    tracing::info!(member = %me, subject, "fleet: saying this process is alive and listening to the others");
    let mut tick = tokio::time::interval(members.heartbeat);
    let first_round = members.heartbeat + members.heartbeat / 2;
    tokio::spawn(async move {
        let _connection = connection;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let _ = client.publish(subject.clone(), me.clone().into()).await;
                }
                Some(message) = heard.next() => {
                    let text = String::from_utf8_lossy(&message.payload);
                    match text.strip_prefix("leave:") {
                        Some(member) => members.heard(member, true),
                        None => members.heard(&text, false),
                    }
                }
                () = stop.cancelled() => {
                    let _ = client.publish(subject.clone(), format!("leave:{me}").into()).await;
                    let _ = client.flush().await;
                    return;
                }
            }
        }
    });
    tokio::time::sleep(first_round).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("member-{i}")).collect()
    }

    #[test]
    fn placement_gives_no_member_more_than_its_share_plus_one_and_is_the_same_everywhere() {
        for (n, m) in [(4, 2), (100, 3), (7, 3), (1, 4), (10, 1)] {
            let pipelines: Vec<String> = (0..n).map(|i| format!("tenant-{i}")).collect();
            let members = names(m);
            let placed = placement(&pipelines, &members);
            assert_eq!(placed.len(), n, "every pipeline placed");
            let mut counts: HashMap<&String, usize> = HashMap::new();
            for member in placed.values() {
                *counts.entry(member).or_default() += 1;
            }
            let share = n / m;
            assert!(
                counts.values().all(|&c| c <= share + 1),
                "{n} on {m}: {counts:?}"
            );
            let mut reversed = members.clone();
            reversed.reverse();
            let mut shuffled = pipelines.clone();
            shuffled.reverse();
            assert_eq!(
                placement(&shuffled, &reversed),
                placed,
                "order does not matter"
            );
        }
    }

    #[test]
    fn members_expire_and_leave_and_placement_follows() {
        let members = Members::new("b".into(), Duration::from_millis(20));
        members.set_pipelines((0..50).map(|i| format!("p{i}")).collect());
        assert_eq!(members.live(), ["b"]);
        members.heard("a", false);
        members.heard("b", false);
        assert_eq!(members.live(), ["a", "b"]);
        assert!(!members.settled(), "just changed");
        std::thread::sleep(Duration::from_millis(45));
        members.heard("a", false);
        assert!(members.settled());
        let elsewhere = (0..50)
            .map(|i| format!("p{i}"))
            .find(|p| members.placed_on(p) == "a")
            .expect("some pipeline placed on a");
        assert!(members.hand_over(&elsewhere));
        assert!(!members.placed_here(&elsewhere));
        members.heard("a", true);
        assert_eq!(members.live(), ["b"]);
        assert!(members.placed_here(&elsewhere), "a left: all placed here");
        members.heard("a", false);
        std::thread::sleep(Duration::from_millis(70));
        assert_eq!(members.live(), ["b"], "a not heard for three heartbeats");
    }
}
