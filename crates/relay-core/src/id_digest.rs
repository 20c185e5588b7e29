//! The 128-bit digest of an event id: what a set or map of "ids seen" keys on instead of the id
//! strings (no allocation per id, a fraction of the memory). Two different ids collide with
//! probability about 2^-128, so a digest match is an id match; a 64-bit digest would, over
//! billions of events, eventually report a false match.
//!
//! Computed in this process only and never stored (the relay's collision check, the backfill's
//! skip sets): the function may change between versions.

use xxhash_rust::xxh3::xxh3_128;

/// The digest of one event id ([`id_digest`]).
pub type IdDigest = u128;

/// The digest of event id `id` (xxh3, 128 bits).
#[must_use]
pub fn id_digest(id: &str) -> IdDigest {
    xxh3_128(id.as_bytes())
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
}
