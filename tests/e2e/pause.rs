//! The relay's pause points (`RELAY_PAUSE=<name>:<file>`, feature `failpoints`): a test stops
//! a relay at a named point of its session, changes the database, then lets it go on.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::support::{Env, Relay};

/// One pause point of one relay process.
pub struct Pause {
    point: &'static str,
    file: PathBuf,
}

impl Pause {
    /// A pause at `point`, released through a file in the test's directory.
    pub fn new(env: &Env, point: &'static str) -> Self {
        let file = env
            .dir
            .path()
            .join(format!("release-{point}-{}", uuid::Uuid::new_v4()));
        Self { point, file }
    }

    /// The `RELAY_PAUSE` value to start the relay with.
    pub fn spec(&self) -> String {
        format!("{}:{}", self.point, self.file.display())
    }

    /// Waits until `relay` is paused here.
    pub async fn reached(&self, relay: &Relay) -> Result<()> {
        relay
            .wait_log(
                &format!("paused at {}", self.point),
                Duration::from_secs(30),
            )
            .await
    }

    /// Lets the relay go on.
    pub fn release(&self) -> Result<()> {
        std::fs::write(&self.file, b"go")?;
        Ok(())
    }
}
