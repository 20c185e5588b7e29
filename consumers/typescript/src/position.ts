// Where is commit LSN X, or commit time T, in outbox-relay's stream? The stream-only lookup of
// crates/outbox-position (what `outbox-relay position --no-map` and the Rust consumer's StartAt
// do), step for step: for an LSN a bounded bisection by Outbox-Commit-Lsn finds a message
// committed before it, the scan starts at the first message stored at or after that commit time
// less the clock margin (for a time: at T less the margin), and a forward scan of headers finds
// the first message that reaches the target. Holds while the PostgreSQL and NATS clocks differ by
// less than the margin (docs/replay.md).
import {
  AckPolicy,
  DeliverPolicy,
  type JetStreamClient,
  type JetStreamManager,
  type MsgRequest,
} from "@nats-io/jetstream";
import { nanos, type MsgHdrs } from "@nats-io/transport-node";
import { randomUUID } from "node:crypto";
import * as c from "./contract.js";
import { parseRfc3339Micros } from "./event.js";

export type Target = { lsn: bigint } | { timeMicros: bigint };

export interface Limits {
  maxScan: number;
  maxGets: number;
  clockMarginMicros: bigint;
  idleMs: number;
}

export const DEFAULT_LIMITS: Limits = { maxScan: 1_000_000, maxGets: 64, clockMarginMicros: 5_000_000n, idleMs: 5000 };

export interface Probe {
  seq: number;
  subject: string;
  commitLsn: bigint | null;
  commitTimeMicros: bigint | null;
  eventId: string | null;
}

export interface Position {
  sequence: number;
  found: Probe | null;
  scanStart: number;
  scanned: number;
  gets: number;
  streamFirst: number;
  streamLast: number;
  truncated: boolean;
}

function probe(seq: number, subject: string, h: MsgHdrs | undefined): Probe {
  const get = (n: string) => (h?.has(n) ? h.get(n) : "");
  const backfill = get(c.HEADER_BACKFILL).toLowerCase() === "true";
  let lsn: bigint | null = null;
  try {
    lsn = c.parseLsn(get(c.HEADER_COMMIT_LSN));
  } catch {
    lsn = null;
  }
  if (lsn === 0n || backfill) lsn = null;
  let time: bigint | null = null;
  if (lsn !== null && get(c.HEADER_COMMIT_TIME)) {
    try {
      time = parseRfc3339Micros(get(c.HEADER_COMMIT_TIME));
    } catch {
      time = null;
    }
  }
  return { seq, subject, commitLsn: lsn, commitTimeMicros: time, eventId: get(c.HEADER_MSG_ID) || null };
}

function reaches(p: Probe, t: Target): boolean | null {
  if ("lsn" in t) return p.commitLsn === null ? null : p.commitLsn >= t.lsn;
  return p.commitTimeMicros === null ? null : p.commitTimeMicros >= t.timeMicros;
}

export class PositionError extends Error {}

/** The first stream sequence to deliver from so that every event committed at or after
 * `target` is delivered. */
export async function locate(
  jsm: JetStreamManager,
  js: JetStreamClient,
  stream: string,
  target: Target,
  limits: Limits = DEFAULT_LIMITS,
): Promise<Position> {
  const { state } = await jsm.streams.info(stream);
  const [first, last] = [state.first_seq, state.last_seq];
  const counter = { gets: 0 };
  if (state.messages === 0) {
    return { sequence: last + 1, found: null, scanStart: last + 1, scanned: 0, gets: 0, streamFirst: first, streamLast: last, truncated: false };
  }
  let truncated = false;
  let start: number | null = null;
  let fromTime: bigint | null;
  if ("timeMicros" in target) {
    fromTime = target.timeMicros - limits.clockMarginMicros;
  } else {
    const below = await bisect(jsm, stream, first, last, target.lsn, limits.maxGets, counter);
    if (below === null) {
      // No message before the target: the whole stream is after it.
      [start, truncated, fromTime] = [first, first > 1, null];
    } else {
      fromTime = below.commitTimeMicros === null ? null : below.commitTimeMicros - limits.clockMarginMicros;
    }
  }
  if (start === null) {
    if (fromTime === null) {
      start = first;
    } else {
      const seq = await firstStoredAtOrAfter(jsm, js, stream, fromTime, limits.idleMs);
      if (seq === null) start = last + 1;
      else [start, truncated] = [seq, seq === first && first > 1];
    }
  }
  const { found, scanned } = await scan(jsm, js, stream, start, last, target, limits);
  return {
    sequence: found ? found.seq : last + 1,
    found,
    scanStart: start,
    scanned,
    gets: counter.gets,
    streamFirst: first,
    streamLast: last,
    truncated,
  };
}

