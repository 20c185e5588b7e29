//! Fleet rows: many pipelines in one relay process, against as many single-relay processes.
//!
//! On a PostgreSQL server of their own (max_connections, max_wal_senders and
//! max_replication_slots raised to fit), N databases made from one template that holds the
//! outbox migrations and a publication, each with its slot, and one stream per database:
//! 1. idle cost: a fleet of one pipeline (the base), a fleet of N, then N single-relay processes
//!    (the same binary, one configuration each), all on the same databases and slots: the time
//!    from the spawn until every pipeline is ready, RSS (and PSS) idle, CPU per second idle, and
//!    the PostgreSQL sessions each pipeline holds;
//! 2. load cost: [`FLEET_RATE`] 1-row transactions per second into every database (one writer
//!    each) through the fleet, then through the N processes, then one single relay alone at that
//!    rate: CPU per event, and what the PostgreSQL server spends meanwhile (each walsender
//!    decodes the whole server's WAL);
//! 3. isolation (`isolation.rs`): commit-to-ack of N-1 pipelines alone, while the Nth (on a
//!    server of its own) catches up a backlog, and while that server is stopped.

mod isolation;
mod run;
mod stamps;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use relay_testkit::{PgOptions, PostgresServer};

use crate::Args;

use self::run::{Group, Writers};
use super::say;
use super::setup::{Env, create_stream, stream_messages};

pub use self::isolation::{BACKLOG_PER_TX, ISOLATION_TARGET, Isolation, PhaseKind};

/// Events per second into each database under load.
pub const FLEET_RATE: u64 = 10;
/// MiB of RSS per idle pipeline above the fleet of one, at most.
pub const MIB_PER_PIPELINE_TARGET: f64 = 2.0;
/// The fleet's RSS against the N single relays' summed RSS, at most.
pub const FLEET_OF_SINGLES_TARGET: f64 = 0.1;

/// Every pipeline's publication (one per database, so one name does for all).
const PUBLICATION: &str = "fleet";
const TEMPLATE: &str = "fleet_template";
/// After every pipeline is ready, before the idle window: start-up's last work done.
const SETTLE: Duration = Duration::from_secs(3);
/// Waiting for every pipeline to be ready, at most.
const READY_WITHIN: Duration = Duration::from_secs(180);

/// Everything the fleet rows measured; a part that failed is in `failed`.
#[derive(Debug, Default)]
pub struct FleetResults {
    pub pipelines: usize,
    /// The fleet server's raised settings, as written.
    pub pg_settings: String,
    /// The fleet of one pipeline: the base its pipelines are counted above.
    pub base: Option<Side>,
    pub fleet: Option<Side>,
    /// N single-relay processes.
    pub singles: Option<Side>,
    /// One single relay with nothing else running, idle then at [`FLEET_RATE`].
    pub alone: Option<Side>,
    pub isolation: Option<Isolation>,
    /// `part: error` of each part that failed.
    pub failed: Vec<String>,
}

/// One way of running the pipelines: one process or many.
#[derive(Debug, Clone)]
pub struct Side {
    pub processes: usize,
    pub pipelines: usize,
    /// From the first spawn until every pipeline was ready.
    pub ready_secs: f64,
    /// The PostgreSQL sessions held while idle.
    pub sessions: Sessions,
    pub idle: Window,
    pub load: Option<Window>,
}

/// PostgreSQL sessions of the relays on the fleet's server.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    /// Client backends (not walsenders) of anything but the bench.
    pub backends: u64,
    pub walsenders: u64,
}

/// One measured span of a [`Side`].
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub secs: f64,
    /// CPU seconds of the relay processes over the span, summed.
    pub relay_cpu_secs: f64,
    /// The relay processes' RSS at the end, summed (shared pages counted in each).
    pub rss: u64,
    /// Their PSS at the end, summed (shared pages counted once); None where unreadable.
    pub pss: Option<u64>,
    pub pg: PgCpu,
    pub nats_cpu_secs: Option<f64>,
    /// Busy CPU seconds of the whole machine.
    pub machine_secs: Option<f64>,
    /// Seconds the writers wrote, at the span's start (0 idle).
    pub write_secs: f64,
    /// Rows committed during the span (0 idle), and how many of them the streams held at
    /// its end.
    pub events: u64,
    pub stored: u64,
}

