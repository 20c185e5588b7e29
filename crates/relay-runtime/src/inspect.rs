//! Read-only looks at the slot, the checkpoint (both from `relay_postgres::catalog`) and the
//! stream, shared by `status`, the metrics sampler and `validate --connect`.

use async_nats::jetstream;

pub use relay_postgres::catalog::{slot, stored_checkpoint as checkpoint};

/// What a stream lookup found.
#[derive(Debug)]
pub enum StreamLookup {
    /// The stream and its info.
    Found(Box<jetstream::stream::Info>),
    /// JetStream answered: no such stream.
    NotFound,
    /// JetStream is not enabled on the server.
    NotEnabled(String),
    /// No answer (disconnected, timeout).
    Failed(String),
}

/// Looks up `name`.
pub async fn stream(context: &jetstream::Context, name: &str) -> StreamLookup {
    use jetstream::context::GetStreamErrorKind;
    match context.get_stream(name).await {
        Ok(mut s) => match s.info().await {
            Ok(info) => StreamLookup::Found(Box::new(info.clone())),
            Err(e) => StreamLookup::Failed(e.to_string()),
        },
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js)
                if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                StreamLookup::NotFound
            }
            GetStreamErrorKind::JetStream(js)
                if js.error_code() == jetstream::ErrorCode::JETSTREAM_NOT_ENABLED =>
            {
                StreamLookup::NotEnabled(e.to_string())
            }
            _ => StreamLookup::Failed(e.to_string()),
        },
    }
}
