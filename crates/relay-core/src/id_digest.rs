//! The 128-bit digest of an event id: what a set or map of "ids seen" keys on instead of the id
//! strings (no allocation per id, a fraction of the memory). Two different ids collide with
//! probability about 2^-128, so a digest match is an id match; a 64-bit digest would, over
//! billions of events, eventually report a false match.
//!
//! Computed in this process only and never stored (the relay's collision check, the backfill's
//! skip sets): the function may change between versions.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use xxhash_rust::xxh3::xxh3_128;

/// The digest of one event id ([`id_digest`]).
pub type IdDigest = u128;

/// The digest of event id `id` (xxh3, 128 bits).
#[must_use]
pub fn id_digest(id: &str) -> IdDigest {
    xxh3_128(id.as_bytes())
}

/// A set of event ids (their digests) that several tasks fill and read: the event ids a
/// backfill has seen the relay publish while it runs.
#[derive(Debug, Clone, Default)]
pub struct SharedIds(Arc<Mutex<HashSet<IdDigest>>>);

impl SharedIds {
    /// Notes event id `id`.
    pub fn insert(&self, id: &str) {
        self.lock().insert(id_digest(id));
    }

    /// Whether an event id with digest `digest` was noted.
    #[must_use]
    pub fn contains(&self, digest: &IdDigest) -> bool {
        self.lock().contains(digest)
    }

    /// How many ids were noted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none was.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<IdDigest>> {
        // A panicking holder left a set that is still a set of ids.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(id_digest("a"), id_digest("a"));
        assert_ne!(id_digest("a"), id_digest("b"));
        assert_ne!(id_digest(""), id_digest("a"));
        // Long ids differing only in their last byte still differ.
        let (long_a, long_b) = ("x".repeat(300) + "a", "x".repeat(300) + "b");
        assert_ne!(id_digest(&long_a), id_digest(&long_b));
    }

    #[test]
    fn shared_ids_are_seen_by_every_clone() {
        let ids = SharedIds::default();
        let writer = ids.clone();
        writer.insert("e1");
        assert!(ids.contains(&id_digest("e1")), "a clone shares the set");
        assert!(!ids.contains(&id_digest("e2")));
        assert_eq!(ids.len(), 1);
    }
}
