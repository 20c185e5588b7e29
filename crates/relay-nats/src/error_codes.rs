//! JetStream API errors in the answers the relay reads itself (PubAcks on the lean connection,
//! fast-batch answers), and what their codes mean for a publish: the one mapping both publish
//! paths (the async-nats one and the lean one, `crate::wire`) use.

use async_nats::jetstream::ErrorCode;
/// The `error` object of a JetStream API answer (one type for both publish paths).
pub(crate) use nats_wire::ApiError;
use relay_core::stage::PublishErrorKind;

/// What JetStream error `code` means for a publish.
pub(crate) fn kind_for_error_code(code: u64) -> PublishErrorKind {
    match ErrorCode(code) {
        // The subject belongs to another stream, or the message exceeds the stream's limit:
        // retrying cannot change the answer.
        // A header block over 64 KiB (10097) is refused on every re-send too.
        ErrorCode::STREAM_NOT_MATCH
        | ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
        | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM => PublishErrorKind::Rejected,
        // The commit-order conditions (`Nats-Expected-Last-Msg-Id`, `Nats-Expected-Last-Sequence`):
        // not stored, re-sent in turn.
        ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID | ErrorCode::STREAM_WRONG_LAST_SEQUENCE => {
            PublishErrorKind::OutOfTurn
        }
        // No room: a stream limit with `discard: new` (10077 "maximum messages exceeded",
        // "maximum bytes exceeded", "maximum messages per subject exceeded"), or the account's
        // or server's storage. Nothing stored: re-sent in order once there is room.
        code if STREAM_FULL.contains(&code.0) => PublishErrorKind::StreamFull,
        // Anything else may clear: keep retrying, loudly.
        _ => PublishErrorKind::Unknown,
    }
}

/// The codes that say the stream stored nothing for lack of room: store failed (10077, the
/// limits with `discard: new`), account resources (10002), insufficient resources (10023),
/// memory (10028) and storage (10047) exceeded.
const STREAM_FULL: [u64; 5] = [10077, 10002, 10023, 10028, 10047];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_stream_is_a_definite_refusal_and_a_wrong_last_id_or_sequence_is_out_of_turn() {
        for code in STREAM_FULL {
            assert_eq!(
                kind_for_error_code(code),
                PublishErrorKind::StreamFull,
                "{code}"
            );
        }
        assert_eq!(kind_for_error_code(10070), PublishErrorKind::OutOfTurn);
        assert_eq!(kind_for_error_code(10071), PublishErrorKind::OutOfTurn);
        assert_eq!(kind_for_error_code(10054), PublishErrorKind::Rejected);
        assert_eq!(kind_for_error_code(10999), PublishErrorKind::Unknown);
    }
}
