"""A consumer service as its own process, for the kill -9 test: it records each event in
``effects`` in the ledger transaction; with ``--hang-on ID`` it writes ``--marker`` and hangs in
the handler for that event (the transaction open, the ledger row uncommitted)."""

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
    ap.add_argument("--marker")
    args = ap.parse_args()
    nc = await nats.connect(args.nats)

    async def handler(conn, event):
        await conn.execute(
            "INSERT INTO effects (service, event_id, delivered, body) VALUES (%s, %s, %s, %s)",
            (args.service, event.id, event.delivered, event.payload.decode()),
        )
        if event.id == args.hang_on:
            Path(args.marker).write_text(event.id)
            await asyncio.sleep(3600)

    consumer = Consumer(nc.jetstream(), args.pg, args.service, ack_wait=2.0,
                        backoff_initial=0.1, backoff_max=0.5)
    await consumer.run(handler)


asyncio.run(main())
