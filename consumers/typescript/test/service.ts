// A consumer service as its own process, for the kill -9 tests: records each event in `effects`
// in the ledger transaction. With HANG_ON=<id> it writes MARKER and hangs when it reaches that
// event: HANG_AT=handler (the default) in the handler, the transaction open; HANG_AT=before-ack
// after COMMIT, before the message is acked (the library's test hook).
import { connect } from "@nats-io/transport-node";
import { writeFileSync } from "node:fs";
import { Consumer, type Event } from "../src/index.js";

const [natsUrl, pgUrl, service] = process.argv.slice(2);
const hangAt = process.env.HANG_AT ?? "handler";
const hang = async (event: Event) => {
  writeFileSync(process.env.MARKER!, event.id);
  await new Promise((r) => setTimeout(r, 3_600_000));
};
const nc = await connect({ servers: natsUrl });
const consumer = new Consumer(nc, pgUrl, service, {
  ackWaitMs: 2000,
  backoffInitialMs: 100,
  backoffMaxMs: 500,
  testHook: async (point, event) => {
    if (hangAt === "before-ack" && point === "beforeAck" && event.id === process.env.HANG_ON) await hang(event);
  },
});
await consumer.run(async (client, event) => {
  await client.query("INSERT INTO effects (service, event_id, delivered, body) VALUES ($1, $2, $3, $4)", [service, event.id, event.delivered, Buffer.from(event.payload).toString()]);
  if (hangAt === "handler" && event.id === process.env.HANG_ON) await hang(event);
});
