//! The files a relay reads before it connects anywhere, beyond those the configuration's own
//! validation reads (the `[outbox.contracts]` schemas, `[postgres] password_file`): the
//! console's token, the NATS credentials and certificates, and PostgreSQL's certificates.
//! [`check_files`] serves both `run` ([`crate::Relay::build`]) and the offline `validate`, so
//! a file `run` refuses, `validate` refuses too, with the same message and exit (78).

use crate::config::RelayConfig;
use crate::failure::{Failure, nats_failure, pg_failure};

/// Reads and checks every file the relay would read before it connects; the first that cannot
/// be read or used is a configuration failure naming the setting and the file (never its
/// contents).
pub fn check_files(config: &RelayConfig) -> Result<(), Failure> {
    // The console is served only on `[http] listen` (validation refuses it without).
    if config.http.console {
        config.http.console_token().map_err(Failure::config)?;
    }
    relay_nats::check_files(&config.nats).map_err(nats_failure)?;
    config.postgres.check_files().map_err(pg_failure)?;
    Ok(())
}
