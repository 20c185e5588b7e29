//! Parking a message on the dead-letter subject.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
pub use outbox_contract::{
    HEADER_DLQ_CONSUMER, HEADER_DLQ_DELIVERIES, HEADER_DLQ_EVENT_ID, HEADER_DLQ_REASON,
    HEADER_DLQ_SOURCE, HEADER_DLQ_SUBJECT, HEADER_ORIGINAL_PREFIX,
};
use tracing::{error, warn};

use crate::event::{Event, HEADER_MSG_ID};
use crate::shared::Inner;

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
        let mut headers = dead_letter_headers(msg.headers.as_ref());
        headers.insert(HEADER_DLQ_REASON, reason.as_str());
        headers.insert(HEADER_DLQ_SUBJECT, msg.subject.as_str());
        headers.insert(HEADER_DLQ_EVENT_ID, event_id.as_str());
        headers.insert(HEADER_DLQ_DELIVERIES, delivered.to_string().as_str());
        headers.insert(HEADER_DLQ_CONSUMER, self.service.as_str());
        headers.insert(HEADER_DLQ_SOURCE, format!("{stream}:{seq}").as_str());
        headers.insert(
            HEADER_MSG_ID,
            dead_letter_id(&self.service, &event_id, &stream, seq).as_str(),
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

/// The original headers with every `Nats-*` one renamed to [`HEADER_ORIGINAL_PREFIX`] + the
/// rest of its name (`outbox_contract::original_name`), so the dead-letter publish is stored
/// as a plain message whatever the original carried, and the values stay readable.
///
/// Why the whole `Nats-` namespace: JetStream acts on these headers when it stores a message.
/// The relay sets `Nats-Expected-Stream`, which the dead-letter stream refuses (error 10060);
/// `Nats-Expected-Last-*` pin a position, `Nats-Msg-Id` deduplicates, `Nats-Rollup` purges,
/// `Nats-TTL` expires, `Nats-Batch-*`, `Nats-Schedule*`, `Nats-Incr` change how it is stored,
/// `Nats-Stream-Source` is refused on a direct publish, and newer servers add more. nats-server
/// itself drops `Nats-Expected-*` and `Nats-Batch-*` when it sources a message elsewhere.
fn dead_letter_headers(original: Option<&HeaderMap>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, values) in original.into_iter().flat_map(HeaderMap::iter) {
        let name: &str = name.as_ref();
        let name = outbox_contract::original_name(name).unwrap_or_else(|| name.to_owned());
        for value in values {
            headers.append(name.as_str(), value.clone());
        }
    }
    headers
}

