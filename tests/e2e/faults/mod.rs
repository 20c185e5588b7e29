//! The fault suite (docs/guarantees.md, "Scenarios"): scenarios that crash, pause or restart the relay, PostgreSQL and
//! NATS under load, then let the oracle classify every committed event id.
//!
//! Each scenario appends one row to the report (`target/fault-suite.tsv`, or `$FAULT_REPORT`);
//! `scripts/test.sh` prints it as one table at the end.

pub(crate) mod oracle;
mod scenarios;
