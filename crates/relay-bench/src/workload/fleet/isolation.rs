//! Isolation: commit-to-ack of N-1 pipelines of one fleet process at [`FLEET_RATE`] events/s
//! each, first alone, then while the Nth pipeline (on a PostgreSQL server of its own, added to
//! the running fleet by a reload) catches up a backlog, then (the control) while a single relay
//! process of its own catches up the same backlog beside the fleet, then while that server is
//! stopped, and alone again once the Nth pipeline is removed.
//! Each event counts in the phase its `ts` falls in (stamps.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use relay_testkit::PostgresServer;

use crate::measure::family_cpu;

use super::super::say;
use super::super::setup::{create_stream, insert_sql_into, stream_messages};
use super::run::{Group, Writers, family_delta};
use super::stamps::{kept_up, latencies, stamp_readers, unix_micros};
use super::{FLEET_RATE, FleetEnv, Pipe, READY_WITHIN, create_slot, outbox_database, pg_options};

/// The p99 of each phase against alone's, at most.
pub const ISOLATION_TARGET: f64 = 1.5;
/// Rows per transaction of the Nth pipeline's backlog.
pub const BACKLOG_PER_TX: u64 = 100;
/// Writing before the first phase, so that it starts steady.
const WARM: Duration = Duration::from_secs(5);

/// The isolation rows' figures.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// Pipelines measured (N-1).
    pub pipelines: usize,
    pub backlog_rows: u64,
    pub backlog_write_secs: f64,
    /// From the reload that added the Nth pipeline until its stream held the whole backlog
    /// (None: not within the time allowed, the phase ended there).
    pub caught_up_secs: Option<f64>,
    /// The same backlog caught up by a single relay process of its own, from its spawn.
    pub control_caught_up_secs: Option<f64>,
    /// In the order of [`PhaseKind`].
    pub phases: Vec<Phase>,
    /// Events of the N-1 pipelines committed and never read back from their streams (in the
    /// time the bench waited for them).
    pub missing: u64,
    /// Why the phases with the Nth pipeline did not run (the N-1 fell behind alone).
    pub not_run: Option<String>,
}

/// What the Nth pipeline does while the N-1 are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    /// Not there: the baseline.
    Alone,
    /// Added to the fleet by a reload, catching up its backlog in the same process.
    CatchingUp,
    /// The control: the same backlog caught up by a single relay process beside the fleet.
    CatchingUpElsewhere,
    /// In the fleet, its server stopped.
    ServerStopped,
    /// Removed again by a reload: the baseline once more.
    AloneAgain,
}

impl PhaseKind {
    pub fn label(self) -> &'static str {
        match self {
            PhaseKind::Alone => "alone",
            PhaseKind::CatchingUp => "catching up",
            PhaseKind::CatchingUpElsewhere => "catching up in a process of its own",
            PhaseKind::ServerStopped => "server stopped",
            PhaseKind::AloneAgain => "alone again",
        }
    }
}

/// Commit-to-ack of the N-1 pipelines over one phase, and where the machine's CPU went.
#[derive(Debug, Clone)]
pub struct Phase {
    pub kind: PhaseKind,
    pub secs: f64,
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The highest p99 of any one pipeline.
    pub worst_pipeline_p99_ms: f64,
    /// The fleet process.
    pub relay_cpu_secs: f64,
    /// The control's single relay process.
    pub second_relay_cpu_secs: Option<f64>,
    pub nats_cpu_secs: Option<f64>,
    pub machine_secs: Option<f64>,
    /// The N-1 pipelines' server (walsenders, sessions, writers' backends) …
    pub pg_cpu_secs: f64,
    /// … and the Nth pipeline's own.
    pub other_pg_cpu_secs: f64,
}

