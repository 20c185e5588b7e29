//! Three (or n) nats-server processes on loopback with cluster routes and
//! JetStream: the way production runs.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use crate::{HOST, NatsOptions, NatsServer, free_port};

/// How long [`NatsCluster::start`] waits for the JetStream meta leader and
/// for an R{n} stream to be creatable.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

static CLUSTERS: AtomicU64 = AtomicU64::new(0);

/// A nats-server cluster on 127.0.0.1: every node is a [`NatsServer`] with
/// JetStream (file store in its own directory), its own client port, its
/// own cluster port, a unique `server_name`, one cluster `name`, and routes
/// to all nodes. Works with nats-server 2.9 and 2.1x.
///
/// Nodes can be killed, paused and restarted one by one through
/// [`Self::node`]; a restarted node keeps its ports, name and store.
#[derive(Debug)]
pub struct NatsCluster {
    name: String,
    nodes: Vec<NatsServer>,
    server_names: Vec<String>,
    cluster_ports: Vec<u16>,
}

impl NatsCluster {
    /// Starts `nodes` nats-servers (3 in practice) and waits until the
    /// cluster answers JetStream API requests on every node and can create
    /// a stream with `nodes` replicas (up to [`CLUSTER_READY_TIMEOUT`]).
    pub async fn start(nodes: usize) -> anyhow::Result<Self> {
        Self::start_with(nodes, NatsOptions::default()).await
    }

    /// Like [`Self::start`]; `opts.config` is added to every node's
    /// configuration and `opts.binary` picks the nats-server binary.
    /// `opts.jetstream = false` gives a plain cluster (no JetStream
    /// readiness check).
    pub async fn start_with(nodes: usize, opts: NatsOptions) -> anyhow::Result<Self> {
        if nodes == 0 {
            bail!("NatsCluster::start: at least one node is needed");
        }
        // A cluster port taken by another process between free_port() and
        // the bind makes a node fail: start everything again on new ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(nodes, &opts).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {}
                Err(e) => return Err(e),
            }
        }
    }

    async fn try_start(nodes: usize, opts: &NatsOptions) -> anyhow::Result<Self> {
        let name = format!(
            "relay-testkit-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        let cluster_ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let server_names: Vec<String> = (0..nodes).map(|i| format!("{name}-n{i}")).collect();
        let mut starting = Vec::with_capacity(nodes);
        for (i, server_name) in server_names.iter().enumerate() {
            let node_opts = NatsOptions {
                config: Some(node_config(
                    &name,
                    server_name,
                    cluster_ports[i],
                    &cluster_ports,
                    opts.config.as_deref(),
                )),
                ..opts.clone()
            };
            // Concurrently: a node may wait for its routes.
            starting.push(tokio::spawn(NatsServer::start_with(node_opts)));
        }
        let mut started = Vec::with_capacity(nodes);
        let mut first_error = None;
        for (i, task) in starting.into_iter().enumerate() {
            match task.await {
                Ok(Ok(server)) => started.push(server),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.context(format!("starting node {i} of {name}")));
                }
                Err(e) => {
                    first_error.get_or_insert(anyhow!("starting node {i} of {name}: {e}"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let cluster = Self {
            name,
            nodes: started,
            server_names,
            cluster_ports,
        };
        if opts.jetstream {
            cluster.wait_ready(CLUSTER_READY_TIMEOUT).await?;
        }
        Ok(cluster)
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true (a cluster has at least one node).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The cluster `name` shared by all nodes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Client URLs of all nodes (`nats://127.0.0.1:PORT`), running or not.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// All client URLs, comma-separated, for a client's server list. Note
    /// that `async_nats::connect("a,b,c")` does not split it: pass
    /// [`Self::urls`] (a `Vec<String>` converts with
    /// `.iter().map(|u| u.parse()).collect::<Result<Vec<ServerAddr>, _>>()`)
    /// or split at commas.
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// Node `i` (0-based), to `kill9`, `stop`, `start_again`, `pause` or
    /// `resume` it. After `start_again`, [`Self::wait_ready`] waits until
    /// the node serves JetStream again.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn node(&mut self, i: usize) -> &mut NatsServer {
        &mut self.nodes[i]
    }

    /// All nodes (read-only).
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// The `server_name` of node `i`, as JetStream reports it (e.g. as a
    /// stream's `cluster.leader`).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn server_name(&self, i: usize) -> &str {
        &self.server_names[i]
    }

    /// The index of the node with this `server_name`.
    pub fn node_index(&self, server_name: &str) -> Option<usize> {
        self.server_names.iter().position(|n| n == server_name)
    }

    /// The cluster (route) port of node `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn cluster_port(&self, i: usize) -> u16 {
        self.cluster_ports[i]
    }

    /// Waits until every running node answers `$JS.API.INFO` without error
    /// (so a JetStream meta leader is elected and the node is current) and
    /// a throw-away stream with one replica per running node can be
    /// created (so all running peers are known); the stream is deleted
    /// again. Paused nodes count as running: resume them first.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_error;
        loop {
            match self.check_ready().await {
                Ok(()) => return Ok(()),
                Err(e) => last_error = e,
            }
            if tokio::time::Instant::now() >= deadline {
                let mut logs = String::new();
                for (i, node) in self.nodes.iter().enumerate() {
                    let _ = write!(
                        logs,
                        "\n--- node {i} ({}) log (tail) ---\n{}",
                        self.server_names[i],
                        tail(&node.log(), 25)
                    );
                }
                bail!(
                    "NatsCluster {}: JetStream not ready within {timeout:?}: {last_error:#}{logs}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn check_ready(&self) -> anyhow::Result<()> {
        let running: Vec<&NatsServer> = self.nodes.iter().filter(|n| n.pid().is_some()).collect();
        let first = running
            .first()
            .ok_or_else(|| anyhow!("no node is running"))?;
        for node in &running {
            let reply = nats_request(node.port(), "$JS.API.INFO", "").await?;
            check_js_reply(&reply).with_context(|| format!("$JS.API.INFO on {}", node.url()))?;
        }
        let probe = format!("TESTKIT_READY_{}", CLUSTERS.fetch_add(1, Ordering::Relaxed));
        let config = serde_json::json!({
            "name": probe,
            "subjects": [format!("_testkit.ready.{probe}")],
            "storage": "memory",
            "num_replicas": running.len(),
        });
        let reply = nats_request(
            first.port(),
            &format!("$JS.API.STREAM.CREATE.{probe}"),
            &config.to_string(),
        )
        .await?;
        check_js_reply(&reply).context("creating a probe stream")?;
        for _ in 0..20 {
            if let Ok(reply) =
                nats_request(first.port(), &format!("$JS.API.STREAM.DELETE.{probe}"), "").await
                && check_js_reply(&reply).is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("could not delete the probe stream {probe}")
    }
}

fn node_config(
    cluster: &str,
    server_name: &str,
    cluster_port: u16,
    all_cluster_ports: &[u16],
    extra: Option<&str>,
) -> String {
    let routes: Vec<String> = all_cluster_ports
        .iter()
        .filter(|p| **p != cluster_port)
        .map(|p| format!("    \"nats-route://{HOST}:{p}\""))
        .collect();
    format!(
        "server_name: \"{server_name}\"\n\
         cluster {{\n  name: \"{cluster}\"\n  listen: \"{HOST}:{cluster_port}\"\n  \
         routes: [\n{}\n  ]\n}}\n{}\n",
        routes.join("\n"),
        extra.unwrap_or("")
    )
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Err with the server's description when a JetStream API reply holds an
/// `error`.
fn check_js_reply(reply: &str) -> anyhow::Result<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(reply)
        .with_context(|| format!("JetStream API reply is not JSON: {reply:?}"))?;
    if let Some(err) = value.get("error") {
        bail!("JetStream API error: {err}");
    }
    Ok(value)
}

/// One request over the raw NATS protocol (no client library), 5 s timeout: the reply's payload,
/// or an error for "no responders", a server error or no reply.
pub async fn nats_request(port: u16, subject: &str, payload: &str) -> anyhow::Result<String> {
    tokio::time::timeout(Duration::from_secs(5), raw_request(port, subject, payload))
        .await
        .with_context(|| format!("{subject} on port {port}: no reply within 5 s"))?
        .with_context(|| format!("{subject} on port {port}"))
}

async fn raw_request(port: u16, subject: &str, payload: &str) -> anyhow::Result<String> {
    let stream = TcpStream::connect((HOST, port)).await?;
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    if !line.starts_with("INFO ") {
        bail!("no INFO line: {line:?}");
    }
    let msg = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}}\r\n\
         SUB _INBOX.testkit 1\r\nPUB {subject} _INBOX.testkit {}\r\n{payload}\r\nPING\r\n",
        payload.len()
    );
    stream.get_mut().write_all(msg.as_bytes()).await?;
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            bail!("connection closed");
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.first().copied() {
            Some("MSG") => {
                let len: usize = fields.last().context("MSG without size")?.parse()?;
                let mut body = vec![0; len + 2];
                stream.read_exact(&mut body).await?;
                body.truncate(len);
                return Ok(String::from_utf8(body)?);
            }
            // A header-only reply: "no responders" (503) during an election.
            Some("HMSG") => bail!("no responders: {}", line.trim_end()),
            Some("PING") => stream.get_mut().write_all(b"PONG\r\n").await?,
            Some("-ERR") => bail!("server error: {}", line.trim_end()),
            _ => {}
        }
    }
}

