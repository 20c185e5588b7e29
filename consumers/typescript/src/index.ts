// Exactly-once consumer for outbox-relay events (TypeScript twin of crates/outbox-consumer): a
// ledger row keyed by (service, event id) is inserted in the handler's own transaction, and the
// message is acked only after COMMIT. See docs/consumers.md.
export * as contract from "./contract.js";
export { formatLsn, parseLsn, LsnError } from "./contract.js";
export { Consumer, ConsumerError, Permanent } from "./consumer.js";
export type { ConsumerOptions, Handler, Reapply, StartAt, Stats } from "./consumer.js";
export { eventFromParts, eventFromMsg, InvalidMessage, parseRfc3339Micros } from "./event.js";
export type { Event } from "./event.js";
export { ensureLedger, pruneLedger, LEDGER_MIGRATION } from "./ledger.js";
export { locate, DEFAULT_LIMITS, PositionError } from "./position.js";
export { ContractRefused, ContractUnavailable, ContractValidator, EventContract, KEY_PATTERN, versionOf, violationText } from "./schema.js";
export type { Violation } from "./schema.js";
export type { Limits, Position, Target } from "./position.js";
