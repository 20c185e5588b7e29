//! `outbox-relay tail`: read the stream back with an ephemeral ordered consumer and print each
//! message, to see events arrive (Quick start) or inspect what the relay published.

use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt;

use crate::exit::{Failure, FailureKind};
use relay_runtime::config::RelayConfig;

/// Prints up to `count` messages, stopping after `idle_timeout` without one.
pub async fn tail(
    config: &RelayConfig,
    count: usize,
    idle_timeout: Duration,
) -> Result<(), Failure> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    let context = nats.jetstream().context().clone();
    let stream = context.get_stream(&config.nats.stream).await.map_err(|e| {
        Failure::new(
            FailureKind::Config,
            anyhow::Error::new(e).context(format!("stream {}", config.nats.stream)),
        )
    })?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, anyhow::Error::new(e)))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, anyhow::Error::new(e)))?;
    let mut seen = 0;
    while seen < count {
        let next = match tokio::time::timeout(idle_timeout, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => {
                return Err(Failure::new(
                    FailureKind::Unavailable,
                    anyhow::Error::new(e),
                ));
            }
            Ok(None) | Err(_) => break,
        };
        seen += 1;
        let seq = next.info().map(|i| i.stream_sequence).unwrap_or_default();
        println!("#{seq} {}", next.subject);
        if let Some(headers) = &next.headers {
            let mut lines: Vec<String> = headers
                .iter()
                .map(|(k, v)| {
                    format!(
                        "  {}: {}",
                        k,
                        v.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            lines.sort();
            for line in lines {
                println!("{line}");
            }
        }
        println!("  {}", String::from_utf8_lossy(&next.payload));
    }
    eprintln!("{seen} message(s)");
    Ok(())
}
