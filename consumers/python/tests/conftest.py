import asyncio
import json
import time

import nats
import psycopg
import pytest

from harness import STREAM, Env

DLQ_STREAM = "DLQ"


@pytest.fixture
def env():
    e = Env()
    yield e
    e.close()


@pytest.fixture
def env_short_window():
    """The relay creates its stream with a 300 ms duplicate window."""
    e = Env(duplicate_window="300ms")
    yield e
    e.close()


class Client:
    """A test's connections: NATS (JetStream) and the application database."""

    def __init__(self, env: Env):
        self.env = env

    async def __aenter__(self):
        self.nc = await nats.connect(self.env.nats.url())
        self.js = self.nc.jetstream()
        self.db = await psycopg.AsyncConnection.connect(self.env.pg.url(), autocommit=True)
        return self

    async def __aexit__(self, *exc):
        await self.db.close()
        await self.nc.close()

    async def insert(self, *bodies, event_type="order-created"):
        """Outbox rows in one transaction; returns their ids in order."""
        ids = []
        async with self.db.transaction():
            for body in bodies:
                cur = await self.db.execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)"
                    " VALUES (gen_random_uuid(), 'Order', '7', %s, %s) RETURNING id::text",
                    (event_type, json.dumps(body)),
                )
                ids.append((await cur.fetchone())[0])
        return ids

    async def wait_stream(self, n, stream=STREAM, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = await self.js.stream_info(stream)
                if info.state.messages >= n:
                    return info.state
            except nats.js.errors.NotFoundError:
                pass
            assert time.monotonic() < deadline, f"{stream} did not reach {n} messages"
            await asyncio.sleep(0.05)

    async def message(self, seq, stream=STREAM):
        return await self.js.get_msg(stream, seq)

    async def messages_by_id(self, stream=STREAM):
        """{event id: [stored message, ...]} for the whole stream."""
        info = await self.js.stream_info(stream)
        out = {}
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            m = await self.message(seq, stream)
            out.setdefault(m.headers["Nats-Msg-Id"], []).append(m)
        return out

    async def ledger(self, service):
        cur = await self.db.execute(
            "SELECT event_id, stream_seq, commit_lsn, subject, applied_at"
            " FROM outbox_consumer_ledger WHERE consumer = %s ORDER BY stream_seq",
            (service,),
        )
        return await cur.fetchall()

    async def effects(self, service):
        cur = await self.db.execute(
            "SELECT event_id, delivered, body FROM effects WHERE service = %s ORDER BY n",
            (service,),
        )
        return await cur.fetchall()

    async def postmaster_start_time(self):
        cur = await self.db.execute("SELECT pg_postmaster_start_time()")
        return (await cur.fetchone())[0]

    async def wait_ledger(self, service, n, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = await self.ledger(service)
            except psycopg.errors.UndefinedTable:
                rows = []
            if len(rows) >= n:
                return rows
            assert time.monotonic() < deadline, f"ledger of {service}: {rows}, not {n} rows"
            await asyncio.sleep(0.05)


async def recording_handler(conn, event, service):
    await conn.execute(
        "INSERT INTO effects (service, event_id, delivered, body) VALUES (%s, %s, %s, %s)",
        (service, event.id, event.delivered, event.payload.decode()),
    )


class Running:
    """A consumer's ``run`` as a task, stopped (and awaited) on exit."""

    def __init__(self, consumer, handler):
        self.consumer, self.handler = consumer, handler

    async def __aenter__(self):
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.consumer.run(self.handler, self.stop))
        return self

    async def __aexit__(self, *exc):
        self.stop.set()
        await asyncio.wait_for(self.task, 30)
