//! A bounded memory of recently routed event ids, to report two rows that share an event id but
//! differ in subject or payload (an id collision) instead of letting JetStream's deduplication
//! silently drop the second one.
//!
//! Only the last `capacity` ids of the current replication session are remembered; JetStream's
//! `duplicate_window` is the broker-side equivalent (where a collision is silently deduplicated).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use crate::message::OutboundMessage;

/// Default number of event ids remembered.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// Event id → hash of subject and payload, for the newest `capacity` ids.
#[derive(Debug)]
pub struct RecentIds {
    capacity: usize,
    hashes: HashMap<String, u64>,
    order: VecDeque<String>,
}

impl RecentIds {
    /// Remembers at most `capacity` ids (0 disables the check).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            hashes: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn fingerprint(msg: &OutboundMessage) -> u64 {
        let mut h = DefaultHasher::new();
        msg.subject.hash(&mut h);
        msg.payload.hash(&mut h);
        h.finish()
    }

    /// Records `msg`; `false` when its id was seen with a different subject or payload.
    pub fn check(&mut self, msg: &OutboundMessage) -> bool {
        if self.capacity == 0 {
            return true;
        }
        let hash = Self::fingerprint(msg);
        if let Some(seen) = self.hashes.get(&msg.event_id) {
            return *seen == hash;
        }
        if self.order.len() >= self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.hashes.remove(&oldest);
        }
        self.order.push_back(msg.event_id.clone());
        self.hashes.insert(msg.event_id.clone(), hash);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use pgoutput::Lsn;

    fn msg(id: &str, payload: &'static str) -> OutboundMessage {
        OutboundMessage {
            subject: "s".into(),
            event_id: id.into(),
            headers: Vec::new(),
            payload: Bytes::from_static(payload.as_bytes()),
            table: "public.outbox".into(),
            commit_lsn: Lsn(1),
            commit_time_micros: 0,
        }
    }

    #[test]
    fn same_id_different_payload_is_a_collision_within_the_window() {
        let mut recent = RecentIds::new(2);
        assert!(recent.check(&msg("a", "1")));
        assert!(
            recent.check(&msg("a", "1")),
            "an identical re-send is no collision"
        );
        assert!(!recent.check(&msg("a", "2")));
        assert!(recent.check(&msg("b", "1")));
        assert!(recent.check(&msg("c", "1")));
        assert!(recent.check(&msg("a", "2")), "forgotten past the window");
    }
}
