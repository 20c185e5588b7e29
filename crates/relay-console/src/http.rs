//! The HTTP endpoints of a running relay (`[http] listen`), from its telemetry:
//!
//! | path | answer |
//! |---|---|
//! | `/livez` | 200 while the process serves requests |
//! | `/readyz` | 200 `{"ready":true}` when streaming, NATS connected and the stream present; 503 with `{"ready":false,"reasons":[…]}` otherwise |
//! | `/metrics` | Prometheus / OpenMetrics text |
//! | `/status` | JSON: positions, counters, slot and stream state; a fleet's: each pipeline's state and its relay's document |
//! | `/status/{pipeline}` | a fleet pipeline's relay's document, as one relay's `/status` |
//! | `/console` | the console, with `[http] console = true` ([`crate::console`]): one relay's, or a fleet's page with each pipeline's console under `/console/p/{pipeline}/` |

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde_json::json;

use relay_runtime::fleet::FleetView;
use relay_telemetry::MetricsCollector;

#[derive(Debug, Clone)]
struct AppState {
    fleet: FleetView,
}

/// Serves the endpoints (and the console's routes when given) on `listener` until `ended` is
/// cancelled.
pub(crate) fn spawn(
    listener: tokio::net::TcpListener,
    fleet: FleetView,
    console: Option<axum::Router>,
    ended: tokio_util::sync::CancellationToken,
) {
    let state = AppState { fleet };
    let app = axum::Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/status/{pipeline}", get(pipeline_status))
        .with_state(state);
    let app = match console {
        Some(console) => app.merge(console),
        None => app,
    };
    tokio::spawn(async move {
        // The peer's address: the console answers only loopback without a token.
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let serve = axum::serve(listener, app).with_graceful_shutdown(ended.cancelled_owned());
        if let Err(error) = serve.await {
            tracing::error!(error = %error, "HTTP server stopped");
        }
    });
}

async fn livez() -> impl IntoResponse {
    Json(json!({ "live": true }))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let (ready, reasons) = state.fleet.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(json!({ "ready": ready, "reasons": reasons })))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // The pipelines of this scrape: a reload may have added or removed some since the last.
    let pipelines = state
        .fleet
        .pipelines()
        .into_iter()
        .filter_map(|p| Some((p.name, p.telemetry?)));
    let collector = if state.fleet.is_fleet() {
        MetricsCollector::fleet(pipelines)
    } else {
        match pipelines.into_iter().next() {
            Some((_, telemetry)) => MetricsCollector::one(telemetry),
            None => MetricsCollector::fleet([]),
        }
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "cannot encode metrics".to_owned(),
        ),
    }
}

async fn status(State(state): State<AppState>) -> axum::response::Response {
    if state.fleet.is_fleet() {
        return Json(state.fleet.status()).into_response();
    }
    match state
        .fleet
        .pipelines()
        .first()
        .and_then(|p| p.telemetry.clone())
    {
        Some(telemetry) => Json(telemetry.status()).into_response(),
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// One pipeline's relay document: what one relay's `/status` says.
async fn pipeline_status(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> axum::response::Response {
    match state.fleet.pipeline(&name) {
        Some(view) => match view.telemetry {
            Some(telemetry) => Json(telemetry.status()).into_response(),
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "error": format!("pipeline `{name}` has not run"), "pipeline": view.status() })),
            )
                .into_response(),
        },
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no pipeline named `{name}`") })),
        )
            .into_response(),
    }
}
