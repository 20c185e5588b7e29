//! The operations the `outbox-relay` commands run besides `run` that look rather than publish,
//! as library calls that gather facts and return them (the binary prints them and maps a
//! [`relay_runtime::Failure`] to an exit code): the facts of `status` ([`status`]) and the HTTP
//! client that asks a running relay ([`client`]), the preflight of `validate --connect`
//! ([`preflight`]), one event's way (`trace`, [`trace`]) and what a set of contracts would refuse
//! (`contracts check`, [`contracts_check`]). The console reads through `trace` too.
//!
//! They read a relay's settings ([`relay_runtime::config::RelayConfig`]) and fail as it does
//! ([`relay_runtime::failure`]); nothing here runs a pipeline.

pub mod client;
pub mod contracts_check;
pub mod preflight;
pub mod status;
pub mod trace;
