//! `outbox-relay validate --connect`: a read-only preflight of everything `run` needs, one line
//! per check (`PASS`, `WARN` or `FAIL`), each failure with a `hint:` that fixes it.
//!
//! Exit code: 0 when nothing failed (warnings allowed); otherwise 65 when a check found a
//! data-safety problem (slot lost or ahead of the checkpoint), 69 when a server could not be
//! reached, 78 for anything else.

mod nats;
mod postgres;

use std::fmt;

use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};

use self::nats::nats_checks;
use self::postgres::postgres_checks;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail(ExitKind),
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
        self.hinted(Verdict::Fail(ExitKind::Config), name, detail, hint);
    }
}

const FAIL: Verdict = Verdict::Fail(ExitKind::Config);
const UNAVAILABLE: Verdict = Verdict::Fail(ExitKind::Unavailable);
const DATA_SAFETY: Verdict = Verdict::Fail(ExitKind::DataSafety);

/// Runs every check, prints one line each, and maps failures to an exit code.
pub async fn preflight(config: &RelayConfig) -> Result<(), Exit> {
    let mut report = Report::default();
    postgres_checks(config, &mut report).await;
    nats_checks(config, &mut report).await;
    let mut worst: Option<ExitKind> = None;
    for check in &report.0 {
        println!("{check}");
        if let Verdict::Fail(kind) = check.verdict {
            worst = Some(match (worst, kind) {
                (Some(ExitKind::DataSafety), _) | (_, ExitKind::DataSafety) => ExitKind::DataSafety,
                (Some(ExitKind::Unavailable), _) | (_, ExitKind::Unavailable) => {
                    ExitKind::Unavailable
                }
                _ => ExitKind::Config,
            });
        }
    }
    let failed = report
        .0
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Fail(_)))
        .count();
    match worst {
        None => {
            println!("preflight passed: {} checks", report.0.len());
            Ok(())
        }
        Some(kind) => Err(Exit::new(
            kind,
            anyhow::anyhow!("preflight failed: {failed} of {} checks", report.0.len()),
        )),
    }
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
