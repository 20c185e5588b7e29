// Event contracts on the consumer side: the payload checked against the JSON Schema the relay
// checked it against before publishing. The relay names the contract in the Outbox-Schema header:
// a key `<name>.<version>` of a NATS KV bucket (outbox-contracts unless configured otherwise)
// whose value is the bundled schema, every file it refers to embedded under $defs (or
// definitions) with a file:/// $id. The version is the first 12 hex digits of the SHA-256 of
// those bytes, so a key never changes meaning: a compiled contract is cached for good, and bytes
// that do not hash to their key's version are refused. `format` is not checked, as in the relay
// (crates/outbox-schema).
import { createHash } from "node:crypto";
import { JetStreamApiCodes, JetStreamApiError, type JetStreamClient } from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import type { MsgHdrs } from "@nats-io/transport-node";
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import { Ajv2020 } from "ajv/dist/2020.js";
import * as c from "./contract.js";

/** `<name>.<version>`: the name as the relay allows it, the version 12 lowercase hex digits. */
export const KEY_PATTERN = /^[A-Za-z0-9_-]{1,64}\.[0-9a-f]{12}$/;
const VERSION_DIGITS = 12;
const DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema";
const DRAFT_7 = "http://json-schema.org/draft-07/schema";
const NOT_A_KEY = "not a valid contracts bucket key (<name>.<12 lowercase hex digits>)";
// Longest text of one part of a violation (pointer, expected, found), as the relay cuts it.
const PART_CHARS = 120;

/** The version a stored contract's bytes are: the first 12 hex digits of their SHA-256. */
export function versionOf(stored: Uint8Array): string {
  return createHash("sha256").update(stored).digest("hex").slice(0, VERSION_DIGITS);
}

/** Why a payload breaks its contract; `keyword` is null when it is not JSON at all. */
export interface Violation {
  /** JSON Pointer to the refused value; "" is the whole payload. */
  pointer: string;
  keyword: string | null;
  message: string;
  /** The keyword's value in the schema, as JSON (cut). */
  expected: string;
  /** The refused value, as JSON (cut). */
  found: string;
}

/** The relay's wording of a violation. */
export function violationText(v: Violation): string {
  if (v.keyword === null) return v.message;
  return `at ${v.pointer || "(root)"}: keyword \`${v.keyword}\` expected ${v.expected}, found ${v.found} (${v.message})`;
}

/** An event that must not be applied: its payload breaks its contract, or the contract it names
 * cannot be used (not in the bucket, bytes not of the key's version, not a schema). The message
 * is the dead-letter reason, `contract <key>: ...`. */
export class ContractRefused extends Error {
  constructor(
    readonly key: string,
    detail: string,
    readonly violation: Violation | null = null,
  ) {
    super(`contract ${key}: ${detail}`);
  }
}

/** The contract cannot be fetched now (no bucket, NATS trouble): try again later; the event is
 * not at fault. */
export class ContractUnavailable extends Error {}

const cut = (text: string, max: number): string => {
  const chars = [...text];
  return chars.length <= max ? text : `${chars.slice(0, max).join("")}…`;
};
const jsonText = (value: unknown): string => cut(JSON.stringify(value) ?? "null", PART_CHARS);
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** One stored contract, compiled: `EventContract.fromStored(key, value).check(payload)`. */
export class EventContract {
  readonly name: string;
  readonly version: string;

  private constructor(
    readonly key: string,
    readonly stored: Uint8Array,
    readonly schema: unknown,
    private readonly validator: ValidateFunction,
  ) {
    [this.name, this.version] = key.split(".");
  }

