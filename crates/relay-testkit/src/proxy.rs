//! A TCP proxy that injects network faults between a client (the relay) and
//! a server (PostgreSQL, nats-server).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Bytes read from one side in one go.
const CHUNK: usize = 64 * 1024;
/// Chunks the proxy holds per direction before it stops reading (then the
/// kernel buffers fill and the sender blocks, as with a slow link).
const QUEUED_CHUNKS: usize = 64;

/// A TCP proxy on `127.0.0.1:<free port>` in front of one server, for fault
/// injection: put it between the relay and PostgreSQL (both the replication
/// and the plain connection go through it when the relay is given the
/// proxy's port) or nats-server.
///
/// Every accepted connection is forwarded to `upstream` over a connection of
/// its own. Faults apply to all connections, current and new:
///
/// * [`Self::set_delay`]: latency added to every chunk, in both directions
///   (a latency, not a bandwidth cap: chunks in flight overlap).
/// * [`Self::set_blackhole`]: a network partition. Nothing is forwarded in
///   either direction, and new connections are accepted but not connected
///   upstream. The bytes are **held**, never dropped: when the blackhole
///   ends, everything is delivered in order, like a partition that heals
///   while both ends kept retransmitting. A close or reset by one side is
///   held in the same way (it reaches the other side after the held bytes).
///   Note that each side talks TCP to the proxy, so kernel TCP keepalive
///   probes are still answered: only application-level timeouts (e.g.
///   `wal_sender_timeout`, NATS pings) detect a blackhole.
/// * [`Self::cut_all`]: resets every current connection (both sides get a
///   TCP RST; held bytes are lost). New connections still work.
/// * [`Self::set_refuse`]: new connections are accepted and reset at once
///   (the client sees "connection reset", or EOF, on its first read).
///
/// It runs on the tokio runtime it was started on (spawned tasks). `Drop`
/// closes the listener and resets every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    delay_nanos: AtomicU64,
    blackhole: watch::Sender<bool>,
    refuse: AtomicBool,
    /// Bumped by `cut_all` and by `Drop`; every connection ends with a reset
    /// when it changes.
    control: watch::Sender<Control>,
    open: AtomicUsize,
    total: AtomicUsize,
    refused: AtomicUsize,
}

