//! Starts the real servers. These run in CI.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use relay_testkit::{NatsOptions, NatsServer, PgOptions, PostgresServer, free_port, nats_request};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpStream;

#[tokio::test]
async fn postgres_logical_replication_ready() -> anyhow::Result<()> {
    let pg = PostgresServer::start_with(PgOptions {
        settings: vec![("wal_sender_timeout".into(), "3s".into())],
        ..PgOptions::default()
    })
    .await?;
    assert_eq!(pg.host(), "127.0.0.1");
    assert_eq!(
        pg.url("app"),
        format!("postgres://postgres:postgres@127.0.0.1:{}/app", pg.port())
    );
    assert!(pg.version_num() >= 150_000, "{}", pg.version_num());
    eprintln!(
        "PostgreSQL {} from {}",
        pg.version_num(),
        pg.bin_dir().display()
    );
    assert!(pg.port() != 5432);

    pg.create_database("app").await?;
    // The URL works as-is (password auth over TCP).
    let (client, conn) = tokio_postgres::connect(&pg.url("app"), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let show = |name: &'static str| {
        let client = &client;
        async move {
            let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
            anyhow::Ok(row.get::<_, String>(0))
        }
    };
    assert_eq!(show("wal_level").await?, "logical");
    assert_eq!(show("wal_sender_timeout").await?, "3s");
    assert_eq!(show("fsync").await?, "off");
    let version: String = show("server_version_num").await?;
    assert_eq!(version.parse::<u32>()?, pg.version_num());

    client
        .batch_execute(
            "CREATE TABLE outbox (id bigserial PRIMARY KEY, payload text);
             CREATE PUBLICATION relay FOR TABLE outbox;",
        )
        .await?;
    let row = client
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot('relay_slot', 'pgoutput')",
            &[],
        )
        .await?;
    let lsn: String = row.get(0);
    assert!(lsn.contains('/'), "{lsn}");

    // A wrong password is refused: host connections need scram.
    let bad = pg
        .url("app")
        .replace("postgres:postgres@", "postgres:wrong@");
    assert!(
        tokio_postgres::connect(&bad, tokio_postgres::NoTls)
            .await
            .is_err()
    );
    assert!(pg.log().len() < 1_000_000);
    Ok(())
}

#[tokio::test]
async fn postgres_crash_and_kill9_keep_committed_data() -> anyhow::Result<()> {
    let mut pg = PostgresServer::start().await?;
    let port = pg.port();
    {
        let client = pg.connect("postgres").await?;
        client
            .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1);")
            .await?;
    }
    pg.crash().await?;
    assert!(!pg.is_running());
    pg.start_again().await?;
    assert_eq!(pg.port(), port);
    let client = pg.connect("postgres").await?;
    client.batch_execute("INSERT INTO t VALUES (2)").await?;

    // SIGKILL the postmaster while a client is connected.
    let pid = pg.postmaster_pid().context("postmaster pid")?;
    pg.kill9()?;
    assert!(!pg.is_running());
    assert!(client.simple_query("SELECT 1").await.is_err() || !pg.is_running());
    drop(client);
    assert!(pg.start_again().await.is_ok(), "log:\n{}", pg.log());
    assert_ne!(pg.postmaster_pid(), Some(pid));
    assert_eq!(pg.port(), port);
    let client = pg.connect("postgres").await?;
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await?
        .get(0);
    assert_eq!(n, 2);

    // Clean stop and start again.
    pg.stop().await?;
    pg.stop().await?; // idempotent
    assert!(pg.start_again().await.is_ok());
    assert!(pg.start_again().await.is_err(), "already running");
    Ok(())
}

#[tokio::test]
async fn postgres_pause_and_resume() -> anyhow::Result<()> {
    let pg = PostgresServer::start().await?;
    let client = pg.connect("postgres").await?;

    // pause(): the existing backend still answers, new connections hang.
    pg.pause()?;
    client.simple_query("SELECT 1").await?;
    let attempt = tokio::time::timeout(Duration::from_millis(500), pg.connect("postgres")).await;
    assert!(
        attempt.is_err(),
        "a new connection got through a paused postmaster"
    );
    pg.resume()?;
    pg.connect("postgres")
        .await?
        .simple_query("SELECT 1")
        .await?;

    // pause_all(): the existing backend hangs too.
    pg.pause_all()?;
    let query = tokio::time::timeout(Duration::from_millis(500), client.simple_query("SELECT 1"));
    assert!(query.await.is_err(), "a query got through a paused cluster");
    pg.resume()?;
    client.simple_query("SELECT 2").await?;
    Ok(())
}

