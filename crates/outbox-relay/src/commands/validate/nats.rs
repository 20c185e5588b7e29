//! The NATS half of the preflight: connection, JetStream and the stream's settings.

use async_nats::jetstream::stream;
use relay_core::check::CheckAspect as _;
use relay_nats::{NatsError, subject_matches};

use super::{Report, UNAVAILABLE, Verdict, error_chain};
use crate::config::RelayConfig;
use crate::inspect::{self, StreamLookup};

pub(super) async fn nats_checks(config: &RelayConfig, r: &mut Report) {
    let nats = &config.nats;
    let connection = match relay_nats::connect(nats).await {
        Ok(c) => c,
        Err(e) => {
            r.hinted(
                UNAVAILABLE,
                "nats connection",
                format!("{e}: {}", error_chain(&e)),
                "check nats.url / RELAY_NATS__URL and the credentials, and that nats-server is up",
            );
            return;
        }
    };
    r.pass(
        "nats connection",
        format!("connected to {}", nats.display_url()),
    );
    // The account info request itself (not `query_account`, whose reply parsing differs
    // across server versions): any JSON without `error` means JetStream answers.
    // In `[nats] domain`'s JetStream, if one is set.
    let info_subject = format!("{}.INFO", relay_nats::api_prefix(nats.domain.as_deref()));
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        connection
            .client()
            .request(info_subject, Default::default()),
    )
    .await;
    let problem = match answer {
        Err(_) => Some("no answer within 5s".to_owned()),
        Ok(Err(e))
            if e.kind() == async_nats::RequestErrorKind::NoResponders
                && let Some(domain) = &nats.domain =>
        {
            r.fail(
                "jetstream",
                format!("no JetStream answers in domain `{domain}` (no responders)"),
                format!(
                    "set [nats] domain to the `domain` of the jetstream {{ }} block of the servers holding stream {stream} (a leaf node reaches the hub's domain only over a working leafnode connection), or remove it when the stream is in the JetStream of the server at nats.url",
                    stream = nats.stream
                ),
            );
            return;
        }
        Ok(Err(e)) => Some(e.to_string()),
        Ok(Ok(msg)) => match serde_json::from_slice::<serde_json::Value>(&msg.payload) {
            Ok(doc) if doc.get("error").is_none() => {
                r.pass(
                    "jetstream",
                    format!("enabled ({} streams in the account)", doc["streams"]),
                );
                None
            }
            Ok(doc) => Some(doc["error"]["description"].to_string()),
            Err(e) => Some(format!("unreadable answer: {e}")),
        },
    };
    if let Some(reason) = problem {
        r.fail(
            "jetstream",
            format!("not available: {reason}"),
            NatsError::JetStreamUnavailable {
                url: nats.display_url(),
                reason,
            }
            .to_string(),
        );
        return;
    }
    let jetstream = connection.jetstream();
    let name = format!("stream {}", nats.stream);
    let info = match inspect::stream(jetstream.context(), &nats.stream).await {
        StreamLookup::Found(info) => info,
        StreamLookup::NotFound if nats.create_stream => {
            // Created with the settings the mappings need: only the server's version can fail.
            let created = stream::Config {
                name: nats.stream.clone(),
                allow_message_ttl: true,
                allow_message_schedules: true,
                ..Default::default()
            };
            native_header_checks(config, &connection, &created, &name, r);
            r.pass(
                name,
                "missing; will be created at start (create_stream = true) or by `outbox-relay setup --create-stream`",
            );
            return;
        }
        StreamLookup::NotFound => {
            r.fail(
                name,
                "does not exist",
                NatsError::StreamMissing {
                    stream: nats.stream.clone(),
                    subjects: nats.stream_subjects.join(","),
                }
                .to_string(),
            );
            return;
        }
        StreamLookup::NotEnabled(e) | StreamLookup::Failed(e) => {
            r.hinted(
                UNAVAILABLE,
                name,
                format!("lookup failed: {e}"),
                "run again",
            );
            return;
        }
    };
    let c = &info.config;
    r.pass(
        name.clone(),
        format!("exists, subjects [{}]", c.subjects.join(", ")),
    );
    for (table, template) in config.unsampled_subjects() {
        r.hinted(
            Verdict::Warn,
            format!("{name} captures {template}"),
            format!("cannot be checked: the template of {table} starts with a column"),
            config.unsampled_warning(&table, &template),
        );
    }
    for (table, subject) in config.sample_subjects() {
        let check = format!("{name} captures {subject}");
        if c.subjects.iter().any(|f| subject_matches(f, &subject)) {
            r.pass(check, format!("subjects of {table}"));
        } else {
            r.fail(
                check,
                format!("no stream subject matches subjects of {table}"),
                NatsError::SubjectNotCaptured {
                    subject,
                    table,
                    stream: nats.stream.clone(),
                    stream_subjects: c.subjects.join(", "),
                }
                .to_string(),
            );
        }
    }
    native_header_checks(config, &connection, c, &name, r);
    // Storage, replicas, persist mode and the servers' disk sync: one assessment (shared with
    // `status` and the start-up log).
    let durability = relay_nats::assess_durability(&jetstream, &info).await;
    for check in durability.checks() {
        let line = format!("{name} {}", check.aspect.name());
        match check.hint {
            None => r.pass(line, check.detail),
            Some(hint) => r.hinted(Verdict::Warn, line, check.detail, hint),
        }
    }
    let limited = c.max_messages > 0 || c.max_bytes > 0 || !c.max_age.is_zero();
    if limited && c.discard == stream::DiscardPolicy::Old {
        r.hinted(
            Verdict::Warn,
            format!("{name} discard"),
            "limits with `discard: old`: old events are evicted silently",
            format!(
                "nats stream edit {} --discard new (publishes are refused when full instead)",
                nats.stream
            ),
        );
    } else {
        r.pass(
            format!("{name} discard"),
            format!(
                "{:?}{}",
                c.discard,
                if limited { "" } else { " (no limits)" }
            )
            .to_lowercase(),
        );
    }
    let window = c.duplicate_window;
    if window.is_zero() {
        r.fail(
            format!("{name} duplicate_window"),
            "0: re-sent events are stored twice",
            format!("nats stream edit {} --dupe-window 2m", nats.stream),
        );
    } else if window < std::time::Duration::from_secs(60) {
        r.hinted(
            Verdict::Warn,
            format!("{name} duplicate_window"),
            format!(
                "{}: a relay restart slower than this re-sends as new messages",
                humantime_serde::re::humantime::format_duration(window)
            ),
            format!("nats stream edit {} --dupe-window 2m", nats.stream),
        );
    } else {
        r.pass(
            format!("{name} duplicate_window"),
            humantime_serde::re::humantime::format_duration(window).to_string(),
        );
    }
}

/// `ttl_column` / `schedule_column`: the server's version and the stream's settings, as the
/// relay checks them at start.
fn native_header_checks(
    config: &RelayConfig,
    connection: &relay_nats::NatsConnection,
    stream_config: &stream::Config,
    name: &str,
    r: &mut Report,
) {
    let needs = config.broker_needs();
    if needs.is_empty() {
        return;
    }
    let version = connection.client().server_info().version;
    let check = format!("{name} native headers");
    match relay_nats::check_broker_needs(&version, stream_config, &needs) {
        Ok(()) => {
            let columns: Vec<String> = needs
                .iter()
                .map(|n| format!("{} {}", n.table, n.column))
                .collect();
            r.pass(
                check,
                format!(
                    "nats-server {version} and the stream honour them ({})",
                    columns.join(", ")
                ),
            );
        }
        Err(NatsError::BrokerFeature { problem, fix }) => r.fail(check, problem, fix),
        Err(e) => r.fail(check, e.to_string(), "see the error"),
    }
}
