//! Two relays built by library calls and run in one process, each on its own PostgreSQL, slot
//! and stream: stopping one's PostgreSQL leaves the other streaming, and each relay's telemetry
//! counts only its own events.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use relay_runtime::config::RelayConfig;
use relay_runtime::{Relay, RelayOptions};
use relay_telemetry::BuildInfo;
use relay_testkit::{NatsServer, PostgresServer};
use tokio_util::sync::CancellationToken;

const DB: &str = "app";
const WAIT: Duration = Duration::from_secs(60);

/// One relay's servers and names.
struct Side {
    pg: PostgresServer,
    /// The aggregate type of its rows: subjects `outbox.<name>.*`.
    name: &'static str,
    slot: String,
    stream: String,
}

impl Side {
    async fn start(name: &'static str) -> Result<Self> {
        let pg = PostgresServer::start().await?;
        pg.create_database(DB).await?;
        let client = pg.connect(DB).await?;
        for sql in migrations()? {
            client.batch_execute(&sql).await?;
        }
        Ok(Self {
            pg,
            name,
            slot: format!("slot_{name}"),
            stream: format!("OUTBOX_{}", name.to_uppercase()),
        })
    }

    /// Builds this side's relay from a configuration file, as the binary does.
    async fn relay(&self, nats: &NatsServer, dir: &Path) -> Result<Relay> {
        let path = dir.join(format!("{}.toml", self.name));
        std::fs::write(
            &path,
            format!(
                r#"
[postgres]
url = "{pg}"
slot = "{slot}"
publication = "pub_{name}"
status_interval = "1s"

[nats]
url = "{nats}"
stream = "{stream}"
stream_subjects = ["outbox.{name}.>"]
create_stream = true
ack_timeout = "3s"

[relay]
checkpoint_interval = "100ms"
idle_checkpoint_interval = "1s"
reconnect_max = "1s"

[[outbox]]
table = "public.outbox"
subject = "outbox.{name}.{{type}}"
"#,
                pg = self.pg.url(DB),
                slot = self.slot,
                name = self.name,
                nats = nats.url(),
                stream = self.stream,
            ),
        )?;
        let config = RelayConfig::load(Some(&path))?;
        let options = RelayOptions {
            accept_slot_position: false,
            build: BuildInfo {
                version: "test",
                commit: "test",
            },
            sample: true,
        };
        Relay::build(config, options)
            .await
            .map_err(|f| anyhow::anyhow!("building relay {}: {f}", self.name))
    }

    /// Inserts `n` rows in one transaction; returns the WAL position after its commit.
    async fn insert(&self, n: usize) -> Result<u64> {
        let mut client = self.pg.connect(DB).await?;
        let tx = client.transaction().await?;
        for i in 0..n {
            tx.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES (gen_random_uuid(), $1, $2, 'created', '{}'::jsonb)",
                &[&self.name, &i.to_string()],
            )
            .await?;
        }
        tx.commit().await?;
        let row = client
            .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// The stored checkpoint and the slot's confirmed_flush_lsn.
    async fn positions(&self) -> Result<(u64, u64)> {
        let client = self.pg.connect(DB).await?;
        let checkpoint = client
            .query_one(
                "SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = $1",
                &[&self.slot],
            )
            .await?
            .get::<_, i64>(0) as u64;
        let slot = client
            .query_one(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await?
            .get::<_, i64>(0) as u64;
        Ok((checkpoint, slot))
    }

    /// Waits until the checkpoint and the slot are at or past `lsn`.
    async fn wait_confirmed(&self, lsn: u64) -> Result<(u64, u64)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let at = self.positions().await?;
            if at.0 >= lsn && at.1 >= lsn {
                return Ok(at);
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: checkpoint {:X} and slot {:X} stayed before {lsn:X}",
                    self.name,
                    at.0,
                    at.1
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn migrations() -> Result<Vec<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| p.display().to_string()))
        .collect()
}

/// Messages in `stream`, waiting until there are `n` (and checking no more arrive).
async fn wait_stream(js: &async_nats::jetstream::Context, stream: &str, n: u64) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut s = js.get_stream(stream).await?;
        let count = s.info().await?.state.messages;
        ensure!(count <= n, "{stream} holds {count} messages, more than {n}");
        if count == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{stream} holds {count} messages, not {n}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The events `telemetry`'s relay published: what its `/metrics` serves as
