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

use anyhow::Context as _;
use relay_runtime::config::HttpSettings;
use relay_runtime::failure::Failure;
use relay_runtime::fleet::FleetView;
use tokio_util::sync::CancellationToken;

mod console;
mod http;

/// The `[http] listen` listener, bound, and the console's token when it is served.
#[derive(Debug)]
pub struct Endpoints {
    listener: tokio::net::TcpListener,
    /// `[http] console = true`: its token (`None`: loopback only).
    console: Option<Option<String>>,
    /// `[http] console_write`.
    console_write: bool,
    /// `[http] listen`, as configured.
    listen: String,
}

impl Endpoints {
    /// Binds `[http] listen` (`None` without one); a port that cannot be listened on is a
    /// configuration failure.
    pub async fn bind(http: &HttpSettings) -> Result<Option<Self>, Failure> {
        let Some(listen) = &http.listen else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("[http] listen: cannot listen on {listen}"))
            .map_err(Failure::config)?;
        // (`[http] console` without `listen` is refused by the configuration's validation.)
        let console = http
            .console
            .then(|| http.console_token())
            .transpose()
            .map_err(Failure::config)?;
        Ok(Some(Self {
            listener,
            console,
            console_write: http.console_write,
            listen: listen.clone(),
        }))
    }

    /// The address bound (a port 0 given, the port chosen).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves the endpoints of `fleet`'s pipelines (and the console) until `ended`: they
    /// answer while the pipelines drain, and end once the fleet's run has returned. A
    /// single-relay configuration's answer as one relay's always did; a fleet's label every
    /// metric with its pipeline and list each pipeline in `/status` and `/readyz`, and its
    /// console is the fleet page with each pipeline's console under it.
    pub fn serve(self, fleet: FleetView, ended: CancellationToken) {
        tracing::info!(listen = %self.listen, console = self.console.is_some(), "serving /livez, /readyz, /metrics, /status");
        let console = self
            .console
            .map(|token| console::routes(fleet.clone(), token, self.console_write, ended.clone()));
        http::spawn(self.listener, fleet, console, ended);
    }
}
