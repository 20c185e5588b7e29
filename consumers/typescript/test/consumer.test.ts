// The consumer against real PostgreSQL, nats-server and outbox-relay processes.
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DeliverPolicy, jetstream } from "@nats-io/jetstream";
import pg from "pg";
import { Consumer, ConsumerError, contract as c, locate, parseLsn, parseRfc3339Micros } from "../src/index.js";
import { STREAM, waitFor } from "./harness.js";
import { effects, FAST, insert, ledger, message, record, running, waitLedger, waitStream, withEnv, type T } from "./support.js";

test("a handler failing once is redelivered and applied once", () =>
  withEnv(async (t) => {
    const ids = await insert(t, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    await waitStream(t, 3);
    const failed: string[] = [];
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", FAST);
    const rows = await running(
      consumer,
      async (client, event) => {
        await record("svc")(client, event);
        if (event.id === ids[1] && event.delivered === 1) {
          failed.push(event.id);
          throw new Error("transient failure");
        }
      },
      () => waitLedger(t, "svc", 3),
    );
    assert.deepEqual(failed, [ids[1]]);
    assert.deepEqual(rows.map((r) => r.event_id), ids);
    for (const [i, r] of rows.entries()) {
      const m = await message(t, i + 1);
      assert.equal(m.header.get(c.HEADER_MSG_ID), r.event_id);
      assert.deepEqual([r.seq, r.commit_lsn], [m.seq, m.header.get(c.HEADER_COMMIT_LSN)]);
    }
    assert.deepEqual((await effects(t, "svc")).map((e) => [e.event_id, e.delivered]), [[ids[0], 1], [ids[1], 2], [ids[2], 1]]);
    assert.deepEqual([consumer.stats.applied, consumer.stats.retried, consumer.stats.duplicates], [3, 1, 0]);
  }));

test("a re-send past the duplicate window is applied once", () =>
  withEnv(async (t) => {
    const [e1] = await insert(t, [{ n: 1 }]);
    await waitStream(t, 1);
    const first = await message(t, 1);
    // Re-send the relay's message as the relay does after a crash: same headers and Nats-Msg-Id.
    await new Promise((r) => setTimeout(r, 600));
    const ack = await jetstream(t.nc).publish(first.subject, first.data, { headers: first.header });
    assert.deepEqual([ack.duplicate, ack.seq], [false, 2]);
    const [e2] = await insert(t, [{ n: 2 }]);
    await waitStream(t, 3);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", FAST);
    await running(consumer, record("svc"), async () => {
      await waitLedger(t, "svc", 2);
      await waitFor(() => consumer.stats.duplicates === 1, "the copy skipped");
    });
    assert.deepEqual((await ledger(t, "svc")).map((r) => [r.event_id, r.seq]), [[e1, 1], [e2, 3]]);
    assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), [e1, e2]);
    assert.deepEqual([consumer.stats.applied, consumer.stats.duplicates], [2, 1]);
  }, "300ms"));

/** test/service.ts as its own process, consuming as service "svc". */
const service = (t: T, env: Record<string, string>) =>
  spawn(process.execPath, [join(import.meta.dirname, "service.js"), t.env.nats.url(), t.env.pg.url(), "svc"], { stdio: "inherit", env: { ...process.env, ...env } });

const exited = (p: ChildProcess) => new Promise((r) => (p.exitCode !== null || p.signalCode !== null ? r(null) : p.once("exit", r)));

test("a consumer killed in the handler applies the event once after a restart", () =>
  withEnv(async (t) => {
    const ids = await insert(t, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    await waitStream(t, 3);
    const marker = join(t.env.dir, "in-handler");
    const hung = service(t, { HANG_ON: ids[1], MARKER: marker });
    try {
      await waitFor(() => existsSync(marker), "the handler of the second event");
      assert.deepEqual((await ledger(t, "svc")).map((r) => r.event_id), [ids[0]]);
    } finally {
      hung.kill("SIGKILL");
    }
    await exited(hung);
    // PostgreSQL rolled the open transaction back with the connection.
    assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), [ids[0]]);
    const again = service(t, {});
    try {
      const rows = await waitLedger(t, "svc", 3);
      assert.deepEqual(rows.map((r) => r.event_id), ids);
    } finally {
      again.kill("SIGKILL");
    }
    const applied = await effects(t, "svc");
    assert.deepEqual(applied.map((e) => e.event_id), ids, "each event applied exactly once");
    assert.ok(applied[1].delivered >= 2, "the second event was redelivered");
  }));

