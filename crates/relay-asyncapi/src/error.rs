//! [`AsyncApiError`]: why no document can be built from a configuration.

use relay_core::route::{ConfigError as MappingError, MessageConfigError};
use relay_runtime::config::ConfigError;

/// Why no document can be built from a configuration.
#[derive(Debug, thiserror::Error)]
pub enum AsyncApiError {
    /// `[nats] url` names no host (the text is shown without its password).
    #[error("[nats] url `{0}` names no server host")]
    ServerUrl(String),
    /// An `[[outbox]]` mapping that does not validate.
    #[error("[[outbox]] table `{table}`: cannot describe its messages")]
    Mapping {
        /// The table, as configured.
        table: String,
        /// Why.
        #[source]
        source: MappingError,
    },
    /// A `[[messages]]` entry that does not validate.
    #[error("[[messages]] prefix `{prefix}`: cannot describe its messages")]
    Messages {
        /// The prefix.
        prefix: String,
        /// Why.
        #[source]
        source: MessageConfigError,
    },
    /// An `[outbox.contracts]` file that cannot be read or compiled.
    #[error("cannot describe the event contracts")]
    Contracts(#[source] ConfigError),
}
