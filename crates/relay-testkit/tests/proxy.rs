//! FaultProxy against an echo server and a real PostgreSQL.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use relay_testkit::{FaultProxy, NatsServer, PostgresServer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// An echo server; counts the connections it accepted.
struct Echo {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo_server() -> anyhow::Result<Echo> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Ok(Echo {
        addr,
        accepted,
        task,
    })
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn read_n(conn: &mut TcpStream, n: usize) -> anyhow::Result<Vec<u8>> {
    let mut buf = vec![0; n];
    tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut buf))
        .await
        .context("read timed out")??;
    Ok(buf)
}

/// The client side ended: reset or EOF (within 5 s).
async fn assert_closed(conn: &mut TcpStream) -> anyhow::Result<()> {
    let mut buf = [0u8; 16];
    match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
        Ok(Ok(0)) => Ok(()),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => Ok(()),
        other => anyhow::bail!("connection still open: {other:?}"),
    }
}

#[tokio::test]
async fn echo_round_trip_and_counts() -> anyhow::Result<()> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    assert_eq!(proxy.addr().port(), proxy.port());
    assert_eq!(proxy.upstream(), echo.addr);
    assert_eq!(proxy.connection_count(), 0);

    let mut conn = TcpStream::connect(proxy.addr()).await?;
    conn.write_all(b"hello").await?;
    assert_eq!(read_n(&mut conn, 5).await?, b"hello");
    assert_eq!(proxy.connection_count(), 1);
    assert_eq!(proxy.total_connections(), 1);

    // 4 MiB both ways at once, byte-exact.
    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = conn.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await?;
        w.shutdown().await?; // half-close: the echo server sees EOF, echoes it
        anyhow::Ok(())
    });
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut back)).await??;
    writer.await??;
    assert!(back == data, "echoed {} bytes, differ", back.len());
    wait_until("the connection is closed", || proxy.connection_count() == 0).await?;

    let mut second = TcpStream::connect(proxy.addr()).await?;
    second.write_all(b"x").await?;
    assert_eq!(read_n(&mut second, 1).await?, b"x");
    assert_eq!(proxy.total_connections(), 2);
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);

    // Drop resets the connection and closes the listener.
    let port = proxy.port();
    drop(proxy);
    assert_closed(&mut second).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    Ok(())
}

#[tokio::test]
async fn delay_adds_latency() -> anyhow::Result<()> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;

    let t = Instant::now();
    conn.write_all(b"a").await?;
    read_n(&mut conn, 1).await?;
    let fast = t.elapsed();
    assert!(fast < Duration::from_millis(250), "{fast:?}");

    proxy.set_delay(Duration::from_millis(150));
    let t = Instant::now();
    conn.write_all(b"b").await?;
    read_n(&mut conn, 1).await?;
    let slow = t.elapsed();
    // Both directions: at least 2 x 150 ms.
    assert!(slow >= Duration::from_millis(300), "{slow:?}");
    assert!(slow < Duration::from_secs(3), "{slow:?}");

    // A latency, not a bandwidth cap: 20 chunks in flight take ~1 round
    // trip (serialized they would take 20 x 300 ms).
    let t = Instant::now();
    for i in 0..20u8 {
        conn.write_all(&[i]).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(read_n(&mut conn, 20).await?, (0..20).collect::<Vec<u8>>());
    let burst = t.elapsed();
    assert!(burst < Duration::from_secs(2), "{burst:?}");

    proxy.set_delay(Duration::ZERO);
    let t = Instant::now();
    conn.write_all(b"c").await?;
    read_n(&mut conn, 1).await?;
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn blackhole_stalls_then_heals_without_loss_or_reordering() -> anyhow::Result<()> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    conn.write_all(b"a").await?;
    assert_eq!(read_n(&mut conn, 1).await?, b"a");

    proxy.set_blackhole(true);
    assert!(proxy.is_blackholed());
    conn.write_all(b"b").await?;
    conn.write_all(b"c").await?;
    // A new connection is accepted but not connected upstream.
    let mut late = TcpStream::connect(proxy.addr()).await?;
    late.write_all(b"late").await?;
    let mut buf = [0u8; 8];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf))
            .await
            .is_err(),
        "data crossed the blackhole"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), late.read(&mut buf))
            .await
            .is_err()
    );
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(proxy.connection_count(), 2);

    proxy.set_blackhole(false);
    assert_eq!(read_n(&mut conn, 2).await?, b"bc");
    assert_eq!(read_n(&mut late, 4).await?, b"late");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);

    // A stream of numbered words while the blackhole flaps: nothing lost,
    // nothing reordered.
    const WORDS: u32 = 200_000;
    let (mut r, mut w) = conn.into_split();
    let writer = tokio::spawn(async move {
        for chunk in (0..WORDS).collect::<Vec<u32>>().chunks(1000) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|i| i.to_be_bytes()).collect();
            w.write_all(&bytes).await?;
            tokio::task::yield_now().await;
        }
        w.shutdown().await?;
        anyhow::Ok(())
    });
    let flapper = {
        let proxy = &proxy;
        async move {
            for i in 0..10 {
                proxy.set_blackhole(i % 2 == 0);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            proxy.set_blackhole(false);
        }
    };
    let mut back = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), r.read_to_end(&mut back));
    let (read, ()) = tokio::join!(read, flapper);
    read??;
    writer.await??;
    assert_eq!(back.len(), WORDS as usize * 4);
    for (i, word) in back.chunks(4).enumerate() {
        let got = u32::from_be_bytes(word.try_into()?);
        assert_eq!(got, i as u32, "word {i}");
    }
    Ok(())
}

