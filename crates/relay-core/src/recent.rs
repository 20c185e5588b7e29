//! A bounded memory of recently routed event ids, to report two rows that share an event id but
//! differ in subject or payload (an id collision) instead of letting JetStream's deduplication
//! silently drop the second one.
//!
//! Only the last `capacity` ids of the current replication session are remembered; JetStream's
//! `duplicate_window` is the broker-side equivalent (where a collision is silently deduplicated).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128};

use crate::id_digest::{IdDigest, id_digest};
use crate::message::OutboundMessage;

/// Default number of event ids remembered.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// Event id digest → digest of subject and payload, for the newest `capacity` ids. Digests
/// instead of the ids themselves: no per-event allocation, and a fifth of the memory.
#[derive(Debug)]
pub struct RecentIds {
    capacity: usize,
    fingerprints: HashMap<IdDigest, u64, BuildHasherDefault<DigestHasher>>,
    order: VecDeque<IdDigest>,
}

/// The keys are already uniform hashes: use their low bits as is.
#[derive(Debug, Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u128 keys, which this map does not have; fold them anyway.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }
    fn write_u128(&mut self, digest: u128) {
        self.0 = digest as u64;
    }
}

impl RecentIds {
    /// Remembers at most `capacity` ids (0 disables the check).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            fingerprints: HashMap::default(),
            order: VecDeque::new(),
        }
    }

    fn fingerprint(msg: &OutboundMessage) -> u64 {
        // The subject's hash seeds the payload's: both must match for an identical re-send.
        xxh3_64_with_seed(&msg.payload, xxh3_128(msg.subject.as_bytes()) as u64)
    }

    /// Records `msg`; `false` when its id was seen with a different subject or payload.
    pub fn check(&mut self, msg: &OutboundMessage) -> bool {
        if self.capacity == 0 {
            return true;
        }
        let id = id_digest(&msg.event_id);
        let fingerprint = Self::fingerprint(msg);
        if let Some(seen) = self.fingerprints.get(&id) {
            return *seen == fingerprint;
        }
        if self.order.len() >= self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.fingerprints.remove(&oldest);
        }
        self.order.push_back(id);
        self.fingerprints.insert(id, fingerprint);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use pgoutput::Lsn;

    fn msg(id: &str, payload: &'static str) -> OutboundMessage {
        OutboundMessage::bare("s", id, Bytes::from_static(payload.as_bytes()), Lsn(1))
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

    #[test]
    fn a_different_subject_alone_is_a_collision_and_zero_capacity_disables() {
        let mut recent = RecentIds::new(10);
        let first = msg("x", "p");
        let mut moved = first.clone();
        moved.subject = "other".into();
        assert!(recent.check(&first));
        assert!(!recent.check(&moved));
        let mut off = RecentIds::new(0);
        assert!(off.check(&first));
        assert!(off.check(&moved));
    }
}
