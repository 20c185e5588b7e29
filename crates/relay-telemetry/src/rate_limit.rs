//! A log layer that limits repeated warnings and errors per call site.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lock;

/// Lets at most `burst` WARN/ERROR events per log statement through every `window`; the rest
/// are dropped, so an outage does not flood the log. INFO and below are not limited.
#[derive(Debug)]
pub struct RateLimit {
    window: Duration,
    burst: u32,
    seen: Mutex<HashMap<tracing::callsite::Identifier, (Instant, u32)>>,
}

impl RateLimit {
    /// A limiter of `burst` events per `window` per call site.
    pub fn new(window: Duration, burst: u32) -> Self {
        Self {
            window,
            burst,
            seen: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RateLimit {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let meta = event.metadata();
        if *meta.level() > tracing::Level::WARN {
            return true;
        }
        let now = Instant::now();
        let mut seen = lock(&self.seen);
        let entry = seen.entry(meta.callsite()).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        entry.1 += 1;
        entry.1 <= self.burst
    }
}
