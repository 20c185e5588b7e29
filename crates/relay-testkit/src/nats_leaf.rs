//! A hub nats-server and a leaf node connected to it, each with its own JetStream domain: the
//! edge deployment where a client on the leaf reaches the hub's streams through
//! `$JS.<domain>.API`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::{HOST, NatsOptions, NatsServer, free_port, nats_request};

/// The JetStream domain of [`NatsLeafPair::hub`].
pub const HUB_DOMAIN: &str = "hub";
/// The JetStream domain of [`NatsLeafPair::leaf`].
pub const LEAF_DOMAIN: &str = "leaf";

/// How long [`NatsLeafPair::start`] waits for the leafnode connection to carry JetStream
/// requests both ways.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

static PAIRS: AtomicU64 = AtomicU64::new(0);

/// Two nats-servers on 127.0.0.1, each with JetStream (file store in its own directory) and a
/// unique `server_name`: the hub, with JetStream domain [`HUB_DOMAIN`] and a leafnode port, and
/// a leaf node, with JetStream domain [`LEAF_DOMAIN`] and a `leafnodes` remote pointing at the
/// hub. Both serve the default account. On the leaf, `$JS.API` is the leaf's own JetStream and
/// `$JS.hub.API` the hub's (and on the hub `$JS.leaf.API` the leaf's). Works with nats-server
/// 2.9 and 2.1x.
#[derive(Debug)]
pub struct NatsLeafPair {
    hub: NatsServer,
    leaf: NatsServer,
    leafnode_port: u16,
}

impl NatsLeafPair {
    /// Starts the hub, then the leaf, and waits until each answers JetStream API requests in
    /// the other's domain (the leafnode connection is up).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(NatsOptions::default()).await
    }

    /// Like [`Self::start`]; `opts.config` is added to both servers' configuration and
    /// `opts.binary` picks the nats-server binary (`jetstream` is always on, `tls` is not
    /// supported here).
    pub async fn start_with(opts: NatsOptions) -> anyhow::Result<Self> {
        Self::start_with_remote(opts, "").await
    }

    /// Like [`Self::start_with`]; `remote` is added to the leaf's remote entry, e.g.
    /// `deny_exports: ["outbox.>"]` so that the hub never hears the leaf's messages on those
    /// subjects (while JetStream requests still cross).
    pub async fn start_with_remote(opts: NatsOptions, remote: &str) -> anyhow::Result<Self> {
        if opts.tls || !opts.jetstream {
            bail!("NatsLeafPair: both servers run JetStream without TLS");
        }
        // A leafnode port taken by another process between free_port() and the bind makes the
        // hub fail: start again on a new one.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(&opts, remote).await {
                Ok(pair) => return Ok(pair),
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {}
                Err(e) => return Err(e),
            }
        }
    }

    async fn try_start(opts: &NatsOptions, remote: &str) -> anyhow::Result<Self> {
        let name = format!(
            "relay-testkit-{}-{}",
            std::process::id(),
            PAIRS.fetch_add(1, Ordering::Relaxed)
        );
        let extra = opts.config.as_deref().unwrap_or("");
        let leafnode_port = free_port();
        let hub = NatsServer::start_with(NatsOptions {
            config: Some(format!(
                "server_name: \"{name}-hub\"\n\
                 jetstream {{\n  domain: \"{HUB_DOMAIN}\"\n}}\n\
                 leafnodes {{\n  listen: \"{HOST}:{leafnode_port}\"\n}}\n{extra}\n"
            )),
            ..opts.clone()
        })
        .await
        .context("starting the hub")?;
        let leaf = NatsServer::start_with(NatsOptions {
            config: Some(format!(
                "server_name: \"{name}-leaf\"\n\
                 jetstream {{\n  domain: \"{LEAF_DOMAIN}\"\n}}\n\
                 leafnodes {{\n  remotes: [\n    {{\n      url: \"nats-leaf://{HOST}:{leafnode_port}\"\n      {remote}\n    }}\n  ]\n}}\n{extra}\n"
            )),
            ..opts.clone()
        })
        .await
        .context("starting the leaf node")?;
        let pair = Self {
            hub,
            leaf,
            leafnode_port,
        };
        pair.wait_connected(CONNECT_TIMEOUT).await?;
        Ok(pair)
    }

    /// Waits until the leaf answers `$JS.hub.API.INFO` (the hub's JetStream, through the
    /// leafnode connection) and the hub `$JS.leaf.API.INFO`, without error: after a start or
    /// after either server is started again.
    pub async fn wait_connected(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let checks = [
            (&self.leaf, format!("$JS.{HUB_DOMAIN}.API.INFO")),
            (&self.hub, format!("$JS.{LEAF_DOMAIN}.API.INFO")),
        ];
        for (server, subject) in &checks {
            loop {
                let answer = nats_request(server.port(), subject, "").await;
                let problem = match &answer {
                    Ok(reply) if !reply.contains("\"error\"") => break,
                    Ok(reply) => reply.clone(),
                    Err(e) => format!("{e:#}"),
                };
                if tokio::time::Instant::now() >= deadline {
                    bail!(
                        "the leafnode connection did not carry {subject} within {timeout:?} (last answer: {problem})\n\
                         --- hub log (tail) ---\n{}\n--- leaf log (tail) ---\n{}",
                        tail(&self.hub.log()),
                        tail(&self.leaf.log())
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The hub: JetStream domain [`HUB_DOMAIN`].
    pub fn hub(&self) -> &NatsServer {
        &self.hub
    }

    /// The leaf node: JetStream domain [`LEAF_DOMAIN`], connected to the hub.
    pub fn leaf(&self) -> &NatsServer {
        &self.leaf
    }

    /// The hub, to stop, kill or pause it.
    pub fn hub_mut(&mut self) -> &mut NatsServer {
        &mut self.hub
    }

    /// The leaf node, to stop, kill or pause it.
    pub fn leaf_mut(&mut self) -> &mut NatsServer {
        &mut self.leaf
    }

    /// Both servers: the hub, then the leaf node (to hand the leaf to a harness that owns one
    /// server while keeping the hub).
    pub fn into_servers(self) -> (NatsServer, NatsServer) {
        (self.hub, self.leaf)
    }

    /// The hub's leafnode port (the leaf's remote).
    pub fn leafnode_port(&self) -> u16 {
        self.leafnode_port
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