/// Writes `rows` rows into `big`'s outbox in transactions of [`BACKLOG_PER_TX`]; seconds.
async fn write_backlog(pg: &PostgresServer, big: &Pipe, rows: u64) -> Result<f64> {
    let started = Instant::now();
    let client = pg.connect(&big.name).await?;
    let mut next = 1;
    while next <= rows {
        let mut sql = String::new();
        // 20 transactions per round trip.
        for _ in 0..20 {
            if next > rows {
                break;
            }
            let to = (next + BACKLOG_PER_TX - 1).min(rows);
            sql.push_str("BEGIN;");
            sql.push_str(&insert_sql_into("outbox", "Big", next, to));
            sql.push_str(";COMMIT;");
            next = to + 1;
        }
        client.batch_execute(&sql).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The readings at a phase's start.
struct PhaseMark {
    start_us: i64,
    group: super::run::Mark,
    other: std::collections::HashMap<u32, f64>,
}

impl PhaseMark {
    fn now(fe: &FleetEnv<'_>, group: &Group, other: &PostgresServer) -> Self {
        Self {
            start_us: unix_micros(),
            group: group.mark(fe),
            other: other.postmaster_pid().map(family_cpu).unwrap_or_default(),
        }
    }

    /// The phase from this mark until now (its latencies filled in later).
    async fn end(
        self,
        kind: PhaseKind,
        fe: &FleetEnv<'_>,
        group: &Group,
        other: &PostgresServer,
    ) -> Result<(Phase, i64, i64)> {
        let other_now = other.postmaster_pid().map(family_cpu).unwrap_or_default();
        let other_pg_cpu_secs = family_delta(&self.other, &other_now)
            .iter()
            .fold(0.0, |sum, (_, c)| sum + c);
        let w = group.window(fe, self.group, 0, 0).await?;
        let phase = Phase {
            kind,
            secs: w.secs,
            samples: 0,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            max_ms: f64::NAN,
            worst_pipeline_p99_ms: f64::NAN,
            relay_cpu_secs: w.relay_cpu_secs,
            second_relay_cpu_secs: None,
            nats_cpu_secs: w.nats_cpu_secs,
            machine_secs: w.machine_secs,
            pg_cpu_secs: w.pg.all,
            other_pg_cpu_secs,
        };
        Ok((phase, self.start_us, unix_micros()))
    }
}

/// Waits (`timeout` at most) until `stream` holds `rows` messages, every process of `groups`
/// alive; the seconds since `since`, or None at the timeout.
async fn caught_up(
    fe: &FleetEnv<'_>,
    stream: &str,
    rows: u64,
    since: Instant,
    timeout: Duration,
    groups: &mut [&mut Group],
) -> Result<Option<f64>> {
    while since.elapsed() < timeout {
        if stream_messages(fe.env, stream).await.unwrap_or(0) >= rows {
            return Ok(Some(since.elapsed().as_secs_f64()));
        }
        for g in groups.iter_mut() {
            g.check_alive()?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

/// What the phases with the Nth pipeline need.
struct Nth<'a> {
    fe: &'a FleetEnv<'a>,
    other: PostgresServer,
    big: Pipe,
    control: Pipe,
    config: std::path::PathBuf,
    rows: u64,
    window: Duration,
}

/// (phase, its start and end in µs since the Unix epoch).
type Measured = (Phase, i64, i64);

impl Nth<'_> {
    /// The phases after the first: catching up in the fleet, in a process of its own, the
    /// server stopped, alone again. Returns the two catch-ups' seconds.
    async fn phases(
        &mut self,
        group: &mut Group,
        quiet: &[Pipe],
        phases: &mut Vec<Measured>,
    ) -> Result<(Option<f64>, Option<f64>)> {
        let (fe, rows) = (self.fe, self.rows);
        let timeout = Duration::from_secs(120 + rows / 2_000);
        let mark = PhaseMark::now(fe, group, &self.other);
        let reloaded = Instant::now();
        let mut with_big = quiet.to_vec();
        with_big.push(self.big.clone());
        group.reload(fe, &self.config, &with_big)?;
        let in_fleet =
            caught_up(fe, &self.big.stream, rows, reloaded, timeout, &mut [group]).await?;
        phases.push(
            mark.end(PhaseKind::CatchingUp, fe, group, &self.other)
                .await?,
        );

        // The control: the same backlog caught up by a relay process of its own beside the
        // fleet.
        let mark = PhaseMark::now(fe, group, &self.other);
        let spawned = Instant::now();
        let mut single = Group::singles(fe, std::slice::from_ref(&self.control))?;
        let single_mark = single.mark(fe);
        let alone = caught_up(
            fe,
            &self.control.stream,
            rows,
            spawned,
            timeout,
            &mut [group, &mut single],
        )
        .await?;
        let single_cpu = single.window(fe, single_mark, 0, 0).await?.relay_cpu_secs;
        let (mut phase, from, to) = mark
            .end(PhaseKind::CatchingUpElsewhere, fe, group, &self.other)
            .await?;
        phase.second_relay_cpu_secs = Some(single_cpu);
        phases.push((phase, from, to));
        single.stop().await?;
        say(format!(
            "   isolation: backlog caught up in {} by the fleet, {} by a relay of its own",
            secs_or_timeout(in_fleet, timeout),
            secs_or_timeout(alone, timeout)
        ));

        self.other.stop().await?;
        let mark = PhaseMark::now(fe, group, &self.other);
        tokio::time::sleep(self.window).await;
        group.check_alive()?;
        phases.push(
            mark.end(PhaseKind::ServerStopped, fe, group, &self.other)
                .await?,
        );

        // The Nth pipeline removed again: the baseline once more, for the noise between phases.
        group.reload(fe, &self.config, quiet)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mark = PhaseMark::now(fe, group, &self.other);
        tokio::time::sleep(self.window).await;
        group.check_alive()?;
        phases.push(
            mark.end(PhaseKind::AloneAgain, fe, group, &self.other)
                .await?,
        );
        Ok((in_fleet, alone))
    }
}

/// Runs the phases, `secs` each (a catch-up as long as it lasts).
// Long: one measured run: set-up, the phases and their readings in order, so what each figure
// includes reads in one place
pub(super) async fn isolation(fe: &FleetEnv<'_>, rows: u64, secs: u64) -> Result<Isolation> {
    let quiet = &fe.pipes[..fe.pipes.len() - 1];
    let other = PostgresServer::start_with(pg_options(&[])).await?;
    outbox_database(&other, "big").await?;
    let big = Pipe::on(&other, "big");
    // The same backlog once more, for a single relay of its own: a slot and a stream of its own.
    let control = Pipe {
        name: "bigctl".into(),
        url: other.url("big"),
        slot: "fleet_bigctl".into(),
        stream: "BIGCTL".into(),
    };
    for p in [&big, &control] {
        create_slot(&other, "big", &p.slot).await?;
        create_stream(fe.env, &p.stream, &format!("{}.>", p.name)).await?;
    }
    say(format!(
        "   isolation: writing {rows} rows ({BACKLOG_PER_TX}-row txs) on the Nth pipeline's own server"
    ));
    let backlog_write_secs = write_backlog(&other, &big, rows).await?;
    let config = fe.dir.join("isolation.toml");
    let mut group = Group::fleet(fe, &config, quiet)?;
    group.wait_ready(READY_WITHIN).await?;
    let (readers, mut rx) = stamp_readers(fe, quiet).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writing = Writers::connect(&fe.pg, quiet)
        .await?
        .spawn(FLEET_RATE, stop.clone());
    tokio::time::sleep(WARM).await;
    let window = Duration::from_secs(secs);
    let mut nth = Nth {
        fe,
        other,
        big,
        control,
        config,
        rows,
        window,
    };
    let mut phases = Vec::new();
    let mut stamps = Vec::new();

    let mark = PhaseMark::now(fe, &group, &nth.other);
    tokio::time::sleep(window).await;
    group.check_alive()?;
    let alone = mark.end(PhaseKind::Alone, fe, &group, &nth.other).await?;
    let span = (alone.1, alone.2);
    phases.push(alone);
    // At a rate the machine cannot carry, the N-1 pipelines fall behind already alone, and
    // every later phase would measure that queue: the Nth pipeline's phases are not run then.
    let expected = quiet.len() as u64 * FLEET_RATE * secs;
    let read_back = kept_up(&mut rx, &mut stamps, span, expected).await;
    let (mut caught_up_secs, mut control_caught_up_secs, mut not_run) = (None, None, None);
    if read_back * 100 >= expected * 95 {
        (caught_up_secs, control_caught_up_secs) =
            nth.phases(&mut group, quiet, &mut phases).await?;
    } else {
        let why = format!(
            "the {} pipelines did not keep up alone: {read_back} of ~{expected} events committed in the alone phase were read back within 5 s of its end",
            quiet.len()
        );
        say(format!(
            "   isolation: the Nth pipeline's phases not run: {why}"
        ));
        not_run = Some(why);
    }

    stop.store(true, Ordering::Relaxed);
    let sent = writing.await??;
    let deadline = Instant::now() + Duration::from_secs(if not_run.is_some() { 10 } else { 60 });
    while (stamps.len() as u64) < sent {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(s)) => stamps.push(s),
            _ => break,
        }
    }
    for r in readers {
        r.abort();
    }
    group.stop().await?;
    let mut out = Vec::new();
    for (mut phase, from, to) in phases {
        let measured = latencies(&stamps, quiet.len(), from, to);
        phase.samples = measured.samples;
        phase.p50_ms = measured.p50_ms;
        phase.p99_ms = measured.p99_ms;
        phase.max_ms = measured.max_ms;
        phase.worst_pipeline_p99_ms = measured.worst_pipeline_p99_ms;
        say(format!(
            "   isolation, {}: {} events, p50 {:.2} ms, p99 {:.2} ms (worst pipeline {:.2} ms), max {:.1} ms",
            phase.kind.label(),
            phase.samples,
            phase.p50_ms,
            phase.p99_ms,
            phase.worst_pipeline_p99_ms,
            phase.max_ms
        ));
        out.push(phase);
    }
    if out.first().is_none_or(|p| p.samples == 0) {
        bail!("no event of the N-1 pipelines was read back while alone");
    }
    Ok(Isolation {
        pipelines: quiet.len(),
        backlog_rows: rows,
        backlog_write_secs,
        caught_up_secs,
        control_caught_up_secs,
        phases: out,
        missing: sent.saturating_sub(stamps.len() as u64),
        not_run,
    })
}

fn secs_or_timeout(secs: Option<f64>, timeout: Duration) -> String {
    secs.map_or_else(|| format!("more than {timeout:?}"), |s| format!("{s:.1} s"))
}
