//! The relay processes of a fleet row, the writers into its databases, and the readings of a
//! measured span.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use relay_testkit::PostgresServer;
use tokio::task::JoinHandle;

use crate::measure::{ProcessCpu, cpu_seconds, family_cpu, machine_busy_seconds, pss, rss};

use super::super::relay::{RelayProc, tail};
use super::super::setup::insert_sql_into;
use super::{FleetEnv, PgCpu, Pipe, Window, fleet_toml};

/// One relay process and where it serves `/readyz` and `/metrics`.
struct Member {
    proc: RelayProc,
    addr: String,
    pipelines: usize,
}

impl Member {
    /// Whether `/readyz` answers 200 and `/metrics` says `outbox_relay_ready` 1 for each of
    /// its pipelines (`{pipeline="…"}` in a fleet). False while it does not answer yet.
    async fn ready(&self) -> bool {
        let get = |path| relay_ops::client::get_text(&self.addr, path, Duration::from_secs(2));
        if !matches!(get("/readyz").await, Ok((200, _))) {
            return false;
        }
        let Ok((200, metrics)) = get("/metrics").await else {
            return false;
        };
        let ready = metrics
            .lines()
            .filter(|l| {
                l.starts_with("outbox_relay_ready{") || l.starts_with("outbox_relay_ready ")
            })
            .filter(|l| l.rsplit_once(' ').is_some_and(|(_, v)| v.trim() == "1"))
            .count();
        ready == self.pipelines
    }
}

/// The relay processes running one side of a fleet row.
pub(super) struct Group {
    members: Vec<Member>,
    spawned: Instant,
}

fn listen_addr() -> String {
    format!("127.0.0.1:{}", relay_testkit::free_port())
}

impl Group {
    /// One fleet process running `pipes`, its configuration written to `config`.
    pub(super) fn fleet(fe: &FleetEnv<'_>, config: &Path, pipes: &[Pipe]) -> Result<Self> {
        let addr = listen_addr();
        std::fs::write(config, fleet_toml(&fe.env.nats.url(), &addr, pipes))?;
        let name = config
            .file_stem()
            .map_or_else(|| "fleet".into(), |s| s.to_string_lossy().into_owned());
        let spawned = Instant::now();
        let proc = RelayProc::start_config(fe.env, &fe.env.relay_bin, config, &name)?;
        Ok(Self {
            members: vec![Member {
                proc,
                addr,
                pipelines: pipes.len(),
            }],
            spawned,
        })
    }

    /// One single-relay process per pipe, all spawned at once.
    pub(super) fn singles(fe: &FleetEnv<'_>, pipes: &[Pipe]) -> Result<Self> {
        let mut configs = Vec::new();
        for p in pipes {
            let addr = listen_addr();
            let path = fe.dir.join(format!("single-{}.toml", p.name));
            std::fs::write(&path, p.single(&fe.env.nats.url(), &addr))?;
            configs.push((p, path, addr));
        }
        let spawned = Instant::now();
        let mut members = Vec::new();
        for (p, path, addr) in configs {
            let name = format!("single-{}", p.name);
            let proc = RelayProc::start_config(fe.env, &fe.env.relay_bin, &path, &name)?;
            members.push(Member {
                proc,
                addr,
                pipelines: 1,
            });
        }
        Ok(Self { members, spawned })
    }

