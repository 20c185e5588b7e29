//! The console of a fleet: the fleet page at `/console` (its JSON `/console/api/fleet`, read
//! from the fleet's view at each request) and each pipeline's console of one relay at
//! `/console/p/{name}/`, its JSON under `/console/p/{name}/api/` (with `…/api/ready`: that
//! pipeline's readiness, for its page's badge).
//!
//! [`Consoles`] keeps one [`Console`] per pipeline run: a pipeline restarted by a reload runs
//! with a new telemetry, and gets a new console (and a new history) the first time it is read
//! or sampled after; a pipeline removed from the fleet loses its console. One relay's console
//! is the same with one pipeline, the only one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use relay_runtime::fleet::{FleetView, PipelineView};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::access::{Access, guard};
use super::{Console, SAMPLE_EVERY, api::failed, page, spawn_history};

mod row;

/// The consoles of the fleet's pipelines, one per pipeline run.
#[derive(Debug)]
pub(crate) struct Consoles {
    fleet: FleetView,
    /// The fleet's end: every console's history ends with it.
    ended: CancellationToken,
    kept: Mutex<BTreeMap<String, Kept>>,
}

/// A pipeline run's console, and what ends its history.
#[derive(Debug)]
struct Kept {
    console: Arc<Console>,
    stop: CancellationToken,
}

impl Consoles {
    pub(crate) fn new(fleet: FleetView, ended: CancellationToken) -> Self {
        Self {
            fleet,
            ended,
            kept: Mutex::default(),
        }
    }

    /// The console of `view`'s current run: the one kept while its telemetry is the same,
    /// else a new one (the previous run's history ends). `None` before its first run.
    fn console_of(&self, view: &PipelineView) -> Option<Arc<Console>> {
        let telemetry = view.telemetry.as_ref()?;
        let mut kept = self.lock();
        if let Some(known) = kept.get(&view.name)
            && Arc::ptr_eq(&known.console.telemetry, telemetry)
        {
            return Some(known.console.clone());
        }
        let console = Arc::new(Console::new(&view.config, telemetry.clone()));
        let stop = self.ended.child_token();
        spawn_history(console.clone(), stop.clone());
        let replaced = kept.insert(
            view.name.clone(),
            Kept {
                console: console.clone(),
                stop,
            },
        );
        if let Some(previous) = replaced {
            previous.stop.cancel();
        }
        Some(console)
    }

    /// Every pipeline with its console (`None` before its first run), in name order; the
    /// consoles of pipelines no longer in the fleet are let go.
    fn all(&self) -> Vec<(PipelineView, Option<Arc<Console>>)> {
        let views = self.fleet.pipelines();
        self.lock().retain(|name, kept| {
            let present = views.iter().any(|v| &v.name == name);
            if !present {
                kept.stop.cancel();
            }
            present
        });
        views
            .into_iter()
            .map(|view| {
                let console = self.console_of(&view);
                (view, console)
            })
            .collect()
    }

    /// The console of pipeline `name`, or why there is none.
    fn named(&self, name: &str) -> Result<Arc<Console>, Missing> {
        let view = self.fleet.pipeline(name).ok_or_else(|| no_pipeline(name))?;
        self.console_of(&view).ok_or_else(|| not_run(&view))
    }

    /// The console of a single-relay configuration's only relay.
    fn only(&self) -> Result<Arc<Console>, Missing> {
        let views = self.fleet.pipelines();
        let view = views.first().ok_or_else(|| Missing {
            status: StatusCode::SERVICE_UNAVAILABLE,
            error: "no relay is running".into(),
        })?;
        self.console_of(view).ok_or_else(|| not_run(view))
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Kept>> {
        // A panic elsewhere while holding it leaves a map that is still whole.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a request has no console to read, as it is answered.
#[derive(Debug)]
struct Missing {
    status: StatusCode,
    error: String,
}

impl IntoResponse for Missing {
    fn into_response(self) -> Response {
        failed(self.status, self.error)
    }
}

fn no_pipeline(name: &str) -> Missing {
    Missing {
        status: StatusCode::NOT_FOUND,
        error: format!("no pipeline named `{name}` in this fleet"),
    }
}

fn not_run(view: &PipelineView) -> Missing {
    Missing {
        status: StatusCode::SERVICE_UNAVAILABLE,
        error: format!(
            "pipeline `{}` has not run: {}",
            view.name,
            view.readiness().1.join("; ")
        ),
    }
}

/// Keeps the consoles in step with the fleet every [`SAMPLE_EVERY`] until `ended`, whether
/// anyone reads them or not: each pipeline's history runs from its start, as one relay's does.
pub(crate) fn spawn_keeper(consoles: Arc<Consoles>, ended: CancellationToken) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = ended.cancelled() => return,
            }
            consoles.all();
        }
    });
}

