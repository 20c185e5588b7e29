//! Event contracts' cost: the relay's catch-up and CPU per event on one backlog whose every row
//! satisfies a 10-property JSON Schema, with `[outbox.contracts]` off and on, alternating runs
//! on one relay build in this run.
//!
//! Both sides read the same rows through the same `[[outbox]]` entry; only the contracts
//! section differs. Each run is checked afterwards from the stream it filled: with contracts on
//! every stored message names the contract in `Outbox-Schema`, with them off none does, so the
//! row cannot compare contracts off with contracts off.

use std::path::Path;

use anyhow::{Context as _, Result, anyhow, bail};
use outbox_schema::{Contract, Limits};

use crate::Args;

use super::relay::{CatchUpConfig, relay_catch_up_with};
use super::setup::{Env, insert_lsn, reset, stream_header_values, write_backlog_with};
use super::{RelayRun, STREAM, say};

/// Rows per transaction of the contracts backlog: where the relay's own CPU per event is lowest
/// (docs/benchmarks.md), so a per-event check weighs the most.
pub const CONTRACTS_PER_TX: u64 = 100;
/// The allowance: on against off, per event (catch-up time and relay CPU).
pub const CONTRACTS_RATIO_TARGET: f64 = 1.15;
/// The contract: 10 typed, required properties, a few format-free constraints. The
/// decode_route micro-benchmark checks the same file.
const CONTRACT_SCHEMA: &str = include_str!("../../contracts/bench-order-created.json");
/// Its file name; the stem is the contract's name.
const CONTRACT_FILE: &str = "bench-order-created.json";
/// Written rows checked against the contract here before any relay runs (a violating row would
/// stop the relay mid-run, with a less direct message).
const PRECHECK_ROWS: i64 = 1_000;

/// The ~300-byte jsonb payload of event `g` with the contract's 10 properties: the bench
/// payload's 7 plus `status`, `channel` and `country`, with a shorter `note` so the size stays
/// that of the bench payload.
const PAYLOAD_10_SQL: &str = "jsonb_build_object(\
           'ts', (extract(epoch from clock_timestamp()) * 1000000)::bigint, \
           'order_id', g, 'customer', 'customer-' || (g % 1000), 'currency', 'EUR', 'amount', 1999, \
           'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (g % 97), 'qty', 1, 'price', 1999)), \
           'status', 'created', 'channel', 'web', 'country', 'DE', \
           'note', repeat('x', 64))";

/// INSERT of rows `from..=to` with the 10-property payload.
fn rows_sql(from: u64, to: u64) -> String {
    format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), 'Order', g::text, 'OrderCreated', {PAYLOAD_10_SQL} \
         FROM generate_series({from}, {to}) g"
    )
}

/// The `[[outbox]]` entry of both sides: the bench table, default mapping; with contracts on,
/// `[outbox.contracts]` naming `schema` for the bench's event type.
fn outbox_entry(schema: Option<&Path>) -> String {
    let mut entry = "\n[[outbox]]\ntable = \"public.outbox\"\n".to_owned();
    if let Some(schema) = schema {
        // A TOML literal string: the path as it is, no escapes.
        entry.push_str(&format!(
            "\n[outbox.contracts]\ntypes = {{ OrderCreated = '{}' }}\n",
            schema.display()
        ));
    }
    entry
}

/// One catch-up of the backlog.
#[derive(Debug, Clone)]
pub struct ContractsRun {
    pub contracts_on: bool,
    pub relay: RelayRun,
    /// Stored messages whose `Outbox-Schema` names the contract (every one with contracts on,
    /// none off).
    pub checked: u64,
}

/// The backlog and every run on it, in the order they ran (off, on, off, on …).
#[derive(Debug, Clone)]
pub struct ContractsScenario {
    pub rows: u64,
    pub write_secs: f64,
    pub wal_bytes: u64,
    /// Bytes of one stored payload (jsonb as text, as the relay publishes it).
    pub payload_bytes: usize,
    /// `<name>.<version>`: the contract's KV key and `Outbox-Schema` value.
    pub contract_key: String,
    pub runs: Vec<ContractsRun>,
}

impl ContractsScenario {
    /// The runs of one side.
    pub fn side(&self, on: bool) -> Vec<&ContractsRun> {
        self.runs.iter().filter(|r| r.contracts_on == on).collect()
    }

    /// Each round's pair: (off, on), in the order they ran.
    pub fn pairs(&self) -> Vec<(&ContractsRun, &ContractsRun)> {
        self.runs
            .chunks_exact(2)
            .filter_map(|pair| match pair {
                [off, on] if !off.contracts_on && on.contracts_on => Some((off, on)),
                _ => None,
            })
            .collect()
    }
}

