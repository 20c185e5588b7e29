//! What a running relay serves over HTTP, and the only crate with HTML: the `[http]` endpoints
//! (`/livez`, `/readyz`, `/metrics`, `/status`: `http.rs`) and the console (`[http] console =
//! true`: its page, script and style, and the JSON they read: `console.rs`, `console/`).
//!
//! They read what the relay exposes (relay-runtime's [`Relay`]: its settings, its telemetry,
//! when it ended) and the libraries the commands use; the relay itself knows nothing of HTTP.
//! The binary wires them: [`Endpoints::bind`] after [`Relay::build`] (which reads every file,
//! the console's token too, and connects to nothing) and before [`Relay::run`], so a taken port
//! is still a configuration failure reported before anything connects, then
//! [`Endpoints::serve`] until the relay's run has returned.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use relay_runtime::Relay;
use relay_runtime::config::RelayConfig;
use relay_runtime::failure::Failure;

mod console;
mod http;

/// The `[http] listen` listener, bound, and the console's token when it is served.
#[derive(Debug)]
pub struct Endpoints {
    listener: tokio::net::TcpListener,
    /// `[http] console = true`: its token (`None`: loopback only).
    console: Option<Option<String>>,
}

impl Endpoints {
    /// Binds `[http] listen` (`None` without one); a port that cannot be listened on is a
    /// configuration failure.
    pub async fn bind(config: &RelayConfig) -> Result<Option<Self>, Failure> {
        let Some(listen) = &config.http.listen else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("[http] listen: cannot listen on {listen}"))
            .map_err(Failure::config)?;
        // (`[http] console` without `listen` is refused by the configuration's validation.)
        let console = config
            .http
            .console
            .then(|| config.http.console_token())
            .transpose()
            .map_err(Failure::config)?;
        Ok(Some(Self { listener, console }))
    }

    /// The address bound (a port 0 given, the port chosen).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `relay`'s endpoints (and its console) until [`Relay::ended`]: they answer while
    /// it drains, and end once its run has returned.
    pub fn serve(self, relay: &Relay) {
        let config = relay.config();
        let telemetry = relay.telemetry().clone();
        let ended = relay.ended();
        let listen = config.http.listen.as_deref().unwrap_or_default();
        tracing::info!(listen = %listen, console = self.console.is_some(), "serving /livez, /readyz, /metrics, /status");
        let console = self.console.map(|token| {
            let console = Arc::new(console::Console::new(config, telemetry.clone(), token));
            console::spawn_history(console.clone(), ended.clone());
            console
        });
        http::spawn(self.listener, telemetry, console, ended);
    }
}
