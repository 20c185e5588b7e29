//! A small OTLP/HTTP receiver: accepts `POST /v1/traces` (protobuf, as OTLP exporters send by
//! default) on a free port and records every span, for tests of the relay's span export.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// One received span, flattened.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of its resource.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Trace id, lowercase hex.
    pub trace_id: String,
    /// Span id, lowercase hex.
    pub span_id: String,
    /// Parent span id, lowercase hex (empty for a root span).
    pub parent_span_id: String,
    /// Start and end, nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    /// Attributes as text (`key` → string, integer or bool rendered).
    pub attributes: Vec<(String, String)>,
    /// Names of its events.
    pub events: Vec<String>,
}

impl ReceivedSpan {
    /// The value of attribute `key`.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    url: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                out.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| {
                            let value = text(kv.value.as_ref().and_then(|v| v.value.as_ref()));
                            (kv.key, value)
                        })
                        .collect(),
                    events: span.events.into_iter().map(|e| e.name).collect(),
                });
            }
        }
    }
    out
}

impl OtlpReceiver {
    /// Listens on a free local port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1/traces", listener.local_addr()?);
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let sink = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let sink = sink.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => {
                            sink.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .extend(flatten(request));
                            (StatusCode::OK, Vec::new())
                        }
                        Err(_) => (StatusCode::BAD_REQUEST, Vec::new()),
                    }
                }
            }),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, spans, task })
    }

    /// The traces URL (`http://127.0.0.1:<port>/v1/traces`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits up to `within` until at least `n` spans arrived; returns them all.
    pub async fn wait_for(&self, n: usize, within: Duration) -> anyhow::Result<Vec<ReceivedSpan>> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if spans.len() >= n {
                return Ok(spans);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {n} spans after {within:?}: {spans:?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
