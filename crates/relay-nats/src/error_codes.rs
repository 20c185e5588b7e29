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
        | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
        | ErrorCode::STREAM_WRONG_LAST_MESSAGE_ID
        | ErrorCode::STREAM_WRONG_LAST_SEQUENCE => PublishErrorKind::Rejected,
        // Store failures (disk full, `discard: new` limits) may clear: keep retrying, loudly.
        _ => PublishErrorKind::Unknown,
    }
}
