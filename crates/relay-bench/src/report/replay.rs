//! Going-back-in-time rows: backfill beside a live load, `position` on a large stream.

use std::fmt::Write as _;

use crate::workload::{BackfillRun, PositionRun};

use super::verdict;

const ANSWER_TARGET_MS: f64 = 50.0;

pub(super) fn backfill_rows(out: &mut String, b: &BackfillRun) {
    let ratio = b.rows_per_s / b.broker;
    let problem = b
        .problem
        .as_deref()
        .map(|p| format!("; **{p}**"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "| **Backfill**, {} rows written before the slot (`outbox-relay backfill --table public.outbox`, defaults; {:.2} s process wall time, beside the live load below){problem} | {:.0} rows/s | broker {:.0}/s | {:.0}% | >= 90% | {} |",
        b.rows,
        b.secs,
        b.rows_per_s,
        b.broker,
        ratio * 100.0,
        verdict(ratio >= 0.9 && b.problem.is_none()),
    );
    let _ = writeln!(
        out,
        "| **Latency during the backfill**, live commit→ack at {}/s (achieved {:.0}/s, {} events committed while it ran) | p50 {:.2} ms, p99 {:.2} ms (max {:.1}) | | | p99 <= 50 ms | {} |",
        b.live_target,
        b.live_achieved,
        b.live_samples,
        b.live_p50_ms,
        b.live_p99_ms,
        b.live_max_ms,
        verdict(b.live_p99_ms <= 50.0 && b.live_samples > 0),
    );
}

/// `trace` answers in a stream of millions, the row's time known.
const TRACE_TARGET_MS: f64 = 1000.0;

pub(super) fn position_rows(out: &mut String, p: &PositionRun) {
    for t in &p.traces {
        let wrong = if t.wrong > 0 {
            format!("; **{} wrong answers**", t.wrong)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| **trace** of an event on a {}-message stream, the row's time known ({}){wrong} | process p50 {:.0} ms, max {:.0} ms ({} runs) | | | < 1 s per answer | {} |",
            p.messages,
            t.label,
            t.p50_ms,
            t.max_ms,
            t.runs,
            verdict(t.max_ms < TRACE_TARGET_MS && t.wrong == 0),
        );
    }
    for l in &p.lookups {
        let wrong = if l.wrong > 0 {
            format!("; **{} wrong answers**", l.wrong)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| **position {}** on a {}-message stream ({}; read <= {} messages, <= {} direct gets){wrong} | query p50 {:.1} ms, max {:.1} ms ({} lookups); process p50 {:.0} ms, max {:.0} ms ({} runs) | | | <= 50 ms per answer (query) | {} |",
            l.label,
            p.messages,
            l.method,
            l.max_scanned,
            l.max_gets,
            l.query_p50_ms,
            l.query_max_ms,
            l.queries,
            l.process_p50_ms,
            l.process_max_ms,
            l.processes,
            verdict(l.query_max_ms <= ANSWER_TARGET_MS && l.wrong == 0),
        );
    }
}

pub(super) fn notes(
    out: &mut String,
    backfill: Option<&BackfillRun>,
    position: Option<&PositionRun>,
) {
    if backfill.is_some() {
        let _ = writeln!(
            out,
            "Backfill: rows written in 1,000-row transactions, then the relay's slot created and the relay started; `outbox-relay backfill` timed from spawn to exit while 1-row transactions of aggregate `Live` arrive (their latency read as above, subject `outbox.Live.>`, only rows committed while the backfill ran); broker limit = raw publishes of as many messages, before the relay started. Then the stream must hold every row and every live event exactly once."
        );
    }
    if let Some(p) = position {
        let _ = writeln!(
            out,
            "Position: stream filled with raw publishes carrying the relay's headers ({}-event transactions, commit time = publish time) in {:.0} s; `outbox_relay.position_map` with one anchor per {} messages ({} anchors); query = the map's start (`relay_postgres::checkpoint::map_start`) + `outbox_position::locate` in the bench process; process = `outbox-relay position … --json` wall time (start-up, connections, map summary); every answer checked against the filled sequence. Pruned: only the newest anchor left, so lookups search the stream (default 5 s clock margin: the scan reads what the stream stored in the 5 s before the target, here at the fill's {:.0} msgs/s).",
            10,
            p.fill_secs,
            p.anchor_every,
            p.anchors,
            p.messages as f64 / p.fill_secs,
        );
    }
}
