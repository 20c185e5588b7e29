// Event contracts without servers: the relay's stored fixture judged as the relay judges it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { headers } from "@nats-io/transport-node";
import type { JetStreamClient } from "@nats-io/jetstream";
import { contract as c, ContractRefused, ContractValidator, EventContract, versionOf, violationText } from "../src/index.js";
import { FIXTURE } from "./fixture.js";

const bytes = (text: string) => new TextEncoder().encode(text);
const fixtureContract = () => EventContract.fromStored(FIXTURE.key, bytes(FIXTURE.stored));

/** A contract stored as the relay stores one: compact JSON under `<name>.<digest>`. */
function storedContract(schema: object): EventContract {
  const stored = bytes(JSON.stringify(schema));
  return EventContract.fromStored(`test.${versionOf(stored)}`, stored);
}

function refusal(f: () => unknown): ContractRefused {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ContractRefused, String(e));
    return e;
  }
  assert.fail("not refused");
}

test("the fixture's key names the digest of the stored bytes", () => {
  const [name, version] = FIXTURE.key.split(".");
  assert.equal(versionOf(bytes(FIXTURE.stored)), version);
  const contract = fixtureContract();
  assert.deepEqual([contract.name, contract.version], [name, version]);
});

test("each fixture case gets the relay's verdict, pointer and keyword", () => {
  const contract = fixtureContract();
  assert.ok(FIXTURE.cases.length >= 6 && FIXTURE.cases.some((x) => !x.valid));
  for (const x of FIXTURE.cases) {
    const violation = contract.check(bytes(x.payload));
    if (x.valid) {
      assert.equal(violation, null, x.payload);
      contract.validate(bytes(x.payload));
      continue;
    }
    assert.ok(violation, x.payload);
    assert.deepEqual([violation.pointer, violation.keyword], [x.pointer, x.keyword], x.payload);
    const refused = refusal(() => contract.validate(bytes(x.payload)));
    assert.ok(refused.message.startsWith(`contract ${FIXTURE.key}: at ${x.pointer || "(root)"}: keyword \`${x.keyword}\` expected `), refused.message);
    assert.deepEqual(refused.violation, violation);
  }
});

test("the reason names what was expected and found", () => {
  const bad = FIXTURE.cases.find((x) => x.keyword === "type")!;
  assert.equal(violationText(fixtureContract().check(bytes(bad.payload))!), 'at /total/cents: keyword `type` expected "integer", found "1250" (must be integer)');
});

test("bytes changed by one byte are refused", () => {
  const stored = bytes(FIXTURE.stored);
  for (const at of [FIXTURE.stored.indexOf("OrderPlaced") + 5, stored.length - 2]) {
    const changed = Uint8Array.from(stored);
    changed[at] ^= 0x01;
    const refused = refusal(() => EventContract.fromStored(FIXTURE.key, changed));
    assert.equal(refused.message, `contract ${FIXTURE.key}: the stored document hashes to version ${versionOf(changed)}, not to the version its key names`);
  }
});

test("a payload that is not JSON is refused", () => {
  const contract = fixtureContract();
  for (const payload of [bytes('{"order_id":'), Uint8Array.from([0xff, 0xfe]), bytes('{"order_id": NaN}'), new Uint8Array()]) {
    const violation = contract.check(payload);
    assert.ok(violation !== null && violation.keyword === null, String(payload));
    assert.match(violation.message, /^payload is not JSON: /);
  }
});

test("a $ref outside the stored document is refused, not fetched", () => {
  const refused = refusal(() => storedContract({ $id: "file:///a.json", properties: { x: { $ref: "https://example.com/x.json" } } }));
  assert.match(refused.message, /^contract test\.[0-9a-f]{12}: not a usable schema: .*example\.com/);
});

