"""The durable pull consumer: one message at a time per worker, in a ledger transaction.

For each message a worker runs ``BEGIN``; the ledger insert (``ON CONFLICT DO NOTHING``); the
handler on the same connection, unless the ledger already had the event; ``COMMIT``; and only
then acks. A handler error rolls back (the ledger row too) and NAKs with backoff; after
``max_deliver`` deliveries, or at once for ``Permanent``, the message is parked on the
dead-letter subject. PostgreSQL trouble outside the handler is retried for ever, never parked.
With ``validate_contracts`` the payload is first checked against its contract (``schema.py``).
The same algorithm as the Rust ``crates/outbox-consumer`` (``worker.rs``, ``park.rs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

import psycopg
from nats.js import api
from nats.js.errors import NotFoundError

from . import contract as c
from .event import Event
from .ledger import INSERT_SQL, REAPPLY_SQL, ensure_ledger
from .position import Limits, locate
from .schema import ContractRefused, ContractValidator

log = logging.getLogger("outbox_consumer")

Handler = Callable[[psycopg.AsyncConnection, Event], Awaitable[None]]

#: Test-only failpoint, not part of the supported API (the Rust crate's ``hooks``): awaited with
#: ``"before_commit"`` (the handler returned, the transaction is open) and ``"before_ack"`` (the
#: transaction is committed, the message not acked yet). A hook that never returns and a killed
#: process simulate a crash at that point.
TestHook = Callable[[str, Event], Awaitable[None]]

# SQLSTATEs that mean the server or the connection went away, not that the event is bad:
# class 08 (connection exception) and 57P01-57P03 (admin / crash shutdown, cannot connect now).
_INFRA_SQLSTATES = ("57P01", "57P02", "57P03")


class Permanent(Exception):
    """Raise (``raise Permanent("...") from err``) to park the event at once, without retries."""


class ConsumerError(RuntimeError):
    """A problem ``Consumer.run`` cannot retry: bad settings, a missing stream, a refused durable."""


@dataclass(frozen=True)
class StartAt:
    """Where a *new* durable starts; an existing durable keeps its position."""

    sequence: Optional[int] = None
    lsn: Optional[int] = None
    time: Optional[dt.datetime] = None

    @classmethod
    def at_sequence(cls, seq: int) -> "StartAt":
        return cls(sequence=seq)

    @classmethod
    def at_lsn(cls, lsn: "int | str") -> "StartAt":
        """The first event committed at or after this commit LSN (``0/16B3748`` or an int)."""
        return cls(lsn=c.parse_lsn(lsn) if isinstance(lsn, str) else lsn)

    @classmethod
    def at_time(cls, time: dt.datetime) -> "StartAt":
        if time.tzinfo is None:
            raise ValueError("StartAt.at_time needs a timezone-aware datetime")
        return cls(time=time)


@dataclass(frozen=True)
class Reapply:
    """Apply again the events committed in ``[from_lsn, until_lsn)`` whose ledger rows were
    written before ``recorded_before`` (a handler bug fixed since). The ledger row is replaced in
    the handler's own transaction, never deleted first; keep ``recorded_before`` fixed for the
    whole re-apply, across restarts (docs/consumers.md, docs/replay.md)."""

    from_lsn: int
    recorded_before: dt.datetime
    until_lsn: Optional[int] = None

    def covers(self, lsn: Optional[int]) -> bool:
        return lsn is not None and lsn >= self.from_lsn and (
            self.until_lsn is None or lsn < self.until_lsn
        )


@dataclass
class Stats:
    applied: int = 0
    duplicates: int = 0
    retried: int = 0
    parked: int = 0
    park_failures: int = 0
    #: PostgreSQL / NATS failures outside the handler (the message was NAKed), reading a
    #: contract from its KV bucket included.
    infra_errors: int = 0
    #: Deliveries whose payload met the contract its ``Outbox-Schema`` header names.
    contracts_passed: int = 0
    #: Deliveries refused by their contract and parked instead of applied (in ``parked`` too).
    contracts_refused: int = 0


@dataclass
class _Slot:
    conninfo: str
    conn: Optional[psycopg.AsyncConnection] = None

    async def ready(self) -> psycopg.AsyncConnection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            if self.conn is not None:
                with contextlib.suppress(Exception):
                    await self.conn.close()
            self.conn = None
            self.conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=False)
        return self.conn

    async def rollback(self) -> None:
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            with contextlib.suppress(psycopg.Error):
                await self.conn.rollback()


@dataclass
class _Outcome:
    kind: str  # applied | duplicate | failed | infra
    error: Optional[BaseException] = None


def _is_infra(err: BaseException, conn: Optional[psycopg.AsyncConnection]) -> bool:
    if conn is None or conn.closed or conn.broken:
        return True
    state = getattr(err, "sqlstate", None) or ""
    return state.startswith("08") or state in _INFRA_SQLSTATES


def _error_text(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    cause = err.__cause__
    while cause is not None:
        if str(cause) and str(cause) not in text:
            text += f": {cause}"
        cause = cause.__cause__
    return text


@dataclass
class Consumer:
    """An exactly-once consumer for one service (the durable name and ledger key)."""

    js: object
    conninfo: str
    service: str
    stream: str = "OUTBOX"
    subjects: Sequence[str] = ("outbox.>",)
    durable: Optional[str] = None
    #: ``None``: strict order (one message outstanding). ``n``: n workers, no order guarantee.
    parallel: Optional[int] = None
    max_deliver: int = 5
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    ack_wait: float = 30.0
    dead_letter_subject: Optional[str] = None
    ensure_ledger: bool = True
    start_at: Optional[StartAt] = None
    reapply: Optional[Reapply] = None
    #: Check each payload against the contract its ``Outbox-Schema`` header names (fetched from
    #: ``contracts_bucket``); an event that breaks it, or names a contract that cannot be used,
    #: is parked with the reason ``contract <key>: ...`` and never handled.
    validate_contracts: bool = False
    contracts_bucket: str = c.CONTRACTS_BUCKET
    #: With ``validate_contracts``: park an event without the header too.
    require_contract: bool = False
    stats: Stats = field(default_factory=Stats)
    test_hook: Optional[TestHook] = field(default=None, repr=False)
    _contracts: Optional[ContractValidator] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        def valid(name: str) -> bool:
            return bool(name) and all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in name)

        if not valid(self.service):
            raise ConsumerError(
                f"service name {self.service!r} must be non-empty ASCII letters, digits, '-' or '_'"
            )
        self.durable = self.durable or self.service
        if not valid(self.durable):
            raise ConsumerError(
                f"durable name {self.durable!r} must be non-empty ASCII letters, digits, '-' or '_'"
            )
        if not self.subjects:
            raise ConsumerError("no subjects")
        if self.ack_wait < 0.3:
            raise ConsumerError("ack_wait must be at least 0.3 s")
        self.max_deliver = max(1, self.max_deliver)
        self.backoff_max = max(self.backoff_max, self.backoff_initial)
        self.dead_letter_subject = (
            self.dead_letter_subject
            or c.DEAD_LETTER["default_subject"].replace("{consumer}", self.service)
        )
        if self.require_contract and not self.validate_contracts:
            raise ConsumerError("require_contract needs validate_contracts")
        if not valid(self.contracts_bucket):
            raise ConsumerError(
                f"contracts bucket {self.contracts_bucket!r} must be non-empty ASCII letters,"
                " digits, '-' or '_'"
            )
        if self.validate_contracts:
            self._contracts = ContractValidator(
                self.js, self.contracts_bucket, require=self.require_contract
            )

    @property
    def workers(self) -> int:
        return max(1, self.parallel or 1)

    def backoff(self, delivered: int) -> float:
        """``initial * 2^(delivered - 1)``, at most ``backoff_max``."""
        return min(self.backoff_initial * (2 ** min(max(delivered - 1, 0), 20)), self.backoff_max)

    async def run(self, handler: Handler, stop: Optional[asyncio.Event] = None) -> None:
        """Creates or updates the durable, then handles messages until ``stop`` is set; the
        messages in flight are finished (committed and acked) before it returns."""
        stop = stop or asyncio.Event()
        slots = [_Slot(self.conninfo) for _ in range(self.workers)]
        try:
            first = await slots[0].ready()
            if self.ensure_ledger:
                await ensure_ledger(first)
                await first.commit()
            sub = await self._subscribe()
            await self._loop(sub, handler, slots, stop)
        finally:
            for slot in slots:
                if slot.conn is not None:
                    with contextlib.suppress(Exception):
                        await slot.conn.close()

    async def _deliver_policy(self) -> dict:
        """An existing durable keeps its deliver policy (JetStream refuses to change it, and an
        ``outbox-relay replay`` re-created one must stay); a new one starts at ``start_at``."""
        try:
            info = await self.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            info = None
        if info is not None:
            if self.start_at is not None:
                log.info("durable %s exists; it keeps its position", self.durable)
            cfg = info.config
            return {
                "deliver_policy": cfg.deliver_policy,
                "opt_start_seq": cfg.opt_start_seq,
                "opt_start_time": cfg.opt_start_time,
            }
        start = self.start_at
        if start is None:
            return {"deliver_policy": api.DeliverPolicy.ALL}
        if start.sequence is not None:
            seq = max(1, start.sequence)
        else:
            target = start.lsn if start.lsn is not None else start.time
            found = await locate(self.js, self.stream, target, Limits())
            seq = found.sequence
            log.info(
                "start position of %s found in the stream: sequence %d (scanned %d, %d gets)",
                self.durable, seq, found.scanned, found.gets,
            )
        return {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": seq}

    async def _subscribe(self):
        try:
            await self.js.stream_info(self.stream)
        except NotFoundError as e:
            raise ConsumerError(f"JetStream stream {self.stream!r} does not exist") from e
        policy = await self._deliver_policy()
        filters = list(self.subjects)
        config = api.ConsumerConfig(
            durable_name=self.durable,
            description=f"outbox-consumer for service {self.service}",
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            # Unlimited on the server: the consumer parks after max_deliver itself, so the
            # server never drops a message without it reaching the dead-letter subject.
            max_deliver=-1,
            max_ack_pending=1 if self.parallel is None else 2 * self.workers,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            **policy,
        )
        try:
            await self.js.add_consumer(self.stream, config=config)
        except Exception as e:
            raise ConsumerError(f"durable consumer {self.durable!r}: {e}") from e
        return await self.js.pull_subscribe_bind(self.durable, stream=self.stream)

    async def _loop(self, sub, handler, slots, stop: asyncio.Event) -> None:
        free: asyncio.Queue = asyncio.Queue()
        for slot in slots:
            free.put_nowait(slot)
        inflight: set = set()
        log.info("outbox-consumer %s running on %s %s", self.service, self.stream, self.subjects)
        async def one(slot: _Slot, msg) -> None:
            try:
                await self._process(slot, handler, msg)
            finally:
                free.put_nowait(slot)

        while not stop.is_set():
            room = free.qsize()
            if room == 0:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                msgs = await sub.fetch(room, timeout=1.0)
            except (asyncio.TimeoutError, TimeoutError):
                continue
            except Exception as e:  # a reconnecting client, a consumer being updated
                log.warning("pull problem (retrying): %s", e)
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                task = asyncio.create_task(one(free.get_nowait(), msg))
                task.add_done_callback(inflight.discard)
                inflight.add(task)
        if inflight:
            await asyncio.gather(*inflight, return_exceptions=True)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        log.info("outbox-consumer %s stopped", self.service)

    async def _process(self, slot: _Slot, handler: Handler, msg) -> None:
        try:
            event = Event.from_msg(msg)
        except Exception as e:  # InvalidMessage, or not a JetStream message
            delivered = 0
            with contextlib.suppress(Exception):
                delivered = msg.metadata.num_delivered
            await self._park(msg, None, delivered, c.reason_text("invalid_message", error=e))
            return
        if self._contracts is not None and not await self._meets_contract(msg, event):
            return
        outcome = await self._with_progress(msg, self._attempt(slot, handler, event))
        if outcome.kind in ("applied", "duplicate"):
            if outcome.kind == "applied":
                self.stats.applied += 1
            else:
                self.stats.duplicates += 1
            if self.test_hook is not None:
                await self.test_hook("before_ack", event)
            try:
                await msg.ack()
            except Exception as e:  # the ledger absorbs the redelivery
                log.warning("ack of %s failed; it will be redelivered: %s", event.id, e)
        elif outcome.kind == "failed":
            await self._failed(msg, event, outcome.error)
        else:
            self.stats.infra_errors += 1
            delay = self.backoff(event.delivered)
            log.warning(
                "%s: PostgreSQL error outside the handler for %s; retry in %.1fs: %s",
                self.service, event.id, delay, outcome.error,
            )
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)
            await asyncio.sleep(min(delay, 5.0))  # do not spin on a database that is down

    async def _meets_contract(self, msg, event: Event) -> bool:
        """Whether the event may be handled; one that may not is parked, or put back with
        backoff when its contract cannot be read now (never parked for that)."""
        try:
            key = await self._with_progress(
                msg, self._contracts.validate(event.headers, event.payload)
            )
        except ContractRefused as e:
            self.stats.contracts_refused += 1
            await self._park(msg, event, event.delivered, str(e))
            return False
        except Exception as e:  # ContractUnavailable, NATS trouble: not the event's fault
            self.stats.infra_errors += 1
            delay = self.backoff(event.delivered)
            log.warning(
                "%s: cannot read the contract of %s from KV bucket %s; retry in %.1fs: %s",
                self.service, event.id, self.contracts_bucket, delay, _error_text(e),
            )
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)
            await asyncio.sleep(min(delay, 5.0))  # do not spin on a server that is down
            return False
        if key is not None:
            self.stats.contracts_passed += 1
        return True

    async def _with_progress(self, msg, work):
        """Awaits ``work`` while keeping the server from redelivering the message."""
        progress = asyncio.create_task(self._progress(msg))
        try:
            return await work
        finally:
            progress.cancel()

    async def _failed(self, msg, event: Event, err: BaseException) -> None:
        reason = _error_text(err)
        permanent = isinstance(err, Permanent)
        if permanent or event.delivered >= self.max_deliver:
            why = (
                c.reason_text("permanent", error=reason)
                if permanent
                else c.reason_text("retries_exhausted", deliveries=event.delivered, error=reason)
            )
            await self._park(msg, event, event.delivered, why)
            return
        self.stats.retried += 1
        delay = self.backoff(event.delivered)
        log.warning(
            "%s: handler failed for %s (delivery %d of %d); retry in %.1fs: %s",
            self.service, event.id, event.delivered, self.max_deliver, delay, reason,
        )
        with contextlib.suppress(Exception):
            await msg.nak(delay=delay)

    async def _progress(self, msg) -> None:
        """Keeps the server from redelivering while a slow handler runs."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            while True:
                await asyncio.sleep(self.ack_wait / 3)
                await msg.in_progress()

    async def _attempt(self, slot: _Slot, handler: Handler, event: Event) -> _Outcome:
        """BEGIN; ledger write; handler; COMMIT."""
        try:
            conn = await slot.ready()
        except psycopg.Error as e:
            return _Outcome("infra", e)
        reapply = self.reapply if self.reapply and self.reapply.covers(event.commit_lsn) else None
        row = (self.service, event.id, event.subject, event.stream_sequence, event.commit_lsn_text)
        try:
            if reapply is not None:
                cur = await conn.execute(REAPPLY_SQL, row + (reapply.recorded_before,))
                found = await cur.fetchone()
                replaced = None if found is None else bool(found[0])
            else:
                cur = await conn.execute(INSERT_SQL, row)
                replaced = False if cur.rowcount > 0 else None
        except psycopg.Error as e:
            await slot.rollback()
            return _Outcome("infra", e)
        if replaced is None:  # applied before: nothing to do
            await slot.rollback()
            return _Outcome("duplicate")
        try:
            await handler(conn, event.as_reapplied() if replaced else event)
        except Exception as e:
            await slot.rollback()
            # A handler that failed because the database went away did nothing wrong.
            return _Outcome("infra" if _is_infra(e, conn) else "failed", e)
        if self.test_hook is not None:
            await self.test_hook("before_commit", event)
        try:
            await conn.commit()
        except psycopg.Error as e:
            # Unknown outcome if the connection broke during COMMIT: the redelivery finds the
            # ledger row if the commit happened, and applies the event if it did not.
            return _Outcome("infra", e)
        return _Outcome("applied")

    async def _park(self, msg, event: Optional[Event], delivered: int, reason: str) -> None:
        """Publishes to the dead-letter subject (waiting for the stream's ack), then TERMs; if
        the publish is not confirmed the message is NAKed and parked on a later delivery."""
        reason = c.sanitize_reason(reason)
        original = msg.headers or {}
        event_id = event.id if event else (original.get(c.HEADER_MSG_ID) or "")
        stream, seq = "", 0
        with contextlib.suppress(Exception):
            stream, seq = msg.metadata.stream, msg.metadata.sequence.stream
        headers = {c.original_name(k) or k: v for k, v in original.items()}
        headers.update(
            {
                c.HEADER_DLQ_REASON: reason,
                c.HEADER_DLQ_SUBJECT: msg.subject,
                c.HEADER_DLQ_EVENT_ID: event_id,
                c.HEADER_DLQ_DELIVERIES: str(delivered),
                c.HEADER_DLQ_CONSUMER: self.service,
                c.HEADER_DLQ_SOURCE: c.dead_letter_source(stream, seq),
                c.HEADER_MSG_ID: c.dead_letter_id(self.service, event_id, stream, seq),
            }
        )
        try:
            await self.js.publish(self.dead_letter_subject, msg.data or b"", headers=headers)
        except Exception as e:
            self.stats.park_failures += 1
            delay = self.backoff(delivered)
            log.error(
                "%s: cannot publish %s to the dead-letter subject %s; message kept, retry in "
                "%.1fs: %s", self.service, event_id, self.dead_letter_subject, delay, e,
            )
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)
            return
        self.stats.parked += 1
        log.error(
            "%s: event %s (%s, %s:%d, delivered %d) parked on %s: %s",
            self.service, event_id, msg.subject, stream, seq, delivered,
            self.dead_letter_subject, reason,
        )
        with contextlib.suppress(Exception):
            await msg.term()