test("a consumer killed after COMMIT, before the ack, skips the redelivered event", () =>
  withEnv(async (t) => {
    const ids = await insert(t, [{ n: 1 }, { n: 2 }, { n: 3 }]);
    await waitStream(t, 3);
    const marker = join(t.env.dir, "committed");
    const hung = service(t, { HANG_ON: ids[1], HANG_AT: "before-ack", MARKER: marker });
    let committed: Awaited<ReturnType<typeof ledger>>;
    try {
      await waitFor(() => existsSync(marker), "the commit of the second event");
      // The kill lands after COMMIT (the second event's ledger row and effect are there) and
      // before the ack (the server still waits for it).
      committed = await ledger(t, "svc");
      assert.deepEqual(committed.map((r) => r.event_id), ids.slice(0, 2));
      assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), ids.slice(0, 2));
      const info = await t.jsm.consumers.info(STREAM, "svc");
      assert.deepEqual([info.num_ack_pending, info.ack_floor.stream_seq, info.delivered.stream_seq], [1, 1, 2]);
    } finally {
      hung.kill("SIGKILL");
    }
    await exited(hung);
    const again = service(t, {});
    let rows, info;
    try {
      rows = await waitLedger(t, "svc", 3);
      info = await waitFor(async () => {
        const i = await t.jsm.consumers.info(STREAM, "svc");
        return i.ack_floor.stream_seq === 3 && i.num_ack_pending === 0 ? i : null;
      }, "the ack floor at sequence 3");
    } finally {
      again.kill("SIGKILL");
    }
    await exited(again);
    assert.deepEqual(rows.map((r) => r.event_id), ids);
    assert.deepEqual(rows[1].applied_at, committed[1].applied_at, "the second event's ledger row is the first one");
    // The handler ran once per event: the second only on its first delivery.
    assert.deepEqual((await effects(t, "svc")).map((e) => [e.event_id, e.delivered]), [[ids[0], 1], [ids[1], 1], [ids[2], 1]]);
    // Sequence 2 was delivered again (to the new process), which acked it.
    assert.ok(info.delivered.consumer_seq >= 4, `delivered ${JSON.stringify(info.delivered)}`);
  }));

test("a poison event is parked with its reason and later events flow", () =>
  withEnv(async (t) => {
    await t.jsm.streams.add({ name: "DLQ", subjects: ["dlq.>"] });
    const [poison] = await insert(t, [{ bad: true }], "poison");
    const [good] = await insert(t, [{ n: 2 }]);
    await waitStream(t, 2);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", { ...FAST, maxDeliver: 3 });
    await running(
      consumer,
      async (client, event) => {
        if (event.eventType === "poison") throw new Error("cannot decode the payload");
        await record("svc")(client, event);
      },
      async () => {
        await waitLedger(t, "svc", 1);
        await waitStream(t, 1, "DLQ");
      },
    );
    const dl = await message(t, 1, "DLQ");
    const original = await message(t, 1);
    const h = dl.header;
    assert.equal(dl.subject, "dlq.svc");
    assert.equal(h.get(c.HEADER_DLQ_REASON), "handler failed 3 times; last error: cannot decode the payload");
    assert.equal(h.get(c.HEADER_DLQ_SUBJECT), "outbox.Order.poison");
    assert.equal(h.get(c.HEADER_DLQ_EVENT_ID), poison);
    assert.equal(h.get(c.HEADER_DLQ_DELIVERIES), "3");
    assert.equal(h.get(c.HEADER_DLQ_CONSUMER), "svc");
    assert.equal(h.get(c.HEADER_DLQ_SOURCE), `${STREAM}:${original.seq}`);
    assert.equal(h.get("Nats-Msg-Id"), `dlq:svc:${poison}`);
    assert.equal(h.get("Outbox-Original-Msg-Id"), poison);
    assert.equal(h.get("Outbox-Original-Expected-Stream"), STREAM);
    assert.equal(h.has("Nats-Expected-Stream"), false);
    assert.equal(h.get(c.HEADER_COMMIT_LSN), original.header.get(c.HEADER_COMMIT_LSN));
    assert.deepEqual(JSON.parse(Buffer.from(dl.data).toString()), { bad: true });
    assert.deepEqual((await ledger(t, "svc")).map((r) => r.event_id), [good]);
    assert.deepEqual([consumer.stats.parked, consumer.stats.retried], [1, 2]);
  }));

