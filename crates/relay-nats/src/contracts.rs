//! The event contracts in their NATS KV bucket: each schema under the key its events'
//! `Outbox-Schema` header names, so consumers can fetch what the relay checked.

use async_nats::jetstream;
use bytes::Bytes;

use crate::NatsError;

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
