//! The PostgreSQL half of the preflight: connection, server settings, privileges, outbox
//! tables, publication and slot.

use relay_core::check::CheckAspect as _;
use relay_postgres::PgError;
use relay_postgres::checkpoint::TableAccess;
use tokio_postgres::Client;

mod cleanup;
use cleanup::cleanup_checks;

use super::{DATA_SAFETY, FAIL, Report, UNAVAILABLE, Verdict, error_chain};
use crate::config::RelayConfig;
use relay_postgres::PostgresSettings;
use relay_postgres::catalog;
use relay_postgres::catalog::failover;
use relay_postgres::catalog::partitions::{self, Membership};
use relay_postgres::catalog::retention::{self, SHORT_SAMPLE, TakeoverPolicy};

pub(super) async fn postgres_checks(config: &RelayConfig, r: &mut Report) {
    let pg = &config.postgres;
    let target = pg.display_target();
    let (client, server) = match relay_postgres::connect_primary(pg).await {
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
    if server.is_pinned() {
        r.pass(
            "postgres connection",
            format!(
                "connected to {}, the read-write server of {target}",
                server.display_target()
            ),
        );
    } else {
        r.pass("postgres connection", format!("connected to {target}"));
    }
    if let Err(e) = catalog_checks(config, &client, r).await {
        r.hinted(
            UNAVAILABLE,
            "postgres catalog",
            format!("query failed: {e}"),
            "the connection broke during the preflight; run it again",
        );
        return;
    }
    let in_recovery = match failover_checks(config, &client, "", r).await {
        Ok(in_recovery) => in_recovery,
        Err(e) => {
            r.hinted(
                Verdict::Warn,
                "failover",
                format!("cannot read what failover needs: {e}"),
                "run the preflight again; the settings are in pg_settings and pg_replication_slots",
            );
            false
        }
    };
    standby_checks(config, &server, r).await;
    if in_recovery {
        r.pass(
            "retention",
            "not measured on a standby (in recovery): run the preflight against the primary",
        );
        return;
    }
    if let Err(e) = retention_checks(config, &client, r).await {
        r.hinted(
            Verdict::Warn,
            "retention",
            format!("cannot read the retention window: {e}"),
            "run the preflight again; the numbers are in pg_settings and pg_replication_slots",
        );
    }
}

/// What a failover needs (docs/operations.md, "Failover"), from `relay_postgres::catalog::failover`:
/// on a primary the slot's failover flag, `synchronized_standby_slots` and the standbys it sees;
/// on a standby (`pg_is_in_recovery()`) the settings slot synchronization needs and the
/// synchronized slot. Lines are named `failover …`, after `prefix` (a standby's address).
/// Returns whether the server is a standby.
async fn failover_checks(
    config: &RelayConfig,
    client: &Client,
    prefix: &str,
    r: &mut Report,
) -> Result<bool, tokio_postgres::Error> {
    let pg = &config.postgres;
    let facts = failover::facts(client, &pg.slot).await?;
    let database = catalog::current_database(client).await?;
    match failover::assess(&facts, pg.failover, &pg.slot, &database) {
        Ok(checks) => {
            for check in checks {
                let name = format!("{prefix}failover {}", check.aspect.name());
                match check.hint {
                    None => r.pass(name, check.detail),
                    Some(hint) => r.hinted(Verdict::Warn, name, check.detail, hint),
                }
            }
        }
        // postgres.failover = true on a server without failover slots: `run` refuses it.
        Err(e) => r.fail(
            format!("{prefix}failover failover slot"),
            "postgres.failover = true, but this server has no failover slots",
            e.to_string(),
        ),
    }
    Ok(facts.in_recovery)
}

/// The other hosts of a multi-host `postgres.url`: each checked as a failover target (a
/// standby), as far as it can be reached. Never a failure: the relay runs on the primary.
async fn standby_checks(config: &RelayConfig, primary: &PostgresSettings, r: &mut Report) {
    let Ok(hosts) = config.postgres.each_host() else {
        return;
    };
    for host in hosts {
        let target = host.display_target();
        if target == primary.display_target() {
            continue;
        }
        let prefix = format!("{target}: ");
        match relay_postgres::connect(&host).await {
            Ok(client) => {
                if let Err(e) = failover_checks(config, &client, &prefix, r).await {
                    r.hinted(
                        Verdict::Warn,
                        format!("{prefix}failover"),
                        format!("cannot read what failover needs: {e}"),
                        "run the preflight against that server",
                    );
                }
            }
            Err(e) => r.hinted(
                Verdict::Warn,
                format!("{prefix}connection"),
                format!("{e}: {}", error_chain(&e)),
                "a host of postgres.url the relay would turn to after a failover is not reachable now; check it before you need it",
            ),
        }
    }
}

/// How long a stopped relay has before the slot is invalidated, at the WAL rate of a short
/// sample (docs/operations.md, "Retention window"): the numbers, then one line per aspect,
/// warnings with a hint. Never a failure: the relay can run, but an outage may cost the slot.
async fn retention_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let policy = TakeoverPolicy {
        budget: config.relay.takeover_budget,
        reconnect_max: config.relay.reconnect_max,
    };
    let window = retention::measure(client, &config.postgres.slot, SHORT_SAMPLE, policy).await?;
    r.pass("retention", window.numbers());
    for check in window.checks() {
        match check.hint {
            None => r.pass(check.aspect.name(), check.detail),
            Some(hint) => r.hinted(Verdict::Warn, check.aspect.name(), check.detail, hint),
        }
    }
    // The WAL kept for `outbox-relay restore` ([relay] replay_retention).
    let replay = relay_postgres::checkpoint::replay_window(client, &config.postgres.slot).await?;
    let setting = config
        .relay
        .replay_retention
        .map_or_else(|| "not set".to_owned(), |r| r.to_string());
    match replay.warning(config.relay.replay_retention_bytes()) {
        None => r.pass(
            "replay window",
            format!("replay_retention {setting}; {}", replay.summary()),
        ),
        Some((detail, hint)) => r.hinted(
            Verdict::Warn,
            "replay window",
            format!("{detail}; {}", replay.summary()),
            hint,
        ),
    }
    Ok(())
}