test("a new durable starts at a commit LSN or time as outbox-relay position finds it", () =>
  withEnv(async (t) => {
    const batches: string[][] = [];
    for (let i = 0; i < 3; i++) batches.push(await insert(t, [{ tx: i, k: 0 }, { tx: i, k: 1 }]));
    await waitStream(t, 6);
    const second = await message(t, 3);
    assert.equal(second.header.get(c.HEADER_MSG_ID), batches[1][0]);
    const lsnText = second.header.get(c.HEADER_COMMIT_LSN);
    const found = await locate(t.jsm, jetstream(t.nc), STREAM, { lsn: parseLsn(lsnText) });
    assert.equal(found.sequence, 3);
    for (const extra of [["--no-map"], []]) {
      const out = JSON.parse(t.env.relayCommand("position", "--lsn", lsnText, "--json", ...extra));
      assert.equal(out.sequence, found.sequence);
    }
    const firstLsn = parseLsn((await message(t, 1)).header.get(c.HEADER_COMMIT_LSN));
    assert.equal((await locate(t.jsm, jetstream(t.nc), STREAM, { lsn: firstLsn + 1n })).sequence, 3);
    const lastLsn = parseLsn((await message(t, 5)).header.get(c.HEADER_COMMIT_LSN));
    assert.equal((await locate(t.jsm, jetstream(t.nc), STREAM, { lsn: lastLsn + 1n })).sequence, 7);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "by-lsn", { ...FAST, startAt: { lsn: lsnText } });
    const rows = await running(consumer, record("by-lsn"), () => waitLedger(t, "by-lsn", 4));
    assert.deepEqual(rows.map((r) => r.event_id), [...batches[1], ...batches[2]]);
    assert.deepEqual(rows.map((r) => r.seq), [3, 4, 5, 6]);

    // By time: the third commit's time, as the header carries it (microseconds).
    const third = await message(t, 5);
    assert.equal(third.header.get(c.HEADER_MSG_ID), batches[2][0]);
    const thirdTime = third.header.get(c.HEADER_COMMIT_TIME);
    assert.equal((await locate(t.jsm, jetstream(t.nc), STREAM, { timeMicros: parseRfc3339Micros(thirdTime) })).sequence, 5);
    const out = JSON.parse(t.env.relayCommand("position", "--time", thirdTime, "--json", "--no-map"));
    assert.equal(out.sequence, 5);
    const byTime = new Consumer(t.nc, t.env.pg.url(), "by-time", { ...FAST, startAt: { time: thirdTime } });
    const timeRows = await running(byTime, record("by-time"), () => waitLedger(t, "by-time", 2));
    const { config } = await t.jsm.consumers.info(STREAM, "by-time");
    assert.deepEqual([config.deliver_policy, config.opt_start_seq], [DeliverPolicy.StartSequence, 5]);
    assert.deepEqual(timeRows.map((r) => [r.event_id, r.seq]), [[batches[2][0], 5], [batches[2][1], 6]]);
    // One microsecond after the last commit: past it (a time cut to milliseconds would not be).
    const micros = parseRfc3339Micros(thirdTime) + 1n;
    const justAfter = `${new Date(Number(micros / 1000n)).toISOString().slice(0, 19)}.${(micros % 1_000_000n).toString().padStart(6, "0")}Z`;
    assert.equal(JSON.parse(t.env.relayCommand("position", "--time", justAfter, "--json", "--no-map")).sequence, 7);
    await running(new Consumer(t.nc, t.env.pg.url(), "after-all", { ...FAST, startAt: { time: justAfter } }), record("after-all"), async () => {
      await waitFor(() => t.jsm.consumers.info(STREAM, "after-all").catch(() => null), "durable after-all");
    });
    assert.equal((await t.jsm.consumers.info(STREAM, "after-all")).config.opt_start_seq, 7);
    const bad = new Consumer(t.nc, t.env.pg.url(), "bad-time", { ...FAST, startAt: { time: "yesterday" } });
    await assert.rejects(bad.run(record("bad-time")), (e: Error) => e instanceof ConsumerError && e.message.includes('"yesterday"'));
  }));

