//! What a periodic task beside the replication session needs: [`Ticks`], its rounds until
//! shutdown, and [`KeptSession`], a plain session kept across rounds and re-made after a
//! failure. One home, so every such task (drift check, samplers, cleanup) retries alike.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::PostgresSettings;

/// The ticks of a periodic task, until `stop` is cancelled.
#[derive(Debug)]
pub struct Ticks {
    interval: tokio::time::Interval,
    stop: CancellationToken,
}

impl Ticks {
    /// Every `every`, the first tick at once; a late tick delays the next ones.
    #[must_use]
    pub fn every(every: Duration, stop: CancellationToken) -> Self {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval, stop }
    }

    /// Every `every`, the first tick `every` from now.
    pub async fn every_after(every: Duration, stop: CancellationToken) -> Self {
        let mut ticks = Self::every(every, stop);
        ticks.interval.tick().await;
        ticks
    }

    /// Waits for the next tick; `false` once `stop` is cancelled.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.interval.tick() => true,
            () = self.stop.cancelled() => false,
        }
    }
}

/// A plain PostgreSQL session a periodic task keeps: opened on demand, and again on the next
/// tick after it closed or the task dropped it ([`Self::drop_session`]) on an error.
#[derive(Debug)]
pub struct KeptSession {
    settings: PostgresSettings,
    /// Run on each new session (e.g. a statement timeout).
    setup: Option<&'static str>,
    /// Names the task in the log line of a failed connect.
    task: &'static str,
    client: Option<tokio_postgres::Client>,
}

impl KeptSession {
    /// A session for `task` (named in its log lines), set up with `setup` when opened.
    #[must_use]
    pub fn new(
        settings: PostgresSettings,
        task: &'static str,
        setup: Option<&'static str>,
    ) -> Self {
        Self {
            settings,
            setup,
            task,
            client: None,
        }
    }

    /// The session, connected if need be; `None` when that failed (the next tick tries again).
    pub async fn get(&mut self) -> Option<&mut tokio_postgres::Client> {
        if self
            .client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            self.client = None;
            match crate::connect(&self.settings).await {
                Ok(client) => {
                    if let Some(sql) = self.setup
                        && let Err(error) = client.batch_execute(sql).await
                    {
                        tracing::debug!(task = self.task, error = %error, "cannot set up the session; next round tries again");
                        return None;
                    }
                    self.client = Some(client);
                }
                Err(error) => {
                    tracing::debug!(task = self.task, error = %error, "cannot connect; next round tries again");
                    return None;
                }
            }
        }
        self.client.as_mut()
    }

    /// Drops the session after an error: the next [`Self::get`] opens a new one.
    pub fn drop_session(&mut self) {
        self.client = None;
    }
}
