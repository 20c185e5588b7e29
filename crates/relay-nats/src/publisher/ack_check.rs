//! Acknowledgements checked against the stream's own state, once per checkpoint: a PubAck
//! names a sequence, and the stream must exist and have reached it. An answer from a stream
//! that does not exist, or a sequence past the stream's last, was not JetStream's (anyone who
//! can answer the reply subject can forge one) or names what the stream no longer holds.

use std::time::Duration;

use async_nats::jetstream;
use relay_core::stage::AckCheck;

/// How long the stream's answer is waited for before the check counts as not made.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks `stream` for its state (one `STREAM.INFO`) and judges `highest_seq` against it.
pub(super) async fn check(
    context: &jetstream::Context,
    stream: &str,
    highest_seq: u64,
) -> AckCheck {
    match tokio::time::timeout(ASK_TIMEOUT, context.get_stream(stream)).await {
        Err(_) => AckCheck::Unknown(format!(
            "stream `{stream}` did not answer within {ASK_TIMEOUT:?}"
        )),
        Ok(Ok(found)) => judge(stream, found.cached_info().state.last_sequence, highest_seq),
        Ok(Err(e)) => match e.kind() {
            jetstream::context::GetStreamErrorKind::JetStream(ref js)
                if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                AckCheck::NotHeld(format!("stream `{stream}` does not exist"))
            }
            _ => AckCheck::Unknown(format!("cannot ask stream `{stream}`: {e}")),
        },
    }
}

/// The verdict on `highest_seq` for a stream whose last sequence is `last_seq`.
fn judge(stream: &str, last_seq: u64, highest_seq: u64) -> AckCheck {
    if last_seq >= highest_seq {
        AckCheck::Held
    } else {
        AckCheck::NotHeld(format!(
            "stream `{stream}`'s last sequence is {last_seq}, before the acknowledged {highest_seq}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_past_the_streams_last_is_not_held() {
        assert_eq!(judge("S", 10, 10), AckCheck::Held);
        assert_eq!(judge("S", 11, 10), AckCheck::Held);
        let AckCheck::NotHeld(reason) = judge("S", 10, 999_999) else {
            panic!("held");
        };
        assert!(
            reason.contains("last sequence is 10") && reason.contains("999999"),
            "{reason}"
        );
    }
}
