//! The event contracts in their NATS KV bucket: each schema under the key its events'
//! `Outbox-Schema` header names, so consumers can fetch what the relay checked.

use async_nats::jetstream;
use bytes::Bytes;

use crate::error::NatsError;

/// One message read back from the stream.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Its stream sequence.
    pub seq: u64,
    /// Its subject.
    pub subject: String,
    /// Its headers, each value once per occurrence.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Bytes,
}

impl StoredMessage {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The last `count` messages of `stream` (fewer when it holds fewer; a sequence removed since
/// is skipped), oldest first.
pub async fn last_messages(
    jetstream: &jetstream::Context,
    stream: &str,
    count: u64,
) -> Result<Vec<StoredMessage>, NatsError> {
    let failed = |reason: String| NatsError::Stream {
        stream: stream.to_owned(),
        reason,
        hint: String::new(),
    };
    let mut handle = jetstream
        .get_stream(stream)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let state = handle
        .info()
        .await
        .map_err(|e| failed(e.to_string()))?
        .state
        .clone();
    if state.messages == 0 || count == 0 {
        return Ok(Vec::new());
    }
    let from = state
        .last_sequence
        .saturating_sub(count - 1)
        .max(state.first_sequence);
    let mut out = Vec::new();
    for seq in from..=state.last_sequence {
        let Ok(stored) = handle.get_raw_message(seq).await else {
            continue;
        };
        let headers = stored
            .headers
            .iter()
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_owned()))
            })
            .collect();
        out.push(StoredMessage {
            seq,
            subject: stored.subject.to_string(),
            headers,
            payload: stored.payload,
        });
    }
    Ok(out)
}

/// What storing the contracts did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContractsStored {
    /// The bucket was created now.
    pub created_bucket: bool,
    /// Keys written now (the others were there with the same bytes).
    pub written: Vec<String>,
}

/// Stores each `(key, document)` in `bucket`, creating the bucket (history 1, file storage)
/// when it is missing. A key already holding the same bytes is left alone: a key names one
/// version, so re-starts write nothing.
pub async fn store_contracts(
    jetstream: &jetstream::Context,
    bucket: &str,
    documents: &[(String, Bytes)],
) -> Result<ContractsStored, NatsError> {
    let failed = |reason: String| NatsError::Contracts {
        bucket: bucket.to_owned(),
        reason,
    };
    let mut stored = ContractsStored::default();
    if documents.is_empty() {
        return Ok(stored);
    }
    // A lookup that fails for any reason (missing, or not allowed) is followed by a create:
    // its error is the one that says what to fix.
    let store = match jetstream.get_key_value(bucket).await {
        Ok(store) => store,
        Err(_) => {
            stored.created_bucket = true;
            // The bucket's stream as async-nats' `create_key_value` makes it, created directly:
            // that call first asks for the account's info, which older servers answer in a
            // shape the client does not read.
            jetstream
                .get_or_create_stream(jetstream::stream::Config {
                    name: format!("KV_{bucket}"),
                    description: Some(
                        "outbox-relay event contracts (JSON Schema), keyed <name>.<version>".into(),
                    ),
                    subjects: vec![format!("$KV.{bucket}.>")],
                    max_messages_per_subject: 1,
                    storage: jetstream::stream::StorageType::File,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: jetstream::stream::DiscardPolicy::New,
                    ..Default::default()
                })
                .await
                .map_err(|e| failed(format!("cannot create it: {e}")))?;
            jetstream
                .get_key_value(bucket)
                .await
                .map_err(|e| failed(format!("cannot open it: {e}")))?
        }
    };
    for (key, document) in documents {
        let existing = store
            .get(key)
            .await
            .map_err(|e| failed(format!("cannot read key `{key}`: {e}")))?;
        if existing.as_ref() == Some(document) {
            continue;
        }
        store
            .put(key, document.clone())
            .await
            .map_err(|e| failed(format!("cannot write key `{key}`: {e}")))?;
        stored.written.push(key.clone());
    }
    Ok(stored)
}
