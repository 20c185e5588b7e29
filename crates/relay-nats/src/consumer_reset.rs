//! Moving a durable consumer to another stream sequence in place (nats-server 2.14+,
//! `$JS.API.CONSUMER.RESET.<stream>.<consumer>`): the consumer keeps its configuration, its
//! name and its creation time; its delivered and ack floor positions become `seq - 1`. The
//! server refuses a reset below the start of a `by_start_sequence` / `by_start_time` consumer and
//! any reset of a `last`, `new` or `last_per_subject` one (error code 10204).

use async_nats::jetstream::{self, consumer};
use serde::Deserialize;

/// The first nats-server version with the consumer reset API.
const MIN_SERVER: (u64, u64, u64) = (2, 14, 0);

/// Whether a server of version `version` (INFO) can reset a consumer in place.
pub fn supports_consumer_reset(version: &str) -> bool {
    crate::native::version_triple(version) >= MIN_SERVER
}

/// The server's answer to a reset: the consumer as it is now and the sequence it delivers next.
#[derive(Debug, Clone, Deserialize)]
pub struct ConsumerReset {
    /// The consumer after the reset.
    #[serde(flatten)]
    pub info: consumer::Info,
    /// The stream sequence it delivers next.
    pub reset_seq: u64,
}

/// Why a reset did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerResetError {
    /// The request did not get an answer (or not one that could be read).
    #[error("the consumer reset request for {consumer} on stream {stream} failed")]
    Request {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::RequestError,
    },
    /// The server refused it.
    #[error(
        "nats-server refused to reset consumer {consumer} on stream {stream} to sequence {seq}: {reason}"
    )]
    Refused {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The sequence asked for.
        seq: u64,
        /// JetStream's error code (10204: invalid reset, 10014: consumer not found).
        code: u64,
        /// The server's words (description, status and error code).
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Answer {
    Err { error: jetstream::Error },
    Ok(Box<ConsumerReset>),
}

/// Resets durable `consumer` of `stream` so that it delivers from stream sequence `seq` on.
pub async fn reset_consumer(
    context: &jetstream::Context,
    stream: &str,
    consumer: &str,
    seq: u64,
) -> Result<ConsumerReset, ConsumerResetError> {
    let subject = format!("CONSUMER.RESET.{stream}.{consumer}");
    let answer: Answer = context
        .request(subject, &serde_json::json!({ "seq": seq }))
        .await
        .map_err(|source| ConsumerResetError::Request {
            stream: stream.into(),
            consumer: consumer.into(),
            source,
        })?;
    match answer {
        Answer::Ok(reset) => Ok(*reset),
        Answer::Err { error } => Err(ConsumerResetError::Refused {
            stream: stream.into(),
            consumer: consumer.into(),
            seq,
            code: error.error_code().0,
            reason: error.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::supports_consumer_reset;

    #[test]
    fn the_reset_api_starts_with_2_14() {
        assert!(!supports_consumer_reset("2.9.10"));
        assert!(!supports_consumer_reset("v2.13.9"));
        assert!(supports_consumer_reset("2.14.0-RC.1"));
        assert!(supports_consumer_reset("2.15.1"));
        assert!(!supports_consumer_reset(""));
    }
}