#[derive(Debug, Clone, Copy, Default)]
struct Control {
    cuts: u64,
    stopped: bool,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:<free port>` and forwards every accepted
    /// connection to `upstream`. Must be called within a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("FaultProxy: binding 127.0.0.1:0")?;
        let addr = listener
            .local_addr()
            .context("FaultProxy: listener has no local address")?;
        let shared = Arc::new(Shared {
            upstream,
            delay_nanos: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
            refuse: AtomicBool::new(false),
            control: watch::Sender::new(Control::default()),
            open: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            addr,
            shared,
            accept_task,
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The proxy's address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Adds `delay` to every chunk forwarded in either direction from now on
    /// (`Duration::ZERO` = none). Chunks already read keep the delay they
    /// were read with.
    pub fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Starts (`true`) or ends (`false`) a blackhole: connections stay open
    /// but nothing is forwarded in either direction; bytes are held (up to
    /// 4 MiB per direction in the proxy, the rest in kernel buffers, then
    /// the sender blocks) and delivered in order when it ends. New
    /// connections are accepted but connected upstream only when it ends.
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Whether a blackhole is on.
    pub fn is_blackholed(&self) -> bool {
        *self.shared.blackhole.borrow()
    }

    /// Resets every current connection (SO_LINGER 0: both the client and
    /// the server side get a TCP RST; bytes held or delayed are lost). New
    /// connections are forwarded as usual.
    pub fn cut_all(&self) {
        self.shared.control.send_modify(|c| c.cuts += 1);
    }

    /// While on, new connections are accepted and reset at once (the client
    /// sees a reset or EOF on its first read). Current connections are not
    /// affected.
    pub fn set_refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::Relaxed);
    }

    /// Connections currently open (accepted and not yet closed on both
    /// sides, including those waiting for a blackhole to end). Refused
    /// connections are not counted.
    pub fn connection_count(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Connections accepted and forwarded since start (refused ones are
    /// counted by [`Self::refused_connections`] instead).
    pub fn total_connections(&self) -> usize {
        self.shared.total.load(Ordering::Relaxed)
    }

    /// Connections reset at once because [`Self::set_refuse`] was on.
    pub fn refused_connections(&self) -> usize {
        self.shared.refused.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    /// Stops the listener and resets every connection.
    fn drop(&mut self) {
        self.accept_task.abort();
        self.shared.control.send_modify(|c| c.stopped = true);
    }
}

impl Shared {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.refuse.load(Ordering::Relaxed) {
            abort(&client);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Subscribe before spawning: a cut_all from now on reaches it.
        let control = shared.control.subscribe();
        if control.borrow().stopped {
            abort(&client);
            return;
        }
        shared.total.fetch_add(1, Ordering::Relaxed);
        shared.open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(connection(client, Arc::clone(&shared), control));
    }
}

/// Decrements the open-connection count when a connection task ends.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    mut client: TcpStream,
    shared: Arc<Shared>,
    mut control: watch::Receiver<Control>,
) {
    let _guard = OpenGuard(Arc::clone(&shared));
    let _ = client.set_nodelay(true);
    let mut upstream: Option<TcpStream> = None;
    let outcome = tokio::select! {
        r = async {
            // A new connection waits for a blackhole to end before it is
            // connected upstream.
            wait_no_blackhole(&shared).await?;
            let up = TcpStream::connect(shared.upstream).await?;
            let _ = up.set_nodelay(true);
            let up = upstream.insert(up);
            forward(&mut client, up, &shared).await
        } => r,
        _ = control.changed() => Err(io::Error::other("connection cut")),
    };
    if outcome.is_err() {
        abort(&client);
        if let Some(up) = &upstream {
            abort(up);
        }
    }
    // Otherwise both directions ended with a clean close: plain drop.
}

/// Makes the close of `stream` send a RST instead of a FIN.
fn abort(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

async fn wait_no_blackhole(shared: &Shared) -> io::Result<()> {
    let mut rx = shared.blackhole.subscribe();
    rx.wait_for(|on| !on)
        .await
        .map(drop)
        .map_err(|_| io::Error::other("proxy stopped"))
}

/// Forwards both directions until both have ended cleanly (Ok) or one
/// fails (Err: the caller resets both sides).
async fn forward(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    shared: &Shared,
) -> io::Result<()> {
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    tokio::try_join!(
        pipe(client_read, upstream_write, shared),
        pipe(upstream_read, client_write, shared),
    )?;
    Ok(())
}

enum Event {
    Data(Vec<u8>),
    Eof,
    Reset(io::Error),
}

/// One direction: a reader stamps each chunk with the time it is due, a
/// writer sends it then (and not before a blackhole ends). In order, nothing
/// dropped.
async fn pipe(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, shared: &Shared) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Option<Instant>, Event)>(QUEUED_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let event = match from.read(&mut buf).await {
                Ok(0) => Event::Eof,
                Ok(n) => Event::Data(buf[..n].to_vec()),
                Err(e) => Event::Reset(e),
            };
            let delay = shared.delay();
            let due = (!delay.is_zero()).then(|| Instant::now() + delay);
            let last = !matches!(event, Event::Data(_));
            if tx.send((due, event)).await.is_err() || last {
                // The writer has ended (its result decides) or this side has.
                return Ok::<(), io::Error>(());
            }
        }
    };
    let writer = async move {
        let mut blackhole = shared.blackhole.subscribe();
        while let Some((due, event)) = rx.recv().await {
            if let Some(due) = due {
                tokio::time::sleep_until(due).await;
            }
            blackhole
                .wait_for(|on| !on)
                .await
                .map_err(|_| io::Error::other("proxy stopped"))?;
            match event {
                Event::Data(bytes) => to.write_all(&bytes).await?,
                Event::Eof => {
                    to.shutdown().await?;
                    return Ok(());
                }
                Event::Reset(e) => return Err(e),
            }
        }
        Ok(())
    };
    tokio::try_join!(reader, writer)?;
    Ok(())
}
