use std::collections::BTreeMap;

use relay_core::check::{CheckReport, Verdict};
use relay_ops::status::StatusReport;
use relay_ops::status::report::{
    BackfillReport, BackfillState, CheckpointReport, RelayAnswer, Section, StatusDoc, StreamState,
    TableCleanup, TableReport,
};
use relay_postgres::catalog::SlotReport;
use relay_postgres::catalog::failover::{FailoverReport, SlotFailoverReport};
use relay_postgres::checkpoint::ReplayWindowReport;
use serde_json::json;

use super::checks::check_lines;
use super::*;

fn check(name: &str, verdict: Verdict, detail: &str, hint: Option<&str>) -> CheckReport {
    CheckReport {
        check: name.to_owned(),
        verdict,
        detail: detail.to_owned(),
        hint: hint.map(str::to_owned),
    }
}

#[test]
fn checks_print_their_verdict_and_the_hint_of_those_that_have_one() {
    let checks = [
        check("wal_keep", Verdict::Pass, "1 GB", None),
        check(
            "budget",
            Verdict::Warn,
            "2 min left",
            Some("raise max_slot_wal_keep_size"),
        ),
        check(
            "role",
            Verdict::Fail,
            "standby",
            Some("connect to the primary"),
        ),
    ];
    assert_eq!(
        check_lines(&checks),
        [
            "    PASS  wal_keep: 1 GB",
            "    WARN  budget: 2 min left",
            "          hint: raise max_slot_wal_keep_size",
            "    FAIL  role: standby",
            "          hint: connect to the primary",
        ]
    );
    assert!(check_lines(&[]).is_empty(), "no checks, no lines");
}

/// A relay's `/status` as it serves it, trimmed to one table and one contract.
fn relay_status() -> RelayAnswer {
    let doc = json!({
        "version": "1.2.3", "commit": "abc", "uptime_seconds": 42, "ready": false,
        "reasons": ["nats: not connected"],
        "postgres": {
            "slot": "outbox", "streaming": true, "reconnects": 0, "last_error": null,
            "checkpoint_lsn": "0/10", "slot_state": null, "retention": null,
            "tables": {"public.outbox": {
                "rows_estimate": 10.0, "size_bytes": 8192,
                "oldest_unconfirmed_age_seconds": 3.4,
                "cleanup": {"mode": "delete", "rows_cleaned": 5, "partitions_dropped": 0,
                            "waiting_for_checkpoint": 1, "errors": 2, "last_error": "boom"}
            }}
        },
        "nats": {"connected": false, "reconnects": 1, "stream": "OUTBOX",
                 "stream_present": true, "stream_last_sequence": 7, "stream_messages": 7},
        "pipeline": {"events_received": 9, "events_published": 7, "changes_skipped": 0,
                     "duplicates_acknowledged": 0, "publish_retries": 0, "outstanding_acks": 2,
                     "last_stream_seq": 7, "last_acked_commit_time": null},
        "contracts": [{"contract": "order.created", "file": "c.json", "tables": ["public.outbox"],
                       "checked": 3, "refused": 1,
                       "last_refused": {"table": "public.outbox", "event_id": "e1", "reason": "bad"}}]
    });
    let status = serde_json::from_value(doc.clone()).expect("a relay's /status");
    assert_eq!(
        serde_json::to_value(&status).expect("json"),
        doc,
        "read back as served"
    );
    RelayAnswer::Status(Box::new(status))
}

// Long: one fake document with every section filled in
fn doc() -> StatusDoc {
    let relay = relay_status();
    let running = relay.status().expect("status").postgres.tables["public.outbox"].clone();
    StatusDoc {
        slot: "outbox".to_owned(),
        slot_state: Some(SlotReport {
            slot_type: "logical".to_owned(),
            plugin: Some("pgoutput".to_owned()),
            database: Some("app".to_owned()),
            active_pid: None,
            wal_status: Some("reserved".to_owned()),
            confirmed_flush_lsn: Some("0/20".to_owned()),
            restart_lsn: Some("0/8".to_owned()),
            lag_bytes: Some(16),
            retained_wal_bytes: Some(24),
            safe_wal_size: None,
        }),
        checkpoint: Some(CheckpointReport {
            lsn: "0/10".to_owned(),
            stored_seconds_ago: 2.6,
        }),
        slot_minus_checkpoint_bytes: Some(16),
        retention: Section::Failed {
            error: "cannot read the retention window: gone".to_owned(),
        },
        replay_window: Section::Read(ReplayWindowReport {
            checkpoint: Some("0/10".to_owned()),
            restore_from_lsn: None,
            restart_lsn: None,
            window_bytes: None,
            retained_wal_bytes: None,
            since: None,
            max_slot_wal_keep_size: None,
            summary: "none kept".to_owned(),
            warning: Some("near the limit".to_owned()),
            hint: Some("raise it".to_owned()),
        }),
        failover: Section::Read(FailoverReport {
            server: "primary".to_owned(),
            version_num: 170_000,
            timeline: Some(1),
            slot: Some(SlotFailoverReport {
                failover: true,
                synced: false,
                temporary: false,
                invalidated: None,
                confirmed_flush_lsn: None,
            }),
            synchronized_standby_slots: Some(vec![]),
            standbys: Some(vec![]),
            checks: Some(vec![check("slot", Verdict::Pass, "failover on", None)]),
            error: None,
        }),
        stream: "OUTBOX".to_owned(),
        stream_state: StreamState::Missing { present: false },
        relay: Some("127.0.0.1:9100".to_owned()),
        relay_status: Some(relay),
        tables: BTreeMap::from([(
            "public.outbox".to_owned(),
            Section::Read(TableReport {
                rows_estimate: 10.4,
                size_bytes: 8192,
                oldest_unconfirmed_age_seconds: Some(3.4),
                oldest_unconfirmed_measured_by: "relay".to_owned(),
                cleanup: Some(TableCleanup {
                    mode: "delete".to_owned(),
                    retain_seconds: 60,
                    running: running.cleanup,
                }),
            }),
        )]),
        backfills: Section::Read(vec![BackfillReport {
            table: "public.orders".to_owned(),
            filter: Some("id > 5".to_owned()),
            on_create: false,
            state: BackfillState::Stopped,
            rows_done: 50,
            rows_estimate: Some(100),
            percent: Some(50.0),
            key_column: "id".to_owned(),
            last_key: Some("55".to_owned()),
            end_key: None,
            started_at: "2026-01-01T00:00:00Z".to_owned(),
            finished_at: None,
            updated_seconds_ago: 120.0,
        }]),
    }
}