async function getAtOrAfter(jsm: JetStreamManager, stream: string, seq: number): Promise<Probe | null> {
  // STREAM.MSG.GET takes next_by_subj like the Rust client's get_first_raw_message_by_subject;
  // the client's type lists only the seq / last_by_subj forms.
  const query = { seq, next_by_subj: ">" } as unknown as MsgRequest;
  const m = await jsm.streams.getMessage(stream, query);
  return m === null ? null : probe(m.seq, m.subject, m.header);
}

async function bisect(
  jsm: JetStreamManager,
  stream: string,
  first: number,
  last: number,
  x: bigint,
  maxGets: number,
  counter: { gets: number },
): Promise<Probe | null> {
  let [lo, hi] = [first, last];
  let below: Probe | null = null;
  while (lo <= hi && counter.gets < maxGets) {
    const mid = lo + Math.floor((hi - lo) / 2);
    let at = mid;
    let found: Probe | null = null;
    while (counter.gets < maxGets) {
      counter.gets++;
      const p = await getAtOrAfter(jsm, stream, at);
      if (p === null || p.seq > hi) break;
      if (p.commitLsn !== null) {
        found = p;
        break;
      }
      at = p.seq + 1;
    }
    if (found !== null && found.commitLsn! < x) {
      lo = found.seq + 1;
      if (below === null || found.commitLsn! > below.commitLsn!) below = found;
    } else if (mid === 0) {
      break;
    } else {
      hi = mid - 1;
    }
  }
  return below;
}

/** An ephemeral consumer reading headers only; deleted after the lookup. */
async function withReader<T>(
  jsm: JetStreamManager,
  js: JetStreamClient,
  stream: string,
  policy: Record<string, unknown>,
  body: (next: (max: number, idleMs: number, stopAt?: number) => Promise<{ seq: number; subject: string; headers?: MsgHdrs }[]>) => Promise<T>,
): Promise<T> {
  const name = `outbox-position-${randomUUID().slice(0, 12)}`;
  await jsm.consumers.add(stream, {
    name,
    ack_policy: AckPolicy.None,
    headers_only: true,
    inactive_threshold: nanos(30_000),
    mem_storage: true,
    ...policy,
  });
  const consumer = await js.consumers.get(stream, name);
  try {
    return await body(async (max, idleMs, stopAt = Infinity) => {
      const out: { seq: number; subject: string; headers?: MsgHdrs }[] = [];
      const iter = await consumer.fetch({ max_messages: max, expires: Math.max(idleMs, 1000) });
      for await (const m of iter) {
        out.push({ seq: m.info.streamSequence, subject: m.subject, headers: m.headers });
        if (out.length >= max || m.info.streamSequence >= stopAt) break;
      }
      return out;
    });
  } finally {
    await jsm.consumers.delete(stream, name).catch(() => undefined);
  }
}

async function firstStoredAtOrAfter(
  jsm: JetStreamManager,
  js: JetStreamClient,
  stream: string,
  micros: bigint,
  idleMs: number,
): Promise<number | null> {
  const start = new Date(Number(micros / 1000n)).toISOString();
  return withReader(jsm, js, stream, { deliver_policy: DeliverPolicy.StartTime, opt_start_time: start }, async (next) => {
    const msgs = await next(1, idleMs);
    return msgs.length ? msgs[0].seq : null;
  });
}

async function scan(
  jsm: JetStreamManager,
  js: JetStreamClient,
  stream: string,
  start: number,
  last: number,
  target: Target,
  limits: Limits,
): Promise<{ found: Probe | null; scanned: number }> {
  let scanned = 0;
  if (start > last) return { found: null, scanned };
  return withReader(jsm, js, stream, { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: start }, async (next) => {
    for (;;) {
      const msgs = await next(256, limits.idleMs, last);
      if (!msgs.length) return { found: null, scanned };
      for (const m of msgs) {
        scanned++;
        const p = probe(m.seq, m.subject, m.headers);
        if (reaches(p, target)) return { found: p, scanned };
        if (m.seq >= last) return { found: null, scanned };
        if (scanned >= limits.maxScan) {
          throw new PositionError(`read ${scanned} messages from sequence ${start} (up to ${m.seq}) without reaching the target: raise maxScan`);
        }
      }
    }
  });
}
