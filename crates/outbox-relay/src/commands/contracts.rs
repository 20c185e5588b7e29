//! `outbox-relay asyncapi`: the AsyncAPI document of what the relay publishes, contracts as
//! payload schemas (built by `relay_asyncapi`).
//!
//! `outbox-relay contracts check`: every event the configured contracts would refuse, among
//! the rows still in the outbox tables and the last messages of the stream (gathered by
//! `relay_ops::contracts_check`), for a CI step before a schema change ships.
//!
//! Exit code: 0 when nothing would be refused; 65 when something would; 69 when PostgreSQL or
//! NATS cannot be reached; 78 for a contract that does not compile.

use anyhow::anyhow;
use relay_ops::contracts_check::{CheckOptions, CheckReport};
use relay_runtime::config::RelayConfig;

use crate::exit::{Failure, FailureKind};

/// `contracts check`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Rows read per outbox table at most.
    #[arg(long, default_value_t = 100_000)]
    pub rows: usize,
    /// Messages read from the end of the stream.
    #[arg(long, default_value_t = 1_000)]
    pub messages: u64,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs the check and prints what it found.
pub async fn check(config: &RelayConfig, args: &CheckArgs) -> Result<(), Failure> {
    let options = CheckOptions {
        rows: args.rows,
        messages: args.messages,
    };
    let report = relay_ops::contracts_check::check(config, options).await?;
    if args.json {
        let doc = serde_json::to_value(&report).map_err(Failure::internal)?;
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_text(&report);
    }
    if report.refused.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        FailureKind::DataSafety,
        anyhow!(
            "{} event(s) would be refused by the contracts: change the contracts, or the rows' writers, before deploying",
            report.refused.len()
        ),
    ))
}

fn print_text(report: &CheckReport) {
    println!(
        "checked {} row(s) in the outbox tables and {} message(s) of the stream",
        report.rows_checked, report.messages_checked
    );
    for contract in &report.contracts {
        let matched = if contract.checked == 0 {
            " (matched no row or message: check its event type or subject pattern)"
        } else {
            ""
        };
        println!(
            "contract {} ({}): {} checked, {} would be refused{matched}",
            contract.contract, contract.file, contract.checked, contract.refused
        );
    }
    for refusal in &report.refused {
        let at = refusal
            .seq
            .map_or_else(String::new, |seq| format!(" (stream sequence {seq})"));
        println!(
            "REFUSED {} {} in {}{at}: {}",
            refusal.source, refusal.event_id, refusal.table, refusal.reason
        );
    }
    if report.refused.is_empty() {
        println!("nothing would be refused");
    }
}

/// Writes the AsyncAPI document to `output` (standard output when `None`).
pub fn asyncapi(config: &RelayConfig, output: Option<std::path::PathBuf>) -> Result<(), Failure> {
    let document = relay_asyncapi::document(config).map_err(Failure::config)?;
    let text = serde_json::to_string_pretty(&document).map_err(Failure::internal)?;
    match output {
        None => println!("{text}"),
        Some(path) => std::fs::write(&path, format!("{text}\n")).map_err(|e| {
            Failure::config(
                anyhow::Error::new(e).context(format!("cannot write {}", path.display())),
            )
        })?,
    }
    Ok(())
}
