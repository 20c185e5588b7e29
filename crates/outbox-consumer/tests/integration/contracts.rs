//! Contract validation on receipt against real servers: the contract the relay stores for
//! `order-placed.json` (crates/outbox-schema/tests/fixtures/stored.json, the fixture every
//! consumer's tests share) is put into a KV bucket, and events name it in `Outbox-Schema`.

use std::time::Duration;

use async_nats::jetstream::stream;
use outbox_consumer::{CONTRACTS_BUCKET, ConsumerStats, HEADER_SCHEMA, StatsSnapshot};
use serde_json::Value;

use crate::common::{Env, dead_letters, header, recording_handler, shutdown, wait_for};

const SUBJECT: &str = "outbox.Order.order-placed";
/// A well-formed key the bucket does not hold.
const UNKNOWN_KEY: &str = "order-placed.000000000000";
/// A key whose stored bytes are not its version (the fixture's bytes under another digest).
const WRONG_BYTES_KEY: &str = "order-placed.ffffffffffff";

struct Fixture {
    key: String,
    stored: String,
    /// (payload, pointer) of each case, `None` for a valid payload.
    cases: Vec<(String, Option<String>)>,
}

impl Fixture {
    fn read() -> anyhow::Result<Self> {
        let doc: Value = serde_json::from_str(include_str!(
            "../../../outbox-schema/tests/fixtures/stored.json"
        ))?;
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let cases = doc["cases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|case| {
                let pointer = match case["valid"].as_bool()? {
                    true => None,
                    false => Some(text(&case["pointer"])?),
                };
                Some((text(&case["payload"])?, pointer))
            })
            .collect();
        Ok(Self {
            key: text(&doc["key"]).ok_or_else(|| anyhow::anyhow!("no key"))?,
            stored: text(&doc["stored"]).ok_or_else(|| anyhow::anyhow!("no stored"))?,
            cases,
        })
    }

    /// The payload of the first valid case (`pointer: None`) or of the first invalid case whose
    /// violation is at `pointer`.
    fn payload(&self, pointer: Option<&str>) -> anyhow::Result<&str> {
        self.cases
            .iter()
            .find(|(_, p)| p.as_deref() == pointer)
            .map(|(payload, _)| payload.as_str())
            .ok_or_else(|| anyhow::anyhow!("no case with pointer {pointer:?}"))
    }

    fn valid_payloads(&self) -> Vec<&str> {
        self.cases
            .iter()
            .filter(|(_, p)| p.is_none())
            .map(|(payload, _)| payload.as_str())
            .collect()
    }
}

/// Creates KV bucket `bucket` holding the fixture's contract under its key and, as a tampered
/// entry, the same bytes under [`WRONG_BYTES_KEY`]. The bucket's stream is made as `nats kv add`
/// makes it: async-nats' `create_key_value` first asks for the account info, whose reply it
/// cannot parse from nats-server 2.9.
async fn put_contracts(env: &Env, bucket: &str, fixture: &Fixture) -> anyhow::Result<()> {
    env.js
        .create_stream(stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            discard: stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            ..Default::default()
        })
        .await?;
    let store = env.js.get_key_value(bucket).await?;
    store
        .put(&fixture.key, fixture.stored.clone().into_bytes().into())
        .await?;
    store
        .put(WRONG_BYTES_KEY, fixture.stored.clone().into_bytes().into())
        .await?;
    Ok(())
}

async fn stats_reach(
    stats: &ConsumerStats,
    what: &str,
    done: impl Fn(&StatsSnapshot) -> bool,
) -> anyhow::Result<()> {
    wait_for(15, what, || async { Ok(done(&stats.snapshot())) })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; stats {:?}", stats.snapshot()))
}

/// The `Outbox-Dlq-Reason` of the dead letter of event `id`.
fn reason_of<'a>(dlq: &'a [async_nats::Message], id: &str) -> anyhow::Result<&'a str> {
    dlq.iter()
        .find(|m| header(m, "Outbox-Dlq-Event-Id") == Some(id))
        .and_then(|m| header(m, "Outbox-Dlq-Reason"))
        .ok_or_else(|| anyhow::anyhow!("no dead letter for {id}"))
}

