//! What a signal row asks for: its `kind` and `args` read into a request, or the reason it
//! cannot be carried out (written back into the row). Pure: no IO.

use std::time::Duration;

use serde::Deserialize;

use crate::progress::Mode;
use crate::table_backfill::{BackfillRequest, RunOptions};

/// The kinds a signal may have, as the error for an unknown one lists them.
pub const KNOWN_KINDS: &str = "backfill";

/// A signal the relay can carry out.
#[derive(Debug, Clone)]
pub enum SignalRequest {
    Backfill(BackfillRequest),
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
pub fn parse(kind: &str, args: &str) -> Result<SignalRequest, String> {
    match kind.trim() {
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
        other @ ("replay" | "restore") => Err(format!(
            "signal kind `{other}` is not carried out from SQL: run `outbox-relay {other}` on the relay's host (signals carry out: {KNOWN_KINDS})"
        )),
        other => Err(format!(
            "unknown signal kind `{other}`: signals carry out {KNOWN_KINDS}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backfill(args: &str) -> BackfillRequest {
        match parse("backfill", args) {
            Ok(SignalRequest::Backfill(request)) => request,
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
    fn unknown_kinds_and_host_only_kinds_say_what_to_do() {
        let error = parse("snapshot", "{}").unwrap_err();
        assert!(
            error.contains("unknown signal kind `snapshot`") && error.contains("backfill"),
            "{error}"
        );
        let error = parse("replay", "{}").unwrap_err();
        assert!(error.contains("`outbox-relay replay`"), "{error}");
    }
}
