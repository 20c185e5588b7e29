// What the tests against real servers share: a started Env with its connections, and helpers
// that read the stream, the ledger and the effects a handler recorded.
import { jetstreamManager, type JetStreamManager, type StoredMsg } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import pg from "pg";
import type { Consumer, Event, Handler } from "../src/index.js";
import { Env, STREAM, waitFor } from "./harness.js";

export const FAST = { ackWaitMs: 2000, backoffInitialMs: 100, backoffMaxMs: 500 };

export interface T {
  env: Env;
  nc: NatsConnection;
  jsm: JetStreamManager;
  db: pg.Client;
}

export async function withEnv(body: (t: T) => Promise<void>, duplicateWindow = "2m"): Promise<void> {
  const env = await Env.start(duplicateWindow);
  const nc = await connect({ servers: env.nats.url() });
  const db = new pg.Client(env.pg.url());
  await db.connect();
  // A test may replace t.db (after a PostgreSQL restart); the last one is closed.
  const t: T = { env, nc, jsm: await jetstreamManager(nc), db };
  try {
    await body(t);
  } finally {
    await t.db.end().catch(() => undefined);
    await nc.close();
    env.close();
  }
}

export async function insert(t: T, bodies: object[], type = "order-created"): Promise<string[]> {
  await t.db.query("BEGIN");
  const ids: string[] = [];
  for (const b of bodies) {
    const r = await t.db.query("INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', '7', $1, $2) RETURNING id::text AS id", [type, JSON.stringify(b)]);
    ids.push(r.rows[0].id);
  }
  await t.db.query("COMMIT");
  return ids;
}

export const waitStream = (t: T, n: number, stream = STREAM) =>
  waitFor(async () => {
    const info = await t.jsm.streams.info(stream).catch(() => null);
    return info && info.state.messages >= n ? info.state : null;
  }, `${stream} with ${n} messages`);

export const message = async (t: T, seq: number, stream = STREAM): Promise<StoredMsg> => (await t.jsm.streams.getMessage(stream, { seq }))!;

export async function ledger(t: T, service: string) {
  const r = await t.db.query("SELECT event_id, stream_seq::int AS seq, commit_lsn, applied_at FROM outbox_consumer_ledger WHERE consumer = $1 ORDER BY stream_seq", [service]).catch(() => ({ rows: [] }));
  return r.rows as { event_id: string; seq: number; commit_lsn: string; applied_at: Date }[];
}

export const waitLedger = (t: T, service: string, n: number, ms = 30000) =>
  waitFor(
    async () => {
      const rows = await ledger(t, service);
      return rows.length >= n ? rows : null;
    },
    `${n} ledger rows of ${service}`,
    ms,
  );

export async function effects(t: T, service: string) {
  const r = await t.db.query("SELECT event_id, delivered, body FROM effects WHERE service = $1 ORDER BY n", [service]);
  return r.rows as { event_id: string; delivered: number; body: string }[];
}

export const record = (service: string) => async (client: pg.Client, event: Event) => {
  await client.query("INSERT INTO effects (service, event_id, delivered, body) VALUES ($1, $2, $3, $4)", [service, event.id, event.delivered, Buffer.from(event.payload).toString()]);
};

export async function running<R>(consumer: Consumer, handler: Handler, body: () => Promise<R>): Promise<R> {
  const stop = new AbortController();
  const run = consumer.run(handler, stop.signal);
  try {
    return await body();
  } finally {
    stop.abort();
    await run;
  }
}