impl Window {
    /// The relays' CPU milliseconds per second of the span.
    pub fn cpu_ms_per_s(&self) -> f64 {
        self.relay_cpu_secs * 1e3 / self.secs
    }
}

/// CPU seconds of a PostgreSQL server over a span.
#[derive(Debug, Clone, Default)]
pub struct PgCpu {
    pub walsenders: f64,
    /// The relays' other sessions (checkpoint, sampler, …).
    pub relay_sessions: f64,
    /// Every process of the server: the above, the writers' backends, the background ones.
    pub all: f64,
}

/// One pipeline: its database, slot and stream.
#[derive(Debug, Clone)]
pub(super) struct Pipe {
    pub(super) name: String,
    url: String,
    slot: String,
    pub(super) stream: String,
}

impl Pipe {
    /// Pipeline `name` on database `name` of `pg`.
    fn on(pg: &PostgresServer, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            url: pg.url(name),
            slot: format!("fleet_{name}"),
            stream: name.to_uppercase(),
        }
    }

    /// Its `[[pipeline]]` entry of a fleet configuration.
    fn entry(&self) -> String {
        format!(
            "\n[[pipeline]]\nname = \"{name}\"\n[pipeline.postgres]\n{pg}[pipeline.nats]\n{nats}[[pipeline.outbox]]\n{outbox}",
            name = self.name,
            pg = self.postgres_keys(),
            nats = self.nats_keys(),
            outbox = self.outbox_keys(),
        )
    }

    /// A single relay's configuration of this pipeline alone.
    fn single(&self, nats_url: &str, listen: &str) -> String {
        format!(
            "[postgres]\n{pg}\n[nats]\nurl = \"{nats_url}\"\ncreate_stream = true\n{nats}\n[[outbox]]\n{outbox}\n[http]\nlisten = \"{listen}\"\n",
            pg = self.postgres_keys(),
            nats = self.nats_keys(),
            outbox = self.outbox_keys(),
        )
    }

    fn postgres_keys(&self) -> String {
        format!(
            "url = \"{}\"\nslot = \"{}\"\npublication = \"{PUBLICATION}\"\n",
            self.url, self.slot
        )
    }

    fn nats_keys(&self) -> String {
        format!(
            "stream = \"{}\"\nstream_subjects = [\"{}.>\"]\n",
            self.stream, self.name
        )
    }

    fn outbox_keys(&self) -> String {
        format!(
            "table = \"public.outbox\"\nsubject = \"{}.{{aggregatetype}}.{{type}}\"\n",
            self.name
        )
    }
}

/// A fleet configuration of `pipes`, every other value the relay's default.
fn fleet_toml(nats_url: &str, listen: &str, pipes: &[Pipe]) -> String {
    let mut text = format!(
        "[nats]\nurl = \"{nats_url}\"\ncreate_stream = true\n\n[http]\nlisten = \"{listen}\"\n"
    );
    for p in pipes {
        text.push_str(&p.entry());
    }
    text
}

/// The fleet's PostgreSQL server, its databases and streams.
pub(super) struct FleetEnv<'a> {
    pub(super) env: &'a Env,
    pub(super) pg: PostgresServer,
    pub(super) pipes: Vec<Pipe>,
    pub(super) dir: PathBuf,
    settings: String,
}

/// PostgreSQL settings of a bench server, `extra` after the common ones.
fn pg_options(extra: &[(&str, String)]) -> PgOptions {
    let mut settings: Vec<(String, String)> = [
        ("shared_buffers", "256MB"),
        ("max_wal_size", "8GB"),
        ("checkpoint_timeout", "30min"),
        ("logical_decoding_work_mem", "64MB"),
        ("autovacuum", "off"),
        // PostgreSQL's default: the kit's 10 s would have the relays' default 10 s status
        // interval answer keepalives, not the idle cost of a real server.
        ("wal_sender_timeout", "60s"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    settings.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let bin_dir = std::env::var_os("RELAY_TEST_PG_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from("/usr/lib/postgresql/15/bin");
            p.is_dir().then_some(p)
        });
    PgOptions { settings, bin_dir }
}

/// The migrations (migrations/*.sql, in order) and the publication, in database `db` of `pg`.
async fn outbox_database(pg: &PostgresServer, db: &str) -> Result<()> {
    pg.create_database(db).await?;
    let client = pg.connect(db).await?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    for file in files {
        client
            .batch_execute(&std::fs::read_to_string(&file)?)
            .await
            .with_context(|| format!("{} in {db}", file.display()))?;
    }
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert')"
        ))
        .await?;
    Ok(())
}

