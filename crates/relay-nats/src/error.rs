//! [`NatsError`]: what fails when talking to NATS outside the publish path (connecting, the
//! stream checks, the contracts bucket, the settings' files); the publish path's own errors are
//! relay-core's `PublishError`.

/// Failures talking to NATS outside the publish path.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// A setting is unusable (a secret file, TLS files).
    #[error("{0}")]
    Settings(String),
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to NATS at {url} (is nats-server running and reachable?)")]
    Connect {
        /// The configured URL, its password replaced.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// JetStream did not answer (disabled on the server, or no permission for its API).
    #[error(
        "JetStream is not available on {url} ({reason}): start nats-server with -js (or `jetstream {{}}` in its config) and allow the $JS.API.> subjects"
    )]
    JetStreamUnavailable {
        /// The configured URL, its password replaced.
        url: String,
        /// Why.
        reason: String,
    },
    /// The configured stream does not exist and creating it is not allowed.
    #[error(
        "JetStream stream `{stream}` does not exist: create it (e.g. `nats stream add {stream} --subjects '{subjects}' --storage file`) or set nats.create_stream = true"
    )]
    StreamMissing {
        /// The stream.
        stream: String,
        /// Subjects it should capture.
        subjects: String,
    },
    /// The contracts could not be stored in their KV bucket.
    #[error(
        "cannot store the event contracts in KV bucket `{bucket}`: {reason}. Allow this relay's NATS user `$JS.API.STREAM.INFO.KV_{bucket}`, `$JS.API.STREAM.CREATE.KV_{bucket}` (or create the bucket: `nats kv add {bucket} --history 1`) and publishing to `$KV.{bucket}.>`, or set [nats] contracts_bucket"
    )]
    Contracts {
        /// The bucket.
        bucket: String,
        /// Why.
        reason: String,
    },
    /// Looking up or creating the stream failed.
    #[error("cannot look up or create JetStream stream `{stream}`: {reason}{hint}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
        /// The JetStream API permission the server refused this connection, when that is why
        /// (a refused request otherwise only times out), with the fix; else empty.
        hint: String,
    },
    /// A mapping's broker-native header (`Nats-TTL`, `Nats-Schedule`) that the server or the
    /// stream cannot honour.
    #[error("{problem}: {fix}")]
    BrokerFeature {
        /// What is needed and missing, naming the table, column, header and setting.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// A subject the mappings produce is not captured by the stream.
    #[error(
        "subject `{subject}` (from outbox table `{table}`) is not captured by stream `{stream}`, whose subjects are [{stream_subjects}]: add it to the stream or change the subject template"
    )]
    SubjectNotCaptured {
        /// A sample subject.
        subject: String,
        /// The table whose mapping produces it.
        table: String,
        /// The stream.
        stream: String,
        /// The stream's subjects.
        stream_subjects: String,
    },
}
