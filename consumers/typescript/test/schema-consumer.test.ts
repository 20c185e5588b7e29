// Contract validation in the consumer, against real nats-server (KV bucket, streams) and
// PostgreSQL processes: events carrying the relay's headers and an Outbox-Schema key.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { jetstream, type StoredMsg } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { headers } from "@nats-io/transport-node";
import { Consumer, ConsumerError, contract as c } from "../src/index.js";
import { FIXTURE } from "./fixture.js";
import { STREAM, waitFor } from "./harness.js";
import { effects, FAST, ledger, message, record, running, waitLedger, waitStream, withEnv, type T } from "./support.js";

const VALID = FIXTURE.cases.find((x) => x.valid)!;
const INVALID = FIXTURE.cases.find((x) => x.keyword === "type")!;
const SUBJECT = "outbox.Order.order-placed";
const DLQ = "DLQ";

/** Publishes one event to the relay's stream with the headers the relay puts on it (as the
 * stored copies in consumer.test.ts have them), and the contract key when there is one. */
async function publish(t: T, payload: string, schemaKey?: string): Promise<string> {
  const id = randomUUID();
  const n = (await t.jsm.streams.info(STREAM)).state.messages + 1;
  const h = headers();
  const values: [string, string][] = [
    [c.HEADER_MSG_ID, id],
    [c.HEADER_EXPECTED_STREAM, STREAM],
    [c.HEADER_COMMIT_LSN, `0/${(0x16b3748 + n).toString(16).toUpperCase()}`],
    [c.HEADER_XID, String(700 + n)],
    [c.HEADER_COMMIT_TIME, `2026-11-29T11:38:44.${String(n).padStart(6, "0")}Z`],
    [c.HEADER_TABLE, "public.outbox"],
    [c.HEADER_TX_INDEX, "0"],
    [c.HEADER_AGGREGATE_TYPE, "Order"],
    [c.HEADER_AGGREGATE_ID, "7"],
    [c.HEADER_EVENT_TYPE, "order-placed"],
  ];
  if (schemaKey !== undefined) values.push([c.HEADER_SCHEMA, schemaKey]);
  for (const [k, v] of values) h.set(k, v);
  await jetstream(t.nc).publish(SUBJECT, new TextEncoder().encode(payload), { headers: h });
  return id;
}

async function putFixture(t: T, bucket = c.CONTRACTS_BUCKET): Promise<void> {
  const kv = await new Kvm(t.nc).create(bucket);
  await kv.put(FIXTURE.key, new TextEncoder().encode(FIXTURE.stored));
}

async function deadLetters(t: T, n: number): Promise<StoredMsg[]> {
  await waitStream(t, n, DLQ);
  return Promise.all(Array.from({ length: n }, (_, i) => message(t, i + 1, DLQ)));
}

test("a valid event is applied and one breaking its contract parked with the reason", () =>
  withEnv(async (t) => {
    await t.jsm.streams.add({ name: DLQ, subjects: ["dlq.>"] });
    await putFixture(t);
    const good = await publish(t, VALID.payload, FIXTURE.key);
    const bad = await publish(t, INVALID.payload, FIXTURE.key);
    const unchecked = await publish(t, '{"no": "contract"}');
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", { ...FAST, validateContracts: true });
    const [rows, [dl]] = await running(consumer, record("svc"), async () => [await waitLedger(t, "svc", 2), await deadLetters(t, 1)] as const);
    // The valid event and the one without the header applied; the invalid one not.
    assert.deepEqual(rows.map((r) => r.event_id), [good, unchecked]);
    assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), [good, unchecked]);
    const reason = dl.header.get(c.HEADER_DLQ_REASON);
    assert.ok(reason.startsWith(`contract ${FIXTURE.key}: at ${INVALID.pointer}: keyword \`${INVALID.keyword}\` expected "integer", found "1250"`), reason);
    assert.equal(dl.header.get(c.HEADER_DLQ_EVENT_ID), bad);
    assert.equal(dl.header.get(c.HEADER_DLQ_DELIVERIES), "1");
    assert.equal(dl.header.get(c.HEADER_SCHEMA), FIXTURE.key);
    assert.equal(new TextDecoder().decode(dl.data), INVALID.payload);
    const s = consumer.stats;
    assert.deepEqual([s.applied, s.parked, s.retried, s.infraErrors], [2, 1, 0, 0]);
    assert.deepEqual([s.contractsPassed, s.contractsRefused], [1, 1]);
  }));

test("a key missing from the bucket and a missing header are refused", () =>
  withEnv(async (t) => {
    await t.jsm.streams.add({ name: DLQ, subjects: ["dlq.>"] });
    await putFixture(t, "contracts-x");
    const missingKey = `${FIXTURE.key.split(".")[0]}.000000000000`;
    const unknown = await publish(t, VALID.payload, missingKey);
    const headerless = await publish(t, VALID.payload);
    const good = await publish(t, VALID.payload, FIXTURE.key);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", { ...FAST, validateContracts: true, contractsBucket: "contracts-x", requireContract: true });
    const [rows, parked] = await running(consumer, record("svc"), async () => [await waitLedger(t, "svc", 1), await deadLetters(t, 2)] as const);
    assert.deepEqual(rows.map((r) => r.event_id), [good]);
    assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), [good]);
    const reasons = Object.fromEntries(parked.map((dl) => [dl.header.get(c.HEADER_DLQ_EVENT_ID), dl.header.get(c.HEADER_DLQ_REASON)]));
    assert.deepEqual(reasons, {
      [unknown]: `contract ${missingKey}: no such key in the contracts bucket "contracts-x"`,
      [headerless]: "contract required: the event has no Outbox-Schema header and this consumer requires one",
    });
    assert.deepEqual([consumer.stats.applied, consumer.stats.parked], [1, 2]);
  }));

test("an event whose bucket does not exist yet waits for it, unparked", () =>
  withEnv(async (t) => {
    await t.jsm.streams.add({ name: DLQ, subjects: ["dlq.>"] });
    const good = await publish(t, VALID.payload, FIXTURE.key);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", { ...FAST, validateContracts: true });
    const rows = await running(consumer, record("svc"), async () => {
      await waitFor(() => consumer.stats.infraErrors >= 2, "deliveries put back while the bucket is missing");
      assert.deepEqual(await ledger(t, "svc"), []);
      assert.equal((await t.jsm.streams.info(DLQ)).state.messages, 0);
      await putFixture(t);
      return waitLedger(t, "svc", 1);
    });
    assert.deepEqual(rows.map((r) => r.event_id), [good]);
    assert.deepEqual([consumer.stats.applied, consumer.stats.parked], [1, 0]);
  }));

test("contract settings are checked when the consumer is made", () => {
  assert.throws(() => new Consumer(null as never, "", "svc", { requireContract: true }), (e) => e instanceof ConsumerError && /requireContract needs validateContracts/.test(e.message));
  assert.throws(() => new Consumer(null as never, "", "svc", { validateContracts: true, contractsBucket: "a.b" }), (e) => e instanceof ConsumerError && /contracts bucket "a.b" must be/.test(e.message));
});
