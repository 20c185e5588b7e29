"""The typed event read from one relay message."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from . import contract as c


class InvalidMessage(ValueError):
    """A message that cannot be handled as an outbox event (no event id, not from JetStream)."""


@dataclass(frozen=True)
class Event:
    """One outbox event as a handler sees it.

    Optional headers that are absent, empty or unparsable are ``None``; the raw values stay in
    ``headers``.
    """

    id: str
    subject: str
    payload: bytes
    stream_sequence: int = 0
    delivered: int = 1
    commit_lsn: Optional[int] = None
    xid: Optional[int] = None
    commit_time: Optional[dt.datetime] = None
    table: Optional[str] = None
    tx_index: Optional[int] = None
    aggregate_type: Optional[str] = None
    aggregate_id: Optional[str] = None
    event_type: Optional[str] = None
    traceparent: Optional[str] = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The ledger had this event and the consumer re-applies it (``Reapply``).
    reapplied: bool = False

    @property
    def commit_lsn_text(self) -> Optional[str]:
        return None if self.commit_lsn is None else c.format_lsn(self.commit_lsn)

    def json(self) -> Any:
        return json.loads(self.payload)

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name)

    def as_reapplied(self) -> "Event":
        return replace(self, reapplied=True)

    @classmethod
    def from_parts(
        cls,
        subject: str,
        headers: Optional[Mapping[str, str]],
        payload: bytes,
        stream_sequence: int = 0,
        delivered: int = 1,
    ) -> "Event":
        headers = dict(headers or {})

        def get(name: str) -> Optional[str]:
            v = headers.get(name)
            v = v.strip() if isinstance(v, str) else None
            return v or None

        # A scheduled event's delivered copy has no Nats-Msg-Id: its id is in Outbox-Event-Id.
        event_id = get(c.HEADER_MSG_ID) or get(c.HEADER_EVENT_ID)
        if not event_id:
            raise InvalidMessage(f"message has no {c.HEADER_MSG_ID} header (event id)")
        return cls(
            id=event_id,
            subject=subject,
            payload=payload or b"",
            stream_sequence=stream_sequence,
            delivered=delivered,
            commit_lsn=_opt(c.parse_lsn, get(c.HEADER_COMMIT_LSN)),
            xid=_opt(_uint, get(c.HEADER_XID)),
            commit_time=_opt(parse_rfc3339, get(c.HEADER_COMMIT_TIME)),
            table=get(c.HEADER_TABLE),
            tx_index=_opt(_uint, get(c.HEADER_TX_INDEX)),
            aggregate_type=get(c.HEADER_AGGREGATE_TYPE),
            aggregate_id=get(c.HEADER_AGGREGATE_ID),
            event_type=get(c.HEADER_EVENT_TYPE),
            traceparent=get(c.HEADER_TRACEPARENT),
            headers=headers,
        )

    @classmethod
    def from_msg(cls, msg: Any) -> "Event":
        """From a nats-py JetStream message."""
        meta = msg.metadata  # raises for a message without a $JS.ACK reply
        return cls.from_parts(
            msg.subject, msg.headers, msg.data, meta.sequence.stream, meta.num_delivered
        )


def parse_rfc3339(text: str) -> dt.datetime:
    """RFC 3339 with any number of fraction digits (Python before 3.11 takes 6 at most)."""
    t = text.strip().replace("z", "Z")
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    if "." in t:
        head, rest = t.split(".", 1)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        frac, tail = rest[:digits], rest[digits:]
        t = f"{head}.{(frac + '000000')[:6]}{tail}"
    value = dt.datetime.fromisoformat(t)
    if value.tzinfo is None:
        raise ValueError(f"time {text!r} has no offset")
    return value


def _uint(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def _opt(parse, text):
    if text is None:
        return None
    try:
        return parse(text)
    except (ValueError, OverflowError):
        return None
