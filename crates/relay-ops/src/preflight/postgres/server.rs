//! The server's settings and the role's privileges: replication, the relay's own tables and
//! the table-free outbox's SQL helpers.

use super::*;

/// Judges a setting of [`Catalog::server`].
type SettingCheck = fn(&Catalog<'_>, &mut Report);

/// What logical replication needs of the server, in the order they are reported.
const SETTING_CHECKS: &[SettingCheck] = &[wal_level, max_replication_slots, max_wal_senders];

pub(super) fn setting_checks(c: &Catalog<'_>, r: &mut Report) {
    for check in SETTING_CHECKS {
        check(c, r);
    }
}

fn wal_level(c: &Catalog<'_>, r: &mut Report) {
    let (wal_level, version) = (&c.server.wal_level, &c.server.version);
    if wal_level == "logical" {
        r.pass("wal_level", format!("logical (PostgreSQL {version})"));
    } else {
        r.fail(
            "wal_level",
            format!("`{wal_level}`, logical replication needs `logical`"),
            "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
        );
    }
}

fn max_replication_slots(c: &Catalog<'_>, r: &mut Report) {
    let (max_slots, used_slots) = c.server.replication_slots;
    if c.slot.is_some() || used_slots < max_slots {
        r.pass(
            "max_replication_slots",
            format!(
                "{used_slots} of {max_slots} in use{}",
                if c.slot.is_some() {
                    " (the relay's slot exists)"
                } else {
                    ""
                }
            ),
        );
    } else {
        r.fail(
            "max_replication_slots",
            format!(
                "all {max_slots} in use, none free for slot `{}`",
                c.config.postgres.slot
            ),
            "raise max_replication_slots (ALTER SYSTEM SET max_replication_slots = ...; restart) or drop an unused slot: SELECT pg_drop_replication_slot('<name>')",
        );
    }
}

fn max_wal_senders(c: &Catalog<'_>, r: &mut Report) {
    let (max_senders, used_senders) = c.server.wal_senders;
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
}

/// REPLICATION, and the checkpoint table the relay cannot run without.
pub(super) async fn privilege_checks(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let ServerInfo {
        user,
        database,
        can_replicate,
        can_create_in_database,
        ..
    } = &c.server;
    let checkpoint_table = relay_postgres::checkpoint::checkpoint_table_access(c.client).await?;
    if *can_replicate {
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
    } else if *can_create_in_database {
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
    Ok(())
}

/// The position map: an aid to `position` and `replay`, never a condition of running.
pub(super) async fn position_map_check(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let (user, database) = (&c.server.user, &c.server.database);
    let map = relay_postgres::checkpoint::position_map_access(c.client).await?;
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
        TableAccess::Missing if c.server.can_create_in_database => r.pass(
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
    Ok(())
}

/// The table-free outbox's SQL helpers: applications may call pg_logical_emit_message
/// themselves, so missing helpers are a warning.
pub(super) async fn emit_functions_check(
    c: &Catalog<'_>,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    if c.config.messages.is_empty() {
        return Ok(());
    }
    let check = "emit functions";
    if catalog::emit_functions_present(c.client).await? {
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
    Ok(())
}