#[tokio::test]
async fn cut_all_resets_and_reconnect_works() -> anyhow::Result<()> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    let mut a = TcpStream::connect(proxy.addr()).await?;
    let mut b = TcpStream::connect(proxy.addr()).await?;
    for conn in [&mut a, &mut b] {
        conn.write_all(b"1").await?;
        read_n(conn, 1).await?;
    }
    assert_eq!(proxy.connection_count(), 2);

    // Also cuts a connection held by a blackhole.
    proxy.set_blackhole(true);
    let mut held = TcpStream::connect(proxy.addr()).await?;
    wait_until("3 connections", || proxy.connection_count() == 3).await?;
    proxy.cut_all();
    proxy.set_blackhole(false);
    for conn in [&mut a, &mut b, &mut held] {
        assert_closed(conn).await?;
    }
    wait_until("no connections", || proxy.connection_count() == 0).await?;

    let mut c = TcpStream::connect(proxy.addr()).await?;
    c.write_all(b"3").await?;
    assert_eq!(read_n(&mut c, 1).await?, b"3");
    assert_eq!(proxy.total_connections(), 4);
    Ok(())
}

#[tokio::test]
async fn refuse_closes_new_connections_only() -> anyhow::Result<()> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    let mut old = TcpStream::connect(proxy.addr()).await?;
    old.write_all(b"o").await?;
    read_n(&mut old, 1).await?;

    proxy.set_refuse(true);
    let mut refused = TcpStream::connect(proxy.addr()).await?;
    assert_closed(&mut refused).await?;
    assert_eq!(proxy.refused_connections(), 1);
    assert_eq!(proxy.total_connections(), 1);
    // The existing connection is untouched.
    old.write_all(b"p").await?;
    assert_eq!(read_n(&mut old, 1).await?, b"p");

    proxy.set_refuse(false);
    let mut new = TcpStream::connect(proxy.addr()).await?;
    new.write_all(b"n").await?;
    assert_eq!(read_n(&mut new, 1).await?, b"n");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);
    Ok(())
}

#[tokio::test]
async fn postgres_through_the_proxy() -> anyhow::Result<()> {
    let pg = PostgresServer::start().await?;
    let upstream: SocketAddr = format!("{}:{}", pg.host(), pg.port()).parse()?;
    let proxy = FaultProxy::start(upstream).await?;
    let url = pg
        .url("postgres")
        .replace(&format!(":{}/", pg.port()), &format!(":{}/", proxy.port()));
    assert!(url.contains(&proxy.port().to_string()), "{url}");

    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        let conn = tokio::spawn(conn);
        anyhow::Ok((client, conn))
    };
    let (client, conn) = connect().await?;
    let row = client.query_one("SELECT 41 + 1", &[]).await?;
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(proxy.connection_count(), 1);

    proxy.set_delay(Duration::from_millis(50));
    let t = Instant::now();
    client.simple_query("SELECT 1").await?;
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    proxy.set_delay(Duration::ZERO);

    proxy.cut_all();
    let err = client
        .simple_query("SELECT 1")
        .await
        .expect_err("query through a cut connection");
    assert!(client.is_closed(), "{err}");
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await??;
    assert!(ended.is_err(), "the connection task saw no error");

    let (client, _conn) = connect().await?;
    client.simple_query("SELECT 1").await?;
    assert_eq!(proxy.total_connections(), 2);
    Ok(())
}

#[tokio::test]
async fn nats_through_the_proxy_reconnects_after_cut() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", nats.port()).parse()?).await?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(format!("nats://127.0.0.1:{}", proxy.port()))
        .await?;
    let info = |client: async_nats::Client| async move {
        let reply = tokio::time::timeout(
            Duration::from_secs(3),
            client.request("$JS.API.INFO", "".into()),
        )
        .await??;
        anyhow::Ok(String::from_utf8(reply.payload.to_vec())?)
    };
    assert!(
        info(client.clone())
            .await?
            .contains("account_info_response")
    );

    proxy.cut_all();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match info(client.clone()).await {
            Ok(reply) if reply.contains("account_info_response") => break,
            other => {
                anyhow::ensure!(Instant::now() < deadline, "no reconnect: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(
        proxy.total_connections() >= 2,
        "{}",
        proxy.total_connections()
    );
    assert_eq!(proxy.connection_count(), 1);
    Ok(())
}
