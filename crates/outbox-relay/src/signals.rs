//! SIGTERM/SIGINT for the long-running commands (`run`, `backfill`): the first asks for a clean
//! stop, the second exits at once with 130.

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
