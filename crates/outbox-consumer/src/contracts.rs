//! Event contracts on receipt (`ConsumerBuilder::validate_contracts`): the payload of an event
//! that names its contract in `Outbox-Schema` is checked against that contract, fetched from
//! the contracts KV bucket, before the handler sees the event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::jetstream::{self, context::KeyValueError, kv};
use outbox_contract::{CONTRACTS_BUCKET, HEADER_SCHEMA};
use outbox_schema::{Contract, Limits, SchemaError, Violation};
use tokio::sync::OnceCell;

/// Hex digits of a contract's version (the digest of its stored bytes) in its key.
const VERSION_DIGITS: usize = 12;

/// What the builder collects for contract validation.
#[derive(Debug, Clone)]
pub(crate) struct ContractSettings {
    pub(crate) bucket: String,
    pub(crate) required: bool,
    pub(crate) limits: Limits,
}

impl Default for ContractSettings {
    fn default() -> Self {
        Self {
            bucket: CONTRACTS_BUCKET.to_owned(),
            required: false,
            limits: Limits::default(),
        }
    }
}

/// Why an event must not be applied; its text is the dead-letter reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// The payload breaks its contract.
    #[error("contract {key}: {violation}")]
    Violation {
        key: String,
        /// Boxed: it is most of the enum's size and rare.
        violation: Box<Violation>,
    },
    /// The bucket holds no contract under the key the event names.
    #[error("contract {key}: no such key in the contracts bucket {bucket:?}")]
    UnknownKey { key: String, bucket: String },
    /// The header's value is not shaped like a contract's key.
    #[error("contract {key}: not a valid contracts bucket key (<name>.<12 lowercase hex digits>)")]
    InvalidKey { key: String },
    /// The stored bytes do not hash to the key's version, or do not compile. The schema
    /// crate's text already starts with `contract <key>: `.
    #[error(transparent)]
    Unusable(SchemaError),
    /// No `Outbox-Schema` header on a consumer that requires one.
    #[error(
        "contract required: the event has no {HEADER_SCHEMA} header and this consumer requires one"
    )]
    Missing,
}

/// The contract could not be read for reasons of NATS, not of the event: retried, never parked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unavailable {
    #[error("contracts bucket {bucket:?}: {source}")]
    Bucket {
        bucket: String,
        #[source]
        source: KeyValueError,
    },
    #[error("contract {key}: reading it from the contracts bucket {bucket:?}: {source}")]
    Entry {
        key: String,
        bucket: String,
        #[source]
        source: kv::EntryError,
    },
}

/// The outcome of checking one event.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The payload satisfies the contract the event names.
    Passed,
    /// The event names no contract, and none is required.
    NoContract,
    /// Not to be applied: park it.
    Refused(Refusal),
    /// Ask again later.
    Unavailable(Unavailable),
}

/// The contracts bucket and the contracts compiled so far.
#[derive(Debug)]
pub(crate) struct Contracts {
    settings: ContractSettings,
    /// Bound on first use: a consumer whose events name no contract never needs the bucket.
    store: OnceCell<kv::Store>,
    /// By KV key. A key names one version, a digest of its bytes, so an entry never goes stale.
    compiled: Mutex<HashMap<String, Arc<Contract>>>,
}

impl Contracts {
    pub(crate) fn new(settings: ContractSettings) -> Self {
        Self {
            settings,
            store: OnceCell::new(),
            compiled: Mutex::default(),
        }
    }

    /// Checks `payload` against the contract `key` names (an event's `Outbox-Schema` header).
    pub(crate) async fn verdict(
        &self,
        jetstream: &jetstream::Context,
        key: Option<&str>,
        payload: &[u8],
    ) -> Verdict {
        let Some(key) = key else {
            return if self.settings.required {
                Verdict::Refused(Refusal::Missing)
            } else {
                Verdict::NoContract
            };
        };
        let contract = match self.contract(jetstream, key).await {
            Ok(Ok(contract)) => contract,
            Ok(Err(refusal)) => return Verdict::Refused(refusal),
            Err(unavailable) => return Verdict::Unavailable(unavailable),
        };
        judge(&contract, payload, &self.settings.limits)
    }

