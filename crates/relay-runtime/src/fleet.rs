//! Many pipelines in one process: a [`Fleet`] runs one [`Relay`] per configured pipeline
//! ([`config::FleetConfig`]), each with its own connections, in-flight window, checkpoint and
//! slot, and supervises each alone:
//!
//! - PostgreSQL or NATS unreachable at a pipeline's start: that pipeline starts again after a
//!   backoff (up to its `[relay] reconnect_max`); the others go on.
//! - A fatal condition (a lost slot, a row it must fail closed on, a bad setup): that
//!   pipeline stops with its reason, shown in `/status` and `/readyz`; the others go on. With
//!   `fail_fast` (and always for a single-relay configuration) the fleet drains every
//!   pipeline and returns that failure instead, so the process exits as one relay would.
//! - A reload ([`Fleet::run`]'s `reloads`, SIGHUP in the binary) reads the configuration
//!   again: a pipeline added starts, one removed drains, stores its checkpoint and stops (its
//!   slot is kept: drop it by hand), one whose merged settings changed drains and starts
//!   again, and one stopped on a fatal condition gets a new try. The others never pause. A
//!   pipeline whose new configuration is refused keeps running its previous one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::failure::Failure;
use crate::relay::{Relay, RelayOptions};
use members::Members;
use pipeline_task::PipelineTask;

pub mod config;
pub mod members;
mod pipeline_task;
mod view;

pub use config::{FleetConfig, FleetSettings, Origin, PipelineEntry, RefusedPipeline};
pub use view::{FleetPipelineStatus, FleetStatus, FleetView, PipelineState, PipelineView};

/// The pipelines of one process, built and not yet running.
#[derive(Debug)]
pub struct Fleet {
    config: FleetConfig,
    options: RelayOptions,
    view: FleetView,
    /// Built at [`Fleet::build`], so every file is read before anything connects.
    built: BTreeMap<String, Relay>,
    /// Where pipelines are placed when several processes run the fleet (`[fleet] spread`).
    members: Option<Arc<Members>>,
    /// Cancelled when [`Fleet::run`] returns, or the fleet is dropped without running.
    ended: CancellationToken,
    _ended_on_drop: tokio_util::sync::DropGuard,
}

/// What a pipeline's task returns when it ends.
struct Ended {
    name: String,
    /// Which start of that name it was (a reload may have started a newer one since).
    generation: u64,
    result: Result<(), Failure>,
}

/// The pipelines' tasks and what the supervisor knows of them.
struct Tasks {
    set: JoinSet<Ended>,
    running: BTreeMap<String, Running>,
    /// Changed by a reload while running: started once the previous run has drained.
    restart: BTreeMap<String, PipelineEntry>,
    /// Starts so far (each run's generation).
    generation: u64,
    fail_fast: bool,
    shutdown: CancellationToken,
}

/// A pipeline's running task.
struct Running {
    generation: u64,
    stop: CancellationToken,
    entry: PipelineEntry,
}

impl Fleet {
    /// Builds every pipeline of `config`, connecting to nothing. A pipeline that cannot be
    /// built (a bad file, a refused configuration) is a configuration failure naming it.
    pub async fn build(config: FleetConfig, options: RelayOptions) -> Result<Self, Failure> {
        if let Some(error) = config.refused_error() {
            return Err(Failure::config(error));
        }
        let view = FleetView::new(config.is_fleet);
        let mut built = BTreeMap::new();
        for entry in &config.pipelines {
            let relay = Relay::build(entry.config.clone(), options)
                .await
                .map_err(|f| named(f, entry, config.is_fleet))?;
            view.insert(view_of(entry, Some(&relay)));
            built.insert(entry.name.clone(), relay);
        }
        let ended = CancellationToken::new();
        Ok(Self {
            members: (config.is_fleet && config.fleet.spread).then(|| {
                Arc::new(Members::new(
                    members::member_id(),
                    config.fleet.heartbeat_interval,
                ))
            }),
            config,
            options,
            view,
            built,
            _ended_on_drop: ended.clone().drop_guard(),
            ended,
        })
    }