#[tokio::test]
async fn valid_events_are_applied_and_contract_breakers_parked() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let fixture = Fixture::read()?;
    put_contracts(&env, CONTRACTS_BUCKET, &fixture).await?;
    let [first_valid, second_valid, ..] = fixture.valid_payloads()[..] else {
        anyhow::bail!("the fixture has fewer than two valid cases");
    };
    let key = fixture.key.as_str();
    let named = |key| [(HEADER_SCHEMA, key)];
    env.publish_with(Some("valid"), SUBJECT, first_valid, &named(key))
        .await?;
    env.publish_with(
        Some("breaks-contract"),
        SUBJECT,
        fixture.payload(Some("/total/cents"))?,
        &named(key),
    )
    .await?;
    env.publish_with(
        Some("unknown-key"),
        SUBJECT,
        first_valid,
        &named(UNKNOWN_KEY),
    )
    .await?;
    env.publish_with(
        Some("wrong-bytes"),
        SUBJECT,
        first_valid,
        &named(WRONG_BYTES_KEY),
    )
    .await?;
    env.publish_with(
        Some("not-a-key"),
        SUBJECT,
        first_valid,
        &named("order-placed.*"),
    )
    .await?;
    env.publish(Some("no-contract"), SUBJECT, r#"{"free":"form"}"#)
        .await?;
    // Compiled once: the second event under the key is checked by the cached contract.
    env.publish_with(Some("valid-again"), SUBJECT, second_valid, &named(key))
        .await?;

    let consumer = env.builder("checked").validate_contracts().build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(recording_handler("checked"), signal));
    stats_reach(&stats, "four events parked", |s| s.parked == 4).await?;
    assert_eq!(
        env.wait_applied("checked", 3).await?,
        ["valid", "no-contract", "valid-again"],
        "valid events and events without a contract are applied, in order; no other"
    );
    stop.notify_one();
    run.await??;

    let dlq = dead_letters(&env, 4).await?;
    assert_eq!(dlq.len(), 4, "one dead letter per refused event");
    let breaks = reason_of(&dlq, "breaks-contract")?;
    assert!(
        breaks.starts_with(&format!("contract {key}: at /total/cents: keyword `type`")),
        "{breaks}"
    );
    let unknown = reason_of(&dlq, "unknown-key")?;
    assert!(
        unknown.starts_with(&format!("contract {UNKNOWN_KEY}: no such key")),
        "{unknown}"
    );
    let wrong = reason_of(&dlq, "wrong-bytes")?;
    assert!(
        wrong.starts_with(&format!(
            "contract {WRONG_BYTES_KEY}: the stored document hashes to version {}",
            key.rsplit_once('.').map_or("", |(_, version)| version)
        )),
        "{wrong}"
    );
    let not_a_key = reason_of(&dlq, "not-a-key")?;
    assert!(
        not_a_key.starts_with("contract order-placed.*: not a valid contracts bucket key"),
        "{not_a_key}"
    );
    let parked = dlq
        .iter()
        .find(|m| header(m, "Outbox-Dlq-Event-Id") == Some("breaks-contract"));
    assert_eq!(
        parked.and_then(|m| header(m, HEADER_SCHEMA)),
        Some(key),
        "the dead letter keeps the header naming the contract"
    );

    let s = stats.snapshot();
    assert_eq!(
        (
            s.applied,
            s.parked,
            s.contracts_passed,
            s.contracts_refused,
            s.infra_errors
        ),
        (3, 4, 2, 4, 0),
        "{s:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_required_contract_parks_events_without_one() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let fixture = Fixture::read()?;
    put_contracts(&env, CONTRACTS_BUCKET, &fixture).await?;
    env.publish(Some("no-contract"), SUBJECT, fixture.payload(None)?)
        .await?;
    env.publish_with(
        Some("valid"),
        SUBJECT,
        fixture.payload(None)?,
        &[(HEADER_SCHEMA, fixture.key.as_str())],
    )
    .await?;

    let consumer = env.builder("required").require_contract().build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(recording_handler("required"), signal));
    stats_reach(&stats, "the event without a contract parked", |s| {
        s.parked == 1
    })
    .await?;
    assert_eq!(env.wait_applied("required", 1).await?, ["valid"]);
    stop.notify_one();
    run.await??;

    let dlq = dead_letters(&env, 1).await?;
    assert_eq!(dlq.len(), 1);
    let reason = reason_of(&dlq, "no-contract")?;
    assert!(
        reason.starts_with(&format!(
            "contract required: the event has no {HEADER_SCHEMA}"
        )),
        "{reason}"
    );
    let s = stats.snapshot();
    assert_eq!(
        (s.applied, s.parked, s.contracts_passed, s.contracts_refused),
        (1, 1, 1, 1),
        "{s:?}"
    );
    Ok(())
}

#[tokio::test]
async fn events_wait_while_the_contracts_bucket_is_missing() -> anyhow::Result<()> {
    const BUCKET: &str = "order-contracts";
    let env = Env::start(Duration::from_secs(120)).await?;
    let fixture = Fixture::read()?;
    env.publish_with(
        Some("valid"),
        SUBJECT,
        fixture.payload(None)?,
        &[(HEADER_SCHEMA, fixture.key.as_str())],
    )
    .await?;

    let consumer = env.builder("waiting").contracts_bucket(BUCKET).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(recording_handler("waiting"), signal));
    stats_reach(&stats, "retries for the missing bucket", |s| {
        s.infra_errors >= 2
    })
    .await?;
    assert!(
        env.applied("waiting").await?.is_empty(),
        "not applied unchecked"
    );
    assert_eq!(
        stats.snapshot().parked,
        0,
        "not parked: the event is not at fault"
    );

    put_contracts(&env, BUCKET, &fixture).await?;
    assert_eq!(env.wait_applied("waiting", 1).await?, ["valid"]);
    stop.notify_one();
    run.await??;
    let s = stats.snapshot();
    assert_eq!(
        (s.applied, s.parked, s.contracts_passed, s.contracts_refused),
        (1, 0, 1, 0),
        "{s:?}"
    );
    Ok(())
}
