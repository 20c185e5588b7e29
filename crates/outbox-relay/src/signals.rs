//! SIGTERM/SIGINT for the long-running commands (`run`, `backfill`): the first asks for a clean
//! stop, the second exits at once with 130. SIGHUP asks `run` to read its configuration again.

use tokio_util::sync::CancellationToken;

/// Cancels `shutdown` on the first SIGTERM or SIGINT, logging `first`; on a second one, logs
/// `second` and exits with 130 (what was not acknowledged is re-sent by the next start).
pub fn spawn_handler(shutdown: CancellationToken, first: &'static str, second: &'static str) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(error) => {
                    tracing::error!(error = %error, "cannot listen for SIGTERM");
                    return;
                }
            };
        for round in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if round == 0 {
                tracing::info!("{first}");
                shutdown.cancel();
            } else {
                tracing::warn!("{second}");
                std::process::exit(130);
            }
        }
    });
}

/// A message on the returned channel for each SIGHUP: read the configuration again.
pub fn spawn_reload_handler() -> tokio::sync::mpsc::Receiver<()> {
    let (reload, reloads) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(error = %error, "cannot listen for SIGHUP: reload by restarting");
                return;
            }
        };
        while hangup.recv().await.is_some() {
            tracing::info!("SIGHUP: reading the configuration again");
            // One pending reload is enough: it reads the files as they are then.
            let _ = reload.try_send(());
        }
    });
    reloads
}
