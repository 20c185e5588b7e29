//! `outbox-relay validate --connect`: a read-only preflight of everything `run` needs, one line
//! per check (`PASS`, `WARN` or `FAIL`), each failure with a `hint:` that fixes it.
//!
//! Exit code: 0 when nothing failed (warnings allowed); otherwise 65 when a check found a
//! data-safety problem (slot lost or ahead of the checkpoint), 69 when a server could not be
//! reached, 78 for anything else.

use std::fmt;

use async_nats::jetstream::{self, stream};
use relay_nats::{NatsError, subject_matches};
use relay_postgres::PgError;
use tokio_postgres::Client;

use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};
use crate::inspect::{self, StreamLookup};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail(ExitKind),
}

/// One preflight line.
#[derive(Debug, Clone)]
pub struct Check {
    pub verdict: Verdict,
    pub name: String,
    pub detail: String,
    pub hint: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail(_) => "FAIL",
        };
        write!(f, "{word}  {}: {}", self.name, self.detail)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n      hint: {hint}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Report(Vec<Check>);

impl Report {
    fn add(&mut self, verdict: Verdict, name: impl Into<String>, detail: impl Into<String>) {
        self.0.push(Check {
            verdict,
            name: name.into(),
            detail: detail.into(),
            hint: None,
        });
    }
    fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.add(Verdict::Pass, name, detail);
    }
    fn hinted(
        &mut self,
        verdict: Verdict,
        name: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.0.push(Check {
            verdict,
            name: name.into(),
            detail: detail.into(),
            hint: Some(hint.into()),
        });
    }
    fn fail(
        &mut self,
        name: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.hinted(Verdict::Fail(ExitKind::Config), name, detail, hint);
    }
}

const FAIL: Verdict = Verdict::Fail(ExitKind::Config);
const UNAVAILABLE: Verdict = Verdict::Fail(ExitKind::Unavailable);
const DATA_SAFETY: Verdict = Verdict::Fail(ExitKind::DataSafety);

/// Runs every check, prints one line each, and maps failures to an exit code.
pub async fn preflight(config: &RelayConfig) -> Result<(), Exit> {
    let mut report = Report::default();
    postgres_checks(config, &mut report).await;
    nats_checks(config, &mut report).await;
    let mut worst: Option<ExitKind> = None;
    for check in &report.0 {
        println!("{check}");
        if let Verdict::Fail(kind) = check.verdict {
            worst = Some(match (worst, kind) {
                (Some(ExitKind::DataSafety), _) | (_, ExitKind::DataSafety) => ExitKind::DataSafety,
                (Some(ExitKind::Unavailable), _) | (_, ExitKind::Unavailable) => {
                    ExitKind::Unavailable
                }
                _ => ExitKind::Config,
            });
        }
    }
    let failed = report
        .0
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Fail(_)))
        .count();
    match worst {
        None => {
            println!("preflight passed: {} checks", report.0.len());
            Ok(())
        }
        Some(kind) => Err(Exit::new(
            kind,
            anyhow::anyhow!("preflight failed: {failed} of {} checks", report.0.len()),
        )),
    }
}

