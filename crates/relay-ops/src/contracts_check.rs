//! `outbox-relay contracts check`: what the configured contracts (a new set, before it ships)
//! would refuse among the rows still in the outbox tables and the last messages of the stream.
//! Rows are routed exactly as the relay routes them; messages are checked by their
//! `Outbox-Table`, event type header and subject. Nothing is published or changed.

use std::sync::Arc;

use relay_backfill as sql;
use relay_core::message::TxContext;
use relay_core::route::{OutboxTableConfig, RouteError, TableContracts, TypeSource};
use serde::Serialize;

use relay_runtime::config::RelayConfig;
use relay_runtime::failure::{Failure, nats_failure, pg_failure};
use relay_runtime::table_backfill::backfill_exit;

/// How much to read.
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions {
    /// Rows read per table at most, in key order from the first.
    pub rows: usize,
    /// Messages read from the end of the stream.
    pub messages: u64,
}

/// One event the contracts would refuse.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    /// `row` (in the outbox table) or `message` (in the stream).
    pub source: &'static str,
    /// The table.
    pub table: String,
    /// The event id.
    pub event_id: String,
    /// The stream sequence, for a message.
    pub seq: Option<u64>,
    /// Why.
    pub reason: String,
}

/// One contract and what it matched.
#[derive(Debug, Clone, Serialize)]
pub struct ContractUse {
    /// `<name>.<version>`.
    pub contract: String,
    /// Its file.
    pub file: String,
    /// Events checked against it.
    pub checked: u64,
    /// Events it refused.
    pub refused: u64,
}

/// What the check found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Rows read from the outbox tables.
    pub rows_checked: u64,
    /// Messages read from the stream.
    pub messages_checked: u64,
    /// Each contract with its counts (a contract that matched nothing has `checked` 0).
    pub contracts: Vec<ContractUse>,
    /// Every event that would be refused.
    pub refused: Vec<Refusal>,
}

/// Checks the rows of every table with contracts and the last messages of the stream.
pub async fn check(config: &RelayConfig, options: CheckOptions) -> Result<CheckReport, Failure> {
    // A fresh compile: the counts below are this check's alone.
    let config = RelayConfig {
        contract_cache: Arc::default(),
        ..config.clone()
    };
    let mut router = config.router().map_err(Failure::config)?;
    let mut report = CheckReport {
        rows_checked: 0,
        messages_checked: 0,
        contracts: Vec::new(),
        refused: Vec::new(),
    };
    let client = sql::connect_reader(&config.postgres)
        .await
        .map_err(pg_failure)?;
    for table in config.outbox.iter().filter(|o| o.contracts.is_some()) {
        check_rows(
            &client,
            &config,
            table,
            &mut router,
            options.rows,
            &mut report,
        )
        .await?;
    }
    if options.messages > 0 {
        let nats = relay_nats::connect(&config.nats)
            .await
            .map_err(nats_failure)?;
        let messages = relay_nats::last_messages(
            &async_nats::jetstream::new(nats.client().clone()),
            &config.nats.stream,
            options.messages,
        )
        .await
        .map_err(nats_failure)?;
        for message in &messages {
            report.messages_checked += 1;
            check_message(&config, &router, message, &mut report);
        }
    }
    let mut seen: Vec<Arc<relay_core::route::LoadedContract>> = Vec::new();
    for (_, contract) in router.contracts() {
        if seen.iter().any(|c| Arc::ptr_eq(c, &contract)) {
            continue;
        }
        report.contracts.push(ContractUse {
            contract: contract.contract().key().to_owned(),
            file: contract.file().to_owned(),
            checked: contract.checked(),
            refused: contract.refused(),
        });
        seen.push(contract);
    }
    Ok(report)
}

/// Routes up to `limit` rows of `table` as the relay would, keeping the contract refusals.
async fn check_rows(
    client: &tokio_postgres::Client,
    config: &RelayConfig,
    table: &OutboxTableConfig,
    router: &mut relay_core::route::Router,
    limit: usize,
    report: &mut CheckReport,
) -> Result<(), Failure> {
    let (schema, name) = table.qualified_name();
    let shape = sql::table_shape(
        client,
        &schema,
        &name,
        &table.event_id,
        &config.postgres.publication,
    )
    .await
    .map_err(backfill_exit)?;
    router
        .on_relation(shape.relation.clone(), None)
        .map_err(|e| Failure::config(anyhow::Error::new(e)))?;
    let Some(upto) = shape.last_key(client, None).await.map_err(backfill_exit)? else {
        return Ok(());
    };
    let tx = TxContext::new(0, relay_core::Lsn(0), 0);
    let mut after: Option<String> = None;
    let mut read = 0usize;
    while read < limit {
        let page = shape
            .page(
                client,
                None,
                after.as_deref(),
                &upto,
                (limit - read).min(1000),
            )
            .await
            .map_err(backfill_exit)?;
        let Some((last, _)) = page.last() else {
            break;
        };
        after = Some(last.clone());
        for (index, (_, insert)) in page.iter().enumerate() {
            read += 1;
            report.rows_checked += 1;
            if let Err(RouteError::Contract {
                table,
                event_id,
                refusal,
            }) = router.route_insert(insert, &tx, index as u64)
            {
                report.refused.push(Refusal {
                    source: "row",
                    table,
                    event_id,
                    seq: None,
                    reason: refusal.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Checks one stream message of a table with contracts.
fn check_message(
    config: &RelayConfig,
    router: &relay_core::route::Router,
    message: &relay_nats::StoredMessage,
    report: &mut CheckReport,
) {
    let Some(table_name) = message.header(outbox_contract::HEADER_TABLE) else {
        return;
    };
    let Some(table) = config
        .outbox
        .iter()
        .find(|o| o.display_name() == table_name)
    else {
        return;
    };
    let Some(contracts) = router.table_contracts(&table.table) else {
        return;
    };
    let event_id = message
        .header(outbox_contract::HEADER_MSG_ID)
        .unwrap_or_default();
    let event_type = match contracts.type_source() {
        TypeSource::Header(name) => message.header(name),
        TypeSource::Column(column) => type_header(table, column).and_then(|h| message.header(h)),
    };
    if let Err(refusal) = TableContracts::check(
        contracts,
        table_name,
        event_id,
        event_type,
        &message.subject,
        &message.payload,
    ) {
        report.refused.push(Refusal {
            source: "message",
            table: table_name.to_owned(),
            event_id: event_id.to_owned(),
            seq: Some(message.seq),
            reason: refusal.to_string(),
        });
    }
}

/// The header the mapping fills from the event type column, if any.
fn type_header<'a>(table: &'a OutboxTableConfig, column: &str) -> Option<&'a str> {
    table
        .headers
        .iter()
        .find(|(_, c)| c.trim_end_matches('?') == column)
        .map(|(h, _)| h.as_str())
}