    /// What the fleet shows of itself (read by the endpoints while it runs).
    pub fn view(&self) -> FleetView {
        self.view.clone()
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// Cancelled once [`Fleet::run`] has returned (or the fleet is dropped without running):
    /// what serves the view ends then.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Runs every pipeline until `shutdown` (then drains each and returns `Ok`), or with
    /// `fail_fast` until the first fatal failure of any (then drains the others and returns
    /// it). Each message on `reloads` reads the configuration again. A single-relay
    /// configuration always fails fast.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
        mut reloads: tokio::sync::mpsc::Receiver<()>,
        fail_fast: bool,
    ) -> Result<(), Failure> {
        let mut tasks = Tasks {
            set: JoinSet::new(),
            running: BTreeMap::new(),
            restart: BTreeMap::new(),
            generation: 0,
            fail_fast: fail_fast || !self.config.is_fleet,
            shutdown,
        };
        if let Some(members) = &self.members {
            members.set_pipelines(
                self.config
                    .pipelines
                    .iter()
                    .map(|p| p.name.clone())
                    .collect(),
            );
            // Hear the fleet's other processes before taking any slot.
            members::spawn_heartbeat(
                members.clone(),
                self.config.nats.clone(),
                self.config.fleet.name.clone(),
                self.ended.clone(),
            )
            .await;
        }
        for entry in self.config.pipelines.clone() {
            let relay = self.built.remove(&entry.name);
            self.start(&mut tasks, entry, relay);
        }
        let shutdown = tasks.shutdown.clone();
        let mut failure = None;
        while failure.is_none() {
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(()) = reloads.recv() => self.apply_reload(&mut tasks),
                Some(joined) = tasks.set.join_next() => {
                    let ended = joined.map_err(|e| Failure::internal(anyhow::anyhow!("a pipeline's task panicked: {e}")))?;
                    failure = self.on_ended(&mut tasks, ended);
                }
            }
        }
        self.drain(tasks, failure).await
    }

    /// A reload: reads the configuration, then drains, restarts and starts what changed.
    fn apply_reload(&mut self, tasks: &mut Tasks) {
        let plan = self.reload(&tasks.running);
        for name in plan.stop {
            if let Some(run) = tasks.running.get(&name) {
                self.view.set_state(&name, PipelineState::Draining);
                run.stop.cancel();
            }
        }
        for entry in plan.restart {
            tasks.restart.insert(entry.name.clone(), entry);
        }
        for entry in plan.start {
            self.start(tasks, entry, None);
        }
    }

    /// A pipeline's task ended: with `fail_fast` its failure is the fleet's; otherwise the
    /// pipeline is stopped (a failure), removed (drained on a reload), or started again with
    /// a reload's new settings.
    fn on_ended(&mut self, tasks: &mut Tasks, ended: Ended) -> Option<Failure> {
        if tasks
            .running
            .get(&ended.name)
            .is_some_and(|r| r.generation == ended.generation)
        {
            tasks.running.remove(&ended.name);
        }
        match ended.result {
            Err(f) if tasks.fail_fast => return Some(f),
            Err(f) => {
                tracing::error!(pipeline = %ended.name, kind = ?f.kind, error = %format!("{:#}", f.error), "pipeline stopped; the others go on (a reload, SIGHUP, starts it again)");
                self.view.set_state(
                    &ended.name,
                    PipelineState::Stopped {
                        kind: f.kind,
                        reason: format!("{:#}", f.error),
                    },
                );
            }
            Ok(()) => {
                if !tasks.restart.contains_key(&ended.name) && !tasks.shutdown.is_cancelled() {
                    // Removed by a reload: drained and stored; its slot is kept.
                    tracing::info!(pipeline = %ended.name, "pipeline removed: drained, checkpoint stored; its slot is kept (drop it with pg_drop_replication_slot once no longer wanted)");
                    self.view.remove(&ended.name);
                }
            }
        }
        if let Some(entry) = tasks.restart.remove(&ended.name)
            && !tasks.running.contains_key(&entry.name)
        {
            self.start(tasks, entry, None);
        }
        None
    }

    /// Shutdown, or a failure with fail_fast: every pipeline still running drains; the first
    /// failure is the fleet's.
    async fn drain(&self, mut tasks: Tasks, mut failure: Option<Failure>) -> Result<(), Failure> {
        for (name, run) in &tasks.running {
            self.view.set_state(name, PipelineState::Draining);
            run.stop.cancel();
        }
        while let Some(joined) = tasks.set.join_next().await {
            match joined {
                Ok(Ended { result: Err(f), .. }) if failure.is_none() => failure = Some(f),
                Ok(Ended {
                    name,
                    result: Err(f),
                    ..
                }) => {
                    tracing::error!(pipeline = %name, error = %format!("{:#}", f.error), "pipeline failed while draining");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "a pipeline's task panicked while draining");
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Spawns the task running `entry` (with `relay` when already built).
    fn start(&self, tasks: &mut Tasks, entry: PipelineEntry, relay: Option<Relay>) {
        tasks.generation += 1;
        let generation = tasks.generation;
        let stop = tasks.shutdown.child_token();
        if relay.is_none() {
            self.view.insert(view_of(&entry, None));
        }
        let task = PipelineTask {
            entry: entry.clone(),
            options: self.options,
            view: self.view.clone(),
            stop: stop.clone(),
            retry_unavailable: !tasks.fail_fast,
            is_fleet: self.config.is_fleet,
            members: self.members.clone(),
        };
        let name = entry.name.clone();
        let run = task.run(relay);
        let ended = async move {
            Ended {
                name,
                generation,
                result: run.await,
            }
        };
        if self.config.is_fleet {
            tasks
                .set
                .spawn(ended.instrument(tracing::info_span!("pipeline", name = %entry.name)));
        } else {
            tasks.set.spawn(ended);
        }
        tasks.running.insert(
            entry.name.clone(),
            Running {
                generation,
                stop,
                entry,
            },
        );
    }

    /// Reads the configuration again and says what changes; a configuration that cannot be
    /// read changes nothing.
    fn reload(&mut self, running: &BTreeMap<String, Running>) -> ReloadPlan {
        let names: Vec<String> = running.keys().cloned().collect();
        let config = match FleetConfig::load(self.config.file.as_deref(), &names) {
            Ok(config) => config,
            Err(error) => {
                tracing::error!(error = %error, "reload refused: the configuration cannot be read; every pipeline runs as before");
                return ReloadPlan::default();
            }
        };
        if !config.is_fleet || config.http != self.config.http {
            tracing::warn!(
                "reload: [http] and the change between one relay's configuration and a fleet's take effect at the next start of the process"
            );
        }
        let mut plan = ReloadPlan::default();
        for refused in &config.refused {
            tracing::error!(pipeline = %refused.name, origin = %refused.origin, reason = %refused.reason, "reload: pipeline refused");
            if running.contains_key(&refused.name) {
                self.view.update(&refused.name, |v| {
                    v.reload_error = Some(refused.reason.clone());
                });
            } else {
                let mut view = PipelineView {
                    name: refused.name.clone(),
                    origin: refused.origin.to_string(),
                    config: Default::default(),
                    telemetry: None,
                    state: PipelineState::Refused {
                        reason: refused.reason.clone(),
                    },
                    since: SystemTime::now(),
                    reload_error: None,
                };
                if let Some(old) = self.view.pipeline(&refused.name) {
                    view.config = old.config;
                }
                self.view.insert(view);
            }
        }
        for (name, run) in running {
            let refused = config.refused.iter().any(|r| &r.name == name);
            match config.pipelines.iter().find(|p| &p.name == name) {
                None if !refused => plan.stop.push(name.clone()),
                Some(entry) if entry.fingerprint != run.entry.fingerprint => {
                    tracing::info!(pipeline = %name, "reload: settings changed; draining, then starting again");
                    plan.stop.push(name.clone());
                    plan.restart.push(entry.clone());
                }
                _ => {}
            }
        }
        for entry in &config.pipelines {
            if !running.contains_key(&entry.name) {
                tracing::info!(pipeline = %entry.name, origin = %entry.origin, "reload: starting pipeline");
                plan.start.push(entry.clone());
            } else {
                self.view.update(&entry.name, |v| v.reload_error = None);
            }
        }
        // Refused newcomers are shown; stopped ones no longer configured leave the view.
        for view in self.view.pipelines() {
            let configured = config.pipelines.iter().any(|p| p.name == view.name)
                || config.refused.iter().any(|r| r.name == view.name);
            if !configured && !running.contains_key(&view.name) {
                self.view.remove(&view.name);
            }
        }
        if let Some(members) = &self.members {
            members.set_pipelines(config.pipelines.iter().map(|p| p.name.clone()).collect());
        }
        let mut kept = config;
        kept.refused.clear();
        self.config = kept;
        plan
    }
}

/// What a reload changes.
#[derive(Debug, Default)]
struct ReloadPlan {
    /// Drain and stop.
    stop: Vec<String>,
    /// Start again once drained, with these settings.
    restart: Vec<PipelineEntry>,
    /// Start (new, or stopped on a fatal condition before).
    start: Vec<PipelineEntry>,
}

/// A fleet pipeline's failure names the pipeline; a single relay's reads as it always did.
fn named(failure: Failure, entry: &PipelineEntry, is_fleet: bool) -> Failure {
    if !is_fleet {
        return failure;
    }
    Failure {
        kind: failure.kind,
        error: failure
            .error
            .context(format!("pipeline `{}` ({})", entry.name, entry.origin)),
    }
}

fn view_of(entry: &PipelineEntry, relay: Option<&Relay>) -> PipelineView {
    PipelineView {
        name: entry.name.clone(),
        origin: entry.origin.to_string(),
        config: entry.config.clone(),
        telemetry: relay.map(|r| r.telemetry().clone()),
        state: PipelineState::Running,
        since: SystemTime::now(),
        reload_error: None,
    }
}

#[cfg(test)]
mod tests;
