"""A consumer service as its own process, for the kill -9 tests: it records each event in
``effects`` in the ledger transaction. With ``--hang-on ID`` it writes ``--marker`` and hangs
when it reaches that event: ``--hang-at handler`` (the default) in the handler, the
transaction open and the ledger row uncommitted; ``--hang-at before-ack`` after ``COMMIT``,
before the message is acked (the library's test hook)."""

import argparse
import asyncio
from pathlib import Path

import nats

from outbox_consumer import Consumer


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True)
    ap.add_argument("--pg", required=True)
    ap.add_argument("--service", required=True)
    ap.add_argument("--hang-on")
    ap.add_argument("--hang-at", choices=["handler", "before-ack"], default="handler")
    ap.add_argument("--marker")
    args = ap.parse_args()
    nc = await nats.connect(args.nats)

    async def hang(event) -> None:
        Path(args.marker).write_text(event.id)
        await asyncio.sleep(3600)

    async def handler(conn, event):
        await conn.execute(
            "INSERT INTO effects (service, event_id, delivered, body) VALUES (%s, %s, %s, %s)",
            (args.service, event.id, event.delivered, event.payload.decode()),
        )
        if args.hang_at == "handler" and event.id == args.hang_on:
            await hang(event)

    async def hook(point, event):
        if args.hang_at == "before-ack" and point == "before_ack" and event.id == args.hang_on:
            await hang(event)

    consumer = Consumer(nc.jetstream(), args.pg, args.service, ack_wait=2.0,
                        backoff_initial=0.1, backoff_max=0.5, test_hook=hook)
    await consumer.run(handler)


asyncio.run(main())
