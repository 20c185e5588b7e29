//! One verdict of a preflight assessment (broker durability, the slot's retention window, ...):
//! what was checked, what was found, and the fix when it is a warning. Shared so that every
//! assessment reads, prints and serialises its findings the same way.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an assessment's checks are about: each aspect has a name for check lines and logs.
pub trait CheckAspect: Copy {
    /// The name used in check lines, logs and JSON.
    fn name(self) -> &'static str;
}

/// The verdict on one aspect: fine when `hint` is `None`, a warning with the fix otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check<A> {
    /// What was checked.
    pub aspect: A,
    /// What was found, with the numbers.
    pub detail: String,
    /// How to fix it; `Some` makes this a warning.
    pub hint: Option<String>,
}

impl<A: CheckAspect> Check<A> {
    /// A passing check.
    pub fn ok(aspect: A, detail: impl Into<String>) -> Self {
        Self {
            aspect,
            detail: detail.into(),
            hint: None,
        }
    }

    /// A warning, with its fix.
    pub fn warn(aspect: A, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            aspect,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }

    /// Whether this is a warning.
    #[must_use]
    pub fn is_warning(&self) -> bool {
        self.hint.is_some()
    }

    /// This check as `status --json` and `/status` show it.
    #[must_use]
    pub fn report(&self) -> CheckReport {
        CheckReport {
            check: self.aspect.name().to_owned(),
            verdict: if self.is_warning() {
                Verdict::Warn
            } else {
                Verdict::Pass
            },
            detail: self.detail.clone(),
            hint: self.hint.clone(),
        }
    }

    /// `{"check", "verdict", "detail", "hint"}` for `status --json` and `/status`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }
}

/// A check's verdict as reports show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Fine.
    Pass,
    /// A warning, with its fix.
    Warn,
    /// A failure.
    Fail,
}

/// One check as `status --json` and `/status` show it: `{"check", "verdict", "detail", "hint"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// What was checked.
    pub check: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// The fix (`null` when it passed).
    pub hint: Option<String>,
}

/// Every check as reports show them, in order.
#[must_use]
pub fn check_reports<A: CheckAspect>(checks: &[Check<A>]) -> Vec<CheckReport> {
    checks.iter().map(Check::report).collect()
}

/// Every check as JSON, in order.
#[must_use]
pub fn checks_json<A: CheckAspect>(checks: &[Check<A>]) -> Value {
    Value::Array(checks.iter().map(Check::to_json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Disk;
    impl CheckAspect for Disk {
        fn name(self) -> &'static str {
            "disk"
        }
    }

    #[test]
    fn a_check_with_a_hint_is_a_warning_and_says_so_in_json() {
        let ok = Check::ok(Disk, "fine");
        let warn = Check::warn(Disk, "full", "delete files");
        assert!(!ok.is_warning() && warn.is_warning());
        assert_eq!(
            checks_json(&[ok, warn]),
            json!([
                {"check": "disk", "verdict": "pass", "detail": "fine", "hint": null},
                {"check": "disk", "verdict": "warn", "detail": "full", "hint": "delete files"},
            ])
        );
    }
}
