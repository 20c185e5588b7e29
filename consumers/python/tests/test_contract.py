"""The package's contract copy against the crate's, and the rules of contract.json."""

from pathlib import Path

import pytest

from outbox_consumer import contract as c
from outbox_consumer.event import Event, InvalidMessage

PKG = Path(c.__file__).parent
REPO = Path(__file__).resolve().parents[3]


def test_the_packaged_copies_are_the_crates_files_byte_for_byte():
    assert (PKG / "contract.json").read_bytes() == (
        REPO / "crates/outbox-contract/contract.json"
    ).read_bytes(), "run scripts/consumers-test.sh --sync (copies contract.json)"
    assert (PKG / "ledger.sql").read_bytes() == (
        REPO / "crates/outbox-consumer/migrations/0001_consumer_ledger.sql"
    ).read_bytes()


def test_lsn_text_form_follows_the_contract_examples():
    lsn = c.CONTRACT["lsn"]
    for ex in lsn["format_examples"]:
        assert c.format_lsn(int(ex["value"])) == ex["text"]
        assert c.parse_lsn(ex["text"]) == int(ex["value"])
    for ex in lsn["parse_examples"]:
        assert c.parse_lsn(ex["text"]) == int(ex["value"])
    for bad in lsn["invalid"] + ["0/1\n"]:
        with pytest.raises(c.LsnError):
            c.parse_lsn(bad)


def test_reserved_headers_are_renamed_and_others_kept():
    assert c.original_name("Nats-Expected-Stream") == "Outbox-Original-Expected-Stream"
    assert c.original_name("nats-msg-id") == "Outbox-Original-msg-id"
    for name in c.CONTRACT["lists"]["STREAM_BINDING_HEADERS"] + c.CONTRACT["lists"][
        "SERVER_ACTION_HEADERS"
    ]:
        kept = c.original_name(name)
        assert kept.startswith(c.HEADER_ORIGINAL_PREFIX) and "nats-" not in kept.lower()
    for name in ["Outbox-Commit-Lsn", "traceparent", "Nats", "X-Nats-Msg-Id", ""]:
        assert c.original_name(name) is None


def test_dead_letter_reason_ids_and_source():
    assert c.sanitize_reason("a\r\nb") == "a  b"
    long = c.sanitize_reason("é" * 2000)
    assert len(long.encode()) <= c.REASON_MAX_BYTES and set(long) == {"é"}
    assert c.dead_letter_id("svc", "e1", "OUTBOX", 9) == "dlq:svc:e1"
    assert c.dead_letter_id("svc", "", "OUTBOX", 9) == "dlq:svc:OUTBOX:9"
    assert c.dead_letter_id("svc", "e{seq}", "OUTBOX", 9) == "dlq:svc:e{seq}"
    assert c.dead_letter_source("OUTBOX", 9) == "OUTBOX:9"


def test_events_read_the_relay_headers():
    e = Event.from_parts(
        "outbox.Order.created",
        {
            "Nats-Msg-Id": " e1 ",
            "Outbox-Commit-Lsn": "0/16B3748",
            "Outbox-Xid": "771",
            "Outbox-Commit-Time": "2026-11-29T11:38:44.123456789Z",
            "Outbox-Tx-Index": "x",
            "Outbox-Event-Type": "created",
        },
        b"{}",
        5,
        2,
    )
    assert (e.id, e.commit_lsn, e.xid, e.tx_index, e.event_type) == (
        "e1", 0x16B3748, 771, None, "created")
    assert e.commit_time.isoformat() == "2026-11-29T11:38:44.123456+00:00"
    scheduled = Event.from_parts("s", {"Outbox-Event-Id": "e2"}, b"")
    assert scheduled.id == "e2"
    with pytest.raises(InvalidMessage):
        Event.from_parts("s", {"Nats-Msg-Id": "  "}, b"")
