//! The operations the `outbox-relay` commands run besides `run`, as library calls that gather
//! facts and return them (the binary prints them and maps a [`relay_runtime::Failure`] to an
//! exit code): the facts of `status` ([`status`]) and the HTTP client that asks a running
//! relay ([`client`]).
//!
//! They read a relay's settings ([`relay_runtime::config::RelayConfig`]) and fail as it does
//! ([`relay_runtime::failure`]); nothing here runs a pipeline.

pub mod client;
pub mod status;