#[test]
fn the_text_shows_every_section_from_the_typed_report() {
    assert_eq!(
        text::lines(&doc(), Some("1h")),
        [
            "slot outbox: wal_status reserved, active pid -",
            "  confirmed_flush_lsn 0/20, lag 16 bytes, retained WAL 24 bytes, safe_wal_size -",
            "retention window: cannot read the retention window: gone",
            "replay window (replay_retention 1h): none kept",
            "  WARN near the limit: raise it",
            "table public.outbox: about 10 rows, 8192 bytes; oldest row not yet confirmed created 3s ago (relay)",
            "  cleanup delete (retain 60s): 5 rows cleaned, 0 partitions dropped, 1 waiting for the checkpoint, 2 failed rounds (last: boom)",
            "backfill public.orders where id > 5: 50 rows done of ~100 (50%), started 2026-01-01T00:00:00Z; STOPPED: no progress for 120.0s; run the same `outbox-relay backfill` again to resume at key 55",
            "failover: primary (timeline 1), slot failover true, synced false, synchronized_standby_slots empty",
            "    PASS  slot: failover on",
            "checkpoint 0/10 stored 3s ago; SLOT AHEAD by 16 bytes",
            "stream OUTBOX: missing",
            "relay 127.0.0.1:9100: NOT READY (version 1.2.3, up 42s)",
            "  reason: nats: not connected",
            "  published 7, outstanding acks 2, last stream seq 7, last acknowledged commit -",
            "  contract order.created (c.json): 3 checked, 1 refused",
            "    last refused: event e1 in public.outbox: bad",
        ]
    );
}

#[test]
fn without_a_relay_or_a_checkpoint_the_text_says_so() {
    let mut doc = doc();
    doc.relay = None;
    doc.relay_status = None;
    doc.checkpoint = None;
    doc.slot_state = None;
    doc.stream_state = StreamState::Failed {
        error: "no servers".to_owned(),
    };
    let lines = text::lines(&doc, None);
    assert_eq!(lines[0], "slot outbox: missing");
    assert_eq!(
        lines[2],
        "replay window (replay_retention not set): none kept"
    );
    let tail = &lines[lines.len() - 3..];
    assert_eq!(
        tail,
        [
            "checkpoint: none stored",
            "stream OUTBOX: no servers",
            "relay: no [http] listen configured (pass --relay host:port)",
        ]
    );
}

#[test]
fn the_json_keeps_its_shapes_error_objects_and_nulls() {
    let mut doc = doc();
    doc.relay_status = None;
    let json = serde_json::to_value(&doc).expect("json");
    assert_eq!(
        json["retention"],
        json!({"error": "cannot read the retention window: gone"})
    );
    assert_eq!(json["stream_state"], json!({"present": false}));
    assert_eq!(json["relay_status"], json!(null));
    assert_eq!(
        json["checkpoint"],
        json!({"lsn": "0/10", "stored_seconds_ago": 2.6})
    );
    assert_eq!(json["backfills"][0]["state"], "stopped");
    assert_eq!(json["backfills"][0]["end_key"], json!(null));
    assert!(
        json["failover"].get("error").is_none(),
        "no error key: {json}"
    );
    assert_eq!(
        json["tables"]["public.outbox"]["cleanup"]["running"]["errors"],
        2
    );
}

#[test]
fn a_slot_ahead_or_lost_is_a_data_safety_problem() {
    let report = |lost, ahead| StatusReport {
        doc: doc(),
        lost,
        ahead,
    };
    assert_eq!(data_safety_problem(&report(false, false)), None);
    assert_eq!(data_safety_problem(&report(true, false)), Some("lost"));
    assert_eq!(
        data_safety_problem(&report(true, true)),
        Some("ahead of the stored checkpoint")
    );
}
