// A consumer service as its own process, for the kill -9 test: records each event in `effects`
// in the ledger transaction; with HANG_ON=<id> it writes MARKER and hangs in that event's handler.
import { connect } from "@nats-io/transport-node";
import { writeFileSync } from "node:fs";
import { Consumer } from "../src/index.js";

const [natsUrl, pgUrl, service] = process.argv.slice(2);
const nc = await connect({ servers: natsUrl });
const consumer = new Consumer(nc, pgUrl, service, { ackWaitMs: 2000, backoffInitialMs: 100, backoffMaxMs: 500 });
await consumer.run(async (client, event) => {
  await client.query("INSERT INTO effects (service, event_id, delivered, body) VALUES ($1, $2, $3, $4)", [service, event.id, event.delivered, Buffer.from(event.payload).toString()]);
  if (event.id === process.env.HANG_ON) {
    writeFileSync(process.env.MARKER!, event.id);
    await new Promise((r) => setTimeout(r, 3_600_000));
  }
});
