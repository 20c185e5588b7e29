//! The operator commands besides `run` (the relay itself is `relay_runtime::Relay`): `validate
//! --connect` (preflight), `setup`, `status`, `config print`, `tail`, `backfill`, `restore`,
//! `replay`, `position`, `trace`, `verify` and `contracts check`.

pub mod backfill;
pub mod config_print;
pub mod contracts;
pub mod position;
pub mod replay;
pub mod restore;
pub mod setup;
pub mod status;
pub mod tail;
pub mod trace;
pub mod validate;
pub mod verify;
