//! The one way the relay reaches PostgreSQL: every plain session, replication session and
//! command connects through here. The parts, in the order a session needs them:

/// The URL and its hosts: parsing, host lists, binding a session to one host (pinning), the
/// plain sessions' configuration and the replication session's parts.
mod hosts;

/// TLS as libpq's `sslmode` says, for every kind of session.
mod tls;

/// The authentication probe, so no cleartext or MD5 password is sent unless allowed.
mod auth;

/// The plain sessions: one host, the read-write server, with notices.
mod session;

/// The replication sessions, on the host the plain sessions reached.
mod replication;

pub use hosts::ConnectionParts;
pub(crate) use replication::{gated, replication_config, streaming, to_wire};
pub(crate) use session::connect_with_notices;
pub use session::{Notifications, connect, connect_primary, connect_with_notifications};
