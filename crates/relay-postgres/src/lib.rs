//! relay-postgres