/// `outbox_relay_events_published_total`.
fn published(telemetry: &relay_telemetry::Telemetry) -> u64 {
    telemetry
        .stats
        .events_published
        .load(std::sync::atomic::Ordering::Relaxed)
}

type Running = tokio::task::JoinHandle<Result<(), relay_runtime::Failure>>;

/// Waits until the relay's session streams (or, `false`, no longer streams), while it runs.
async fn wait_streaming(
    telemetry: &relay_telemetry::Telemetry,
    run: &mut Running,
    streaming: bool,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while telemetry
        .streaming
        .load(std::sync::atomic::Ordering::Relaxed)
        != streaming
    {
        if run.is_finished() {
            match run.await? {
                Ok(()) => bail!("the relay returned"),
                Err(failure) => bail!("the relay stopped: {failure}"),
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the relay's streaming state stayed {}",
            !streaming
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_postgres_stops_only_its_own_relay() -> Result<()> {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let nats = NatsServer::start().await?;
    let (alpha, beta) = tokio::try_join!(Side::start("alpha"), Side::start("beta"))?;
    let dir = tempfile::tempdir()?;
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await?);

    let relay_a = alpha.relay(&nats, dir.path()).await?;
    let relay_b = beta.relay(&nats, dir.path()).await?;
    let (ended_a, ended_b) = (relay_a.ended(), relay_b.ended());
    let telemetry_a = relay_a.telemetry().clone();
    let telemetry_b = relay_b.telemetry().clone();
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let mut run_a = tokio::spawn(relay_a.run(stop_a.clone()));
    let mut run_b = tokio::spawn(relay_b.run(stop_b.clone()));

    // Rows committed before a slot exists are not in its stream: wait until both stream.
    wait_streaming(&telemetry_a, &mut run_a, true).await?;
    wait_streaming(&telemetry_b, &mut run_b, true).await?;
    // Both stream their own rows into their own stream.
    let lsn_a = alpha.insert(20).await?;
    let lsn_b = beta.insert(30).await?;
    wait_stream(&js, &alpha.stream, 20).await?;
    wait_stream(&js, &beta.stream, 30).await?;
    let (checkpoint_a, _) = alpha.wait_confirmed(lsn_a).await?;
    beta.wait_confirmed(lsn_b).await?;

    // Alpha's PostgreSQL goes away; beta goes on streaming.
    let mut alpha = alpha;
    alpha.pg.stop().await?;
    wait_streaming(&telemetry_a, &mut run_a, false).await?;
    let lsn_b = beta.insert(25).await?;
    wait_stream(&js, &beta.stream, 55).await?;
    let (checkpoint_b, slot_b) = beta.wait_confirmed(lsn_b).await?;
    ensure!(
        !run_a.is_finished(),
        "alpha's relay ended when its PostgreSQL stopped instead of waiting for it"
    );
    ensure!(
        !ended_a.is_cancelled(),
        "alpha's relay is marked ended while it runs"
    );
    wait_stream(&js, &alpha.stream, 20).await?;

    // Each relay's telemetry counts its own events only.
    ensure!(published(&telemetry_b) == 55, "beta's telemetry");
    ensure!(published(&telemetry_a) == 20, "alpha's telemetry");

    // Alpha comes back and resumes from its checkpoint, without re-sending.
    alpha.pg.start_again().await?;
    let lsn_a = alpha.insert(5).await?;
    wait_stream(&js, &alpha.stream, 25).await?;
    let (checkpoint_a_after, _) = alpha.wait_confirmed(lsn_a).await?;
    ensure!(
        checkpoint_a_after > checkpoint_a,
        "alpha's checkpoint moved on"
    );
    ensure!(published(&telemetry_a) == 25, "alpha's telemetry");

    stop_a.cancel();
    stop_b.cancel();
    run_a
        .await?
        .map_err(|f| anyhow::anyhow!("alpha stopped with {f}"))?;
    run_b
        .await?
        .map_err(|f| anyhow::anyhow!("beta stopped with {f}"))?;
    // Beta's positions stayed where its last events put them.
    let (checkpoint_b_end, slot_b_end) = beta.positions().await?;
    ensure!(checkpoint_b_end >= checkpoint_b && slot_b_end >= slot_b);
    // What serves each relay's telemetry is told that it ended, and only once it has.
    ensure!(
        ended_a.is_cancelled() && ended_b.is_cancelled(),
        "a relay's run returned without it being marked ended"
    );
    Ok(())
}
