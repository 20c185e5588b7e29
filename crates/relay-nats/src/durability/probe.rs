//! Asking the servers for their sync setting: `$SYS.REQ.SERVER.PING.JSZ`, answered by every
//! server the relay's account reaches through an import from the system account.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use serde::Deserialize;

use super::{LazyServer, PROBE_TIMEOUT, SYNC_PROBE_SUBJECT, ServerSync, duration};
use crate::connection::JetStream;

/// Without the stream's server names, how long to wait for more answers after the first one.
const PROBE_GRACE: Duration = Duration::from_millis(300);
/// Before 2.10 nats-server synced every minute and could not be told otherwise.
const LEGACY_SYNC_INTERVAL: Duration = Duration::from_secs(60);

/// One server's answer to [`SYNC_PROBE_SUBJECT`].
#[derive(Debug, Deserialize)]
pub(super) struct JszAnswer {
    server: JszServer,
    #[serde(default)]
    data: Option<JszData>,
}

#[derive(Debug, Deserialize)]
struct JszServer {
    name: String,
    #[serde(default)]
    ver: String,
}

#[derive(Debug, Default, Deserialize)]
struct JszData {
    #[serde(default)]
    config: JszConfig,
}

/// nats-server's `JetStreamConfig`: `sync_interval` is a Go duration in nanoseconds; both
/// fields exist since 2.10 and are left out when zero.
#[derive(Debug, Clone, Default, Deserialize)]
struct JszConfig {
    #[serde(default)]
    sync_always: bool,
    #[serde(default)]
    sync_interval: Option<u64>,
}

/// What one server said about its sync setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ServerSetting {
    Always,
    Every {
        interval: Duration,
        configurable: bool,
    },
    Unreported,
}

pub(super) fn version_before_2_10(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    major < 2 || (major == 2 && minor < 10)
}

pub(super) fn server_setting(answer: &JszAnswer) -> ServerSetting {
    let config = answer
        .data
        .as_ref()
        .map(|d| d.config.clone())
        .unwrap_or_default();
    if config.sync_always {
        ServerSetting::Always
    } else if let Some(ns) = config.sync_interval.filter(|ns| *ns > 0) {
        ServerSetting::Every {
            interval: Duration::from_nanos(ns),
            configurable: true,
        }
    } else if version_before_2_10(&answer.server.ver) {
        ServerSetting::Every {
            interval: LEGACY_SYNC_INTERVAL,
            configurable: false,
        }
    } else {
        ServerSetting::Unreported
    }
}

/// Asks every server for its JetStream configuration and judges the ones holding the stream
/// (`expected`; all that answer when the stream info named none).
pub(super) async fn probe_sync(jetstream: &JetStream, expected: &[String]) -> ServerSync {
    let unknown = |reason: String| ServerSync::Unknown { reason };
    let client = jetstream.context().client();
    let inbox = client.new_inbox();
    let mut answers = match client.subscribe(inbox.clone()).await {
        Ok(s) => s,
        Err(e) => return unknown(format!("cannot subscribe for the answer: {e}")),
    };
    if let Err(e) = client
        .publish_with_reply(SYNC_PROBE_SUBJECT, inbox, bytes::Bytes::new())
        .await
    {
        return unknown(format!("cannot ask {SYNC_PROBE_SUBJECT}: {e}"));
    }
    // Sends it now, so a permission error comes back now.
    let _ = client.flush().await;
    let started = tokio::time::Instant::now();
    let mut deadline = started + PROBE_TIMEOUT;
    let mut settings: BTreeMap<String, (String, ServerSetting)> = BTreeMap::new();
    loop {
        if !expected.is_empty() && expected.iter().all(|n| settings.contains_key(n)) {
            break;
        }
        if jetstream
            .state()
            .publish_denied(SYNC_PROBE_SUBJECT)
            .is_some()
        {
            return unknown(format!(
                "the relay's NATS user may not publish to {SYNC_PROBE_SUBJECT}"
            ));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let wait = (deadline - now).min(Duration::from_millis(50));
        match tokio::time::timeout(wait, answers.next()).await {
            Err(_) => {}
            Ok(None) => break,
            Ok(Some(msg)) => {
                if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                    if settings.is_empty() {
                        return unknown(format!(
                            "no answer on {SYNC_PROBE_SUBJECT}: the relay's account does not import it from the system account"
                        ));
                    }
                    continue;
                }
                if let Ok(answer) = serde_json::from_slice::<JszAnswer>(&msg.payload) {
                    let setting = server_setting(&answer);
                    settings.insert(answer.server.name, (answer.server.ver, setting));
                    if expected.is_empty() {
                        deadline = deadline.min(tokio::time::Instant::now() + PROBE_GRACE);
                    }
                }
            }
        }
    }
    let _ = answers.unsubscribe().await;
    judge(expected, &settings)
}

pub(super) fn judge(
    expected: &[String],
    settings: &BTreeMap<String, (String, ServerSetting)>,
) -> ServerSync {
    let names: Vec<String> = if expected.is_empty() {
        settings.keys().cloned().collect()
    } else {
        expected.to_vec()
    };
    if names.is_empty() {
        return ServerSync::Unknown {
            reason: format!(
                "no server answered {SYNC_PROBE_SUBJECT} within {}",
                duration(PROBE_TIMEOUT)
            ),
        };
    }
    let mut lazy = Vec::new();
    let mut missing = Vec::new();
    let mut unreported = Vec::new();
    for name in &names {
        match settings.get(name) {
            None => missing.push(name.clone()),
            Some((
                version,
                ServerSetting::Every {
                    interval,
                    configurable,
                },
            )) => lazy.push(LazyServer {
                name: name.clone(),
                version: version.clone(),
                interval: *interval,
                configurable: *configurable,
            }),
            Some((version, ServerSetting::Unreported)) => {
                unreported.push(format!("{name} (nats-server {version})"));
            }
            Some((_, ServerSetting::Always)) => {}
        }
    }
    if !lazy.is_empty() {
        ServerSync::Interval { servers: lazy }
    } else if !missing.is_empty() {
        ServerSync::Unknown {
            reason: format!(
                "no answer on {SYNC_PROBE_SUBJECT} from {} within {}",
                missing.join(", "),
                duration(PROBE_TIMEOUT)
            ),
        }
    } else if !unreported.is_empty() {
        ServerSync::Unknown {
            reason: format!("{} does not report it", unreported.join(", ")),
        }
    } else {
        ServerSync::Always { servers: names }
    }
}
