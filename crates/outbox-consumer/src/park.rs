//! Parking a message on the dead-letter subject.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use tracing::{error, warn};

use crate::consumer::Inner;
use crate::event::{Event, HEADER_MSG_ID};

/// Dead-letter header: why the message was parked.
pub const HEADER_DLQ_REASON: &str = "Outbox-Dlq-Reason";
/// Dead-letter header: the subject the message was delivered on.
pub const HEADER_DLQ_SUBJECT: &str = "Outbox-Dlq-Subject";
/// Dead-letter header: the event id (`Nats-Msg-Id` of the original message).
pub const HEADER_DLQ_EVENT_ID: &str = "Outbox-Dlq-Event-Id";
/// Dead-letter header: how many times the message had been delivered.
pub const HEADER_DLQ_DELIVERIES: &str = "Outbox-Dlq-Deliveries";
/// Dead-letter header: the consumer (service) that parked it.
pub const HEADER_DLQ_CONSUMER: &str = "Outbox-Dlq-Consumer";
/// Dead-letter header: stream and sequence of the original message, `STREAM:SEQ`.
pub const HEADER_DLQ_SOURCE: &str = "Outbox-Dlq-Source";

/// Longest `Outbox-Dlq-Reason` value; longer reasons are cut.
const MAX_REASON_LEN: usize = 1024;

impl Inner {
    /// Publishes the message to the dead-letter subject (waiting for the stream's ack), then
    /// terminates it. If the publish fails the message is NAKed and parked on a later delivery.
    pub(crate) async fn park(
        &self,
        msg: &jetstream::Message,
        event: Option<&Event>,
        delivered: u64,
        reason: &str,
    ) {
        let reason = sanitize_reason(reason);
        let event_id = event
            .map(|e| e.id.clone())
            .or_else(|| {
                msg.headers
                    .as_ref()
                    .and_then(|h| h.get(HEADER_MSG_ID))
                    .map(|v| v.as_str().to_owned())
            })
            .unwrap_or_default();
        let (stream, seq) = msg
            .info()
            .map(|i| (i.stream.to_owned(), i.stream_sequence))
            .unwrap_or_default();
        let mut headers: HeaderMap = msg.headers.clone().unwrap_or_default();
        headers.insert(HEADER_DLQ_REASON, reason.as_str());
        headers.insert(HEADER_DLQ_SUBJECT, msg.subject.as_str());
        headers.insert(HEADER_DLQ_EVENT_ID, event_id.as_str());
        headers.insert(HEADER_DLQ_DELIVERIES, delivered.to_string().as_str());
        headers.insert(HEADER_DLQ_CONSUMER, self.service.as_str());
        headers.insert(HEADER_DLQ_SOURCE, format!("{stream}:{seq}").as_str());
        // Dedupe a re-park (crash between the dead-letter publish and the TERM).
        headers.insert(
            HEADER_MSG_ID,
            format!("dlq:{}:{stream}:{seq}", self.service).as_str(),
        );

        let published = async {
            self.jetstream
                .publish_with_headers(
                    self.dead_letter_subject.clone(),
                    headers,
                    msg.payload.clone(),
                )
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        match published {
            Ok(_) => {
                self.stats.inc(|c| &c.parked);
                error!(
                    service = %self.service,
                    event_id = %event_id,
                    subject = %msg.subject,
                    stream_seq = seq,
                    delivered,
                    dead_letter_subject = %self.dead_letter_subject,
                    reason = %reason,
                    "outbox-consumer: message parked on the dead-letter subject"
                );
                if let Err(e) = msg.ack_with(AckKind::Term).await {
                    warn!(event_id = %event_id, error = %e, "TERM after parking failed");
                }
            }
            Err(e) => {
                self.stats.inc(|c| &c.park_failures);
                let delay = self.backoff(delivered);
                error!(
                    service = %self.service,
                    event_id = %event_id,
                    dead_letter_subject = %self.dead_letter_subject,
                    error = %e,
                    retry_in = ?delay,
                    "outbox-consumer: cannot publish to the dead-letter subject; message kept"
                );
                let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }
}

/// One line, at most [`MAX_REASON_LEN`] bytes (header values cannot hold CR/LF).
fn sanitize_reason(reason: &str) -> String {
    let mut s: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.len() > MAX_REASON_LEN {
        let mut cut = MAX_REASON_LEN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(sanitize_reason("a\r\nb"), "a  b");
        let long = "é".repeat(2000);
        let s = sanitize_reason(&long);
        assert!(s.len() <= MAX_REASON_LEN);
        assert!(s.chars().all(|c| c == 'é'));
    }
}
