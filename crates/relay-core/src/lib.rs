//! relay-core
