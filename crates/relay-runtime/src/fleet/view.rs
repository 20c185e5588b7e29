//! What the fleet shows of itself while it runs: each pipeline's state, settings and telemetry,
//! read by whatever serves them (relay-console's endpoints and console) at each request, so a
//! pipeline added, restarted or removed by a reload is seen at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use relay_telemetry::{RelayStatus, Telemetry};
use serde::{Deserialize, Serialize};

use crate::config::RelayConfig;
use crate::failure::FailureKind;

/// Where a pipeline is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum PipelineState {
    /// Built and running: connecting, waiting for its slot, or streaming (its telemetry says
    /// which).
    Running,
    /// PostgreSQL or NATS could not be reached at start; started again after a backoff.
    Retrying { reason: String },
    /// Asked to stop (shutdown, removed or changed by a reload): draining and storing its
    /// checkpoint.
    Draining,
    /// Stopped on a fatal condition; the others go on. A reload (SIGHUP) starts it again.
    Stopped {
        /// The kind of stop (a single relay's exit code says the same).
        kind: FailureKind,
        reason: String,
    },
    /// Its configuration cannot be used (a reload's new pipeline file): never started.
    Refused { reason: String },
}

/// One pipeline as the fleet shows it.
#[derive(Debug, Clone)]
pub struct PipelineView {
    pub name: String,
    /// Where its configuration comes from (a file, a `[[pipeline]]` entry).
    pub origin: String,
    pub config: RelayConfig,
    /// The telemetry of its current run (`None` before its first, or when refused).
    pub telemetry: Option<Arc<Telemetry>>,
    pub state: PipelineState,
    /// When it entered `state`.
    pub since: SystemTime,
    /// A reload's new configuration of this pipeline that was refused (it runs the previous).
    pub reload_error: Option<String>,
}

/// One pipeline in a fleet's `/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetPipelineStatus {
    pub name: String,
    pub origin: String,
    #[serde(flatten)]
    pub state: PipelineState,
    /// Unix seconds since it is in `state`.
    pub since: u64,
    pub ready: bool,
    /// Why it is not ready (empty when it is).
    pub reasons: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_error: Option<String>,
    /// Its relay's own `/status` document (`None` before its first run, or refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayStatus>,
}

/// A fleet's `/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    pub ready: bool,
    pub pipelines: Vec<FleetPipelineStatus>,
}

impl PipelineView {
    /// Its entry in the fleet's `/status`.
    pub fn status(&self) -> FleetPipelineStatus {
        let (ready, reasons) = self.readiness();
        FleetPipelineStatus {
            name: self.name.clone(),
            origin: self.origin.clone(),
            state: self.state.clone(),
            since: self
                .since
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ready,
            reasons,
            reload_error: self.reload_error.clone(),
            relay: self.telemetry.as_ref().map(|t| t.status_report()),
        }
    }

    /// Whether `/readyz` counts it ready, and if not, why.
    pub fn readiness(&self) -> (bool, Vec<String>) {
        match (&self.state, &self.telemetry) {
            (PipelineState::Running, Some(telemetry)) => telemetry.readiness(),
            (PipelineState::Running, None) => (false, vec!["starting".into()]),
            (PipelineState::Retrying { reason }, _) => (false, vec![format!("retrying: {reason}")]),
            (PipelineState::Draining, _) => (false, vec!["draining".into()]),
            (PipelineState::Stopped { reason, .. }, _) => {
                (false, vec![format!("stopped: {reason}")])
            }
            (PipelineState::Refused { reason }, _) => (false, vec![format!("refused: {reason}")]),
        }
    }
}

/// The fleet's pipelines, shared between the fleet's supervisor (which writes) and what
/// serves them (which reads).
#[derive(Debug, Clone)]
pub struct FleetView {
    /// `false` for a single-relay configuration: its endpoints answer as one relay's.
    is_fleet: bool,
    pipelines: Arc<Mutex<BTreeMap<String, PipelineView>>>,
}

impl FleetView {
    pub(crate) fn new(is_fleet: bool) -> Self {
        Self {
            is_fleet,
            pipelines: Arc::default(),
        }
    }

    /// Whether this is a fleet configuration (`[fleet]` or `[[pipeline]]`) rather than one
    /// relay's.
    pub fn is_fleet(&self) -> bool {
        self.is_fleet
    }

    /// Every pipeline, in name order.
    pub fn pipelines(&self) -> Vec<PipelineView> {
        self.lock().values().cloned().collect()
    }

    /// The pipeline named `name`.
    pub fn pipeline(&self, name: &str) -> Option<PipelineView> {
        self.lock().get(name).cloned()
    }

    /// Whether every pipeline is ready, and the reasons of each that is not, prefixed with
    /// its name in a fleet.
    pub fn readiness(&self) -> (bool, Vec<String>) {
        let mut reasons = Vec::new();
        for view in self.lock().values() {
            let (_, why) = view.readiness();
            if self.is_fleet {
                reasons.extend(why.into_iter().map(|r| format!("{}: {r}", view.name)));
            } else {
                reasons.extend(why);
            }
        }
        (reasons.is_empty(), reasons)
    }

    /// The fleet's `/status` document.
    pub fn status(&self) -> FleetStatus {
        let pipelines: Vec<FleetPipelineStatus> =
            self.lock().values().map(PipelineView::status).collect();
        FleetStatus {
            ready: pipelines.iter().all(|p| p.ready),
            pipelines,
        }
    }

    pub(crate) fn insert(&self, view: PipelineView) {
        self.lock().insert(view.name.clone(), view);
    }

    pub(crate) fn remove(&self, name: &str) {
        self.lock().remove(name);
    }

    pub(crate) fn update(&self, name: &str, change: impl FnOnce(&mut PipelineView)) {
        if let Some(view) = self.lock().get_mut(name) {
            change(view);
        }
    }

    pub(crate) fn set_state(&self, name: &str, state: PipelineState) {
        self.update(name, |view| {
            if view.state != state {
                view.state = state;
                view.since = SystemTime::now();
            }
        });
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PipelineView>> {
        // A panic elsewhere while holding it leaves a map that is still whole.
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner())
    }
}