#[tokio::test]
async fn missing_binaries_say_how_to_install() {
    let err = PostgresServer::start_with(PgOptions {
        bin_dir: Some(PathBuf::from("/nonexistent/pg/bin")),
        ..PgOptions::default()
    })
    .await
    .expect_err("no such PostgreSQL");
    assert!(format!("{err:#}").contains("ensure-deps.sh"), "{err:#}");

    let err = NatsServer::start_with(NatsOptions {
        binary: Some(PathBuf::from("/nonexistent/nats-server")),
        ..NatsOptions::default()
    })
    .await
    .expect_err("no such nats-server");
    assert!(format!("{err:#}").contains("ensure-deps.sh"), "{err:#}");
}

#[test]
fn free_ports_differ() {
    let a = free_port();
    let b = free_port();
    assert_ne!(a, b);
    assert!(a > 0 && b > 0);
}

#[tokio::test]
async fn nats_jetstream_kill9_and_restart_on_same_port() -> anyhow::Result<()> {
    let mut nats = NatsServer::start().await?;
    let port = nats.port();
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{port}"));
    assert!(nats.version().starts_with("2."), "{}", nats.version());
    eprintln!("nats-server {}", nats.version());
    assert!(nats.store_dir().is_dir());

    let info = nats_request(port, "$JS.API.INFO", "").await?;
    assert!(info.contains("account_info_response"), "{info}");
    assert!(!info.contains("\"error\""), "{info}");

    let created = nats_request(
        port,
        "$JS.API.STREAM.CREATE.OUTBOX",
        r#"{"name":"OUTBOX","subjects":["outbox.>"],"storage":"file"}"#,
    )
    .await?;
    assert!(!created.contains("\"error\""), "{created}");

    nats.kill9()?;
    assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    nats.start_again().await?;
    assert_eq!(nats.port(), port);
    let stream_info = nats_request(port, "$JS.API.STREAM.INFO.OUTBOX", "").await?;
    assert!(stream_info.contains("\"OUTBOX\""), "{stream_info}");
    assert!(!stream_info.contains("\"error\""), "{stream_info}");

    nats.stop().await?;
    nats.stop().await?; // idempotent
    nats.start_again().await?;
    assert!(nats.start_again().await.is_err(), "already running");
    assert!(nats.log().contains("Server is ready"));
    Ok(())
}

#[tokio::test]
async fn nats_pause_and_resume() -> anyhow::Result<()> {
    let nats = NatsServer::start_with(NatsOptions {
        config: Some("max_payload: 65536".into()),
        ..NatsOptions::default()
    })
    .await?;
    let port = nats.port();
    nats.pause()?;
    let paused = tokio::time::timeout(
        Duration::from_millis(400),
        nats_request(port, "$JS.API.INFO", ""),
    )
    .await;
    assert!(paused.is_err(), "a paused server answered: {paused:?}");
    nats.resume()?;
    let info = nats_request(port, "$JS.API.INFO", "").await?;
    assert!(info.contains("account_info_response"), "{info}");

    // The extra config is in force.
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).await?;
    assert!(line.contains("\"max_payload\":65536"), "{line}");
    Ok(())
}

#[tokio::test]
async fn nats_without_jetstream() -> anyhow::Result<()> {
    let nats = NatsServer::start_with(NatsOptions {
        jetstream: false,
        ..NatsOptions::default()
    })
    .await?;
    let reply = nats_request(nats.port(), "$JS.API.INFO", "").await;
    assert!(reply.is_err(), "JetStream answered: {reply:?}");
    Ok(())
}

#[tokio::test]
async fn drop_after_kill9_removes_everything() -> anyhow::Result<()> {
    let mut pg = PostgresServer::start().await?;
    let data_dir = pg.data_dir().to_path_buf();
    pg.pause_all()?;
    pg.kill9()?;
    drop(pg);
    assert!(!data_dir.exists());

    let nats = NatsServer::start().await?;
    let store = nats.store_dir().to_path_buf();
    let port = nats.port();
    nats.pause()?;
    drop(nats);
    assert!(!store.exists());
    assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    Ok(())
}
