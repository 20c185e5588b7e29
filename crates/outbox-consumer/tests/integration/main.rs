//! Integration tests against real PostgreSQL and nats-server processes (relay-testkit).
//! Each test starts its own servers.

mod common;

mod contracts;
mod crash_windows;
mod dead_letters;
mod exactly_once;
mod ledger;
mod relay_format;
mod replay;
mod retries;

#[path = "../../examples/order_notifications/service.rs"]
#[allow(dead_code)]
mod example_service;