/// Asks the leader of JetStream stream `stream` to step down (request
/// `$JS.API.STREAM.LEADER.STEPDOWN.<stream>`), so another replica is
/// elected. Fails with the server's error (e.g. no leader right now) or
/// when nobody answers (e.g. "no responders" during an election) within
/// 5 s; callers that step down in a loop should treat that as "try again".
pub async fn stream_leader_stepdown(
    client: &async_nats::Client,
    stream: &str,
) -> anyhow::Result<()> {
    let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
    let value = client_request(client, subject).await?;
    if value.get("success").and_then(serde_json::Value::as_bool) != Some(true) {
        bail!("stream leader stepdown of {stream}: unexpected reply {value}");
    }
    Ok(())
}

/// The `server_name` of the current leader of JetStream stream `stream`
/// (from `$JS.API.STREAM.INFO.<stream>`), `None` while there is none. Map
/// it to a node with [`NatsCluster::node_index`].
pub async fn stream_leader(
    client: &async_nats::Client,
    stream: &str,
) -> anyhow::Result<Option<String>> {
    let value = client_request(client, format!("$JS.API.STREAM.INFO.{stream}")).await?;
    Ok(value
        .pointer("/cluster/leader")
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned))
}

async fn client_request(
    client: &async_nats::Client,
    subject: String,
) -> anyhow::Result<serde_json::Value> {
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request(subject.clone(), "".into()),
    )
    .await
    .with_context(|| format!("{subject}: no reply within 5 s"))?
    .with_context(|| format!("request {subject}"))?;
    check_js_reply(&String::from_utf8_lossy(&reply.payload)).with_context(|| subject.clone())
}