test("draft 7 bundles resolve their definitions, and format is not checked", () => {
  const contract = storedContract({
    $schema: "http://json-schema.org/draft-07/schema#",
    $id: "file:///user.json",
    definitions: { "file:///shared/email.json": { $id: "file:///shared/email.json", type: "string", format: "email", maxLength: 8 } },
    properties: { email: { $ref: "shared/email.json" } },
    required: ["email"],
  });
  assert.equal(contract.check(bytes('{"email": "not-one"}')), null, "format is an annotation");
  const tooLong = contract.check(bytes('{"email": "123456789"}'))!;
  assert.deepEqual([tooLong.pointer, tooLong.keyword], ["/email", "maxLength"]);
  // Draft 7 has no prefixItems: a 2020-12 keyword is ignored there, not applied.
  const ignored = storedContract({ $schema: "http://json-schema.org/draft-07/schema#", prefixItems: [{ type: "string" }] });
  assert.equal(ignored.check(bytes("[1]")), null);
});

test("pointers escape slash and tilde", () => {
  const violation = storedContract({ properties: { "a/b": { properties: { "~c": { type: "null" } } } } }).check(bytes('{"a/b": {"~c": 1}}'))!;
  assert.deepEqual([violation.pointer, violation.keyword], ["/a~1b/~0c", "type"]);
});

test("unusable contracts are refused", () => {
  assert.match(refusal(() => storedContract({ $schema: "http://json-schema.org/draft-04/schema#" })).message, /keyword `\$schema`/);
  assert.match(refusal(() => storedContract({ type: 12 })).message, /not a usable schema/);
  assert.match(refusal(() => EventContract.fromStored("order placed.565aaced9d08", bytes(FIXTURE.stored))).message, /not a valid contracts bucket key/);
  assert.match(refusal(() => EventContract.fromStored("order-placed.565AACED9D08", bytes(FIXTURE.stored))).message, /not a valid contracts bucket key/);
});

test("messages without the header pass unless it is required", async () => {
  // No KV access happens for these: a client that fails on use proves it.
  const js = null as unknown as JetStreamClient;
  const plain = headers();
  plain.set("Nats-Msg-Id", "e1");
  assert.equal(await new ContractValidator(js).validate(plain, bytes("not json")), null);
  const blank = headers();
  blank.set(c.HEADER_SCHEMA, "  ");
  assert.equal(await new ContractValidator(js).validate(blank, bytes("not json")), null);
  const strict = new ContractValidator(js, c.CONTRACTS_BUCKET, true);
  await assert.rejects(strict.validate(plain, bytes("{}")), { message: "contract required: the event has no Outbox-Schema header and this consumer requires one" });
  const odd = headers();
  odd.set(c.HEADER_SCHEMA, "../etc");
  await assert.rejects(strict.validate(odd, bytes("{}")), (e) => e instanceof ContractRefused && /not a valid contracts bucket key/.test(e.message));
});

test("the header and bucket names come from the wire contract", () => {
  assert.deepEqual([c.HEADER_SCHEMA, c.CONTRACTS_BUCKET], ["Outbox-Schema", "outbox-contracts"]);
  assert.equal(new ContractValidator(null as unknown as JetStreamClient).bucket, c.CONTRACTS_BUCKET);
});

test("patterns are read as ECMA-262", () => {
  const contract = fixtureContract();
  const base = { customer: "c-7", total: { cents: 1, currency: "EUR" } };
  for (const orderId of ["o-1\n", "o-\u0663"]) {
    const violation = contract.check(bytes(JSON.stringify({ ...base, order_id: orderId })))!;
    assert.deepEqual([violation.pointer, violation.keyword], ["/order_id", "pattern"], orderId);
  }
  assert.equal(contract.check(bytes(JSON.stringify({ ...base, order_id: "o-12" }))), null);
  const word = storedContract({ pattern: "^[\\w$]+$" });
  assert.equal(word.check(bytes('"a_1$"')), null);
  assert.equal(word.check(bytes('"\\u00e9"'))?.keyword, "pattern", "\\w is ASCII");
});
