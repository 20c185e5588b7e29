//! The preflight of `outbox-relay validate --connect`: a read-only look at everything a relay
//! needs, as a list of [`Check`]s (`PASS`, `WARN` or `FAIL`), each failure with a hint that
//! fixes it. The binary prints them and maps the [`worst`] failure to its exit code.

mod nats;
mod postgres;

use std::fmt;

use crate::config::RelayConfig;
use crate::failure::FailureKind;

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
    postgres_checks(config, &mut report).await;
    nats_checks(config, &mut report).await;
    report.0
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
