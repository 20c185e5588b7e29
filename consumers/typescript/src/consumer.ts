// The durable pull consumer, the same algorithm as the Rust crates/outbox-consumer (worker.rs,
// park.rs): per message BEGIN; ledger insert ON CONFLICT DO NOTHING; the handler on the same
// connection unless the ledger had the event; COMMIT; only then ack. A handler error rolls back
// (the ledger row too) and NAKs with backoff; after maxDeliver deliveries, or at once for a
// Permanent error, the message is parked on the dead-letter subject. PostgreSQL trouble outside
// the handler is retried for ever, never parked.
import {
  AckPolicy,
  DeliverPolicy,
  JetStreamApiCodes,
  JetStreamApiError,
  jetstream,
  jetstreamManager,
  type ConsumerConfig,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import { headers as newHeaders, nanos, type NatsConnection } from "@nats-io/transport-node";
import pg from "pg";
import * as c from "./contract.js";
import { eventFromMsg, parseRfc3339Micros, type Event } from "./event.js";
import { ensureLedger, INSERT_SQL, REAPPLY_SQL } from "./ledger.js";
import { locate } from "./position.js";
import { ContractRefused, ContractValidator } from "./schema.js";

export type Handler = (client: pg.Client, event: Event) => Promise<void>;

/** Throw (`new Permanent("...", { cause })`) to park the event at once, without retries. */
export class Permanent extends Error {}

/** A problem `run` cannot retry: bad settings, a missing stream, a refused durable. */
export class ConsumerError extends Error {}

/** Where a *new* durable starts; an existing durable keeps its position. A `time` string is
 * RFC 3339 with an offset, to the microsecond (as `Outbox-Commit-Time` and `outbox-relay
 * position --json` print it); a `Date` has milliseconds only. */
export type StartAt = { sequence: number } | { lsn: bigint | string } | { time: Date | string };

/** Test-only failpoint, not part of the supported API (the Rust crate's `hooks`): awaited at
 * "beforeCommit" (the handler returned, the transaction is open) and "beforeAck" (committed, not
 * acked yet). A hook that never resolves and a killed process simulate a crash at that point. */
export type TestHook = (point: "beforeCommit" | "beforeAck", event: Event) => Promise<void>;

/** Apply again the events committed in [fromLsn, untilLsn) whose ledger rows were written before
 * recordedBefore (a handler bug fixed since); the ledger row is replaced in the handler's own
 * transaction, never deleted first. Keep recordedBefore fixed for the whole re-apply. */
export interface Reapply {
  fromLsn: bigint;
  untilLsn?: bigint;
  recordedBefore: Date;
}

export interface ConsumerOptions {
  /** Default "OUTBOX". */
  stream?: string;
  /** Default ["outbox.>"]; more than one needs nats-server 2.10. */
  subjects?: string[];
  /** Default: the service name. */
  durable?: string;
  /** Unset: strict order (one message outstanding). n: n workers, no order guarantee. */
  parallel?: number;
  /** Default 5. */
  maxDeliver?: number;
  /** Default 1000 and 60000 ms. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** Default 30000 ms. */
  ackWaitMs?: number;
  /** Default `dlq.<service>`; must be captured by a stream. */
  deadLetterSubject?: string;
  /** Default true. */
  ensureLedger?: boolean;
  startAt?: StartAt;
  reapply?: Reapply;
  /** Check each payload against the contract its Outbox-Schema header names (fetched from
   * contractsBucket); an event that breaks it, or names a contract that cannot be used, is
   * parked with the reason `contract <key>: ...` and never handled. Default false. */
  validateContracts?: boolean;
  /** Default "outbox-contracts". */
  contractsBucket?: string;
  /** With validateContracts: park an event without the header too. Default false. */
  requireContract?: boolean;
  /** Test-only; see TestHook. */
  testHook?: TestHook;
}

export interface Stats {
  applied: number;
  duplicates: number;
  retried: number;
  parked: number;
  parkFailures: number;
  /** PostgreSQL / NATS failures outside the handler (the message was NAKed), reading a
   * contract from its KV bucket included. */
  infraErrors: number;
  /** Deliveries whose payload met the contract its Outbox-Schema header names. */
  contractsPassed: number;
  /** Deliveries refused by their contract and parked instead of applied (in `parked` too). */
  contractsRefused: number;
}

// SQLSTATEs meaning the server or the connection went away, not a bad event: class 08 and
// 57P01-57P03 (admin / crash shutdown, cannot connect now).
const INFRA_SQLSTATES = ["57P01", "57P02", "57P03"];

type Outcome = { kind: "applied" } | { kind: "duplicate" } | { kind: "failed"; error: unknown } | { kind: "infra"; error: unknown };

class Slot {
  client: pg.Client | null = null;
  broken = false;
  constructor(private readonly config: string | pg.ClientConfig) {}

  async ready(): Promise<pg.Client> {
    if (this.client === null || this.broken) {
      const old = this.client;
      this.client = null;
      if (old) await old.end().catch(() => undefined);
      const client = new pg.Client(this.config as pg.ClientConfig);
      this.broken = false;
      // Without a listener a lost connection would crash the process.
      client.on("error", () => {
        this.broken = true;
      });
      client.on("end", () => {
        this.broken = true;
      });
      await client.connect();
      this.client = client;
    }
    return this.client;
  }

  async rollback(): Promise<void> {
    if (this.client && !this.broken) await this.client.query("ROLLBACK").catch(() => undefined);
  }
}

function errorText(err: unknown): string {
  let text = err instanceof Error ? err.message || err.name : String(err);
  let cause = err instanceof Error ? err.cause : undefined;
  while (cause !== undefined && cause !== null) {
    const next = cause instanceof Error ? cause.message : String(cause);
    if (next && !text.includes(next)) text += `: ${next}`;
    cause = cause instanceof Error ? cause.cause : undefined;
  }
  return text;
}

/** A StartAt time as microseconds since the epoch. */
function startMicros(time: Date | string): bigint {
  if (typeof time === "string") {
    try {
      return parseRfc3339Micros(time);
    } catch {
      throw new ConsumerError(`startAt.time ${JSON.stringify(time)} is not an RFC 3339 time with an offset, e.g. 2026-11-29T11:38:44.123456Z`);
    }
  }
  const ms = time.getTime();
  if (Number.isNaN(ms)) throw new ConsumerError("startAt.time is an invalid Date");
  return BigInt(ms) * 1000n;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Consumer {
  readonly stats: Stats = { applied: 0, duplicates: 0, retried: 0, parked: 0, parkFailures: 0, infraErrors: 0, contractsPassed: 0, contractsRefused: 0 };
  readonly stream: string;
  readonly subjects: string[];
  readonly durable: string;
  readonly workers: number;
  readonly maxDeliver: number;
  readonly deadLetterSubject: string;
  private readonly backoffInitialMs: number;
  private readonly backoffMaxMs: number;
  private readonly ackWaitMs: number;
  private readonly contracts: ContractValidator | null;

  /** `pgConfig`: a connection string or pg.ClientConfig; one connection per worker, reconnected
   * after a loss. `service` is the ledger key and the default durable name. */
  private readonly js: JetStreamClient;

  constructor(
    private readonly nc: NatsConnection,
    private readonly pgConfig: string | pg.ClientConfig,
    readonly service: string,
    private readonly options: ConsumerOptions = {},
  ) {
    const valid = (s: string) => /^[A-Za-z0-9_-]+$/.test(s);
    if (!valid(service)) throw new ConsumerError(`service name ${JSON.stringify(service)} must be non-empty ASCII letters, digits, '-' or '_'`);
    this.durable = options.durable ?? service;
    if (!valid(this.durable)) throw new ConsumerError(`durable name ${JSON.stringify(this.durable)} must be non-empty ASCII letters, digits, '-' or '_'`);
    this.stream = options.stream ?? "OUTBOX";
    this.subjects = options.subjects ?? ["outbox.>"];
    if (this.subjects.length === 0) throw new ConsumerError("no subjects");
    this.workers = Math.max(1, options.parallel ?? 1);
    this.maxDeliver = Math.max(1, options.maxDeliver ?? 5);
    this.backoffInitialMs = options.backoffInitialMs ?? 1000;
    this.backoffMaxMs = Math.max(options.backoffMaxMs ?? 60_000, this.backoffInitialMs);
    this.ackWaitMs = options.ackWaitMs ?? 30_000;
    if (this.ackWaitMs < 300) throw new ConsumerError("ackWaitMs must be at least 300");
    this.deadLetterSubject = options.deadLetterSubject ?? c.defaultDeadLetterSubject(service);
    if (options.requireContract && !options.validateContracts) throw new ConsumerError("requireContract needs validateContracts");
    const bucket = options.contractsBucket ?? c.CONTRACTS_BUCKET;
    if (!valid(bucket)) throw new ConsumerError(`contracts bucket ${JSON.stringify(bucket)} must be non-empty ASCII letters, digits, '-' or '_'`);
    this.js = jetstream(nc);
    this.contracts = options.validateContracts ? new ContractValidator(this.js, bucket, options.requireContract ?? false) : null;
  }

  /** `initial * 2^(delivered - 1)`, at most the maximum. */
  backoffMs(delivered: number): number {
    return Math.min(this.backoffInitialMs * 2 ** Math.min(Math.max(delivered - 1, 0), 20), this.backoffMaxMs);
  }

  /** Creates or updates the durable, then handles messages until `signal` aborts; messages in
   * flight are finished (committed and acked) before it resolves. */
  async run(handler: Handler, signal?: AbortSignal): Promise<void> {
    const slots = Array.from({ length: this.workers }, () => new Slot(this.pgConfig));
    try {
      const first = await slots[0].ready();
      if (this.options.ensureLedger ?? true) await ensureLedger(first);
      const jsm = await jetstreamManager(this.nc);
      await this.subscribe(jsm);
      await this.loop(handler, slots, signal);
    } finally {
      await Promise.all(slots.map((s) => s.client?.end().catch(() => undefined)));
    }
  }

  /** An existing durable keeps its deliver policy (JetStream refuses to change it, and one an
   * `outbox-relay replay` re-created must stay); a new one starts at `startAt`. */
  private async deliverPolicy(jsm: JetStreamManager): Promise<Partial<ConsumerConfig>> {
    const info = await jsm.consumers.info(this.stream, this.durable).catch((e) => {
      if (e instanceof JetStreamApiError && e.code === JetStreamApiCodes.ConsumerNotFound) return null;
      throw e;
    });
    if (info !== null) {
      const { deliver_policy, opt_start_seq, opt_start_time } = info.config;
      return { deliver_policy, opt_start_seq, opt_start_time };
    }
    const start = this.options.startAt;
    if (start === undefined) return { deliver_policy: DeliverPolicy.All };
    let seq: number;
    if ("sequence" in start) {
      seq = Math.max(1, start.sequence);
    } else {
      const target =
        "lsn" in start
          ? { lsn: typeof start.lsn === "string" ? c.parseLsn(start.lsn) : start.lsn }
          : { timeMicros: startMicros(start.time) };
      seq = (await locate(jsm, this.js, this.stream, target)).sequence;
    }
    return { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: seq };
  }

  private async subscribe(jsm: JetStreamManager): Promise<void> {
    try {
      await jsm.streams.info(this.stream);
    } catch (e) {
      throw new ConsumerError(`JetStream stream ${JSON.stringify(this.stream)}: ${errorText(e)}`, { cause: e });
    }
    const config: Partial<ConsumerConfig> = {
      durable_name: this.durable,
      description: `outbox-consumer for service ${this.service}`,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(this.ackWaitMs),
      // Unlimited on the server: the consumer parks after maxDeliver itself, so the server
      // never drops a message without it reaching the dead-letter subject.
      max_deliver: -1,
      max_ack_pending: this.options.parallel === undefined ? 1 : 2 * this.workers,
      ...(this.subjects.length === 1 ? { filter_subject: this.subjects[0] } : { filter_subjects: this.subjects }),
      ...(await this.deliverPolicy(jsm)),
    };
    try {
      await jsm.consumers.add(this.stream, config);
    } catch (e) {
      throw new ConsumerError(`durable consumer ${JSON.stringify(this.durable)}: ${errorText(e)}`, { cause: e });
    }
  }

  private async loop(handler: Handler, slots: Slot[], signal?: AbortSignal): Promise<void> {
    const consumer = await this.js.consumers.get(this.stream, this.durable);
    const free = [...slots];
    const inflight = new Set<Promise<void>>();
    while (!signal?.aborted) {
      if (free.length === 0) {
        await Promise.race(inflight);
        continue;
      }
      let msgs: JsMsg[] = [];
      try {
        const room = free.length;
        const iter = await consumer.fetch({ max_messages: room, expires: 1000 });
        for await (const m of iter) {
          msgs.push(m);
          if (msgs.length >= room) break;
        }
      } catch (e) {
        console.warn(`outbox-consumer ${this.service}: pull problem (retrying): ${errorText(e)}`);
        await sleep(1000);
        continue;
      }
      for (const msg of msgs) {
        const slot = free.pop()!;
        const task: Promise<void> = this.process(slot, handler, msg).finally(() => {
          free.push(slot);
          inflight.delete(task);
        });
        inflight.add(task);
      }
    }
    await Promise.allSettled(inflight);
  }

  private async process(slot: Slot, handler: Handler, msg: JsMsg): Promise<void> {
    let event: Event;
    try {
      event = eventFromMsg(msg);
    } catch (e) {
      await this.park(msg, null, msg.info.deliveryCount, c.reasonText("invalid_message", { error: errorText(e) }));
      return;
    }
    if (this.contracts !== null && !(await this.meetsContract(this.contracts, msg, event))) return;
    const outcome = await this.withProgress(msg, this.attempt(slot, handler, event));
    if (outcome.kind === "applied" || outcome.kind === "duplicate") {
      if (outcome.kind === "applied") this.stats.applied++;
      else this.stats.duplicates++;
      await this.options.testHook?.("beforeAck", event);
      msg.ack(); // if lost, the ledger absorbs the redelivery
    } else if (outcome.kind === "failed") {
      await this.failed(msg, event, outcome.error);
    } else {
      this.stats.infraErrors++;
      const delay = this.backoffMs(event.delivered);
      console.warn(`outbox-consumer ${this.service}: PostgreSQL error outside the handler for ${event.id}; retry in ${delay} ms: ${errorText(outcome.error)}`);
      msg.nak(delay);
      await sleep(Math.min(delay, 5000)); // do not spin on a database that is down
    }
  }

  /** Awaits `work` while keeping the server from redelivering the message. */
  private async withProgress<R>(msg: JsMsg, work: Promise<R>): Promise<R> {
    const progress = setInterval(() => msg.working(), this.ackWaitMs / 3);
    try {
      return await work;
    } finally {
      clearInterval(progress);
    }
  }

  /** Whether the event may be handled; one that may not is parked, or put back with backoff
   * when its contract cannot be read now (never parked for that). */
  private async meetsContract(contracts: ContractValidator, msg: JsMsg, event: Event): Promise<boolean> {
    let key: string | null;
    try {
      key = await this.withProgress(msg, contracts.validate(event.headers, event.payload));
    } catch (e) {
      if (e instanceof ContractRefused) {
        this.stats.contractsRefused++;
        await this.park(msg, event, event.delivered, e.message);
        return false;
      }
      // ContractUnavailable, NATS trouble: not the event's fault.
      this.stats.infraErrors++;
      const delay = this.backoffMs(event.delivered);
      console.warn(`outbox-consumer ${this.service}: cannot read the contract of ${event.id} from KV bucket ${contracts.bucket}; retry in ${delay} ms: ${errorText(e)}`);
      msg.nak(delay);
      await sleep(Math.min(delay, 5000)); // do not spin on a server that is down
      return false;
    }
    if (key !== null) this.stats.contractsPassed++;
    return true;
  }

  private async failed(msg: JsMsg, event: Event, error: unknown): Promise<void> {
    const reason = errorText(error);
    const permanent = error instanceof Permanent;
    if (permanent || event.delivered >= this.maxDeliver) {
      const why = permanent
        ? c.reasonText("permanent", { error: reason })
        : c.reasonText("retries_exhausted", { deliveries: event.delivered, error: reason });
      await this.park(msg, event, event.delivered, why);
      return;
    }
    this.stats.retried++;
    const delay = this.backoffMs(event.delivered);
    console.warn(`outbox-consumer ${this.service}: handler failed for ${event.id} (delivery ${event.delivered} of ${this.maxDeliver}); retry in ${delay} ms: ${reason}`);
    msg.nak(delay);
  }

  private isInfra(err: unknown, slot: Slot): boolean {
    if (slot.broken) return true;
    const code = (err as { code?: unknown })?.code;
    return typeof code === "string" && (code.startsWith("08") || INFRA_SQLSTATES.includes(code));
  }

  /** BEGIN; ledger write; handler; COMMIT. */
  private async attempt(slot: Slot, handler: Handler, event: Event): Promise<Outcome> {
    let client: pg.Client;
    try {
      client = await slot.ready();
    } catch (error) {
      return { kind: "infra", error };
    }
    const r = this.options.reapply;
    const reapply = r && event.commitLsn !== null && event.commitLsn >= r.fromLsn && (r.untilLsn === undefined || event.commitLsn < r.untilLsn) ? r : null;
    const row = [this.service, event.id, event.subject, event.streamSequence, event.commitLsnText];
    let replaced: boolean | null;
    try {
      await client.query("BEGIN");
      if (reapply) {
        const res = await client.query(REAPPLY_SQL, [...row, reapply.recordedBefore]);
        replaced = res.rows.length ? Boolean(res.rows[0].replaced) : null;
      } else {
        const res = await client.query(INSERT_SQL, row);
        replaced = (res.rowCount ?? 0) > 0 ? false : null;
      }
    } catch (error) {
      await slot.rollback();
      return { kind: "infra", error };
    }
    if (replaced === null) {
      await slot.rollback(); // applied before: nothing to do
      return { kind: "duplicate" };
    }
    try {
      await handler(client, replaced ? { ...event, reapplied: true } : event);
    } catch (error) {
      await slot.rollback();
      // A handler that failed because the database went away did nothing wrong.
      return this.isInfra(error, slot) ? { kind: "infra", error } : { kind: "failed", error };
    }
    await this.options.testHook?.("beforeCommit", event);
    try {
      await client.query("COMMIT");
    } catch (error) {
      // Unknown outcome if the connection broke during COMMIT: the redelivery finds the ledger
      // row if the commit happened, and applies the event if it did not.
      return { kind: "infra", error };
    }
    return { kind: "applied" };
  }

  /** Publishes to the dead-letter subject (waiting for the stream's ack), then TERMs; if the
   * publish is not confirmed the message is NAKed and parked on a later delivery. */
  private async park(msg: JsMsg, event: Event | null, delivered: number, reasonIn: string): Promise<void> {
    const reason = c.sanitizeReason(reasonIn);
    const original = msg.headers;
    const eventId = event?.id ?? (original?.has(c.HEADER_MSG_ID) ? original.get(c.HEADER_MSG_ID) : "");
    const { stream, streamSequence: seq } = msg.info;
    const h = newHeaders();
    for (const name of original?.keys() ?? []) {
      const kept = c.originalName(name) ?? name;
      for (const value of original!.values(name)) h.append(kept, value);
    }
    const set: [string, string][] = [
      [c.HEADER_DLQ_REASON, reason],
      [c.HEADER_DLQ_SUBJECT, msg.subject],
      [c.HEADER_DLQ_EVENT_ID, eventId],
      [c.HEADER_DLQ_DELIVERIES, String(delivered)],
      [c.HEADER_DLQ_CONSUMER, this.service],
      [c.HEADER_DLQ_SOURCE, c.deadLetterSource(stream, seq)],
      [c.HEADER_MSG_ID, c.deadLetterId(this.service, eventId, stream, seq)],
    ];
    for (const [k, v] of set) h.set(k, v);
    try {
      await this.js.publish(this.deadLetterSubject, msg.data, { headers: h });
    } catch (e) {
      this.stats.parkFailures++;
      const delay = this.backoffMs(delivered);
      console.error(`outbox-consumer ${this.service}: cannot publish ${eventId} to the dead-letter subject ${this.deadLetterSubject}; message kept, retry in ${delay} ms: ${errorText(e)}`);
      msg.nak(delay);
      return;
    }
    this.stats.parked++;
    console.error(`outbox-consumer ${this.service}: event ${eventId} (${msg.subject}, ${stream}:${seq}, delivered ${delivered}) parked on ${this.deadLetterSubject}: ${reason}`);
    msg.term();
  }
}
