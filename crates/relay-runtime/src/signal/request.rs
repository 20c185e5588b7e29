//! What a signal row asks for: its `kind` and `args` read into a request, or the reason it
//! cannot be carried out (written back into the row). Pure: no IO.

use std::time::Duration;

use serde::Deserialize;

use outbox_position::{Limits, Target};

use crate::position::{parse_lsn, parse_target_at, parse_time_at};
use crate::progress::Mode;
use crate::replay::ReplayRequest;
use crate::table_backfill::{BackfillRequest, RunOptions};

/// The kinds a signal may have, as the error for an unknown one lists them.
pub const KNOWN_KINDS: &str = "backfill, replay, restore";

/// A signal the relay can carry out.
#[derive(Debug, Clone)]
pub enum SignalRequest {
    Backfill(BackfillRequest),
    Replay(ReplayRequest),
    Restore(RestoreArgs),
}

/// `args` of a `restore` signal: `outbox-relay restore`'s options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreArgs {
    pub from_lsn: String,
    pub to_lsn: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default = "default_restore_in_flight")]
    pub max_in_flight: usize,
}

fn default_restore_in_flight() -> usize {
    256
}

impl RestoreArgs {
    /// The window's bounds as LSNs.
    pub fn bounds(&self) -> Result<(relay_core::Lsn, Option<relay_core::Lsn>), String> {
        let from = parse_lsn(&self.from_lsn).map_err(|e| format!("from_lsn: {e}"))?;
        let to = self
            .to_lsn
            .as_deref()
            .map(parse_lsn)
            .transpose()
            .map_err(|e| format!("to_lsn: {e}"))?;
        Ok((from, to))
    }
}

fn restore(args: serde_json::Value) -> Result<SignalRequest, String> {
    let bad = |why: String| {
        format!(
            "bad args for a restore signal: {why}; expected an object such as {{\"from_lsn\": \"0/195D570\"}}"
        )
    };
    let args: RestoreArgs = serde_json::from_value(args).map_err(|e| bad(e.to_string()))?;
    args.bounds().map_err(bad)?;
    if args.max_in_flight == 0 {
        return Err(bad("max_in_flight must be at least 1".into()));
    }
    Ok(SignalRequest::Restore(args))
}

/// `args` of a `replay` signal: `outbox-relay replay`'s options.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayArgs {
    consumer: String,
    from_lsn: Option<String>,
    since: Option<String>,
    until: Option<String>,
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default)]
    recreate: bool,
    #[serde(default)]
    dry_run: bool,
}

const REPLAY_EXAMPLE: &str = r#"{"consumer": "billing", "from_lsn": "0/16B3748"} or {"consumer": "billing", "since": "15m ago"}"#;

fn replay(
    args: serde_json::Value,
    asked_at: std::time::SystemTime,
) -> Result<SignalRequest, String> {
    let bad = |why: String| {
        format!("bad args for a replay signal: {why}; expected an object such as {REPLAY_EXAMPLE}")
    };
    let args: ReplayArgs = serde_json::from_value(args).map_err(|e| bad(e.to_string()))?;
    if args.consumer.trim().is_empty() {
        return Err(bad("`consumer` is empty".into()));
    }
    let from = match (&args.from_lsn, &args.since) {
        (Some(lsn), None) => {
            Target::Lsn(parse_lsn(lsn).map_err(|e| bad(format!("from_lsn: {e}")))?)
        }
        (None, Some(time)) => {
            Target::Time(parse_time_at(time, asked_at).map_err(|e| bad(format!("since: {e}")))?)
        }
        _ => return Err(bad("give exactly one of `from_lsn` and `since`".into())),
    };
    let until = args
        .until
        .as_deref()
        .map(|t| parse_target_at(t, asked_at))
        .transpose()
        .map_err(|e| bad(format!("until: {e}")))?;
    Ok(SignalRequest::Replay(ReplayRequest {
        from,
        until,
        consumer: args.consumer,
        subjects: args.subjects,
        dry_run: args.dry_run,
        recreate: args.recreate,
        no_map: false,
        limits: Limits::default(),
    }))
}

/// `args` of a `backfill` signal; the defaults are `outbox-relay backfill`'s.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillArgs {
    table: String,
    #[serde(rename = "where", default)]
    filter: Option<String>,
    #[serde(default)]
    restart: bool,
    #[serde(default = "default_page_size")]
    page_size: usize,
    #[serde(default = "default_max_in_flight")]
    max_in_flight: usize,
    #[serde(default)]
    rate: u64,
    #[serde(default = "default_skip_check_limit")]
    skip_check_limit: u64,
}