/// Creates logical slot `slot` (pgoutput) in database `db`.
async fn create_slot(pg: &PostgresServer, db: &str, slot: &str) -> Result<()> {
    pg.connect(db)
        .await?
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .with_context(|| format!("creating slot {slot} in {db}"))?;
    Ok(())
}

impl<'a> FleetEnv<'a> {
    /// Starts the server, makes `n` databases from the template, their slots and streams.
    async fn start(env: &'a Env, n: usize) -> Result<Self> {
        // About 5 sessions and a walsender per pipeline (measured and reported), a writer per
        // database, and room for the N single relays' start-up sessions.
        let settings = [
            ("max_connections", (n * 8 + 50).to_string()),
            ("max_wal_senders", (n + 10).to_string()),
            ("max_replication_slots", (n + 10).to_string()),
        ];
        let pg = PostgresServer::start_with(pg_options(&settings)).await?;
        outbox_database(&pg, TEMPLATE).await?;
        let pipes: Vec<Pipe> = (1..=n)
            .map(|i| Pipe::on(&pg, &format!("f{i:03}")))
            .collect();
        let admin = pg.connect("postgres").await?;
        for p in &pipes {
            let sql = format!("CREATE DATABASE {} TEMPLATE {TEMPLATE}", p.name);
            // The template's own session may still be closing: retry a moment.
            let mut tries = 0;
            while let Err(e) = admin.batch_execute(&sql).await {
                tries += 1;
                if tries > 50 {
                    return Err(e).context(sql);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The slots after every database: a copied database is WAL (PostgreSQL 15's default
        // strategy), which a slot made before it would decode at its relay's first start.
        for p in &pipes {
            create_slot(&pg, &p.name, &p.slot).await?;
            create_stream(env, &p.stream, &format!("{}.>", p.name)).await?;
        }
        let dir = env.log_dir.join("fleet");
        std::fs::create_dir_all(&dir)?;
        let settings = settings
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Self {
            env,
            pg,
            pipes,
            dir,
            settings,
        })
    }

    /// Messages the streams of `pipes` hold, in all.
    async fn stored(&self, pipes: &[Pipe]) -> Result<u64> {
        let mut total = 0;
        for p in pipes {
            total += stream_messages(self.env, &p.stream).await?;
        }
        Ok(total)
    }

    /// Waits (`within` at most) until the streams of `pipes` hold `messages`; returns what
    /// they hold then.
    async fn wait_stored(&self, pipes: &[Pipe], messages: u64, within: Duration) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let now = self.stored(pipes).await?;
            if now >= messages || tokio::time::Instant::now() > deadline {
                return Ok(now);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The relays' sessions on the server now: client backends other than the bench's, and
    /// walsenders.
    async fn sessions(&self) -> Result<Sessions> {
        let row = self
            .pg
            .connect("postgres")
            .await?
            .query_one(
                "SELECT count(*) FILTER (WHERE backend_type = 'client backend' \
                   AND application_name IS DISTINCT FROM 'relay-testkit'), \
                 count(*) FILTER (WHERE backend_type = 'walsender') FROM pg_stat_activity",
                &[],
            )
            .await?;
        Ok(Sessions {
            backends: row.get::<_, i64>(0) as u64,
            walsenders: row.get::<_, i64>(1) as u64,
        })
    }
}

/// How a side runs its pipelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fleet,
    Singles,
}

/// Runs `pipes` as `kind`: ready, idle for `secs`, then (with `load`) [`FLEET_RATE`] events/s
/// into each database for `secs`.
async fn side(
    fe: &FleetEnv<'_>,
    kind: Kind,
    pipes: &[Pipe],
    secs: u64,
    load: bool,
) -> Result<Side> {
    let label = match kind {
        Kind::Fleet => format!("fleet of {}", pipes.len()),
        Kind::Singles => format!("{} single relay(s)", pipes.len()),
    };
    say(format!("   {label}: starting"));
    let mut group = match kind {
        Kind::Fleet => {
            let config = fe.dir.join(format!("fleet-{}.toml", pipes.len()));
            Group::fleet(fe, &config, pipes)?
        }
        Kind::Singles => Group::singles(fe, pipes)?,
    };
    let ready_secs = group.wait_ready(READY_WITHIN).await?;
    tokio::time::sleep(SETTLE).await;
    let sessions = fe.sessions().await?;
    let mark = group.mark(fe);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    group.check_alive()?;
    let idle = group.window(fe, mark, 0, 0).await?;
    say(format!(
        "   {label}: all ready after {ready_secs:.2} s; idle {:.1} MiB RSS, {:.2} CPU ms/s; {} sessions + {} walsenders",
        idle.rss as f64 / 1048576.0,
        idle.cpu_ms_per_s(),
        sessions.backends,
        sessions.walsenders
    ));
    let load = if load {
        let writers = Writers::connect(&fe.pg, pipes).await?;
        let before = fe.stored(pipes).await?;
        let mark = group.mark(fe);
        let writing = std::time::Instant::now();
        let events = writers
            .run_for(FLEET_RATE, Duration::from_secs(secs))
            .await?;
        let write_secs = writing.elapsed().as_secs_f64();
        let stored = fe
            .wait_stored(pipes, before + events, Duration::from_secs(30))
            .await?
            - before;
        group.check_alive()?;
        let w = Window {
            write_secs,
            ..group.window(fe, mark, events, stored).await?
        };
        say(format!(
            "   {label} at {FLEET_RATE}/s per database: {events} events ({stored} stored), {:.1} CPU µs/event, walsenders {:.1} µs/event, RSS {:.1} MiB",
            w.relay_cpu_secs * 1e6 / events.max(1) as f64,
            w.pg.walsenders * 1e6 / events.max(1) as f64,
            w.rss as f64 / 1048576.0
        ));
        Some(w)
    } else {
        None
    };
    let processes = group.len();
    group.stop().await?;
    Ok(Side {
        processes,
        pipelines: pipes.len(),
        ready_secs,
        sessions,
        idle,
        load,
    })
}

/// Every fleet row; None when `--fleet-pipelines 0`.
pub(super) async fn fleet(env: &Env, args: &Args) -> Result<Option<FleetResults>> {
    let n = args.fleet_pipelines();
    if n == 0 {
        return Ok(None);
    }
    let secs = args.fleet_secs();
    say(format!(
        "== fleet: {n} pipelines in one process against {n} processes ({secs} s windows)"
    ));
    let fe = FleetEnv::start(env, n).await?;
    let mut res = FleetResults {
        pipelines: n,
        pg_settings: fe.settings.clone(),
        ..Default::default()
    };
    let all = fe.pipes.clone();
    let parts: [(&str, Kind, &[Pipe], bool); 4] = [
        ("fleet of 1", Kind::Fleet, &all[..1], false),
        ("fleet", Kind::Fleet, &all, true),
        ("single relays", Kind::Singles, &all, true),
        ("one single relay alone", Kind::Singles, &all[..1], true),
    ];
    for (i, (part, kind, pipes, load)) in parts.into_iter().enumerate() {
        let slot = match i {
            0 => &mut res.base,
            1 => &mut res.fleet,
            2 => &mut res.singles,
            _ => &mut res.alone,
        };
        match side(&fe, kind, pipes, secs, load).await {
            Ok(s) => *slot = Some(s),
            Err(e) => {
                say(format!("   {part} failed: {e:#}"));
                res.failed.push(format!("{part}: {e:#}"));
            }
        }
    }
    if args.fleet_backlog() > 0 && n >= 2 {
        match isolation::isolation(&fe, args.fleet_backlog(), secs).await {
            Ok(iso) => res.isolation = Some(iso),
            Err(e) => {
                say(format!("   isolation failed: {e:#}"));
                res.failed.push(format!("isolation: {e:#}"));
            }
        }
    }
    Ok(Some(res))
}
