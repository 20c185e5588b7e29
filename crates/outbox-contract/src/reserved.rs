//! The `Nats-*` headers: what must not follow a message re-published to another subject.
//!
//! NATS reserves the `Nats-` header namespace ("Nats- is a reserved namespace", NATS docs,
//! JetStream headers), and JetStream acts on many of these headers when it stores a message.
//! A message read from one stream and published again elsewhere (a dead letter, a replay, a
//! copy) that kept them would be bound to the first stream's name or position, deduplicated
//! against the original, or stored differently (purged, expired, batched, scheduled). The
//! rule is the whole namespace, because servers keep adding headers; the lists below are
//! those nats-server acts on when it stores a published message (`server/stream.go`, 2026),
//! for documentation and tests.

/// NATS's reserved header namespace.
pub const RESERVED_PREFIX: &str = "Nats-";

/// Prefix under which a re-published message keeps an original `Nats-<rest>` header, as
/// `Outbox-Original-<rest>`: `Nats-Expected-Stream: OUTBOX` becomes
/// `Outbox-Original-Expected-Stream: OUTBOX`.
///
/// Not `Outbox-Original-Nats-<rest>`: nats-server before 2.11.11 / 2.12.2 finds a header by the
/// first occurrence of its name anywhere in the header block, so a copy named
/// `…-Nats-Msg-Id` written before the real `Nats-Msg-Id` hides it and turns deduplication off
/// (seen with nats-server 2.9.10).
pub const HEADER_ORIGINAL_PREFIX: &str = "Outbox-Original-";

/// Headers that bind a publish to a stream, to a position in it, or to its deduplication
/// state. The relay sets the first two on every message.
pub const STREAM_BINDING_HEADERS: [&str; 7] = [
    "Nats-Msg-Id",
    "Nats-Expected-Stream",
    "Nats-Expected-Last-Msg-Id",
    "Nats-Expected-Last-Sequence",
    "Nats-Expected-Last-Subject-Sequence",
    "Nats-Expected-Last-Subject-Sequence-Subject",
    // Refused on a direct publish: only the server sets it, on messages it sources.
    "Nats-Stream-Source",
];

/// Headers that make the server store the message differently, or refuse it on a stream
/// without the feature: rollups purge, TTLs expire, counters add, batches and schedules
/// defer, markers are the server's own.
pub const SERVER_ACTION_HEADERS: [&str; 16] = [
    "Nats-Rollup",
    "Nats-TTL",
    "Nats-Marker-Reason",
    "Nats-Incr",
    "Nats-Counter-Sources",
    "Nats-Batch-Id",
    "Nats-Batch-Sequence",
    "Nats-Batch-Commit",
    "Nats-Schedule",
    "Nats-Schedule-Time-Zone",
    "Nats-Schedule-TTL",
    "Nats-Schedule-Rollup",
    "Nats-Schedule-Target",
    "Nats-Schedule-Source",
    "Nats-Scheduler",
    "Nats-Schedule-Next",
];

/// Whether `name` is in the reserved `Nats-` namespace (ASCII case-insensitive): such a header
/// must not be copied onto a message published to another subject or stream.
pub fn is_reserved(name: &str) -> bool {
    name.as_bytes()
        .get(..RESERVED_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()))
}

/// The name a re-published message keeps a reserved header's value under
/// (`Nats-Msg-Id` → `Outbox-Original-Msg-Id`); `None` for a header that is not reserved and
/// is copied as it is.
pub fn original_name(name: &str) -> Option<String> {
    if !is_reserved(name) {
        return None;
    }
    let rest = name.get(RESERVED_PREFIX.len()..)?;
    Some(format!("{HEADER_ORIGINAL_PREFIX}{rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_header_is_reserved_and_kept_under_a_name_without_nats() {
        for name in STREAM_BINDING_HEADERS
            .into_iter()
            .chain(SERVER_ACTION_HEADERS)
        {
            assert!(is_reserved(name), "{name}");
            let kept = original_name(name).unwrap_or_default();
            assert!(kept.starts_with(HEADER_ORIGINAL_PREFIX), "{kept}");
            // Old servers would find `Nats-…` inside the kept name.
            assert!(!kept.to_ascii_lowercase().contains("nats-"), "{kept}");
            assert!(!is_reserved(&kept), "{kept}");
        }
        assert_eq!(
            original_name("Nats-Expected-Stream").as_deref(),
            Some("Outbox-Original-Expected-Stream")
        );
        assert_eq!(
            original_name("nats-msg-id").as_deref(),
            Some("Outbox-Original-msg-id")
        );
    }

    #[test]
    fn other_headers_are_copied_as_they_are() {
        for name in [
            "Outbox-Commit-Lsn",
            "traceparent",
            "Nats",
            "Nat-Msg-Id",
            "X-Nats-Msg-Id",
            "",
        ] {
            assert!(!is_reserved(name), "{name}");
            assert_eq!(original_name(name), None, "{name}");
        }
    }
}
