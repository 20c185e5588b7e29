import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { contract as c, eventFromParts, InvalidMessage } from "../src/index.js";
import { headers } from "@nats-io/transport-node";
import { REPO } from "./harness.js";

const PKG = join(import.meta.dirname, "../../src");

test("the packaged copies are the crate's files byte for byte", () => {
  assert.deepEqual(readFileSync(join(PKG, "contract.json")), readFileSync(join(REPO, "crates/outbox-contract/contract.json")));
  assert.deepEqual(readFileSync(join(PKG, "ledger.sql")), readFileSync(join(REPO, "crates/outbox-consumer/migrations/0001_consumer_ledger.sql")));
});

test("the LSN text form follows the contract's examples", () => {
  for (const ex of c.CONTRACT.lsn.format_examples) {
    assert.equal(c.formatLsn(BigInt(ex.value)), ex.text);
    assert.equal(c.parseLsn(ex.text), BigInt(ex.value));
  }
  for (const ex of c.CONTRACT.lsn.parse_examples) assert.equal(c.parseLsn(ex.text), BigInt(ex.value));
  for (const bad of [...c.CONTRACT.lsn.invalid, "0/1\n"]) assert.throws(() => c.parseLsn(bad), c.LsnError, bad);
});

test("reserved headers are renamed, others kept", () => {
  assert.equal(c.originalName("Nats-Expected-Stream"), "Outbox-Original-Expected-Stream");
  assert.equal(c.originalName("nats-msg-id"), "Outbox-Original-msg-id");
  for (const name of [...c.CONTRACT.lists.STREAM_BINDING_HEADERS, ...c.CONTRACT.lists.SERVER_ACTION_HEADERS]) {
    const kept = c.originalName(name)!;
    assert.ok(kept.startsWith(c.HEADER_ORIGINAL_PREFIX) && !kept.toLowerCase().includes("nats-"), kept);
  }
  for (const name of ["Outbox-Commit-Lsn", "traceparent", "Nats", "X-Nats-Msg-Id", ""]) assert.equal(c.originalName(name), null);
});

test("dead-letter reasons, ids and sources", () => {
  assert.equal(c.sanitizeReason("a\r\nb"), "a  b");
  const long = c.sanitizeReason("é".repeat(2000));
  assert.ok(Buffer.byteLength(long) <= c.REASON_MAX_BYTES && /^é+$/.test(long));
  assert.equal(c.deadLetterId("svc", "e1", "OUTBOX", 9), "dlq:svc:e1");
  assert.equal(c.deadLetterId("svc", "", "OUTBOX", 9), "dlq:svc:OUTBOX:9");
  assert.equal(c.deadLetterId("svc", "e{seq}", "OUTBOX", 9), "dlq:svc:e{seq}");
  assert.equal(c.deadLetterSource("OUTBOX", 9), "OUTBOX:9");
});

test("events read the relay's headers", () => {
  const h = headers();
  for (const [k, v] of [["Nats-Msg-Id", " e1 "], ["Outbox-Commit-Lsn", "0/16B3748"], ["Outbox-Xid", "771"], ["Outbox-Commit-Time", "2026-11-29T11:38:44.123456789Z"], ["Outbox-Tx-Index", "x"]]) h.set(k, v);
  const e = eventFromParts("outbox.Order.created", h, new Uint8Array(), 5, 2);
  assert.deepEqual([e.id, e.commitLsn, e.xid, e.txIndex, e.commitTimeMicros], ["e1", 0x16b3748n, 771, null, 1795952324123456n]);
  const none = headers();
  none.set("Nats-Msg-Id", "  ");
  assert.throws(() => eventFromParts("s", none, new Uint8Array()), InvalidMessage);
});
