// The wire contract with outbox-relay, read from contract.json: a copy of
// crates/outbox-contract/contract.json, the file the Rust crate is tested against. Every header
// name this package uses comes from it; test/contract.test.ts fails when the copy drifts.
import { readFileSync } from "node:fs";

export interface Contract {
  constants: Record<string, string>;
  lists: Record<string, string[]>;
  lsn: {
    pattern: string;
    format_examples: { value: string; text: string }[];
    parse_examples: { value: string; text: string }[];
    invalid: string[];
  };
  dead_letter: {
    reason_max_bytes: number;
    reasons: Record<"retries_exhausted" | "permanent" | "invalid_message", string>;
    msg_id: string;
    msg_id_without_event_id: string;
    source: string;
    default_subject: string;
  };
  ledger: { table: string };
}

export const CONTRACT: Contract = JSON.parse(
  readFileSync(new URL("./contract.json", import.meta.url), "utf8"),
);
const C = CONTRACT.constants;

export const HEADER_MSG_ID = C.HEADER_MSG_ID;
export const HEADER_EXPECTED_STREAM = C.HEADER_EXPECTED_STREAM;
export const HEADER_COMMIT_LSN = C.HEADER_COMMIT_LSN;
export const HEADER_XID = C.HEADER_XID;
export const HEADER_COMMIT_TIME = C.HEADER_COMMIT_TIME;
export const HEADER_TABLE = C.HEADER_TABLE;
export const HEADER_TX_INDEX = C.HEADER_TX_INDEX;
export const HEADER_BACKFILL = C.HEADER_BACKFILL;
export const HEADER_AGGREGATE_TYPE = C.HEADER_AGGREGATE_TYPE;
export const HEADER_AGGREGATE_ID = C.HEADER_AGGREGATE_ID;
export const HEADER_EVENT_TYPE = C.HEADER_EVENT_TYPE;
export const HEADER_TRACEPARENT = C.HEADER_TRACEPARENT;
export const HEADER_EVENT_ID = C.HEADER_EVENT_ID;
export const HEADER_SCHEMA = C.HEADER_SCHEMA;
export const CONTRACTS_BUCKET = C.CONTRACTS_BUCKET;
export const HEADER_DLQ_REASON = C.HEADER_DLQ_REASON;
export const HEADER_DLQ_SUBJECT = C.HEADER_DLQ_SUBJECT;
export const HEADER_DLQ_EVENT_ID = C.HEADER_DLQ_EVENT_ID;
export const HEADER_DLQ_DELIVERIES = C.HEADER_DLQ_DELIVERIES;
export const HEADER_DLQ_CONSUMER = C.HEADER_DLQ_CONSUMER;
export const HEADER_DLQ_SOURCE = C.HEADER_DLQ_SOURCE;
export const RESERVED_PREFIX = C.RESERVED_PREFIX;
export const HEADER_ORIGINAL_PREFIX = C.HEADER_ORIGINAL_PREFIX;
export const REASON_MAX_BYTES = CONTRACT.dead_letter.reason_max_bytes;
export const LEDGER_TABLE = CONTRACT.ledger.table;

const LSN_PATTERN = new RegExp(CONTRACT.lsn.pattern);

export class LsnError extends Error {
  constructor(readonly text: string) {
    super(
      `invalid LSN ${JSON.stringify(text)}: expected two hex numbers of at most 8 digits ` +
        "separated by '/' (e.g. 0/16B3748)",
    );
  }
}

/** `0/16B3748` -> 23803720n (either case; nothing around it). */
export function parseLsn(text: string): bigint {
  if (typeof text !== "string" || !LSN_PATTERN.test(text)) throw new LsnError(String(text));
  const [hi, lo] = text.split("/");
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

/** 23803720n -> `0/16B3748` (uppercase, unpadded, as PostgreSQL prints it). */
export function formatLsn(value: bigint): string {
  if (value < 0n || value >= 1n << 64n) throw new RangeError(`LSN ${value} is not a u64`);
  return `${(value >> 32n).toString(16).toUpperCase()}/${(value & 0xffffffffn).toString(16).toUpperCase()}`;
}

/** Whether `name` is in NATS's reserved `Nats-` namespace (ASCII case-insensitive). */
export function isReserved(name: string): boolean {
  return name.slice(0, RESERVED_PREFIX.length).toLowerCase() === RESERVED_PREFIX.toLowerCase();
}

/** `Nats-Msg-Id` -> `Outbox-Original-Msg-Id`; `null` for a header copied as it is. */
export function originalName(name: string): string | null {
  return isReserved(name) ? HEADER_ORIGINAL_PREFIX + name.slice(RESERVED_PREFIX.length) : null;
}

/** One line of at most REASON_MAX_BYTES UTF-8 bytes (header values hold no CR/LF). */
export function sanitizeReason(reason: string): string {
  // Rust's char::is_control: C0, DEL and C1.
  const line = reason.replace(/[\u0000-\u001f\u007f-\u009f]/g, " ");
  const bytes = Buffer.from(line, "utf8");
  if (bytes.length <= REASON_MAX_BYTES) return line;
  let cut = REASON_MAX_BYTES;
  while (cut > 0 && (bytes[cut] & 0xc0) === 0x80) cut--; // a character boundary
  return bytes.subarray(0, cut).toString("utf8");
}

function fill(template: string, values: Record<string, string | number>): string {
  // One pass: an event id may hold a `{seq}` of its own.
  return template.replace(/\{(\w+)\}/g, (_, key: string) => String(values[key]));
}

/** The dead letter's own Nats-Msg-Id: from the event, so a second park is deduplicated. */
export function deadLetterId(consumer: string, eventId: string, stream: string, seq: number): string {
  const dl = CONTRACT.dead_letter;
  return fill(eventId ? dl.msg_id : dl.msg_id_without_event_id, {
    consumer,
    event_id: eventId,
    stream,
    seq,
  });
}

export function deadLetterSource(stream: string, seq: number): string {
  return fill(CONTRACT.dead_letter.source, { stream, seq });
}

export function defaultDeadLetterSubject(consumer: string): string {
  return fill(CONTRACT.dead_letter.default_subject, { consumer });
}

export function reasonText(
  kind: keyof Contract["dead_letter"]["reasons"],
  values: Record<string, string | number>,
): string {
  return fill(CONTRACT.dead_letter.reasons[kind], values);
}
