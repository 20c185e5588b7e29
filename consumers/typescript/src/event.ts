// The typed event read from one relay message.
import type { JsMsg } from "@nats-io/jetstream";
import type { MsgHdrs } from "@nats-io/transport-node";
import * as c from "./contract.js";

export class InvalidMessage extends Error {}

export interface Event {
  /** Nats-Msg-Id: the outbox row id, stable across re-sends. */
  id: string;
  subject: string;
  payload: Uint8Array;
  /** Stream sequence of this copy (a re-sent duplicate has a new one). */
  streamSequence: number;
  /** Deliveries of this message to this consumer (1 = first). */
  delivered: number;
  commitLsn: bigint | null;
  /** Outbox-Commit-Lsn as sent (`0/16B3748`). */
  commitLsnText: string | null;
  xid: number | null;
  /** Outbox-Commit-Time, microseconds since the epoch (the header has microseconds). */
  commitTimeMicros: bigint | null;
  table: string | null;
  txIndex: number | null;
  aggregateType: string | null;
  aggregateId: string | null;
  eventType: string | null;
  traceparent: string | null;
  headers: MsgHdrs | undefined;
  /** The ledger had this event and the consumer re-applies it (Reapply). */
  reapplied: boolean;
  json<T = unknown>(): T;
}

/** RFC 3339 -> microseconds since the epoch (fraction digits past 6 are cut). */
export function parseRfc3339Micros(text: string): bigint {
  const m = /^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$/.exec(text.trim());
  if (!m) throw new RangeError(`not an RFC 3339 time: ${text}`);
  const secs = Date.parse(`${m[1].replace(/[t ]/, "T")}${m[3].toUpperCase()}`);
  if (Number.isNaN(secs)) throw new RangeError(`not an RFC 3339 time: ${text}`);
  const frac = ((m[2] ?? "") + "000000").slice(0, 6);
  return BigInt(secs) * 1000n + BigInt(frac);
}

function opt<T>(text: string | null, parse: (t: string) => T): T | null {
  if (text === null) return null;
  try {
    return parse(text);
  } catch {
    return null;
  }
}

const uint = (t: string): number => {
  if (!/^\d+$/.test(t)) throw new RangeError(t);
  return Number(t);
};

export function eventFromParts(
  subject: string,
  headers: MsgHdrs | undefined,
  payload: Uint8Array,
  streamSequence = 0,
  delivered = 1,
): Event {
  const get = (name: string): string | null => {
    const v = headers?.has(name) ? headers.get(name).trim() : "";
    return v === "" ? null : v;
  };
  // A scheduled event's delivered copy has no Nats-Msg-Id: its id is in Outbox-Event-Id.
  const id = get(c.HEADER_MSG_ID) ?? get(c.HEADER_EVENT_ID);
  if (!id) throw new InvalidMessage(`message has no ${c.HEADER_MSG_ID} header (event id)`);
  const commitLsn = opt(get(c.HEADER_COMMIT_LSN), c.parseLsn);
  return {
    id,
    subject,
    payload,
    streamSequence,
    delivered,
    commitLsn,
    commitLsnText: commitLsn === null ? null : c.formatLsn(commitLsn),
    xid: opt(get(c.HEADER_XID), uint),
    commitTimeMicros: opt(get(c.HEADER_COMMIT_TIME), parseRfc3339Micros),
    table: get(c.HEADER_TABLE),
    txIndex: opt(get(c.HEADER_TX_INDEX), uint),
    aggregateType: get(c.HEADER_AGGREGATE_TYPE),
    aggregateId: get(c.HEADER_AGGREGATE_ID),
    eventType: get(c.HEADER_EVENT_TYPE),
    traceparent: get(c.HEADER_TRACEPARENT),
    headers,
    reapplied: false,
    json<T>(): T {
      return JSON.parse(Buffer.from(payload).toString("utf8")) as T;
    },
  };
}

export function eventFromMsg(msg: JsMsg): Event {
  return eventFromParts(msg.subject, msg.headers, msg.data, msg.info.streamSequence, msg.info.deliveryCount);
}
