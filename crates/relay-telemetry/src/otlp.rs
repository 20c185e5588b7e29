//! `[otlp]`: OpenTelemetry spans for the relay's own work on an event (from its commit to its
//! JetStream ack), exported over OTLP/HTTP (protobuf) as children of the event's
//! `traceparent` header.
//!
//! Off unless `[otlp] endpoint` is set; then only events that carry a valid `traceparent` get
//! a span (the parent's sampled flag is honoured), so events without trace context cost one
//! header lookup. Spans are batched and exported by the SDK's own background thread, off the
//! publish path; a collector that is down loses spans, never events.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use relay_core::message::{OutboundMessage, pg_time_to_system};
use relay_core::stage::{AckWatch, PubReceipt, PublishError, PublishHook, Settling};
use serde::{Deserialize, Serialize};

/// The span of one event.
pub const SPAN_NAME: &str = "outbox-relay publish";

/// The `[otlp]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSettings {
    /// OTLP/HTTP traces URL, used as is (e.g. `http://127.0.0.1:4318/v1/traces`). Unset: no
    /// spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `service.name` of the spans. Default `outbox-relay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// The exporter and tracer while spans are on; flushed and shut down when dropped.
#[derive(Debug)]
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Drop for Spans {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "could not flush the last OTLP spans");
        }
    }
}

impl OtlpSettings {
    /// The exporter, when `endpoint` is set.
    pub fn start(&self) -> anyhow::Result<Option<Arc<Spans>>> {
        let Some(endpoint) = &self.endpoint else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| anyhow::anyhow!("[otlp] endpoint `{endpoint}`: {e}"))?;
        let service = self.service_name.as_deref().unwrap_or("outbox-relay");
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service.to_owned())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("outbox-relay");
        tracing::info!(endpoint = %endpoint, "exporting spans over OTLP for events with a traceparent");
        Ok(Some(Arc::new(Spans { provider, tracer })))
    }
}

/// The span context of a W3C `traceparent` value (`00-<trace id>-<span id>-<flags>`), as a
/// remote parent; `None` when it is not one.
pub fn parent_of(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    let trace = TraceId::from_hex(trace)
        .ok()
        .filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span)
        .ok()
        .filter(|s| *s != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

/// A span per traced event, as a hook on the relay's publisher ([`PublishHook`]): each attempt
/// to publish an event that carries a `traceparent` gets a span from its commit to its answer.
#[derive(Debug, Clone)]
pub struct Tracing {
    spans: Arc<Spans>,
    stream: Arc<str>,
}

impl Tracing {
    /// The hook for the events published into `stream`, when `[otlp]` is on (`spans` set).
    /// Off, there is no hook: nothing is called or allocated per event.
    pub fn hook(spans: Option<Arc<Spans>>, stream: &str) -> Option<Arc<dyn PublishHook>> {
        let spans = spans?;
        Some(Arc::new(Self {
            spans,
            stream: stream.into(),
        }))
    }

    /// A span for `msg`, started at its commit, when it carries a traceparent.
    fn span(&self, msg: &OutboundMessage) -> Option<opentelemetry_sdk::trace::Span> {
        let parent = parent_of(msg.header(outbox_contract::HEADER_TRACEPARENT)?)?;
        let context = Context::new().with_remote_span_context(parent);
        let span = self
            .spans
            .tracer
            .span_builder(SPAN_NAME)
            .with_kind(SpanKind::Producer)
            .with_start_time(pg_time_to_system(msg.commit_time_micros))
            .with_attributes([
                KeyValue::new("messaging.system", "nats"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", msg.subject.clone()),
                KeyValue::new("messaging.message.id", msg.event_id.clone()),
                KeyValue::new("outbox.table", msg.table.to_string()),
                KeyValue::new("outbox.commit_lsn", msg.commit_lsn.to_string()),
                KeyValue::new("nats.stream", self.stream.to_string()),
            ])
            .start_with_context(&self.spans.tracer, &context);
        Some(span)
    }
}

impl PublishHook for Tracing {
    fn handing(&self, msg: &Arc<OutboundMessage>) -> Option<Box<dyn AckWatch>> {
        let span = self.span(msg)?;
        Some(Box::new(EventSpan(span)))
    }
}

/// The span of one attempt to publish an event.
struct EventSpan(opentelemetry_sdk::trace::Span);

impl AckWatch for EventSpan {
    fn sent(&mut self) {
        self.0
            .add_event_with_timestamp("published", SystemTime::now(), Vec::new());
    }

    fn settled<'a>(self: Box<Self>, outcome: &'a Result<PubReceipt, PublishError>) -> Settling<'a> {
        let mut span = self.0;
        match outcome {
            Ok(receipt) => {
                span.set_attribute(KeyValue::new(
                    "nats.stream.sequence",
                    i64::try_from(receipt.stream_seq).unwrap_or(i64::MAX),
                ));
                span.set_attribute(KeyValue::new("nats.duplicate", receipt.duplicate));
            }
            Err(e) => {
                span.set_status(opentelemetry::trace::Status::error(e.message.clone()));
            }
        }
        span.end();
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_as_w3c_or_not_at_all() {
        let parent =
            parent_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").expect("valid");
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        assert!(parent.is_sampled() && parent.is_remote());
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
            "00-xyz7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(parent_of(bad).is_none(), "{bad:?}");
        }
    }
}
