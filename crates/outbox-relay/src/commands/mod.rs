//! The operator commands besides `run` and `tail`: `validate --connect` (preflight), `setup`,
//! `status` and `config print`.

pub mod backfill;
pub mod config_print;
pub mod position;
pub mod replay;
pub mod restore;
pub mod setup;
pub mod status;
pub mod validate;
