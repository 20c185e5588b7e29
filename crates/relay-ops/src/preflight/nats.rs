//! The NATS half of the preflight: connection, JetStream and the stream's settings.
//!
//! Three gates, each stopping the checks when it fails (no connection, no JetStream, no
//! stream), then [`STREAM_CHECKS`]: one entry per aspect of the existing stream, judged from
//! the [`StreamFacts`] read once. Adding a stream check is adding an entry.

use async_nats::jetstream::stream;
use relay_core::check::CheckAspect as _;
use relay_nats::{Durability, NatsConnection, NatsError, subject_matches};

use super::{Report, UNAVAILABLE, Verdict, error_chain};
use relay_runtime::config::RelayConfig;
use relay_runtime::inspect::{self, StreamLookup};

pub(super) async fn nats_checks(config: &RelayConfig, r: &mut Report) {
    let Some(connection) = connection_check(config, r).await else {
        return;
    };
    inbox_check(config, r);
    if !jetstream_check(config, &connection, r).await {
        return;
    }
    let name = format!("stream {}", config.nats.stream);
    let Some(info) = stream_check(config, &connection, &name, r).await else {
        return;
    };
    // Storage, replicas, persist mode and the servers' disk sync: one assessment (shared with
    // `status` and the start-up log).
    let durability = relay_nats::assess_durability(&connection.jetstream(), &info).await;
    let facts = StreamFacts {
        config,
        connection: &connection,
        name,
        stream: &info.config,
        durability,
    };
    for check in STREAM_CHECKS {
        check(&facts, r);
    }
}

/// What the checks of an existing stream judge.
struct StreamFacts<'a> {
    config: &'a RelayConfig,
    connection: &'a NatsConnection,
    /// `stream <name>`, the start of every line.
    name: String,
    stream: &'a stream::Config,
    durability: Durability,
}

/// Judges one aspect of an existing stream, in lines named `stream <name> …`.
type StreamCheck = fn(&StreamFacts<'_>, &mut Report);

/// The checks of an existing stream, in the order they are reported.
const STREAM_CHECKS: &[StreamCheck] = &[
    subject_checks,
    |f, r| native_header_checks(f.config, f.connection, f.stream, &f.name, r),
    durability_checks,
    discard_check,
    duplicate_window_check,
];

/// The first gate: a connection to `nats.url`.
async fn connection_check(config: &RelayConfig, r: &mut Report) -> Option<NatsConnection> {
    let nats = &config.nats;
    match relay_nats::connect(nats).await {
        Ok(c) => {
            r.pass(
                "nats connection",
                format!("connected to {}", nats.display_url()),
            );
            Some(c)
        }
        Err(e) => {
            r.hinted(
                UNAVAILABLE,
                "nats connection",
                format!("{e}: {}", error_chain(&e)),
                "check nats.url / RELAY_NATS__URL and the credentials, and that nats-server is up",
            );
            None
        }
    }
}

/// Whose answers the relay can take for JetStream's: on the shared `_INBOX` prefix, any user of
/// the account that sees the outbox subjects and may publish there can answer first.
fn inbox_check(config: &RelayConfig, r: &mut Report) {
    let prefix = config.nats.inbox_prefix();
    if prefix == relay_nats::SHARED_INBOX_PREFIX {
        r.hinted(
            Verdict::Warn,
            "nats inbox_prefix",
            format!(
                "`{prefix}`, shared by every client of the account: a user that may subscribe to the outbox subjects and publish to `{prefix}.>` can answer a publish in JetStream's place"
            ),
            "set [nats] inbox_prefix to a prefix of the relay's own and let only the relay's user subscribe to it and no user publish to it (docs/security.md, \"Who else may use the account\")",
        );
    } else {
        r.pass(
            "nats inbox_prefix",
            format!("`{prefix}` (private when only the relay's user may subscribe to `{prefix}.>` and no user may publish to it)"),
        );
    }
}

/// The second gate: JetStream answers (in `[nats] domain`'s JetStream, if one is set).
async fn jetstream_check(
    config: &RelayConfig,
    connection: &NatsConnection,
    r: &mut Report,
) -> bool {
    let nats = &config.nats;
    // The account info request itself (not `query_account`, whose reply parsing differs
    // across server versions): any JSON without `error` means JetStream answers.
    let info_subject = format!("{}.INFO", relay_nats::api_prefix(nats.domain.as_deref()));
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        connection
            .client()
            .request(info_subject, Default::default()),
    )
    .await;
    let reason = match answer {
        Err(_) => "no answer within 5s".to_owned(),
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
            return false;
        }
        Ok(Err(e)) => e.to_string(),
        Ok(Ok(msg)) => match serde_json::from_slice::<serde_json::Value>(&msg.payload) {
            Ok(doc) if doc.get("error").is_none() => {
                r.pass(
                    "jetstream",
                    format!("enabled ({} streams in the account)", doc["streams"]),
                );
                return true;
            }
            Ok(doc) => doc["error"]["description"].to_string(),
            Err(e) => format!("unreadable answer: {e}"),
        },
    };
    r.fail(
        "jetstream",
        format!("not available: {reason}"),
        NatsError::JetStreamUnavailable {
            url: nats.display_url(),
            reason,
        }
        .to_string(),
    );
    false
}