/// The dead letter's own `Nats-Msg-Id`: derived from the event, so parking it again (a crash
/// between the dead-letter publish and the TERM, or a second copy of the event re-sent by the
/// relay past the outbox stream's duplicate window) is dropped by the dead-letter stream
/// instead of stored twice. The service is part of it because several services may share one
/// dead-letter stream and each parks its own copy. A message without an event id falls back to
/// its stream position.
fn dead_letter_id(service: &str, event_id: &str, stream: &str, seq: u64) -> String {
    if event_id.is_empty() {
        format!("dlq:{service}:{stream}:{seq}")
    } else {
        format!("dlq:{service}:{event_id}")
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
    fn dead_letters_carry_no_reserved_header_and_keep_the_originals() {
        let mut original = HeaderMap::new();
        for (name, value) in [
            ("Nats-Msg-Id", "e1"),
            ("Nats-Expected-Stream", "OUTBOX"),
            ("Nats-Expected-Last-Msg-Id", "e0"),
            ("Nats-Expected-Last-Sequence", "41"),
            ("Nats-Expected-Last-Subject-Sequence", "7"),
            ("Nats-Rollup", "all"),
            ("Nats-TTL", "1s"),
            ("Nats-Batch-Id", "b1"),
            ("Nats-Schedule", "@every 1s"),
            ("Nats-Stream-Source", "OTHER 1 > > outbox.a"),
            ("Nats-Marker-Reason", "MaxAge"),
            ("nats-expected-stream", "lowercase"),
            ("Outbox-Commit-Lsn", "0/16B3748"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ] {
            original.insert(name, value);
        }
        original.append("Outbox-Tag", "a");
        original.append("Outbox-Tag", "b");
        let headers = dead_letter_headers(Some(&original));
        // Not even inside a name: old servers would find `Nats-Msg-Id` in `X-Nats-Msg-Id`.
        let reserved: Vec<String> = headers
            .iter()
            .map(|(n, _)| n.to_string())
            .filter(|n| n.to_ascii_lowercase().contains("nats-"))
            .collect();
        assert!(reserved.is_empty(), "{reserved:?}");
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(
            get("Outbox-Original-Expected-Stream").as_deref(),
            Some("OUTBOX")
        );
        assert_eq!(get("Outbox-Original-Msg-Id").as_deref(), Some("e1"));
        assert_eq!(get("Outbox-Original-Rollup").as_deref(), Some("all"));
        assert_eq!(
            get("Outbox-Original-expected-stream").as_deref(),
            Some("lowercase")
        );
        assert_eq!(get("Outbox-Commit-Lsn").as_deref(), Some("0/16B3748"));
        assert!(get("traceparent").is_some());
        let tags: Vec<&str> = headers.get_all("Outbox-Tag").map(|v| v.as_str()).collect();
        assert_eq!(
            tags,
            ["a", "b"],
            "repeated headers keep every value in order"
        );
        assert_eq!(headers.iter().count(), original.iter().count());
        assert!(dead_letter_headers(None).is_empty());
    }

    #[test]
    fn dead_letter_ids_follow_the_event() {
        assert_eq!(dead_letter_id("svc", "e1", "OUTBOX", 9), "dlq:svc:e1");
        assert_eq!(
            dead_letter_id("svc", "e1", "OUTBOX", 10),
            dead_letter_id("svc", "e1", "OUTBOX", 9),
            "a second copy of the event parks under the same id"
        );
        assert_ne!(
            dead_letter_id("svc", "e1", "OUTBOX", 9),
            dead_letter_id("other", "e1", "OUTBOX", 9)
        );
        assert_eq!(dead_letter_id("svc", "", "OUTBOX", 9), "dlq:svc:OUTBOX:9");
    }

    #[test]
    fn dead_letter_rules_match_contract_json() {
        // The Python and TypeScript consumers park by `contract.json`; so must this one.
        let contract: serde_json::Value =
            serde_json::from_str(include_str!("../../outbox-contract/contract.json"))
                .expect("contract.json");
        let dl = &contract["dead_letter"];
        assert_eq!(dl["reason_max_bytes"].as_u64(), Some(MAX_REASON_LEN as u64));
        let fill = |key: &str| {
            dl[key]
                .as_str()
                .expect(key)
                .replace("{consumer}", "svc")
                .replace("{event_id}", "e1")
                .replace("{stream}", "OUTBOX")
                .replace("{seq}", "9")
        };
        assert_eq!(fill("msg_id"), dead_letter_id("svc", "e1", "OUTBOX", 9));
        assert_eq!(
            fill("msg_id_without_event_id"),
            dead_letter_id("svc", "", "OUTBOX", 9)
        );
        assert_eq!(fill("source"), "OUTBOX:9");
        let ledger = &contract["ledger"];
        assert_eq!(ledger["table"].as_str(), Some(crate::LEDGER_TABLE));
        assert!(
            crate::LEDGER_MIGRATION.contains("CREATE TABLE IF NOT EXISTS outbox_consumer_ledger")
        );
    }

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(sanitize_reason("a\r\nb"), "a  b");
        let long = "é".repeat(2000);
        let s = sanitize_reason(&long);
        assert!(s.len() <= MAX_REASON_LEN);
        assert!(s.chars().all(|c| c == 'é'));
    }
}