/// The `{name}` of a pipeline's routes (other parameters of the path are left to the handler).
#[derive(Debug, Deserialize)]
struct PipelineName {
    name: String,
}

/// Gives a request the console of the pipeline its path names.
async fn pick_named(
    State(consoles): State<Arc<Consoles>>,
    Path(PipelineName { name }): Path<PipelineName>,
    mut request: Request,
    next: Next,
) -> Response {
    match consoles.named(&name) {
        Ok(console) => {
            request.extensions_mut().insert(console);
            next.run(request).await
        }
        Err(missing) => missing.into_response(),
    }
}

/// Gives a request the console of the only relay.
pub(super) async fn pick_only(
    State(consoles): State<Arc<Consoles>>,
    mut request: Request,
    next: Next,
) -> Response {
    match consoles.only() {
        Ok(console) => {
            request.extensions_mut().insert(console);
            next.run(request).await
        }
        Err(missing) => missing.into_response(),
    }
}

/// A fleet's console.
pub(super) fn routes(consoles: Arc<Consoles>, access: Arc<Access>, write: bool) -> axum::Router {
    let pipeline_api = super::api_routes("/console/p/{name}/api")
        .route_layer(from_fn_with_state(consoles.clone(), pick_named));
    let fleet_api = axum::Router::new()
        .route("/console/api/fleet", get(fleet_json))
        .route("/console/p/{name}/api/ready", get(pipeline_ready))
        .with_state(consoles.clone());
    let api = pipeline_api
        .merge(fleet_api)
        .route_layer(from_fn_with_state(access, guard));
    let fleet_text: Arc<str> = page::fleet_page(write).into();
    let fleet_page = move || {
        let text = fleet_text.clone();
        async move { page::html(&text) }
    };
    let pipeline_page =
        move |State(consoles): State<Arc<Consoles>>,
              Path(PipelineName { name }): Path<PipelineName>| async move {
            match consoles.fleet.pipeline(&name) {
                Some(_) => page::html(&page::relay_page(write, Some(&name))),
                None => no_pipeline(&name).into_response(),
            }
        };
    axum::Router::new()
        .route("/console", get(fleet_page.clone()))
        .route("/console/", get(fleet_page))
        .route("/console/p/{name}", get(pipeline_page))
        .route("/console/p/{name}/", get(pipeline_page))
        .with_state(consoles)
        .merge(api)
}

/// The fleet page's JSON: every pipeline's row, as the fleet is now.
async fn fleet_json(State(consoles): State<Arc<Consoles>>) -> Response {
    let rows: Vec<row::FleetRow> = consoles
        .all()
        .iter()
        .map(|(view, console)| {
            let sample = console.as_ref().and_then(|c| c.latest_sample());
            row::row(view, sample.as_ref())
        })
        .collect();
    Json(json!({
        "ready": rows.iter().all(|r| r.ready),
        "pipelines": rows,
    }))
    .into_response()
}

/// One pipeline's readiness, as `/readyz` answers for one relay (503 when not ready).
async fn pipeline_ready(
    State(consoles): State<Arc<Consoles>>,
    Path(PipelineName { name }): Path<PipelineName>,
) -> Response {
    let Some(view) = consoles.fleet.pipeline(&name) else {
        return no_pipeline(&name).into_response();
    };
    let (ready, reasons) = view.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(json!({ "ready": ready, "reasons": reasons }))).into_response()
}
