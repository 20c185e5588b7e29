"""The wire contract with outbox-relay, read from ``contract.json``.

``contract.json`` is a copy of ``crates/outbox-contract/contract.json``, the file the Rust crate
``outbox-contract`` is tested against; every header name this package uses comes from it, none
is written out here.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Mapping, Optional

CONTRACT: Mapping[str, Any] = json.loads(
    resources.files(__package__).joinpath("contract.json").read_text(encoding="utf-8")
)
_C: Mapping[str, str] = CONTRACT["constants"]

HEADER_MSG_ID: str = _C["HEADER_MSG_ID"]
HEADER_EXPECTED_STREAM: str = _C["HEADER_EXPECTED_STREAM"]
HEADER_COMMIT_LSN: str = _C["HEADER_COMMIT_LSN"]
HEADER_XID: str = _C["HEADER_XID"]
HEADER_COMMIT_TIME: str = _C["HEADER_COMMIT_TIME"]
HEADER_TABLE: str = _C["HEADER_TABLE"]
HEADER_TX_INDEX: str = _C["HEADER_TX_INDEX"]
HEADER_MESSAGE_PREFIX: str = _C["HEADER_MESSAGE_PREFIX"]
HEADER_BACKFILL: str = _C["HEADER_BACKFILL"]
HEADER_AGGREGATE_TYPE: str = _C["HEADER_AGGREGATE_TYPE"]
HEADER_AGGREGATE_ID: str = _C["HEADER_AGGREGATE_ID"]
HEADER_EVENT_TYPE: str = _C["HEADER_EVENT_TYPE"]
HEADER_TRACEPARENT: str = _C["HEADER_TRACEPARENT"]
HEADER_EVENT_ID: str = _C["HEADER_EVENT_ID"]
HEADER_SCHEMA: str = _C["HEADER_SCHEMA"]
CONTRACTS_BUCKET: str = _C["CONTRACTS_BUCKET"]
HEADER_DLQ_REASON: str = _C["HEADER_DLQ_REASON"]
HEADER_DLQ_SUBJECT: str = _C["HEADER_DLQ_SUBJECT"]
HEADER_DLQ_EVENT_ID: str = _C["HEADER_DLQ_EVENT_ID"]
HEADER_DLQ_DELIVERIES: str = _C["HEADER_DLQ_DELIVERIES"]
HEADER_DLQ_CONSUMER: str = _C["HEADER_DLQ_CONSUMER"]
HEADER_DLQ_SOURCE: str = _C["HEADER_DLQ_SOURCE"]
RESERVED_PREFIX: str = _C["RESERVED_PREFIX"]
HEADER_ORIGINAL_PREFIX: str = _C["HEADER_ORIGINAL_PREFIX"]

DEAD_LETTER: Mapping[str, Any] = CONTRACT["dead_letter"]
REASON_MAX_BYTES: int = DEAD_LETTER["reason_max_bytes"]
LEDGER_TABLE: str = CONTRACT["ledger"]["table"]

_LSN_PATTERN = re.compile(CONTRACT["lsn"]["pattern"])


class LsnError(ValueError):
    """A text that is not an LSN in PostgreSQL's form."""

    def __init__(self, text: str):
        super().__init__(
            f"invalid LSN {text!r}: expected two hex numbers of at most 8 digits separated by '/'"
            " (e.g. 0/16B3748)"
        )
        self.text = text


def parse_lsn(text: str) -> int:
    """``0/16B3748`` -> 23803720 (either case; nothing else around it)."""
    # fullmatch: `$` alone would accept a trailing newline.
    if not isinstance(text, str) or not _LSN_PATTERN.fullmatch(text):
        raise LsnError(str(text))
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(value: int) -> str:
    """23803720 -> ``0/16B3748`` (uppercase, unpadded, as PostgreSQL prints it)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"LSN {value} is not a 64-bit unsigned integer")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def is_reserved(name: str) -> bool:
    """Whether ``name`` is in NATS's reserved ``Nats-`` namespace (ASCII case-insensitive)."""
    return name[: len(RESERVED_PREFIX)].lower() == RESERVED_PREFIX.lower()


def original_name(name: str) -> Optional[str]:
    """``Nats-Msg-Id`` -> ``Outbox-Original-Msg-Id``; ``None`` for a header copied as it is."""
    if not is_reserved(name):
        return None
    return HEADER_ORIGINAL_PREFIX + name[len(RESERVED_PREFIX) :]


def sanitize_reason(reason: str) -> str:
    """One line of at most ``REASON_MAX_BYTES`` UTF-8 bytes (header values hold no CR/LF)."""
    line = "".join(" " if _is_control(c) else c for c in reason)
    data = line.encode("utf-8")
    if len(data) <= REASON_MAX_BYTES:
        return line
    return data[:REASON_MAX_BYTES].decode("utf-8", errors="ignore")


def _is_control(c: str) -> bool:
    # Rust's char::is_control: the Cc category (C0, DEL, C1).
    o = ord(c)
    return o < 0x20 or 0x7F <= o <= 0x9F


def dead_letter_id(consumer: str, event_id: str, stream: str, seq: int) -> str:
    """The dead letter's own ``Nats-Msg-Id``: from the event, so a second park is deduplicated."""
    key = "msg_id" if event_id else "msg_id_without_event_id"
    return _fill(DEAD_LETTER[key], consumer=consumer, event_id=event_id, stream=stream, seq=seq)


def dead_letter_source(stream: str, seq: int) -> str:
    return _fill(DEAD_LETTER["source"], stream=stream, seq=seq)


def reason_text(kind: str, **values: Any) -> str:
    """A dead-letter reason from the contract's templates (``retries_exhausted``, ...)."""
    return _fill(DEAD_LETTER["reasons"][kind], **values)


def _fill(template: str, **values: Any) -> str:
    # One pass, not str.format: an event id may hold braces or a `{seq}` of its own.
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]), template)
