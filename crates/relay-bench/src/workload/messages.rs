//! The emit-message row: the same backlog written once as outbox rows and once with
//! `pg_logical_emit_message` (through `outbox_relay.emit_event`, migrations/0005) and relayed
//! through a `[[messages]]` entry, each caught up by the relay in the same run.

use anyhow::{Context as _, Result};

use crate::Args;

use super::relay::{CatchUpConfig, relay_catch_up_with};
use super::setup::{Env, PAYLOAD_SQL, insert_lsn, insert_sql, reset, write_backlog_with};
use super::{RelayRun, say};

/// The `[[messages]]` prefix the bench emits under.
const PREFIX: &str = "outbox";

/// One transaction size: the table outbox's catch-up and the emit-message outbox's.
#[derive(Debug)]
pub struct MessagesRun {
    pub label: String,
    pub rows: u64,
    pub table: OutboxRun,
    pub emit: OutboxRun,
}

/// One outbox's backlog and its catch-up.
#[derive(Debug)]
pub struct OutboxRun {
    pub wal_bytes: u64,
    pub write_secs: f64,
    pub relay: RelayRun,
}

/// `SELECT outbox_relay.emit_event(…)` of events `from..=to`: the table rows' subject, payload
/// and headers, as one transactional logical decoding message each.
fn emit_sql(from: u64, to: u64) -> String {
    format!(
        "SELECT outbox_relay.emit_event('{PREFIX}', gen_random_uuid()::text, \
           'outbox.Order.OrderCreated', {PAYLOAD_SQL}, \
           jsonb_build_object('Outbox-Aggregate-Type', 'Order', 'Outbox-Aggregate-Id', g::text, \
             'Outbox-Event-Type', 'OrderCreated')) \
         FROM generate_series({from}, {to}) g"
    )
}

/// The table and emit-message catch-up of every `--message-tx-sizes` backlog.
pub(super) async fn messages(env: &Env, args: &Args) -> Result<Vec<MessagesRun>> {
    let rows = args.mode_rows();
    if rows == 0 || args.message_tx_sizes.is_empty() {
        return Ok(Vec::new());
    }
    env.client
        .batch_execute(include_str!(
            "../../../../migrations/0005_emit_outbox_message.sql"
        ))
        .await
        .context("installing outbox_relay.emit_event (migrations/0005)")?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let mut out = Vec::new();
    for &per_tx in &args.message_tx_sizes {
        let per_tx = per_tx.clamp(1, rows);
        let label = if per_tx >= rows {
            format!("1 tx of {rows} events")
        } else {
            format!("{per_tx}-event txs")
        };
        say(format!("== emit-message outbox, {label}: {rows} events"));
        let table = outbox_run(env, rows, per_tx, mif, "_table", insert_sql, "").await?;
        let entry = format!("\n[[messages]]\nprefix = \"{PREFIX}\"\n");
        let emit = outbox_run(env, rows, per_tx, mif, "_emit", emit_sql, &entry).await?;
        out.push(MessagesRun {
            label,
            rows,
            table,
            emit,
        });
    }
    Ok(out)
}

/// Writes the backlog with `rows_sql` after a reset and catches it up with a relay whose config
/// ends with `tables` (the slot and log are named after `variant`).
async fn outbox_run(
    env: &Env,
    rows: u64,
    per_tx: u64,
    mif: usize,
    variant: &'static str,
    rows_sql: fn(u64, u64) -> String,
    tables: &str,
) -> Result<OutboxRun> {
    reset(env).await?;
    let before = insert_lsn(&env.client).await?;
    let (inside_last, end, write_secs) = write_backlog_with(env, rows, per_tx, rows_sql).await?;
    let setup = CatchUpConfig {
        relay: tables,
        ..Default::default()
    };
    let bin = &env.relay_bin;
    let relay = relay_catch_up_with(env, bin, variant, mif, rows, inside_last, &setup)
        .await
        .with_context(|| format!("{variant} outbox catch-up"))?
        .run;
    say(format!(
        "   {}: written in {write_secs:.1} s ({:.0} MB WAL), relayed at {:.0} events/s ({:.2} s)",
        variant.trim_start_matches('_'),
        (end - before) as f64 / 1e6,
        relay.events_per_s,
        relay.secs
    ));
    Ok(OutboxRun {
        wal_bytes: end - before,
        write_secs,
        relay,
    })
}
