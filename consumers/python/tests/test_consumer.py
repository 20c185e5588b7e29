"""The consumer against real PostgreSQL, nats-server and outbox-relay processes."""

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import DLQ_STREAM, Client, Running, recording_handler
from harness import STREAM
from nats.js import api

from outbox_consumer import Consumer, Permanent, Reapply, StartAt, contract as c, locate
from outbox_consumer.contract import format_lsn, parse_lsn

FAST = dict(ack_wait=2.0, backoff_initial=0.1, backoff_max=0.5)


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 120))


def test_a_handler_failing_once_is_redelivered_and_applied_once(env):
    async def body():
        async with Client(env) as t:
            ids = await t.insert({"n": 1}, {"n": 2}, {"n": 3})
            await t.wait_stream(3)
            stored = await t.messages_by_id()
            failed = []

            async def handler(conn, event):
                await recording_handler(conn, event, "svc")
                if event.id == ids[1] and event.delivered == 1:
                    failed.append(event.id)
                    raise RuntimeError("transient failure")

            consumer = Consumer(t.js, env.pg.url(), "svc", **FAST)
            async with Running(consumer, handler):
                rows = await t.wait_ledger("svc", 3)
            assert failed == [ids[1]]
            # One ledger row per event, at the stored copy's sequence and commit LSN.
            assert [r[0] for r in rows] == ids
            for event_id, seq, lsn, subject, _ in rows:
                (m,) = stored[event_id]
                assert (seq, lsn, subject) == (
                    m.seq, m.headers[c.HEADER_COMMIT_LSN], "outbox.Order.order-created"
                )
            # The failed attempt was rolled back: each effect once, the retried one from delivery 2.
            effects = await t.effects("svc")
            assert [(e[0], e[1]) for e in effects] == [(ids[0], 1), (ids[1], 2), (ids[2], 1)]
            s = consumer.stats
            assert (s.applied, s.retried, s.duplicates, s.parked) == (3, 1, 0, 0)

    run(body())


def test_a_resend_past_the_duplicate_window_is_applied_once(env_short_window):
    env = env_short_window

    async def body():
        async with Client(env) as t:
            (e1,) = await t.insert({"n": 1})
            await t.wait_stream(1)
            first = await t.message(1)
            # Re-send the relay's message as the relay does after a crash: same headers, same
            # Nats-Msg-Id (Nats-Expected-Stream included), once past the stream's window.
            await asyncio.sleep(0.6)
            ack = await t.js.publish(first.subject, first.data, headers=dict(first.headers))
            assert not ack.duplicate and ack.seq == 2, ack
            (e2,) = await t.insert({"n": 2})
            await t.wait_stream(3)
            copies = await t.messages_by_id()
            assert [m.seq for m in copies[e1]] == [1, 2]

            consumer = Consumer(t.js, env.pg.url(), "svc", **FAST)
            handler = lambda conn, ev: recording_handler(conn, ev, "svc")  # noqa: E731
            async with Running(consumer, handler):
                await t.wait_ledger("svc", 2)
                await wait_async(lambda: consumer.stats.duplicates == 1, "the copy skipped")
            rows = await t.ledger("svc")
            # The first copy was applied; the second found its ledger row.
            assert [(r[0], r[1]) for r in rows] == [(e1, 1), (e2, 3)]
            assert [e[0] for e in await t.effects("svc")] == [e1, e2]
            assert (consumer.stats.applied, consumer.stats.duplicates) == (2, 1)

    run(body())


