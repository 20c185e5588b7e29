//! The event contracts in their NATS KV bucket: each schema under the key its events'
//! `Outbox-Schema` header names, so consumers can fetch what the relay checked.

use async_nats::jetstream::{self, kv};
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
            jetstream
                .create_key_value(kv::Config {
                    bucket: bucket.to_owned(),
                    description:
                        "outbox-relay event contracts (JSON Schema), keyed <name>.<version>".into(),
                    history: 1,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| failed(format!("cannot look it up or create it: {e}")))?
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