  /** Compiles the value stored under `key`; throws ContractRefused for bytes that are not the
   * key's version or not a usable schema. Nothing is fetched: every $ref must resolve within
   * the stored document. */
  static fromStored(key: string, stored: Uint8Array): EventContract {
    if (!KEY_PATTERN.test(key)) throw new ContractRefused(key, NOT_A_KEY);
    const actual = versionOf(stored);
    if (actual !== key.split(".")[1]) {
      throw new ContractRefused(key, `the stored document hashes to version ${actual}, not to the version its key names`);
    }
    let schema: unknown;
    try {
      schema = JSON.parse(strictUtf8.decode(stored));
    } catch (e) {
      throw new ContractRefused(key, `the stored document is not JSON: ${(e as Error).message}`);
    }
    const declared = typeof schema === "object" && schema !== null ? (schema as Record<string, unknown>).$schema : undefined;
    const draft = typeof declared === "string" ? declared.replace(/#+$/, "") : declared;
    // One instance per contract: two versions of a contract share their root $id.
    const options = { strict: false, validateFormats: false, allErrors: false, verbose: true };
    let ajv: Ajv | Ajv2020;
    if (draft === undefined || draft === DRAFT_2020_12) ajv = new Ajv2020(options);
    else if (draft === DRAFT_7) ajv = new Ajv(options);
    else throw new ContractRefused(key, `keyword \`$schema\` is ${JSON.stringify(declared)}: not draft 2020-12 or draft 7`);
    let validator: ValidateFunction;
    try {
      validator = ajv.compile(schema as object);
    } catch (e) {
      // An invalid keyword value, or a $ref the document does not resolve (never fetched).
      throw new ContractRefused(key, `not a usable schema: ${(e as Error).message}`);
    }
    return new EventContract(key, stored, schema, validator);
  }

  /** null when `payload` (UTF-8 JSON bytes) meets the contract; else the first violation found,
   * as the relay reports it. */
  check(payload: Uint8Array): Violation | null {
    let value: unknown;
    try {
      value = JSON.parse(strictUtf8.decode(payload));
    } catch (e) {
      return { pointer: "", keyword: null, message: `payload is not JSON: ${cut((e as Error).message, PART_CHARS)}`, expected: "", found: "" };
    }
    if (this.validator(value)) return null;
    const error = this.validator.errors![0] as ErrorObject;
    return {
      pointer: cut(error.instancePath, PART_CHARS),
      keyword: error.keyword,
      message: cut(error.message ?? error.keyword, 2 * PART_CHARS),
      expected: jsonText(error.schema),
      found: jsonText(error.data),
    };
  }

  /** Throws ContractRefused when `payload` breaks the contract. */
  validate(payload: Uint8Array): void {
    const violation = this.check(payload);
    if (violation !== null) throw new ContractRefused(this.key, violationText(violation), violation);
  }
}

/** Checks messages against the contracts their Outbox-Schema header names, fetched from the KV
 * bucket once per key: `await new ContractValidator(js).validate(msg.headers, msg.data)`.
 * `validate` throws ContractRefused for an event that must not be applied, and
 * ContractUnavailable (or a NATS error) when the contract cannot be fetched now. */
export class ContractValidator {
  private kv: Promise<KV> | null = null;
  private readonly compiled = new Map<string, EventContract>();

  /** `require`: refuse a message without the header instead of passing it unchecked. */
  constructor(
    private readonly js: JetStreamClient,
    readonly bucket: string = c.CONTRACTS_BUCKET,
    readonly require = false,
  ) {}

  /** The compiled contract stored under `key` (cached: a key never changes meaning; a refusal
   * is not cached, so a contract put later is found). */
  async contract(key: string): Promise<EventContract> {
    const found = this.compiled.get(key);
    if (found) return found;
    if (!KEY_PATTERN.test(key)) throw new ContractRefused(key, NOT_A_KEY);
    this.kv ??= new Kvm(this.js).open(this.bucket);
    let entry;
    try {
      entry = await (await this.kv).get(key);
    } catch (e) {
      if (e instanceof JetStreamApiError && e.code === JetStreamApiCodes.StreamNotFound) {
        throw new ContractUnavailable(`KV bucket ${this.bucket} does not exist`, { cause: e });
      }
      throw e;
    }
    if (entry === null || entry.operation !== "PUT") throw new ContractRefused(key, `no such key in the contracts bucket ${JSON.stringify(this.bucket)}`);
    const compiled = EventContract.fromStored(key, entry.value);
    this.compiled.set(key, compiled);
    return compiled;
  }

  /** Checks `payload` against the contract the headers name; resolves to that key, or null for
   * a message without the header (refused when `require` is set). */
  async validate(headers: MsgHdrs | undefined, payload: Uint8Array): Promise<string | null> {
    const key = headers?.has(c.HEADER_SCHEMA) ? headers.get(c.HEADER_SCHEMA).trim() : "";
    if (key === "") {
      if (this.require) throw new ContractRefused("required", `the event has no ${c.HEADER_SCHEMA} header and this consumer requires one`);
      return null;
    }
    (await this.contract(key)).validate(payload);
    return key;
  }
}
