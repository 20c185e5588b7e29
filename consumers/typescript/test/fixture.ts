// What outbox-relay stores for crates/outbox-schema/tests/fixtures/contracts/order-placed.json (its
// KV key and exact bytes) and its verdict on each payload, written by the schema crate's
// tests/stored_fixture.rs: the consumers' tests judge the same payloads against the same bytes.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO } from "./harness.js";

export interface Fixture {
  key: string;
  stored: string;
  cases: { payload: string; valid: boolean; pointer?: string; keyword?: string }[];
}

export const FIXTURE: Fixture = JSON.parse(readFileSync(join(REPO, "crates/outbox-schema/tests/fixtures/stored.json"), "utf8"));