async fn postgres_checks(config: &RelayConfig, r: &mut Report) {
    let pg = &config.postgres;
    let target = pg.display_target();
    let client = match relay_postgres::connect(pg).await {
        Ok(c) => c,
        Err(e) => {
            let verdict = if e.is_transient() { UNAVAILABLE } else { FAIL };
            r.hinted(
                verdict,
                "postgres connection",
                format!("{e}: {}", error_chain(&e)),
                "check postgres.url / RELAY_POSTGRES__URL, RELAY_POSTGRES__PASSWORD, pg_hba.conf and that the server is up",
            );
            return;
        }
    };
    r.pass("postgres connection", format!("connected to {target}"));
    if let Err(e) = catalog_checks(config, &client, r).await {
        r.hinted(
            UNAVAILABLE,
            "postgres catalog",
            format!("query failed: {e}"),
            "the connection broke during the preflight; run it again",
        );
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

async fn catalog_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let pg = &config.postgres;
    let row = client
        .query_one(
            "SELECT current_setting('wal_level'), current_database(), current_user, \
                    current_setting('max_replication_slots')::int, \
                    (SELECT count(*)::int FROM pg_replication_slots), \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*)::int FROM pg_stat_replication), \
                    current_setting('server_version')",
            &[],
        )
        .await?;
    let wal_level: String = row.get(0);
    let database: String = row.get(1);
    let user: String = row.get(2);
    let (max_slots, used_slots): (i32, i32) = (row.get(3), row.get(4));
    let (max_senders, used_senders): (i32, i32) = (row.get(5), row.get(6));
    let version: String = row.get(7);
    if wal_level == "logical" {
        r.pass("wal_level", format!("logical (PostgreSQL {version})"));
    } else {
        r.fail(
            "wal_level",
            format!("`{wal_level}`, logical replication needs `logical`"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        );
    }
    let slot_info = inspect::slot(client, &pg.slot).await?;
    if slot_info.is_some() || used_slots < max_slots {
        r.pass(
            "max_replication_slots",
            format!(
                "{used_slots} of {max_slots} in use{}",
                if slot_info.is_some() {
                    " (the relay's slot exists)"
                } else {
                    ""
                }
            ),
        );
    } else {
        r.fail(
            "max_replication_slots",
            format!("all {max_slots} in use, none free for slot `{}`", pg.slot),
            "raise max_replication_slots (ALTER SYSTEM SET max_replication_slots = ...; restart) or drop an unused slot: SELECT pg_drop_replication_slot('<name>')",
        );
    }
    if used_senders < max_senders {
        r.pass(
            "max_wal_senders",
            format!("{used_senders} of {max_senders} in use"),
        );
    } else {
        r.fail(
            "max_wal_senders",
            format!("all {max_senders} in use"),
            "raise max_wal_senders (ALTER SYSTEM SET max_wal_senders = ...; restart)",
        );
    }

    // Privileges.
    let row = client
        .query_one(
            "SELECT rolreplication OR rolsuper, \
                    has_database_privilege(current_database(), 'CREATE'), \
                    to_regclass('outbox_relay.checkpoint') IS NOT NULL \
             FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?;
    let (replication, create_db, checkpoint_table): (bool, bool, bool) =
        (row.get(0), row.get(1), row.get(2));
    if replication {
        r.pass("role replication", format!("role `{user}` has REPLICATION"));
    } else {
        r.fail(
            "role replication",
            format!("role `{user}` lacks REPLICATION"),
            format!("ALTER ROLE {user} WITH REPLICATION"),
        );
    }
    if checkpoint_table {
        let writable: bool = client
            .query_one(
                "SELECT has_table_privilege('outbox_relay.checkpoint', 'SELECT, INSERT, UPDATE')",
                &[],
            )
            .await?
            .get(0);
        if writable {
            r.pass(
                "checkpoint table",
                "outbox_relay.checkpoint exists and is writable",
            );
        } else {
            r.fail(
                "checkpoint table",
                format!("role `{user}` cannot write outbox_relay.checkpoint"),
                format!(
                    "GRANT USAGE ON SCHEMA outbox_relay TO {user}; GRANT SELECT, INSERT, UPDATE ON outbox_relay.checkpoint TO {user}"
                ),
            );
        }
    } else if create_db {
        r.pass(
            "checkpoint table",
            "outbox_relay.checkpoint missing; will be created at start (role has CREATE)",
        );
    } else {
        r.fail(
            "checkpoint table",
            format!("outbox_relay.checkpoint missing and role `{user}` lacks CREATE on `{database}`"),
            "apply migrations/0002_relay_checkpoint.sql as an owner, or run `outbox-relay setup` as one",
        );
    }

    // Outbox tables.
    let tables = config.tables();
    for (schema, table) in &tables {
        let name = format!("table {schema}.{table}");
        let row = client
            .query_opt(
                "SELECT has_table_privilege(c.oid, 'SELECT') FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
                &[schema, table],
            )
            .await?;
        match row.map(|r| r.get::<_, bool>(0)) {
            Some(true) => r.pass(name, "exists, readable"),
            Some(false) => r.fail(
                name,
                format!("role `{user}` lacks SELECT"),
                format!("GRANT SELECT ON {schema}.{table} TO {user}"),
            ),
            None => r.fail(
                name,
                format!("does not exist in database `{database}`"),
                PgError::TableMissing {
                    table: format!("{schema}.{table}"),
                    database: database.clone(),
                }
                .to_string(),
            ),
        }
    }

    // Publication.
    let publication = &pg.publication;
    let quoted = tables
        .iter()
        .map(|(s, t)| format!("{s}.{t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let found = client
        .query_opt(
            "SELECT pubinsert FROM pg_publication WHERE pubname = $1",
            &[publication],
        )
        .await?;
    let name = format!("publication {publication}");
    match found.map(|row| row.get::<_, bool>(0)) {
        None if pg.create_publication => r.pass(
            name,
            "missing; will be created at start (create_publication = true) or by `outbox-relay setup`",
        ),
        None => r.fail(
            name,
            "does not exist",
            PgError::PublicationMissing {
                publication: publication.clone(),
                tables: quoted,
            }
            .to_string(),
        ),
        Some(false) => r.fail(
            name,
            "does not publish inserts",
            PgError::PublicationNoInsert {
                publication: publication.clone(),
            }
            .to_string(),
        ),
        Some(true) => {
            r.pass(name.clone(), "exists, publishes inserts");
            for (schema, table) in &tables {
                let member = client
                    .query_opt(
                        "SELECT 1 FROM pg_publication_tables \
                         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                        &[publication, schema, table],
                    )
                    .await?;
                let check = format!("{name} has {schema}.{table}");
                if member.is_some() {
                    r.pass(check, "member");
                } else {
                    r.fail(
                        check,
                        "not in the publication",
                        PgError::PublicationMissingTable {
                            publication: publication.clone(),
                            table: format!("{schema}.{table}"),
                        }
                        .to_string(),
                    );
                }
            }
        }
    }

    // Slot, against the stored checkpoint.
    let checkpoint = inspect::checkpoint(client, &pg.slot).await?;
    let name = format!("slot {}", pg.slot);
    let slot = &pg.slot;
    let Some(info) = slot_info else {
        match checkpoint {
            Some((lsn, _)) => r.hinted(
                DATA_SAFETY,
                name,
                format!("missing, but a checkpoint {lsn} is stored for it: the slot was dropped or lost"),
                "docs/operations.md, \"Slot lost\": reconcile from the outbox table, then DELETE FROM outbox_relay.checkpoint WHERE slot_name = '<slot>'",
            ),
            None if pg.create_slot => r.pass(
                name,
                "missing; will be created at start (create_slot = true) or by `outbox-relay setup`",
            ),
            None => r.fail(
                name,
                "does not exist",
                PgError::SlotMissing { slot: slot.clone() }.to_string(),
            ),
        }
        return Ok(());
    };
    if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
        r.fail(
            name.clone(),
            format!(
                "{} slot with plugin {:?}",
                info.slot_type,
                info.plugin.as_deref().unwrap_or("none")
            ),
            "the relay needs a logical slot with plugin pgoutput: use another postgres.slot name",
        );
    } else if info.database.as_deref() != Some(database.as_str()) {
        r.fail(
            name.clone(),
            format!(
                "belongs to database {:?}, not {database:?}",
                info.database.as_deref().unwrap_or("")
            ),
            "point postgres.url at that database or use another postgres.slot name",
        );
    } else {
        r.pass(
            name.clone(),
            format!("logical, pgoutput, database {database}"),
        );
    }
    match info.wal_status.as_deref() {
        Some("lost") => r.hinted(
            DATA_SAFETY,
            format!("{name} wal_status"),
            "lost: invalidated, WAL it needed was removed (max_slot_wal_keep_size)",
            "docs/operations.md, \"Slot lost\"",
        ),
        Some("unreserved") => r.hinted(
            Verdict::Warn,
            format!("{name} wal_status"),
            "unreserved: the slot is about to be invalidated",
            "start the relay now, or raise max_slot_wal_keep_size",
        ),
        other => r.pass(
            format!("{name} wal_status"),
            other.unwrap_or("unknown").to_owned(),
        ),
    }
    match info.active_pid {
        Some(pid) => r.fail(
            format!("{name} active"),
            format!("streaming to another process (pid {pid})"),
            format!(
                "another relay (or client) is reading this slot: stop it, or SELECT pg_terminate_backend({pid})"
            ),
        ),
        None => r.pass(format!("{name} active"), "not in use by another process"),
    }
    match (checkpoint, info.confirmed_flush_lsn) {
        (Some((stored, _)), Some(slot_lsn)) if slot_lsn > stored => r.hinted(
            DATA_SAFETY,
            format!("{name} position"),
            format!("slot at {slot_lsn} is ahead of the checkpoint {stored}"),
            PgError::SlotAhead {
                slot: slot.clone(),
                slot_lsn,
                checkpoint: stored,
            }
            .to_string(),
        ),
        (Some((stored, _)), Some(slot_lsn)) => r.pass(
            format!("{name} position"),
            format!("slot at {slot_lsn}, checkpoint {stored}"),
        ),
        (None, Some(slot_lsn)) => r.pass(
            format!("{name} position"),
            format!("slot at {slot_lsn}, no checkpoint yet (first start)"),
        ),
        (_, None) => {}
    }
    Ok(())
}

async fn nats_checks(config: &RelayConfig, r: &mut Report) {
    let nats = &config.nats;
    let client = match relay_nats::connect(nats).await {
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
    r.pass("nats connection", format!("connected to {}", nats.url));
    // The account info request itself (not `query_account`, whose reply parsing differs
    // across server versions): any JSON without `error` means JetStream answers.
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client.request("$JS.API.INFO", Default::default()),
    )
    .await;
    let problem = match answer {
        Err(_) => Some("no answer within 5s".to_owned()),
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
                url: nats.url.clone(),
                reason,
            }
            .to_string(),
        );
        return;
    }
    let context = jetstream::new(client);
    let name = format!("stream {}", nats.stream);
    let info = match inspect::stream(&context, &nats.stream).await {
        StreamLookup::Found(info) => info,
        StreamLookup::NotFound if nats.create_stream => {
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
    if c.storage == stream::StorageType::File {
        r.pass(format!("{name} storage"), "file");
    } else {
        r.hinted(
            Verdict::Warn,
            format!("{name} storage"),
            "memory: acknowledged events are lost when nats-server restarts",
            format!(
                "recreate the stream with file storage: nats stream add {} --storage file ...",
                nats.stream
            ),
        );
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
