//! The operator commands besides `run` (the supervisor, [`crate::run`]): `validate
//! --connect` (preflight), `setup`, `status`, `config print`, `tail`, `backfill`, `restore`,
//! `replay` and `position`.

pub mod backfill;
pub mod config_print;
pub mod position;
pub mod replay;
pub mod restore;
pub mod setup;
pub mod status;
pub mod tail;
pub mod validate;
