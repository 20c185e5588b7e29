//! [`Lsn`]: a PostgreSQL WAL position (`pg_lsn`).
//!
//! The type and its text form (`0/16B3748`) live in `outbox-contract`, the one implementation
//! the relay's `Outbox-Commit-Lsn` header and the consumer library share; the decoder
//! re-exports it so its messages carry the same type.

pub use outbox_contract::{Lsn, ParseLsnError};