    /// The compiled contract under `key`: from the cache, or fetched and compiled. The outer
    /// `Err` is NATS trouble, the inner one a contract that cannot be had.
    async fn contract(
        &self,
        jetstream: &jetstream::Context,
        key: &str,
    ) -> Result<Result<Arc<Contract>, Refusal>, Unavailable> {
        if let Some(found) = self.cached(key) {
            return Ok(Ok(found));
        }
        if !is_contract_key(key) {
            return Ok(Err(Refusal::InvalidKey {
                key: key.to_owned(),
            }));
        }
        let bucket = &self.settings.bucket;
        let store = self
            .store
            .get_or_try_init(|| jetstream.get_key_value(bucket.as_str()))
            .await
            .map_err(|source| Unavailable::Bucket {
                bucket: bucket.clone(),
                source,
            })?;
        let stored = match store.get(key).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                return Ok(Err(Refusal::UnknownKey {
                    key: key.to_owned(),
                    bucket: bucket.clone(),
                }));
            }
            Err(e) if e.kind() == kv::EntryErrorKind::InvalidKey => {
                return Ok(Err(Refusal::InvalidKey {
                    key: key.to_owned(),
                }));
            }
            Err(source) => {
                return Err(Unavailable::Entry {
                    key: key.to_owned(),
                    bucket: bucket.clone(),
                    source,
                });
            }
        };
        Ok(compile(key, &stored).map(|contract| {
            let contract = Arc::new(contract);
            self.compiled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.to_owned(), Arc::clone(&contract));
            contract
        }))
    }

    fn cached(&self, key: &str) -> Option<Arc<Contract>> {
        self.compiled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

/// Whether `key` is `<name>.<version>` as the relay writes it: no KV round trip for a value
/// that cannot be one (or that would name several keys, like `*`).
fn is_contract_key(key: &str) -> bool {
    key.rsplit_once('.').is_some_and(|(name, version)| {
        outbox_schema::check_name(name).is_ok()
            && version.len() == VERSION_DIGITS
            && version
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Compiles the bytes stored under `key`, refusing bytes that are not the version it names.
fn compile(key: &str, stored: &[u8]) -> Result<Contract, Refusal> {
    Contract::from_stored(key, stored).map_err(Refusal::Unusable)
}

fn judge(contract: &Contract, payload: &[u8], limits: &Limits) -> Verdict {
    match contract.check(payload, limits) {
        Ok(()) => Verdict::Passed,
        Err(violation) => Verdict::Refused(Refusal::Violation {
            key: contract.key().to_owned(),
            violation: Box::new(violation),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the relay stores for `order-placed.json` and its verdicts, shared with the schema
    /// crate's tests and the other consumers'.
    fn fixture() -> serde_json::Value {
        serde_json::from_str(include_str!(
            "../../outbox-schema/tests/fixtures/stored.json"
        ))
        .expect("stored.json")
    }

    fn stored(fixture: &serde_json::Value) -> (&str, &[u8]) {
        let key = fixture["key"].as_str().expect("key");
        let stored = fixture["stored"].as_str().expect("stored").as_bytes();
        (key, stored)
    }

    #[test]
    fn reasons_name_the_key_then_the_pointer_and_keyword() {
        let fixture = fixture();
        let (key, stored) = stored(&fixture);
        let contract = compile(key, stored).expect("compiles");
        let limits = Limits::default();
        for case in fixture["cases"].as_array().expect("cases") {
            let payload = case["payload"].as_str().expect("payload").as_bytes();
            match (case["valid"].as_bool(), judge(&contract, payload, &limits)) {
                (Some(true), Verdict::Passed) => {}
                (Some(false), Verdict::Refused(refusal)) => {
                    let pointer = case["pointer"].as_str().expect("pointer");
                    let at = if pointer.is_empty() {
                        "(root)"
                    } else {
                        pointer
                    };
                    let keyword = case["keyword"].as_str().expect("keyword");
                    let reason = refusal.to_string();
                    assert!(
                        reason
                            .starts_with(&format!("contract {key}: at {at}: keyword `{keyword}`")),
                        "{reason}"
                    );
                }
                (expected, verdict) => panic!("{case}: expected {expected:?}, got {verdict:?}"),
            }
        }
    }

    #[test]
    fn bytes_that_are_not_the_keys_version_are_refused_naming_the_key_once() {
        let fixture = fixture();
        let (key, stored) = stored(&fixture);
        let wrong = "order-placed.000000000000";
        let reason = compile(wrong, stored)
            .expect_err("digest mismatch")
            .to_string();
        assert!(
            reason.starts_with(&format!("contract {wrong}: the stored document hashes to")),
            "{reason}"
        );
        assert!(!reason.contains(&format!("{wrong}: contract")), "{reason}");
        let mut tampered = stored.to_vec();
        tampered.push(b' ');
        assert!(
            compile(key, &tampered).is_err(),
            "one more byte, another digest"
        );
    }

    #[test]
    fn only_name_dot_version_is_a_contract_key() {
        assert!(is_contract_key("order-placed.565aaced9d08"));
        for not_a_key in [
            "order-placed",
            "order-placed.565AACED9D08",
            "order-placed.565aaced9d0",
            "order placed.565aaced9d08",
            ".565aaced9d08",
            "a.b.565aaced9d08",
            "order-placed.*",
            "",
        ] {
            assert!(!is_contract_key(not_a_key), "{not_a_key:?}");
        }
    }

    #[test]
    fn other_refusals_start_with_the_key() {
        let unknown = Refusal::UnknownKey {
            key: "a.b".into(),
            bucket: "outbox-contracts".into(),
        };
        assert!(unknown.to_string().starts_with("contract a.b: "));
        let invalid = Refusal::InvalidKey { key: "a b*".into() };
        assert!(invalid.to_string().starts_with("contract a b*: "));
        assert!(Refusal::Missing.to_string().contains(HEADER_SCHEMA));
    }
}