/// `--contracts-rows` events in 100-row transactions, caught up `max(--rounds, 2)` times with
/// contracts off and on, alternating.
pub(super) async fn contracts(env: &Env, args: &Args) -> Result<Option<ContractsScenario>> {
    let rows = args.contracts_rows();
    if rows == 0 {
        return Ok(None);
    }
    let rounds = args.rounds.max(2);
    let schema = env.log_dir.join(CONTRACT_FILE);
    std::fs::write(&schema, CONTRACT_SCHEMA)
        .with_context(|| format!("writing {}", schema.display()))?;
    let contract = Contract::load(&schema, None).context("compiling the bench contract")?;
    say(format!(
        "== event contracts: {rows} events in {CONTRACTS_PER_TX}-row txs against {}, contracts off vs on ({rounds} rounds)",
        contract.key()
    ));
    reset(env).await?;
    let before = insert_lsn(&env.client).await?;
    let (inside_last, end, write_secs) =
        write_backlog_with(env, rows, CONTRACTS_PER_TX, rows_sql).await?;
    let payload_bytes = precheck(env, &contract).await?;
    let mut scenario = ContractsScenario {
        rows,
        write_secs,
        wal_bytes: end - before,
        payload_bytes,
        contract_key: contract.key().to_owned(),
        runs: Vec::new(),
    };
    say(format!(
        "   written in {write_secs:.1} s ({:.0} MB WAL), {payload_bytes}-byte payloads",
        scenario.wal_bytes as f64 / 1e6
    ));
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    for round in 1..=rounds {
        for on in [false, true] {
            let run = one_run(env, &schema, &scenario, on, mif, inside_last)
                .await
                .with_context(|| {
                    format!(
                        "contracts {} run, round {round}",
                        if on { "on" } else { "off" }
                    )
                })?;
            say(format!(
                "   contracts {}: {:.0} events/s ({:.2} s), {:.2} CPU µs/event, {} events named the contract",
                if on { "on " } else { "off" },
                run.relay.events_per_s,
                run.relay.secs,
                crate::measure::micros_per_event(run.relay.cpu_secs, rows),
                run.checked
            ));
            scenario.runs.push(run);
        }
    }
    let _ = env.js.delete_stream(STREAM).await;
    Ok(Some(scenario))
}

/// Checks the first written rows against the contract; returns one payload's size.
async fn precheck(env: &Env, contract: &Contract) -> Result<usize> {
    let payloads = env
        .client
        .query(
            "SELECT payload::text FROM outbox LIMIT $1",
            &[&PRECHECK_ROWS],
        )
        .await?;
    let mut size = 0;
    for row in payloads {
        let payload: String = row.get(0);
        contract
            .check(payload.as_bytes(), &Limits::default())
            .map_err(|v| anyhow!("a bench row breaks the bench contract ({v}): {payload}"))?;
        size = payload.len();
    }
    Ok(size)
}

async fn one_run(
    env: &Env,
    schema: &Path,
    scenario: &ContractsScenario,
    on: bool,
    mif: usize,
    inside_last: u64,
) -> Result<ContractsRun> {
    let entry = outbox_entry(on.then_some(schema));
    let setup = CatchUpConfig {
        relay: &entry,
        ..Default::default()
    };
    let variant = if on {
        "_contracts_on"
    } else {
        "_contracts_off"
    };
    let rows = scenario.rows;
    let relay = relay_catch_up_with(env, &env.relay_bin, variant, mif, rows, inside_last, &setup)
        .await?
        .run;
    // The stream as this run left it: every message's `Outbox-Schema`.
    let schemas = stream_header_values(env, STREAM, outbox_contract::HEADER_SCHEMA).await?;
    let checked = u64::from(schemas.get(&scenario.contract_key).copied().unwrap_or(0));
    let without = u64::from(schemas.get("").copied().unwrap_or(0));
    let expected = if on { (rows, 0) } else { (0, rows) };
    if (checked, without) != expected {
        bail!(
            "contracts {}: of {rows} stored messages {checked} name contract {} and {without} name none (Outbox-Schema values: {schemas:?})",
            if on { "on" } else { "off" },
            scenario.contract_key
        );
    }
    Ok(ContractsRun {
        contracts_on: on,
        relay,
        checked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows the bench writes satisfy the contract: the payload as PostgreSQL's jsonb prints
    /// it for event 123456.
    #[test]
    fn the_bench_payload_satisfies_the_bench_contract() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CONTRACT_FILE);
        std::fs::write(&path, CONTRACT_SCHEMA).unwrap();
        let contract = Contract::load(&path, None).unwrap();
        assert!(contract.key().starts_with("bench-order-created."));
        let properties = contract.schema()["properties"].as_object().unwrap();
        assert_eq!(properties.len(), 10);
        let payload = format!(
            r#"{{"ts": 1795952324123456, "note": "{}", "items": [{{"qty": 1, "sku": "SKU-42", "price": 1999}}], "amount": 1999, "status": "created", "channel": "web", "country": "DE", "currency": "EUR", "customer": "customer-456", "order_id": 123456}}"#,
            "x".repeat(64)
        );
        assert!((280..=320).contains(&payload.len()), "{}", payload.len());
        contract
            .check(payload.as_bytes(), &Limits::default())
            .unwrap();
        // Each property is checked: a wrong value of any one is refused.
        for (good, bad) in [
            (r#""currency": "EUR""#, r#""currency": "EURO""#),
            (r#""country": "DE""#, r#""country": "de""#),
            (r#""order_id": 123456"#, r#""order_id": 0"#),
            (r#""status": "created""#, r#""status": 1"#),
        ] {
            let broken = payload.replace(good, bad);
            assert!(
                contract
                    .check(broken.as_bytes(), &Limits::default())
                    .is_err(),
                "{bad}"
            );
        }
        // The SQL builds every property the contract requires.
        for name in properties.keys() {
            assert!(PAYLOAD_10_SQL.contains(&format!("'{name}'")), "{name}");
        }
    }

    #[test]
    fn only_the_contracts_side_names_a_contract() {
        let off = outbox_entry(None);
        let on = outbox_entry(Some(Path::new("/tmp/bench-order-created.json")));
        assert!(on.starts_with(&off), "{on}");
        assert!(!off.contains("contracts"));
        assert!(
            on.contains("types = { OrderCreated = '/tmp/bench-order-created.json' }"),
            "{on}"
        );
    }
}