/// The third gate: the stream exists. A stream the relay will create passes, after the check
/// of the settings it will be created with.
async fn stream_check(
    config: &RelayConfig,
    connection: &NatsConnection,
    name: &str,
    r: &mut Report,
) -> Option<Box<stream::Info>> {
    let nats = &config.nats;
    match inspect::stream(connection.jetstream().context(), &nats.stream).await {
        StreamLookup::Found(info) => {
            r.pass(
                name,
                format!("exists, subjects [{}]", info.config.subjects.join(", ")),
            );
            Some(info)
        }
        StreamLookup::NotFound if nats.create_stream => {
            // Created with the settings the mappings need: only the server's version can fail.
            let created = stream::Config {
                name: nats.stream.clone(),
                allow_message_ttl: true,
                allow_message_schedules: true,
                ..Default::default()
            };
            native_header_checks(config, connection, &created, name, r);
            r.pass(
                name,
                "missing; will be created at start (create_stream = true) or by `outbox-relay setup --create-stream`",
            );
            None
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
            None
        }
        StreamLookup::NotEnabled(e) | StreamLookup::Failed(e) => {
            r.hinted(
                UNAVAILABLE,
                name,
                format!("lookup failed: {e}"),
                "run again",
            );
            None
        }
    }
}

/// Whether the stream captures each table's subjects, as far as a sample subject shows.
fn subject_checks(f: &StreamFacts<'_>, r: &mut Report) {
    let (config, name, subjects) = (f.config, &f.name, &f.stream.subjects);
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
        if subjects.iter().any(|f| subject_matches(f, &subject)) {
            r.pass(check, format!("subjects of {table}"));
        } else {
            r.fail(
                check,
                format!("no stream subject matches subjects of {table}"),
                NatsError::SubjectNotCaptured {
                    subject,
                    table,
                    stream: config.nats.stream.clone(),
                    stream_subjects: subjects.join(", "),
                }
                .to_string(),
            );
        }
    }
}

fn durability_checks(f: &StreamFacts<'_>, r: &mut Report) {
    for check in f.durability.checks() {
        r.assessed(format!("{} {}", f.name, check.aspect.name()), check);
    }
}

fn discard_check(f: &StreamFacts<'_>, r: &mut Report) {
    let c = f.stream;
    let check = format!("{} discard", f.name);
    let limited = c.max_messages > 0 || c.max_bytes > 0 || !c.max_age.is_zero();
    if limited && c.discard == stream::DiscardPolicy::Old {
        r.hinted(
            Verdict::Warn,
            check,
            "limits with `discard: old`: old events are evicted silently",
            format!(
                "nats stream edit {} --discard new (publishes are refused when full instead)",
                f.config.nats.stream
            ),
        );
    } else {
        r.pass(
            check,
            format!(
                "{:?}{}",
                c.discard,
                if limited { "" } else { " (no limits)" }
            )
            .to_lowercase(),
        );
    }
}

fn duplicate_window_check(f: &StreamFacts<'_>, r: &mut Report) {
    let window = f.stream.duplicate_window;
    let check = format!("{} duplicate_window", f.name);
    let fix = format!("nats stream edit {} --dupe-window 2m", f.config.nats.stream);
    let shown = humantime_serde::re::humantime::format_duration(window);
    if window.is_zero() {
        r.fail(check, "0: re-sent events are stored twice", fix);
    } else if window < std::time::Duration::from_secs(60) {
        r.hinted(
            Verdict::Warn,
            check,
            format!("{shown}: a relay restart slower than this re-sends as new messages"),
            fix,
        );
    } else {
        r.pass(check, shown.to_string());
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
