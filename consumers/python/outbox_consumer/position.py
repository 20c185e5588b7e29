"""Where is commit LSN ``X``, or commit time ``T``, in outbox-relay's stream?

The stream-only lookup of ``crates/outbox-position`` (what ``outbox-relay position --no-map`` and
the Rust consumer's ``StartAt`` do), step for step, so the three answer the same sequence:

* for an LSN, a bounded bisection by ``Outbox-Commit-Lsn`` (direct gets) finds a message
  committed before the target; every event committed at or after the target was stored after
  that commit time, so the scan starts at the first message stored at or after that time less
  ``clock_margin``;
* for a time, the scan starts at the first message stored at or after ``T`` less the margin;
* a forward scan of headers finds the first message that reaches the target.

This holds while the clocks of PostgreSQL and the NATS servers differ by less than the margin
(docs/replay.md).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Optional, Union

from nats.js import api
from nats.js.errors import NotFoundError

from . import contract as c
from .event import parse_rfc3339


@dataclass(frozen=True)
class Limits:
    max_scan: int = 1_000_000
    max_gets: int = 64
    clock_margin: dt.timedelta = dt.timedelta(seconds=5)
    idle: float = 5.0


@dataclass(frozen=True)
class Probe:
    seq: int
    subject: str
    commit_lsn: Optional[int]
    commit_time: Optional[dt.datetime]
    event_id: Optional[str]

    @classmethod
    def of(cls, seq: int, subject: str, headers) -> "Probe":
        headers = headers or {}
        backfill = (headers.get(c.HEADER_BACKFILL) or "").lower() == "true"
        lsn = None
        try:
            lsn = c.parse_lsn(headers.get(c.HEADER_COMMIT_LSN, ""))
        except c.LsnError:
            pass
        if lsn == 0 or backfill:
            lsn = None
        time = None
        if lsn is not None and headers.get(c.HEADER_COMMIT_TIME):
            try:
                time = parse_rfc3339(headers[c.HEADER_COMMIT_TIME])
            except ValueError:
                pass
        return cls(seq, subject, lsn, time, headers.get(c.HEADER_MSG_ID))

    def reaches(self, target: "Target") -> Optional[bool]:
        if isinstance(target, int):
            return None if self.commit_lsn is None else self.commit_lsn >= target
        return None if self.commit_time is None else self.commit_time >= target


#: An LSN (int) or a commit time (aware datetime).
Target = Union[int, dt.datetime]


@dataclass(frozen=True)
class Position:
    sequence: int
    found: Optional[Probe]
    scan_start: int
    scanned: int
    gets: int
    stream_first: int
    stream_last: int
    truncated: bool


class PositionError(RuntimeError):
    pass


async def locate(js, stream: str, target: Target, limits: Limits = Limits()) -> Position:
    """The first stream sequence to deliver from so that every event committed at or after
    ``target`` (an LSN as int, or an aware datetime) is delivered."""
    if isinstance(target, dt.datetime) and target.tzinfo is None:
        raise ValueError("the commit time must be timezone-aware (e.g. datetime.timezone.utc)")
    info = await js.stream_info(stream)
    first, last, count = info.state.first_seq, info.state.last_seq, info.state.messages
    gets = 0
    if count == 0:
        return Position(last + 1, None, last + 1, 0, 0, first, last, False)
    truncated = False
    from_time: Optional[dt.datetime]
    start: Optional[int] = None
    if isinstance(target, dt.datetime):
        from_time = target - limits.clock_margin
    else:
        below, gets = await _bisect(js, stream, first, last, target, limits.max_gets)
        if below is None:
            # No message before the target: the whole stream is after it.
            start, truncated = first, first > 1
            from_time = None
        else:
            from_time = below.commit_time - limits.clock_margin if below.commit_time else None
    if start is None:
        if from_time is None:
            start = first
        else:
            seq = await _first_stored_at_or_after(js, stream, from_time, limits.idle)
            if seq is None:
                start = last + 1
            else:
                start, truncated = seq, seq == first and first > 1
    found, scanned = await _scan(js, stream, start, last, target, limits)
    sequence = found.seq if found else last + 1
    return Position(sequence, found, start, scanned, gets, first, last, truncated)


async def _get_at_or_after(js, stream: str, seq: int) -> Optional[Probe]:
    try:
        m = await js.get_msg(stream, seq=seq, subject=">", next=True)
    except NotFoundError:
        return None
    return Probe.of(m.seq, m.subject, m.headers)


async def _bisect(js, stream, first, last, x, max_gets):
    lo, hi, below, gets = first, last, None, 0
    while lo <= hi and gets < max_gets:
        mid = lo + (hi - lo) // 2
        at, probe = mid, None
        while gets < max_gets:
            gets += 1
            p = await _get_at_or_after(js, stream, at)
            if p is None or p.seq > hi:
                break
            if p.commit_lsn is not None:
                probe = p
                break
            at = p.seq + 1
        if probe is not None and probe.commit_lsn < x:
            lo = probe.seq + 1
            if below is None or probe.commit_lsn > below.commit_lsn:
                below = probe
        elif mid == 0:
            break
        else:
            hi = mid - 1
    return below, gets


async def _reader(js, stream: str, **policy):
    """An ephemeral pull consumer reading headers only, removed when the lookup is done."""
    name = f"outbox-position-{uuid.uuid4().hex[:12]}"
    config = api.ConsumerConfig(
        name=name,
        ack_policy=api.AckPolicy.NONE,
        headers_only=True,
        inactive_threshold=30.0,
        mem_storage=True,
        **policy,
    )
    await js.add_consumer(stream, config=config)
    return await js.pull_subscribe_bind(name, stream=stream), name


async def _fetch(sub, batch: int, idle: float):
    try:
        return await sub.fetch(batch, timeout=idle)
    except (asyncio.TimeoutError, TimeoutError):
        return []


async def _first_stored_at_or_after(js, stream, time: dt.datetime, idle: float) -> Optional[int]:
    sub, name = await _reader(
        js, stream, deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=time
    )
    try:
        msgs = await _fetch(sub, 1, idle)
        return msgs[0].metadata.sequence.stream if msgs else None
    finally:
        await _drop(js, sub, stream, name)


async def _scan(js, stream, start, last, target, limits: Limits):
    scanned = 0
    if start > last:
        return None, 0
    sub, name = await _reader(
        js, stream, deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
    )
    try:
        while True:
            msgs = await _fetch(sub, 256, limits.idle)
            if not msgs:
                return None, scanned
            for m in msgs:
                scanned += 1
                seq = m.metadata.sequence.stream
                probe = Probe.of(seq, m.subject, m.headers)
                if probe.reaches(target):
                    return probe, scanned
                if seq >= last:
                    return None, scanned
                if scanned >= limits.max_scan:
                    raise PositionError(
                        f"read {scanned} messages from sequence {start} (up to {seq}) without "
                        f"reaching the target: raise Limits.max_scan"
                    )
    finally:
        await _drop(js, sub, stream, name)


async def _drop(js, sub, stream, name):
    try:
        await sub.unsubscribe()
        await js.delete_consumer(stream, name)
    except Exception:  # the inactive threshold removes it anyway
        pass