test("events are applied once across a PostgreSQL restart", () =>
  withEnv(async (t) => {
    const ids = await insert(t, [{ n: 1 }, { n: 2 }]);
    await waitStream(t, 2);
    const consumer = new Consumer(t.nc, t.env.pg.url(), "svc", FAST);
    const rows = await running(consumer, record("svc"), async () => {
      await waitLedger(t, "svc", 2);
      const started = async () => (await t.db.query("SELECT pg_postmaster_start_time() AS at")).rows[0].at as Date;
      const before = await started();
      // The test's own connection would error out on the restart: close it first.
      await t.db.end();
      await t.env.pg.restartImmediate();
      t.db = new pg.Client(t.env.pg.url());
      await t.db.connect();
      assert.ok((await started()) > before, "PostgreSQL restarted");
      ids.push(...(await insert(t, [{ n: 3 }, { n: 4 }])));
      return waitLedger(t, "svc", 4, 60000);
    });
    assert.deepEqual(rows.map((r) => r.event_id), ids);
    assert.deepEqual((await effects(t, "svc")).map((e) => e.event_id), ids);
    assert.equal(consumer.stats.applied, 4);
  }));

test("re-apply after a bug fix runs the fixed handler once per event", () =>
  withEnv(async (t) => {
    const ids = await insert(t, [{ n: 1 }, { n: 2 }]);
    await waitStream(t, 2);
    const firstLsn = (await message(t, 1)).header.get(c.HEADER_COMMIT_LSN);
    const buggy = new Consumer(t.nc, t.env.pg.url(), "svc", FAST);
    await running(buggy, async (client, e) => {
      await client.query("INSERT INTO effects (service, event_id, delivered, body) VALUES ('svc', $1, $2, 'wrong')", [e.id, e.delivered]);
    }, () => waitLedger(t, "svc", 2));
    await new Promise((r) => setTimeout(r, 20));
    const fixedAt = new Date();
    t.env.relayCommand("replay", "--from-lsn", firstLsn, "--consumer", "svc", "--yes");
    const fixed = new Consumer(t.nc, t.env.pg.url(), "svc", { ...FAST, reapply: { fromLsn: parseLsn(firstLsn), recordedBefore: fixedAt } });
    await running(fixed, async (client, e) => {
      assert.ok(e.reapplied);
      await client.query("UPDATE effects SET body = 'right' WHERE service = 'svc' AND event_id = $1", [e.id]);
    }, () => waitFor(() => fixed.stats.applied === 2, "both re-applied"));
    const after = await ledger(t, "svc");
    assert.deepEqual(after.map((r) => r.event_id), ids);
    assert.ok(after.every((r) => r.applied_at > fixedAt), "each ledger row replaced");
    assert.deepEqual((await effects(t, "svc")).map((e) => [e.event_id, e.body]), [[ids[0], "right"], [ids[1], "right"]]);
  }));
