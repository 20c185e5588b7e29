//! The HTTP endpoints of a running relay (`[http] listen`), from its telemetry:
//!
//! | path | answer |
//! |---|---|
//! | `/livez` | 200 while the process serves requests |
//! | `/readyz` | 200 `{"ready":true}` when streaming, NATS connected and the stream present; 503 with `{"ready":false,"reasons":[…]}` otherwise |
//! | `/metrics` | Prometheus / OpenMetrics text |
//! | `/status` | JSON: positions, counters, slot and stream state |
//! | `/console` | the console, with `[http] console = true` ([`crate::console`]) |

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde_json::json;

use relay_telemetry::{MetricsCollector, Telemetry};

#[derive(Debug, Clone)]
struct AppState {
    telemetry: Arc<Telemetry>,
    registry: Arc<Registry>,
}

/// Serves the endpoints (and `console`'s pages when given) on `listener` until `ended` is
/// cancelled.
pub(crate) fn spawn(
    listener: tokio::net::TcpListener,
    telemetry: Arc<Telemetry>,
    console: Option<Arc<crate::console::Console>>,
    ended: tokio_util::sync::CancellationToken,
) {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(MetricsCollector(telemetry.clone())));
    let state = AppState {
        telemetry,
        registry: Arc::new(registry),
    };
    let app = axum::Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state);
    let app = match console {
        Some(console) => app.merge(crate::console::routes(console)),
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
    let (ready, reasons) = state.telemetry.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(json!({ "ready": ready, "reasons": reasons })))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
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

async fn status(State(state): State<AppState>) -> impl IntoResponse {
    Json(state.telemetry.status())
}
