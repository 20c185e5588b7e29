//! End-to-end tests: the real relay binary against a real PostgreSQL and a real NATS JetStream,
//! both started by the tests on free ports in temp dirs.

mod alerts;
mod backfill;
mod backfill_on_create;
mod bad_config;
mod batches;
mod cleanup;
mod compose;
mod consumer;
mod delivery;
mod deploy;
mod drift;
mod durable_checkpoint;
mod failover;
mod fast_batch;
mod faults;
mod hostile;
mod limits;
mod localized;
mod message_position;
mod messages;
mod native_headers;
mod ops;
mod partitions;
mod pause;
mod publication_order;
mod replay;
mod restart;
mod restore;
mod security;
mod security_nats;
mod security_roles;
mod shards;
mod slot;
mod standby;
mod support;
