//! The preflight of `outbox-relay validate --connect`: a read-only look at everything a relay
//! needs, as a list of [`Check`]s (`PASS`, `WARN` or `FAIL`), each failure with a hint that
//! fixes it. The binary prints them and maps the [`worst`] failure to its exit code.

mod nats;
mod postgres;

use std::fmt;

use relay_runtime::config::RelayConfig;
use relay_runtime::failure::FailureKind;

use self::nats::nats_checks;
use self::postgres::postgres_checks;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail(FailureKind),
}

/// One preflight line.
#[derive(Debug, Clone)]
pub struct Check {
    pub verdict: Verdict,
    pub name: String,
    pub detail: String,
    pub hint: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail(_) => "FAIL",
        };
        write!(f, "{word}  {}: {}", self.name, self.detail)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n      hint: {hint}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Report(Vec<Check>);

impl Report {
    fn add(&mut self, verdict: Verdict, name: impl Into<String>, detail: impl Into<String>) {
        self.0.push(Check {
            verdict,
            name: name.into(),
            detail: detail.into(),
            hint: None,
        });
    }
    fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.add(Verdict::Pass, name, detail);
    }
    fn hinted(
        &mut self,
        verdict: Verdict,
        name: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.0.push(Check {
            verdict,
            name: name.into(),
            detail: detail.into(),
            hint: Some(hint.into()),
        });
    }
    /// A finding of a shared assessment (relay-core's [`relay_core::check::Check`]): a pass,
    /// or a warning with its fix, on the line `name`.
    fn assessed<A>(&mut self, name: impl Into<String>, check: relay_core::check::Check<A>) {
        match check.hint {
            None => self.pass(name, check.detail),
            Some(hint) => self.hinted(Verdict::Warn, name, check.detail, hint),
        }
    }
    fn fail(
        &mut self,
        name: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.hinted(Verdict::Fail(FailureKind::Config), name, detail, hint);
    }
}

const FAIL: Verdict = Verdict::Fail(FailureKind::Config);
const UNAVAILABLE: Verdict = Verdict::Fail(FailureKind::Unavailable);
const DATA_SAFETY: Verdict = Verdict::Fail(FailureKind::DataSafety);

/// Runs every check of `validate --connect`, in the order they are reported.
pub async fn run(config: &RelayConfig) -> Vec<Check> {
    let mut report = Report::default();
    // The files `run` reads before it connects (`validate` without --connect checks them too);
    // a line only when one is refused.
    if let Err(failure) = relay_runtime::files::check_files(config) {
        report.hinted(
            Verdict::Fail(failure.kind),
            "files",
            format!("{:#}", failure.error),
            "fix the file or the setting named above: `run` refuses to start with it",
        );
    }
    postgres_checks(config, &mut report).await;
    nats_checks(config, &mut report).await;
    contract_checks(config, &mut report).await;
    report.0
}

/// Rows the contract lines route per table.
const CONTRACT_ROWS: usize = 1_000;

/// One line per contract: how the rows in its table match it (`contracts check` reads more,
/// and the stream too).
async fn contract_checks(config: &RelayConfig, r: &mut Report) {
    if config.outbox.iter().all(|o| o.contracts.is_none()) {
        return;
    }
    let options = crate::contracts_check::CheckOptions {
        rows: CONTRACT_ROWS,
        messages: 0,
    };
    let report = match crate::contracts_check::check(config, options).await {
        Ok(report) => report,
        Err(failure) => {
            r.hinted(
                Verdict::Fail(failure.kind),
                "contracts",
                format!("{:#}", failure.error),
                "fix the contract or the connection named above",
            );
            return;
        }
    };
    for contract in &report.contracts {
        let name = format!("contract {}", contract.contract);
        let first = report
            .refused
            .iter()
            .find(|refusal| refusal.reason.contains(&contract.contract));
        match (contract.checked, first) {
            (0, _) => r.hinted(
                Verdict::Warn,
                name,
                format!("{}: matched none of the first {CONTRACT_ROWS} rows of its tables", contract.file),
                "check the event type or subject pattern it is configured for (an event type nothing writes yet is fine)",
            ),
            (checked, Some(refusal)) => r.hinted(
                Verdict::Warn,
                name,
                format!(
                    "{}: {} of {checked} rows would be refused, e.g. event {}: {}",
                    contract.file, contract.refused, refusal.event_id, refusal.reason
                ),
                "`outbox-relay contracts check` lists them all; fix the rows' writer or the contract before those rows are published",
            ),
            (checked, None) => r.pass(name, format!("{}: {checked} rows match", contract.file)),
        }
    }
}

/// The failure of a preflight whose checks are `checks`: the worst kind among its failures
/// (data safety, then unavailable, then configuration), `None` when nothing failed.
pub fn worst(checks: &[Check]) -> Option<FailureKind> {
    let mut worst: Option<FailureKind> = None;
    for check in checks {
        if let Verdict::Fail(kind) = check.verdict {
            worst = Some(match (worst, kind) {
                (Some(FailureKind::DataSafety), _) | (_, FailureKind::DataSafety) => {
                    FailureKind::DataSafety
                }
                (Some(FailureKind::Unavailable), _) | (_, FailureKind::Unavailable) => {
                    FailureKind::Unavailable
                }
                _ => FailureKind::Config,
            });
        }
    }
    worst
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}