def service(env, *extra):
    """tests/service.py as its own process, consuming as service ``svc``."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("service.py")), "--nats",
         env.nats.url(), "--pg", env.pg.url(), "--service", "svc", *extra],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )


def test_a_consumer_killed_in_the_handler_applies_the_event_once_after_restart(env):
    marker = env.dir / "in-handler"

    async def body():
        async with Client(env) as t:
            ids = await t.insert({"n": 1}, {"n": 2}, {"n": 3})
            await t.wait_stream(3)
            proc = service(env, "--hang-on", ids[1], "--marker", str(marker))
            try:
                await wait_async(marker.exists, "the handler of the second event", 30)
                # The first event is committed; the second's transaction is open.
                assert [r[0] for r in await t.ledger("svc")] == [ids[0]]
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            finally:
                proc.kill()
            # PostgreSQL rolled the open transaction back with the connection.
            assert [r[0] for r in await t.ledger("svc")] == [ids[0]]
            assert [e[0] for e in await t.effects("svc")] == [ids[0]]
            proc = service(env)
            try:
                rows = await t.wait_ledger("svc", 3)
            finally:
                proc.kill()
                proc.wait()
            assert [r[0] for r in rows] == ids
            effects = await t.effects("svc")
            assert [e[0] for e in effects] == ids, "each event applied exactly once"
            # The killed delivery and the redelivery: the second event was delivered twice.
            assert effects[1][1] >= 2

    run(body())


def test_a_consumer_killed_after_commit_before_the_ack_skips_the_redelivered_event(env):
    marker = env.dir / "committed"

    async def body():
        async with Client(env) as t:
            ids = await t.insert({"n": 1}, {"n": 2}, {"n": 3})
            await t.wait_stream(3)
            proc = service(env, "--hang-on", ids[1], "--hang-at", "before-ack",
                           "--marker", str(marker))
            try:
                await wait_async(marker.exists, "the commit of the second event", 30)
                # The kill lands after COMMIT (the second event's ledger row and effect are
                # there) and before the ack (the server still waits for it).
                committed = await t.ledger("svc")
                assert [r[0] for r in committed] == ids[:2]
                assert [e[0] for e in await t.effects("svc")] == ids[:2]
                info = await t.js.consumer_info(STREAM, "svc")
                assert (info.num_ack_pending, info.ack_floor.stream_seq,
                        info.delivered.stream_seq) == (1, 1, 2), info
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            finally:
                proc.kill()
            proc = service(env)
            try:
                rows = await t.wait_ledger("svc", 3)

                async def acked_all():
                    i = await t.js.consumer_info(STREAM, "svc")
                    return i if (i.ack_floor.stream_seq, i.num_ack_pending) == (3, 0) else None

                info = await wait_for(acked_all, "the ack floor at sequence 3")
            finally:
                proc.kill()
                proc.wait()
            assert [r[0] for r in rows] == ids
            assert rows[1][4] == committed[1][4], "the second event's ledger row is the first one"
            # The handler ran once per event: the second only on its first delivery.
            assert [(e[0], e[1]) for e in await t.effects("svc")] == [
                (ids[0], 1), (ids[1], 1), (ids[2], 1)]
            # Sequence 2 was delivered again (to the new process), which acked it.
            assert info.delivered.consumer_seq >= 4, info

    run(body())


def test_a_poison_event_is_parked_with_its_reason_and_later_events_flow(env):
    async def body():
        async with Client(env) as t:
            await t.js.add_stream(name=DLQ_STREAM, subjects=["dlq.>"])
            (poison,) = await t.insert({"bad": True}, event_type="poison")
            (good,) = await t.insert({"n": 2})
            await t.wait_stream(2)

            async def handler(conn, event):
                if event.event_type == "poison":
                    raise ValueError("cannot decode the payload")
                await recording_handler(conn, event, "svc")

            consumer = Consumer(t.js, env.pg.url(), "svc", max_deliver=3, **FAST)
            async with Running(consumer, handler):
                await t.wait_ledger("svc", 1)
                state = await t.wait_stream(1, stream=DLQ_STREAM)
            assert state.messages == 1
            dl = await t.message(1, stream=DLQ_STREAM)
            original = await t.message(1)
            h = dl.headers
            assert dl.subject == "dlq.svc"
            assert h[c.HEADER_DLQ_REASON] == (
                "handler failed 3 times; last error: cannot decode the payload"
            )
            assert h[c.HEADER_DLQ_SUBJECT] == "outbox.Order.poison"
            assert h[c.HEADER_DLQ_EVENT_ID] == poison
            assert h[c.HEADER_DLQ_DELIVERIES] == "3"
            assert h[c.HEADER_DLQ_CONSUMER] == "svc"
            assert h[c.HEADER_DLQ_SOURCE] == f"{STREAM}:{original.seq}"
            assert h["Nats-Msg-Id"] == f"dlq:svc:{poison}"
            assert h["Outbox-Original-Msg-Id"] == poison
            assert h["Outbox-Original-Expected-Stream"] == STREAM
            assert "Nats-Expected-Stream" not in h
            assert h[c.HEADER_COMMIT_LSN] == original.headers[c.HEADER_COMMIT_LSN]
            assert json.loads(dl.data) == {"bad": True}
            # Parked, not applied; the later event was.
            assert [r[0] for r in await t.ledger("svc")] == [good]
            assert (consumer.stats.parked, consumer.stats.retried) == (1, 2)

    run(body())


def test_a_permanent_error_parks_at_once(env):
    async def body():
        async with Client(env) as t:
            await t.js.add_stream(name=DLQ_STREAM, subjects=["dlq.>"])
            (poison,) = await t.insert({"bad": True}, event_type="poison")
            await t.wait_stream(1)

            async def handler(conn, event):
                try:
                    raise KeyError("order")
                except KeyError as e:
                    raise Permanent("no order in the payload") from e

            consumer = Consumer(t.js, env.pg.url(), "svc", dead_letter_subject="dlq.x", **FAST)
            async with Running(consumer, handler):
                await t.wait_stream(1, stream=DLQ_STREAM)
            dl = await t.message(1, stream=DLQ_STREAM)
            assert dl.headers[c.HEADER_DLQ_REASON] == (
                "permanent handler error: no order in the payload: 'order'"
            )
            assert dl.headers[c.HEADER_DLQ_DELIVERIES] == "1"
            assert dl.headers[c.HEADER_DLQ_EVENT_ID] == poison

    run(body())


def test_a_new_durable_starts_at_a_commit_lsn_or_time_as_outbox_relay_position_finds(env):
    async def body():
        async with Client(env) as t:
            batches = [await t.insert(*[{"tx": i, "k": k} for k in range(2)]) for i in range(3)]
            await t.wait_stream(6)
            stored = await t.messages_by_id()
            second = stored[batches[1][0]][0]
            lsn_text = second.headers[c.HEADER_COMMIT_LSN]
            lsn = parse_lsn(lsn_text)
            assert format_lsn(lsn) == lsn_text
            # The same answer as the relay's own lookup, with and without its position map.
            found = await locate(t.js, STREAM, lsn)
            assert found.sequence == second.seq == 3
            for extra in (["--no-map"], []):
                out = json.loads(env.relay.command("position", "--lsn", lsn_text, "--json", *extra))
                assert out["sequence"] == found.sequence, out
            # An LSN between the first and the second commit finds the second too.
            before = parse_lsn(stored[batches[0][0]][0].headers[c.HEADER_COMMIT_LSN])
            assert (await locate(t.js, STREAM, before + 1)).sequence == 3
            # Past the last commit: the next sequence the stream will store.
            last = parse_lsn(stored[batches[2][0]][0].headers[c.HEADER_COMMIT_LSN])
            assert (await locate(t.js, STREAM, last + 1)).sequence == 7

            handler = lambda conn, ev: recording_handler(conn, ev, "by-lsn")  # noqa: E731
            consumer = Consumer(t.js, env.pg.url(), "by-lsn", start_at=StartAt.at_lsn(lsn_text),
                                **FAST)
            async with Running(consumer, handler):
                rows = await t.wait_ledger("by-lsn", 4)
            assert [r[0] for r in rows] == batches[1] + batches[2]
            assert [r[1] for r in rows] == [3, 4, 5, 6]

            third_time = stored[batches[2][0]][0].headers[c.HEADER_COMMIT_TIME]
            from outbox_consumer.event import parse_rfc3339

            at = parse_rfc3339(third_time)
            assert (await locate(t.js, STREAM, at)).sequence == 5
            out = json.loads(env.relay.command("position", "--time", third_time, "--json",
                                               "--no-map"))
            assert out["sequence"] == 5, out
            # One microsecond after the last commit: past it.
            assert (await locate(t.js, STREAM, at + dt.timedelta(microseconds=1))).sequence == 7
            # A new durable starting at that time: its first event is the third commit's first.
            handler = lambda conn, ev: recording_handler(conn, ev, "by-time")  # noqa: E731
            consumer = Consumer(t.js, env.pg.url(), "by-time", start_at=StartAt.at_time(at),
                                **FAST)
            async with Running(consumer, handler):
                rows = await t.wait_ledger("by-time", 2)
            info = await t.js.consumer_info(STREAM, "by-time")
            assert (info.config.deliver_policy, info.config.opt_start_seq) == (
                api.DeliverPolicy.BY_START_SEQUENCE, 5)
            assert [(r[0], r[1]) for r in rows] == list(zip(batches[2], [5, 6]))

    run(body())


def test_reapply_after_a_bug_fix_runs_the_fixed_handler_once_per_event(env):
    async def body():
        async with Client(env) as t:
            ids = await t.insert({"n": 1}, {"n": 2})
            await t.wait_stream(2)
            first_lsn = (await t.message(1)).headers[c.HEADER_COMMIT_LSN]

            async def buggy(conn, event):
                await conn.execute(
                    "INSERT INTO effects (service, event_id, delivered, body) VALUES"
                    " ('svc', %s, %s, 'wrong')", (event.id, event.delivered))

            consumer = Consumer(t.js, env.pg.url(), "svc", **FAST)
            async with Running(consumer, buggy):
                before = await t.wait_ledger("svc", 2)
            fixed_at = dt.datetime.now(dt.timezone.utc)

            async def fixed(conn, event):
                assert event.reapplied
                await conn.execute(
                    "UPDATE effects SET body = 'right' WHERE service = 'svc' AND event_id = %s",
                    (event.id,))

            # The documented path: reposition the durable, run the fixed handler with Reapply.
            env.relay.command("replay", "--from-lsn", first_lsn, "--consumer", "svc", "--yes")
            consumer = Consumer(t.js, env.pg.url(), "svc",
                                reapply=Reapply(parse_lsn(first_lsn), fixed_at), **FAST)
            async with Running(consumer, fixed):
                await wait_async(lambda: consumer.stats.applied == 2, "both re-applied")
            after = await t.ledger("svc")
            assert [r[0] for r in after] == ids
            assert all(r[4] > fixed_at for r in after), "each ledger row replaced"
            assert all(b[4] < fixed_at for b in before)
            assert [(e[0], e[2]) for e in await t.effects("svc")] == [
                (ids[0], "right"), (ids[1], "right")]
            # Run again from the start: rows are newer than fixed_at now, so nothing re-applies.
            env.relay.command("replay", "--from-lsn", first_lsn, "--consumer", "svc", "--yes")
            again = Consumer(t.js, env.pg.url(), "svc",
                             reapply=Reapply(parse_lsn(first_lsn), fixed_at), **FAST)
            async with Running(again, fixed):
                await wait_async(lambda: again.stats.duplicates == 2, "both skipped")
            assert again.stats.applied == 0
            assert [r[4] for r in await t.ledger("svc")] == [r[4] for r in after]

    run(body())


def test_events_are_applied_once_across_a_postgres_restart(env):
    async def body():
        async with Client(env) as t:
            ids = await t.insert({"n": 1}, {"n": 2})
            await t.wait_stream(2)
            handler = lambda conn, ev: recording_handler(conn, ev, "svc")  # noqa: E731
            consumer = Consumer(t.js, env.pg.url(), "svc", **FAST)
            async with Running(consumer, handler):
                await t.wait_ledger("svc", 2)
                before = await t.postmaster_start_time()
                await t.db.close()
                await asyncio.to_thread(env.pg.restart_immediate)
                import psycopg

                t.db = await psycopg.AsyncConnection.connect(env.pg.url(), autocommit=True)
                assert await t.postmaster_start_time() > before, "PostgreSQL restarted"
                ids += await t.insert({"n": 3}, {"n": 4})
                rows = await t.wait_ledger("svc", 4, timeout=60)
            assert [r[0] for r in rows] == ids
            assert [e[0] for e in await t.effects("svc")] == ids
            assert consumer.stats.applied == 4

    run(body())


async def wait_for(probe, what, timeout=30):
    """Polls the coroutine function ``probe`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while not (value := await probe()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.05)
    return value


async def wait_async(cond, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.05)
