//! The JetStream publisher: one `send` per message in commit order, acks awaited separately so
//! many are outstanding at once.

use std::error::Error as _;
use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind as NatsKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use futures::future::BoxFuture;
use relay_core::message::{HEADER_MSG_ID, OutboundMessage};
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind, Publisher};

/// JetStream's header pinning a publish to one stream.
const HEADER_EXPECTED_STREAM: &str = "Nats-Expected-Stream";

/// Publishes outbound messages into one JetStream stream.
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
    stream: Arc<str>,
}

impl std::fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl JetStreamPublisher {
    /// A publisher into `stream`. `ack_timeout` bounds the wait for each PubAck; `max_in_flight`
    /// sizes the client's own window so it never blocks before the pipeline's does.
    pub fn new(
        client: async_nats::Client,
        stream: &str,
        ack_timeout: std::time::Duration,
        max_in_flight: usize,
    ) -> Self {
        let context = jetstream::ContextBuilder::new()
            .timeout(ack_timeout)
            .max_ack_inflight(max_in_flight.saturating_add(64))
            .build(client);
        Self {
            context,
            stream: stream.into(),
        }
    }

    /// The JetStream context, for stream checks.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }
}

/// Maps an async-nats publish error to the pipeline's classes.
fn classify(error: jetstream::context::PublishError) -> PublishError {
    let server_code = error
        .source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    let kind = match error.kind() {
        NatsKind::TimedOut | NatsKind::BrokenPipe | NatsKind::MaxAckPending => {
            PublishErrorKind::Unknown
        }
        // 503 no responders: a leader election, or no stream captures the subject.
        NatsKind::StreamNotFound => PublishErrorKind::NoStream,
        NatsKind::MaxPayloadExceeded
        | NatsKind::WrongLastMessageId
        | NatsKind::WrongLastSequence => PublishErrorKind::Rejected,
        _ => match server_code {
            // The subject belongs to another stream, or the message exceeds the stream's limit:
            // retrying cannot change the answer.
            Some(ErrorCode::STREAM_NOT_MATCH) | Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
                PublishErrorKind::Rejected
            }
            // Store failures (disk full, `discard: new` limits) may clear: keep retrying, loudly.
            _ => PublishErrorKind::Unknown,
        },
    };
    let detail = match error.source() {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    };
    PublishError::new(kind, detail)
}

impl Publisher for JetStreamPublisher {
    type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

    async fn send(&self, msg: &OutboundMessage) -> Result<Self::Ack, PublishError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_MSG_ID, msg.event_id.as_str());
        headers.insert(HEADER_EXPECTED_STREAM, self.stream.as_ref());
        for (name, value) in &msg.headers {
            headers.insert(name.as_ref(), value.as_ref());
        }
        let publish = PublishMessage::build()
            .headers(headers)
            .payload(msg.payload.clone());
        let ack = self
            .context
            .send_publish(msg.subject.clone(), publish)
            .await
            .map_err(classify)?;
        let subject = msg.subject.clone();
        Ok(Box::pin(async move {
            let ack = ack.await.map_err(|e| {
                let timed_out = e.kind() == NatsKind::TimedOut;
                let error = classify(e);
                match crate::publish_denied(&subject) {
                    // The server refused the publish itself: no PubAck will ever come.
                    Some(denied) if timed_out => PublishError::new(
                        PublishErrorKind::Rejected,
                        format!(
                            "NATS refused to let the relay publish to `{subject}` ({denied}): grant the relay's NATS user publish permission on the outbox subjects"
                        ),
                    ),
                    _ => error,
                }
            })?;
            Ok(PubReceipt {
                stream_seq: ack.sequence,
                duplicate: ack.duplicate,
            })
        }))
    }
}