fn default_page_size() -> usize {
    1000
}
fn default_max_in_flight() -> usize {
    512
}
fn default_skip_check_limit() -> u64 {
    500_000
}

/// Reads a row's `kind` and `args` (JSON text); the error is the reason written into the row.
/// A relative time (`"15m ago"`) counts back from `asked_at`, when the row was inserted, not
/// from when the relay gets to it.
pub fn parse(
    kind: &str,
    args: &str,
    asked_at: std::time::SystemTime,
) -> Result<SignalRequest, String> {
    match kind.trim() {
        "replay" => {
            let args: serde_json::Value = serde_json::from_str(args)
                .map_err(|e| format!("bad args for a replay signal: {e}"))?;
            replay(args, asked_at)
        }
        "restore" => {
            let args: serde_json::Value = serde_json::from_str(args)
                .map_err(|e| format!("bad args for a restore signal: {e}"))?;
            restore(args)
        }
        "backfill" => {
            let args: serde_json::Value = serde_json::from_str(args)
                .map_err(|e| format!("bad args for a backfill signal: {e}"))?;
            if !args.is_object() {
                return Err(format!(
                    "bad args for a backfill signal: {args} is not a JSON object such as {{\"table\": \"public.outbox\"}}"
                ));
            }
            let args: BackfillArgs = serde_json::from_value(args).map_err(|e| {
                format!(
                    "bad args for a backfill signal: {e}; expected an object such as {{\"table\": \"public.outbox\", \"where\": \"created_at > now() - interval '1 day'\", \"restart\": false, \"page_size\": 1000, \"max_in_flight\": 512, \"rate\": 0}}"
                )
            })?;
            if args.page_size == 0 || args.max_in_flight == 0 {
                return Err(
                    "bad args for a backfill signal: page_size and max_in_flight must be at least 1"
                        .into(),
                );
            }
            // The relay checks it again before the backfill (a signal inserted before this
            // check existed); here it is refused before anything connects, and the console
            // refuses it instead of inserting it.
            if let Some(filter) = args.filter.as_deref().map(str::trim)
                && !filter.is_empty()
            {
                relay_backfill::check_one_condition(filter)
                    .map_err(|e| format!("bad args for a backfill signal: {e}"))?;
            }
            Ok(SignalRequest::Backfill(BackfillRequest {
                table: args.table,
                filter: args.filter,
                restart: args.restart,
                options: RunOptions {
                    page_size: args.page_size,
                    max_in_flight: args.max_in_flight,
                    rate: args.rate,
                    skip_check_limit: args.skip_check_limit,
                    progress_interval: Duration::from_secs(30),
                    log_progress: true,
                    progress_mode: Mode::Lines,
                },
            }))
        }
        other => Err(format!(
            "unknown signal kind `{other}`: signals carry out {KNOWN_KINDS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::parse`] of a row asked for now.
    fn parse(kind: &str, args: &str) -> Result<SignalRequest, String> {
        super::parse(kind, args, std::time::SystemTime::now())
    }

    #[test]
    fn a_relative_time_counts_from_when_the_signal_was_asked_for() {
        let asked = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let Ok(SignalRequest::Replay(r)) =
            super::parse("replay", r#"{"consumer": "b", "since": "15m ago"}"#, asked)
        else {
            panic!("refused");
        };
        assert_eq!(
            r.from,
            Target::Time(asked - std::time::Duration::from_secs(900))
        );
    }

    fn backfill(args: &str) -> BackfillRequest {
        match parse("backfill", args) {
            Ok(SignalRequest::Backfill(request)) => request,
            Ok(other) => panic!("not a backfill: {other:?}"),
            Err(e) => panic!("refused {args}: {e}"),
        }
    }

    #[test]
    fn a_backfill_takes_the_command_defaults() {
        let request = backfill(r#"{"table": "public.outbox"}"#);
        assert_eq!(request.table, "public.outbox");
        assert_eq!(request.filter, None);
        assert!(!request.restart);
        assert_eq!(request.options.page_size, 1000);
        assert_eq!(request.options.max_in_flight, 512);
        assert_eq!(request.options.rate, 0);
        assert!(request.options.log_progress);
    }

    #[test]
    fn a_backfill_reads_every_argument() {
        let request = backfill(
            r#"{"table": "orders_outbox", "where": "id > 5", "restart": true, "page_size": 10, "max_in_flight": 4, "rate": 100, "skip_check_limit": 0}"#,
        );
        assert_eq!(request.filter.as_deref(), Some("id > 5"));
        assert!(request.restart);
        assert_eq!(
            (
                request.options.page_size,
                request.options.max_in_flight,
                request.options.rate,
                request.options.skip_check_limit
            ),
            (10, 4, 100, 0)
        );
    }

    #[test]
    fn a_misspelt_argument_is_named_with_the_known_ones() {
        let error = parse("backfill", r#"{"tabel": "outbox"}"#).unwrap_err();
        assert!(error.contains("unknown field `tabel`"), "{error}");
        assert!(error.contains("`table`"), "{error}");
    }

    #[test]
    fn a_filter_that_leaves_its_parentheses_or_the_statement_is_refused() {
        let error = parse(
            "backfill",
            r#"{"table": "outbox", "where": "aggregateid = '1') OR (true"}"#,
        )
        .unwrap_err();
        assert!(
            error.contains("`aggregateid = '1') OR (true` closes a parenthesis it did not open")
                && error.contains("give one condition"),
            "{error}"
        );
        let error = parse(
            "backfill",
            r#"{"table": "outbox", "where": "true; DELETE FROM outbox"}"#,
        )
        .unwrap_err();
        assert!(error.contains("holds a `;`"), "{error}");
        let error = parse("backfill", r#"{"table": "outbox", "where": "true -- x"}"#).unwrap_err();
        assert!(error.contains("comment"), "{error}");
        let request = backfill(r#"{"table": "outbox", "where": "aggregateid = ')'"}"#);
        assert_eq!(request.filter.as_deref(), Some("aggregateid = ')'"));
    }

    #[test]
    fn a_backfill_without_a_table_is_refused() {
        let error = parse("backfill", "{}").unwrap_err();
        assert!(error.contains("missing field `table`"), "{error}");
    }

    #[test]
    fn arguments_of_the_wrong_type_are_refused() {
        let error = parse("backfill", r#"{"table": "outbox", "page_size": "ten"}"#).unwrap_err();
        assert!(error.contains("invalid type"), "{error}");
        let error = parse("backfill", r#"{"table": "outbox", "page_size": 0}"#).unwrap_err();
        assert!(error.contains("at least 1"), "{error}");
        let error = parse("backfill", r#"["outbox"]"#).unwrap_err();
        assert!(error.contains("bad args"), "{error}");
    }

    #[test]
    fn unknown_kinds_and_bad_restores_say_what_to_do() {
        let error = parse("snapshot", "{}").unwrap_err();
        assert!(
            error.contains("unknown signal kind `snapshot`")
                && error.contains("backfill, replay, restore"),
            "{error}"
        );
        let error = parse("restore", "{}").unwrap_err();
        assert!(error.contains("missing field `from_lsn`"), "{error}");
        let error = parse("restore", r#"{"from_lsn": "x"}"#).unwrap_err();
        assert!(error.contains("from_lsn: "), "{error}");
        assert!(matches!(
            parse(
                "restore",
                r#"{"from_lsn": "0/195D570", "to_lsn": "0/2000000"}"#
            ),
            Ok(SignalRequest::Restore(RestoreArgs {
                max_in_flight: 256,
                dry_run: false,
                ..
            }))
        ));
    }

    #[test]
    fn a_replay_takes_one_start_and_a_consumer() {
        let Ok(SignalRequest::Replay(r)) = parse(
            "replay",
            r#"{"consumer": "billing", "from_lsn": "0/16B3748", "subjects": ["outbox.>"]}"#,
        ) else {
            panic!("refused");
        };
        assert_eq!(r.from, Target::Lsn(relay_core::Lsn(0x16B3748)));
        assert_eq!(r.consumer, "billing");
        assert_eq!(r.subjects, vec!["outbox.>".to_owned()]);
        assert!(!r.recreate && !r.dry_run);
        assert!(matches!(
            parse("replay", r#"{"consumer": "b", "since": "15m ago"}"#),
            Ok(SignalRequest::Replay(ReplayRequest {
                from: Target::Time(_),
                ..
            }))
        ));
        let both = parse(
            "replay",
            r#"{"consumer": "b", "since": "15m ago", "from_lsn": "0/1"}"#,
        );
        assert!(both.unwrap_err().contains("exactly one"));
        let neither = parse("replay", r#"{"consumer": "b"}"#).unwrap_err();
        assert!(neither.contains("exactly one"), "{neither}");
        let bad_lsn = parse("replay", r#"{"consumer": "b", "from_lsn": "nope"}"#).unwrap_err();
        assert!(bad_lsn.contains("from_lsn"), "{bad_lsn}");
        let no_consumer = parse("replay", r#"{"from_lsn": "0/1"}"#).unwrap_err();
        assert!(
            no_consumer.contains("missing field `consumer`"),
            "{no_consumer}"
        );
    }
}