    /// Rewrites the (one) fleet process's configuration `config` with `pipes` and has it read
    /// it again (SIGHUP): a pipeline added starts, the others go on.
    pub(super) fn reload(&self, fe: &FleetEnv<'_>, config: &Path, pipes: &[Pipe]) -> Result<()> {
        let m = &self.members[0];
        std::fs::write(config, fleet_toml(&fe.env.nats.url(), &m.addr, pipes))?;
        let pid = nix::unistd::Pid::from_raw(m.proc.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)?;
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// Seconds from the first spawn until every process said every pipeline is ready.
    pub(super) async fn wait_ready(&mut self, within: Duration) -> Result<f64> {
        let mut ready = vec![false; self.members.len()];
        loop {
            for (m, ready) in self.members.iter_mut().zip(ready.iter_mut()) {
                if !*ready {
                    m.proc.check_alive()?;
                    *ready = m.ready().await;
                }
            }
            if ready.iter().all(|r| *r) {
                return Ok(self.spawned.elapsed().as_secs_f64());
            }
            if self.spawned.elapsed() > within {
                let waiting = ready.iter().filter(|r| !**r).count();
                let first = self.members.iter().zip(&ready).find(|(_, r)| !**r);
                bail!(
                    "{waiting} of {} relay processes not ready after {within:?}; log of one:\n{}",
                    self.members.len(),
                    first.map_or_else(String::new, |(m, _)| tail(&m.proc.log))
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            m.proc.check_alive()?;
        }
        Ok(())
    }

    /// Each process's CPU time so far.
    fn cpu(&self) -> Vec<ProcessCpu> {
        self.members
            .iter()
            .map(|m| ProcessCpu::now(m.proc.pid()))
            .collect()
    }

    /// RSS and PSS now, summed over the processes (PSS None where unreadable).
    fn memory(&self) -> (u64, Option<u64>) {
        let pids = self.members.iter().map(|m| m.proc.pid());
        let rss_sum = pids.clone().map(|p| rss(p).unwrap_or(0)).sum();
        let pss_sum = pids.map(pss).sum::<Option<u64>>();
        (rss_sum, pss_sum)
    }

    /// The readings a [`Window`] starts from, now.
    pub(super) fn mark(&self, fe: &FleetEnv<'_>) -> Mark {
        Mark {
            at: Instant::now(),
            relay: self.cpu(),
            pg: fe.pg.postmaster_pid().map(family_cpu).unwrap_or_default(),
            nats: fe.env.nats.pid().and_then(|p| cpu_seconds(&p.to_string())),
            machine: machine_busy_seconds(),
        }
    }

    /// The span since `mark`, in which `events` rows were committed, `stored` of them stored.
    pub(super) async fn window(
        &self,
        fe: &FleetEnv<'_>,
        mark: Mark,
        events: u64,
        stored: u64,
    ) -> Result<Window> {
        let secs = mark.at.elapsed().as_secs_f64();
        let relay_cpu_secs = self
            .cpu()
            .iter()
            .zip(&mark.relay)
            .map(|(now, before)| now.since(before))
            .sum();
        let machine = machine_busy_seconds();
        let nats = fe.env.nats.pid().and_then(|p| cpu_seconds(&p.to_string()));
        let pg_now = fe.pg.postmaster_pid().map(family_cpu).unwrap_or_default();
        let (rss, pss) = self.memory();
        let pg = pg_cpu(&fe.pg, &mark.pg, &pg_now).await?;
        Ok(Window {
            secs,
            relay_cpu_secs,
            rss,
            pss,
            pg,
            nats_cpu_secs: nats.zip(mark.nats).map(|(b, a)| b - a),
            machine_secs: machine.zip(mark.machine).map(|(b, a)| b - a),
            write_secs: 0.0,
            events,
            stored,
        })
    }

    /// Stops every process (SIGTERM, all at once), each draining.
    pub(super) async fn stop(self) -> Result<()> {
        let stops = self.members.into_iter().map(|m| m.proc.stop());
        for r in futures::future::join_all(stops).await {
            r?;
        }
        Ok(())
    }
}

/// The readings at the start of a [`Window`].
pub(super) struct Mark {
    at: Instant,
    relay: Vec<ProcessCpu>,
    pg: HashMap<u32, f64>,
    nats: Option<f64>,
    machine: Option<f64>,
}

/// CPU seconds of each process between two [`family_cpu`] readings (a process started
/// between them counts whole; one that ended is lost).
pub(super) fn family_delta(
    before: &HashMap<u32, f64>,
    after: &HashMap<u32, f64>,
) -> Vec<(u32, f64)> {
    after
        .iter()
        .map(|(pid, cpu)| (*pid, cpu - before.get(pid).copied().unwrap_or(0.0)))
        .collect()
}

/// The server's CPU between two readings, by role (from pg_stat_activity now).
async fn pg_cpu(
    pg: &PostgresServer,
    before: &HashMap<u32, f64>,
    after: &HashMap<u32, f64>,
) -> Result<PgCpu> {
    let rows = pg
        .connect("postgres")
        .await?
        .query(
            "SELECT pid, backend_type = 'walsender', \
               backend_type = 'client backend' AND application_name IS DISTINCT FROM 'relay-testkit' \
             FROM pg_stat_activity",
            &[],
        )
        .await?;
    let roles: HashMap<u32, (bool, bool)> = rows
        .iter()
        .map(|r| {
            let flag = |i| r.get::<_, Option<bool>>(i).unwrap_or(false);
            (r.get::<_, i32>(0) as u32, (flag(1), flag(2)))
        })
        .collect();
    let mut out = PgCpu::default();
    for (pid, cpu) in family_delta(before, after) {
        out.all += cpu;
        match roles.get(&pid) {
            Some((true, _)) => out.walsenders += cpu,
            Some((_, true)) => out.relay_sessions += cpu,
            _ => {}
        }
    }
    Ok(out)
}

/// One connection per database, each writing 1-row transactions.
pub(super) struct Writers {
    clients: Vec<tokio_postgres::Client>,
}

impl Writers {
    /// Connects to the database of each of `pipes`.
    pub(super) async fn connect(pg: &PostgresServer, pipes: &[Pipe]) -> Result<Self> {
        let mut clients = Vec::new();
        for p in pipes {
            clients.push(pg.connect(&p.name).await?);
        }
        Ok(Self { clients })
    }

    /// [`Writers::spawn`] for `span`; returns the rows committed.
    pub(super) async fn run_for(self, rate: u64, span: Duration) -> Result<u64> {
        let stop = Arc::new(AtomicBool::new(false));
        let task = self.spawn(rate, stop.clone());
        tokio::time::sleep(span).await;
        stop.store(true, Ordering::Relaxed);
        task.await?
    }

    /// `rate` 1-row autocommit transactions per second into each database (the writers'
    /// ticks spread over the period) until `stop` is set; the task returns the rows committed.
    pub(super) fn spawn(self, rate: u64, stop: Arc<AtomicBool>) -> JoinHandle<Result<u64>> {
        let n = self.clients.len().max(1);
        let period = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
        let start = tokio::time::Instant::now() + Duration::from_millis(10);
        let tasks: Vec<JoinHandle<Result<u64>>> = self
            .clients
            .into_iter()
            .enumerate()
            .map(|(i, client)| {
                let stop = stop.clone();
                let first = start + period.mul_f64(i as f64 / n as f64);
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval_at(first, period);
                    let mut sent = 0_u64;
                    loop {
                        tick.tick().await;
                        if stop.load(Ordering::Relaxed) {
                            return Ok(sent);
                        }
                        let g = sent + 1;
                        client
                            .batch_execute(&insert_sql_into("outbox", "Order", g, g))
                            .await?;
                        sent = g;
                    }
                })
            })
            .collect();
        tokio::spawn(async move {
            let mut total = 0;
            for t in tasks {
                total += t.await??;
            }
            Ok(total)
        })
    }
}
