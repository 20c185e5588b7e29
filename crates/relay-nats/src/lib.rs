//! relay-nats
