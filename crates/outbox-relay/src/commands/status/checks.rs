//! `status`' assessments: the retention window, the replay window and failover, each a
//! headline and its checks (warnings with their hint).

use relay_core::check::{CheckReport, Verdict};
use relay_ops::status::report::Section;
use relay_postgres::catalog::failover::FailoverReport;
use relay_postgres::catalog::retention::RetentionReport;
use relay_postgres::checkpoint::ReplayWindowReport;

use super::opt;

/// The retention window (see `relay_postgres::catalog::retention`): the headline, the numbers,
/// then each check, nested under it (warnings with their hint).
pub(super) fn retention_lines(r: &Section<RetentionReport>) -> Vec<String> {
    let r = match r.as_result() {
        Err(e) => return vec![format!("retention window: {e}")],
        Ok(r) => r,
    };
    let mut out = vec![
        format!("retention window: {}", r.headline),
        format!("  {}", r.numbers),
    ];
    out.extend(check_lines(&r.checks));
    out
}

/// The WAL kept behind the checkpoint for `outbox-relay restore`; `setting` is
/// `[relay] replay_retention`.
pub(super) fn replay_window_lines(
    w: &Section<ReplayWindowReport>,
    setting: Option<&str>,
) -> Vec<String> {
    let setting = setting.unwrap_or("not set");
    match w.as_result() {
        Err(e) => vec![format!("replay window (replay_retention {setting}): {e}")],
        Ok(w) => {
            let mut out = vec![format!(
                "replay window (replay_retention {setting}): {}",
                w.summary
            )];
            if let Some(warning) = &w.warning {
                out.push(format!("  WARN {warning}: {}", opt(&w.hint)));
            }
            out
        }
    }
}

/// What a failover needs (see `relay_postgres::catalog::failover`): the server's role and the
/// slot's flags, then each check, warnings with their hint.
pub(super) fn failover_lines(f: &Section<FailoverReport>) -> Vec<String> {
    let f = match f.as_result() {
        Err(e) => return vec![format!("failover: {e}")],
        Ok(f) => f,
    };
    if let Some(e) = &f.error {
        return vec![format!("failover: {e}")];
    }
    let flags = match &f.slot {
        None => "slot missing".to_owned(),
        Some(slot) => format!("slot failover {}, synced {}", slot.failover, slot.synced),
    };
    let extra = match &f.synchronized_standby_slots {
        Some(list) => format!(
            ", synchronized_standby_slots {}",
            if list.is_empty() {
                "empty".to_owned()
            } else {
                list.join(",")
            }
        ),
        None => String::new(),
    };
    let mut out = vec![format!(
        "failover: {} (timeline {}), {flags}{extra}",
        f.server,
        opt(&f.timeline)
    )];
    out.extend(check_lines(f.checks.as_deref().unwrap_or_default()));
    out
}

/// Each check as `    VERDICT  check: detail`, then its hint on a line of its own where it
/// has one.
pub(super) fn check_lines(checks: &[CheckReport]) -> Vec<String> {
    let mut lines = Vec::new();
    for check in checks {
        let verdict = match check.verdict {
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Pass => "PASS",
        };
        lines.push(format!("    {verdict}  {}: {}", check.check, check.detail));
        if let Some(hint) = &check.hint {
            lines.push(format!("          hint: {hint}"));
        }
    }
    lines
}