async fn catalog_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let pg = &config.postgres;
    let server = catalog::server(client).await?;
    let (wal_level, database, user, version) = (
        &server.wal_level,
        &server.database,
        &server.user,
        &server.version,
    );
    let (max_slots, used_slots) = server.replication_slots;
    let (max_senders, used_senders) = server.wal_senders;
    if wal_level == "logical" {
        r.pass("wal_level", format!("logical (PostgreSQL {version})"));
    } else {
        r.fail(
            "wal_level",
            format!("`{wal_level}`, logical replication needs `logical`"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        );
    }
    let slot_info = catalog::slot(client, &pg.slot).await?;
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
    let (replication, create_db) = (server.can_replicate, server.can_create_in_database);
    let checkpoint_table = relay_postgres::checkpoint::checkpoint_table_access(client).await?;
    if replication {
        r.pass("role replication", format!("role `{user}` has REPLICATION"));
    } else {
        r.fail(
            "role replication",
            format!("role `{user}` lacks REPLICATION"),
            format!("ALTER ROLE {user} WITH REPLICATION"),
        );
    }
    if checkpoint_table == TableAccess::Usable {
        r.pass(
            "checkpoint table",
            "outbox_relay.checkpoint exists and is writable",
        );
    } else if let TableAccess::NotGranted { role } = &checkpoint_table {
        r.fail(
            "checkpoint table",
            format!("role `{role}` cannot use outbox_relay.checkpoint"),
            relay_postgres::checkpoint::checkpoint_grants(role),
        );
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

    // The position map: an aid to `position` and `replay`, never a condition of running.
    let map = relay_postgres::checkpoint::position_map_access(client).await?;
    match &map {
        TableAccess::Usable => r.pass(
            "position map",
            "outbox_relay.position_map exists and is writable",
        ),
        TableAccess::NotGranted { role } => r.hinted(
            Verdict::Warn,
            "position map",
            format!(
                "role `{role}` cannot write outbox_relay.position_map: checkpoints are stored without it, and `position`/`replay` search the stream instead"
            ),
            relay_postgres::checkpoint::position_map_grants(role),
        ),
        TableAccess::Missing if create_db => r.pass(
            "position map",
            "outbox_relay.position_map missing; will be created at start (role has CREATE)",
        ),
        TableAccess::Missing => r.hinted(
            Verdict::Warn,
            "position map",
            format!(
                "outbox_relay.position_map missing and role `{user}` lacks CREATE on `{database}`: `position`/`replay` will search the stream instead"
            ),
            "apply migrations/0004_position_map.sql as an owner, or run `outbox-relay setup` as one",
        ),
    }

    // The table-free outbox's SQL helpers: applications may call pg_logical_emit_message
    // themselves, so missing helpers are a warning.
    if !config.messages.is_empty() {
        let check = "emit functions";
        if catalog::emit_functions_present(client).await? {
            r.pass(
                check,
                "outbox_relay.emit_event and outbox_relay.emit_envelope exist",
            );
        } else {
            r.hinted(
                Verdict::Warn,
                check,
                "[[messages]] is configured, but outbox_relay.emit_event / outbox_relay.emit_envelope do not exist: applications must call pg_logical_emit_message themselves",
                "run `outbox-relay setup` (it installs them), or apply migrations/0005_emit_outbox_message.sql",
            );
        }
    }

    // Outbox tables.
    let tables = config.published_tables();
    for (index, t) in tables.iter().enumerate() {
        let name = format!("table {}", t.name());
        let info = catalog::table(client, &t.schema, &t.table).await?;
        if let Some(info) = &info {
            column_checks(config, client, index, &t.name(), info.oid, r).await?;
        }
        match info.map(|t| t.readable) {
            Some(true) => r.pass(name, "exists, readable"),
            Some(false) => r.fail(
                name,
                format!("role `{user}` lacks SELECT"),
                format!("GRANT SELECT ON {} TO {user}", t.relation()),
            ),
            None => {
                let lookalikes = catalog::table_lookalikes(client, &t.schema, &t.table).await?;
                r.fail(
                    name,
                    format!("does not exist in database `{database}`"),
                    PgError::TableMissing {
                        table: t.name(),
                        database: database.clone(),
                        lookalikes: catalog::lookalikes_hint(&lookalikes),
                    }
                    .to_string(),
                );
            }
        }
    }
    cleanup_checks(config, client, r).await?;

    // Publication.
    let publication = &pg.publication;
    let quoted = tables
        .iter()
        .map(relay_postgres::bootstrap::PublishedTable::relation)
        .collect::<Vec<_>>()
        .join(", ");
    let found = catalog::publication(client, publication).await?;
    let name = format!("publication {publication}");
    match found.map(|p| p.publishes_inserts) {
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
            for t in &tables {
                let membership =
                    partitions::membership(client, publication, &t.schema, &t.table).await?;
                let qualified = t.name();
                let check = format!("{name} has {qualified}");
                let member = membership == Membership::Member;
                match membership {
                    Membership::Member => r.pass(check, "member"),
                    Membership::NotInPublication => r.fail(
                        check,
                        "not in the publication",
                        PgError::PublicationMissingTable {
                            publication: publication.clone(),
                            table: qualified,
                        }
                        .to_string(),
                    ),
                    other => r.fail(
                        check,
                        match other {
                            Membership::PublishedAsPartitions => "partitioned, published as its partitions (publish_via_partition_root is off)".to_owned(),
                            _ => "published as its partitioned parent's".to_owned(),
                        },
                        other.problem(publication, &qualified).unwrap_or_default(),
                    ),
                }
                if member {
                    row_filter_check(pg, client, server.version_num, t, r).await?;
                }
            }
        }
    }

    // Slot, against the stored checkpoint.
    let checkpoint = catalog::stored_checkpoint(client, &pg.slot).await?;
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
        // The other relay of an active/standby pair: this one will wait as its standby, so
        // a preflight before start (the systemd unit's ExecStartPre) must not refuse it.
        Some(pid) => r.hinted(
            Verdict::Warn,
            format!("{name} active"),
            format!("streaming to another process (pid {pid}); a relay started now waits as its standby"),
            format!(
                "expected with an active/standby pair; if that process is not a relay of this pair, stop it or SELECT pg_terminate_backend({pid})"
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

/// The publication's row filter on the table, judged as the relay judges it at start.
/// Whether the table of `[[outbox]]` entry `index` has every column its mapping reads, naming
/// the key (and the preset that set it) of each one it lacks.
async fn column_checks(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
    index: usize,
    table: &str,
    oid: u32,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let Some(mapping) = config.outbox.get(index) else {
        return Ok(());
    };
    let mut missing = Vec::new();
    let mut presets = std::collections::BTreeSet::new();
    for (key, column) in mapping.mapped_columns() {
        if !catalog::column_exists(client, oid, &column).await? {
            match config.outbox.preset_of(index, &key) {
                Some(preset) => {
                    presets.insert(preset.to_owned());
                    missing.push(format!("`{column}` ({key}, from preset {preset})"));
                }
                None => missing.push(format!("`{column}` ({key})")),
            }
        }
    }
    let check = format!("columns of {table}");
    if missing.is_empty() {
        r.pass(check, "every column the mapping reads exists");
        return Ok(());
    }
    let hint = if presets.is_empty() {
        "fix the [[outbox]] mapping (column names are exact, case included) or the table".to_owned()
    } else {
        format!(
            "the table does not have the shape preset {} expects (the framework's current release, docs/frameworks.md): set those keys in the [[outbox]] entry to the table's own column names, or check that the framework created the table",
            presets.into_iter().collect::<Vec<_>>().join(", ")
        )
    };
    r.fail(check, format!("no column {}", missing.join(", ")), hint);
    Ok(())
}

async fn row_filter_check(
    pg: &PostgresSettings,
    client: &Client,
    version_num: i32,
    t: &relay_postgres::bootstrap::PublishedTable,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    use relay_postgres::RowFilterVerdict;
    let check = format!("publication {} rows of {}", pg.publication, t.name());
    if t.row_filter.is_some()
        && let Some(problem) = relay_postgres::row_filters_unsupported(&[t.name()], version_num)
    {
        r.fail(check, "row_filter needs PostgreSQL 15 or later", problem);
        return Ok(());
    }
    let verdict = relay_postgres::catalog::row_filter::row_filter_verdict(
        client,
        pg,
        version_num,
        &t.schema,
        &t.table,
        t.row_filter.as_deref(),
    )
    .await?;
    match &verdict {
        RowFilterVerdict::Unfiltered => {}
        RowFilterVerdict::Shard(shard) => {
            r.pass(check, format!("shard {} (row filter)", shard.describe()));
        }
        RowFilterVerdict::Configured { filter } => {
            r.pass(check, format!("row_filter ({filter})"));
        }
        RowFilterVerdict::FilteredWithoutShard { filter, .. } => r.hinted(
            Verdict::Warn,
            check,
            format!("row filter ({filter}): rows it does not keep are never relayed"),
            verdict.warning().unwrap_or_default(),
        ),
        RowFilterVerdict::NotTheShard { .. } => r.fail(
            check,
            "row filter is not the configured shard's",
            verdict.problem().unwrap_or_default(),
        ),
        RowFilterVerdict::NotTheConfigured { .. } => r.fail(
            check,
            "row filter is not the configured row_filter",
            verdict.problem().unwrap_or_default(),
        ),
        RowFilterVerdict::InvalidFilter { .. } | RowFilterVerdict::CannotCheck { .. } => r.fail(
            check,
            "row_filter cannot be checked",
            verdict.problem().unwrap_or_default(),
        ),
    }
    Ok(())
}
