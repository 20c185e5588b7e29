//! The IO-free core of outbox-relay.
//!
//! The pipeline stages, each testable alone:
//! - **source** ([`stage::ChangeSource`]): committed changes in commit order, already decoded by
//!   the `pgoutput` crate;
//! - **route** ([`route::Router`]): outbox INSERT → [`message::OutboundMessage`];
//! - **publish** ([`stage::Publisher`]): JetStream, a bounded window of outstanding acks;
//! - **checkpoint** ([`stage::CheckpointStore`], then [`stage::ChangeSource::confirm`]): the
//!   [`frontier::AckFrontier`], stored first, then reported to the slot.
//!
//! [`pipeline::Pipeline`] runs them. Nothing here does IO; `relay-postgres` and `relay-nats`
//! implement the traits.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

pub mod check;
pub mod failpoint;
pub mod frontier;
pub mod id_digest;
pub mod ident;
pub mod message;
pub mod pipeline;
pub mod recent;
pub mod route;
pub mod secret;
pub mod stage;
pub mod subject;
pub mod trail;
pub mod value;

pub use pgoutput::Lsn;
