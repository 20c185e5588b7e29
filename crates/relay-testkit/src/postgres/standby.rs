//! A streaming standby of a test server: a base backup (`pg_basebackup`, or
//! `pg_backup_start`/`pg_backup_stop` and a file copy where the build has no `pg_basebackup`),
//! a physical replication slot on the primary, slot synchronization on PostgreSQL 17+, and the
//! things a failover test does to it: wait for replay, cut it off its primary, promote it.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use nix::unistd::chown;

use super::{LOG_TAIL_LINES, PASSWORD, PostgresServer, SUPERUSER};
use crate::HOST;
use crate::procs;

/// How a standby is set up by [`PostgresServer::start_standby`].
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    /// The physical slot on the primary the standby streams through (`primary_slot_name`);
    /// created by `start_standby`. Default `standby1`.
    pub slot: String,
    /// The database named in `primary_conninfo` (slot synchronization connects to one);
    /// `None` leaves `dbname` out. Default `postgres`.
    pub dbname: Option<String>,
    /// `sync_replication_slots` (PostgreSQL 17+; ignored before). Default `true`.
    pub sync_replication_slots: bool,
    /// `hot_standby_feedback`. Default `true`.
    pub hot_standby_feedback: bool,
    /// Extra settings for the standby's `postgresql.conf`.
    pub settings: Vec<(String, String)>,
    /// Copy the data directory with `pg_backup_start`/`pg_backup_stop` even when the build has
    /// `pg_basebackup` (to test that path). Default `false`.
    pub force_file_copy: bool,
}

impl Default for StandbyOptions {
    fn default() -> Self {
        Self {
            slot: "standby1".into(),
            dbname: Some("postgres".into()),
            sync_replication_slots: true,
            hot_standby_feedback: true,
            settings: Vec::new(),
            force_file_copy: false,
        }
    }
}

/// `postgres://postgres:postgres@127.0.0.1:P1,127.0.0.1:P2/database?target_session_attrs=read-write`:
/// every server in `servers`, in that order.
pub fn multi_host_url(servers: &[&PostgresServer], database: &str) -> String {
    let hosts = servers
        .iter()
        .map(|s| format!("{HOST}:{}", s.port()))
        .collect::<Vec<_>>()
        .join(",");
    format!("postgres://{SUPERUSER}:{PASSWORD}@{hosts}/{database}?target_session_attrs=read-write")
}

impl PostgresServer {
    /// A hot standby of this server, streaming through a new physical slot
    /// ([`StandbyOptions::slot`]) from a base backup taken now, with the primary's settings
    /// (its `postgresql.conf` is copied) plus what slot synchronization needs on PostgreSQL
    /// 17+: `sync_replication_slots`, `hot_standby_feedback`, `primary_slot_name` and `dbname`
    /// in `primary_conninfo`. Returns once it accepts connections (in recovery).
    pub async fn start_standby(&self, opts: StandbyOptions) -> anyhow::Result<PostgresServer> {
        let client = self.connect("postgres").await?;
        client
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)",
                &[&opts.slot],
            )
            .await
            .with_context(|| format!("creating the physical slot {} on the primary", opts.slot))?;
        let mut standby = PostgresServer::unstarted(
            self.bin_dir.clone(),
            self.admin_socket,
            self.server_env.clone(),
        )?;
        if !opts.force_file_copy && self.bin_dir.join("pg_basebackup").is_file() {
            standby.base_backup_from(self).await?;
        } else {
            standby.file_copy_from(self).await?;
        }
        let socket_dir = standby.dir.path().to_string_lossy().into_owned();
        let dbname = opts
            .dbname
            .as_deref()
            .map(|d| format!(" dbname={d}"))
            .unwrap_or_default();
        let conninfo = format!(
            "host={HOST} port={} user={SUPERUSER} password={PASSWORD} application_name={}{dbname}",
            self.port, opts.slot
        );
        let on_off = |b: bool| if b { "on" } else { "off" }.to_owned();
        let mut settings = vec![
            ("unix_socket_directories".to_owned(), socket_dir),
            ("hot_standby".to_owned(), "on".to_owned()),
            ("primary_conninfo".to_owned(), conninfo),
            ("primary_slot_name".to_owned(), opts.slot.clone()),
            (
                "hot_standby_feedback".to_owned(),
                on_off(opts.hot_standby_feedback),
            ),
            // Not inherited: the primary may list this very standby.
            ("synchronized_standby_slots".to_owned(), String::new()),
        ];
        if self.version_num >= 170_000 {
            settings.push((
                "sync_replication_slots".to_owned(),
                on_off(opts.sync_replication_slots),
            ));
        } else {
            settings.retain(|(k, _)| k != "synchronized_standby_slots");
        }
        settings.extend(opts.settings.iter().cloned());
        standby.write_settings_only(&settings)?;
        let signal = standby.data_dir.join("standby.signal");
        std::fs::write(&signal, "").with_context(|| format!("writing {}", signal.display()))?;
        if let Some((uid, gid)) = standby.owner {
            chown(&signal, Some(uid), Some(gid)).context("chown standby.signal")?;
        }
        standby.launch().await?;
        Ok(standby)
    }

    /// `pg_basebackup` over the primary's unix socket (trusted for replication by the
    /// cluster's `pg_hba.conf`), WAL streamed along, no fsync.
    async fn base_backup_from(&self, primary: &PostgresServer) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_basebackup");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-h")
            .arg(primary.dir.path())
            .arg("-p")
            .arg(primary.port.to_string())
            .arg("-U")
            .arg(SUPERUSER)
            .args(["-X", "stream", "-c", "fast", "--no-sync", "--no-password"]);
        let output = self.run(cmd, "pg_basebackup").await?;
        if !output.status.success() {
            bail!(
                "pg_basebackup failed ({}): {}{}\n--- primary log (tail) ---\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                procs::log_tail(&primary.log_path, LOG_TAIL_LINES)
            );
        }
        Ok(())
    }

    /// The low-level base backup: `pg_backup_start`, a copy of the data directory (without
    /// WAL, slots, pid file and statistics), `pg_backup_stop`'s label file. The standby then
    /// streams the WAL from the backup's start through its slot, which reserved it.
    async fn file_copy_from(&self, primary: &PostgresServer) -> anyhow::Result<()> {
        let client = primary.connect("postgres").await?;
        client
            .execute("SELECT pg_backup_start('relay-testkit standby', true)", &[])
            .await
            .context("pg_backup_start")?;
        let copied = copy_data_dir(&primary.data_dir, &self.data_dir);
        let row = client
            .query_one(
                "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)",
                &[],
            )
            .await
            .context("pg_backup_stop")?;
        copied?;
        let label: String = row.get(0);
        std::fs::write(self.data_dir.join("backup_label"), label).context("backup_label")?;
        let map: Option<String> = row.get(1);
        if let Some(map) = map.filter(|m| !m.is_empty()) {
            std::fs::write(self.data_dir.join("tablespace_map"), map).context("tablespace_map")?;
        }
        if let Some((uid, gid)) = self.owner {
            chown_tree(&self.data_dir, uid, gid)?;
        }
        Ok(())
    }

    /// Appends settings to `postgresql.conf` (values quoted); they take effect at the next
    /// (re)start, e.g. `recovery_target_lsn` for [`Self::start_again`].
    pub fn add_settings(&self, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        let owned: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.write_settings_only(&owned)
    }

    /// Whether the server is in recovery (a standby).
    pub async fn is_in_recovery(&self) -> anyhow::Result<bool> {
        let client = self.connect("postgres").await?;
        Ok(client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await?
            .get(0))
    }

    /// Promotes a standby (`pg_ctl promote`) and waits until it accepts writes.
    pub async fn promote(&self) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("promote")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-w")
            .arg("-t")
            .arg("60");
        let output = self.run(cmd, "pg_ctl promote").await?;
        if !output.status.success() {
            bail!(
                "pg_ctl promote failed ({}): {}{}\n--- server log (tail) ---\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                procs::log_tail(&self.log_path, LOG_TAIL_LINES)
            );
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.is_in_recovery().await? {
            if tokio::time::Instant::now() > deadline {
                bail!("the standby is still in recovery 30 s after pg_ctl promote");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Waits until `standby` has replayed this server's WAL up to its current position.
    pub async fn wait_replayed(
        &self,
        standby: &PostgresServer,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let target: String = self
            .connect("postgres")
            .await?
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0);
        let client = standby.connect("postgres").await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let done: bool = client
                .query_one(
                    "SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                    &[&target],
                )
                .await?
                .get(0);
            if done {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the standby did not replay up to {target} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cuts the standby off its primary: `primary_conninfo` emptied and reloaded, which ends
    /// its WAL receiver; returns once none runs. From then on the standby receives nothing
    /// (unlike a paused receiver, which still reads what the primary already sent into the
    /// socket when it resumes). Undo with [`Self::reconnect_to_primary`].
    pub async fn disconnect_from_primary(&self) -> anyhow::Result<()> {
        let client = self.connect("postgres").await?;
        client
            .batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
            .await?;
        client.batch_execute("SELECT pg_reload_conf()").await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let receiving = client
                .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
                .await?
                .is_some();
            if !receiving {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the standby's WAL receiver still runs 20 s after primary_conninfo = ''");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Undoes [`Self::disconnect_from_primary`]: the `primary_conninfo` of `postgresql.conf`
    /// is in force again.
    pub async fn reconnect_to_primary(&self) -> anyhow::Result<()> {
        let client = self.connect("postgres").await?;
        client
            .batch_execute("ALTER SYSTEM RESET primary_conninfo")
            .await?;
        client.batch_execute("SELECT pg_reload_conf()").await?;
        Ok(())
    }

    /// Waits until `slot` exists on this standby as a synchronized, persistent slot
    /// (`synced` and not `temporary`, PostgreSQL 17+) whose `confirmed_flush_lsn` is at least
    /// `at_least` (an LSN as text, e.g. a position the primary's slot reached).
    pub async fn wait_slot_synced(
        &self,
        slot: &str,
        at_least: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let client = self.connect("postgres").await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let row = client
                .query_opt(
                    "SELECT synced AND NOT temporary \
                            AND confirmed_flush_lsn >= $2::text::pg_lsn \
                     FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot, &at_least],
                )
                .await?;
            if row.is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true)) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                let state = client
                    .query_opt(
                        "SELECT synced, temporary, confirmed_flush_lsn::text \
                         FROM pg_replication_slots WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await?
                    .map(|r| {
                        format!(
                            "synced {:?}, temporary {:?}, confirmed_flush_lsn {:?}",
                            r.get::<_, Option<bool>>(0),
                            r.get::<_, Option<bool>>(1),
                            r.get::<_, Option<String>>(2)
                        )
                    })
                    .unwrap_or_else(|| "missing".into());
                return Err(anyhow!(
                    "slot {slot} not synchronized to {at_least} on the standby within {timeout:?} ({state})\n--- standby log (tail) ---\n{}",
                    procs::log_tail(&self.log_path, LOG_TAIL_LINES)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Copies a data directory for a low-level base backup: everything but the WAL (its
/// directory structure is kept), replication slots, the pid file and temporary statistics.
/// Files that vanish meanwhile are skipped (the server keeps running).
fn copy_data_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    const EMPTY: [&str; 5] = [
        "pg_wal",
        "pg_replslot",
        "pg_stat_tmp",
        "pg_dynshmem",
        "pg_notify",
    ];
    const SKIP: [&str; 4] = [
        "postmaster.pid",
        "postmaster.opts",
        "backup_label",
        "standby.signal",
    ];
    fn walk(from: &Path, to: &Path, top: bool) -> anyhow::Result<()> {
        std::fs::create_dir_all(to).with_context(|| format!("mkdir {}", to.display()))?;
        let entries = match std::fs::read_dir(from) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", from.display())),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let name_str = name.to_string_lossy();
            if top && SKIP.contains(&name_str.as_ref()) {
                continue;
            }
            let (src, dst) = (entry.path(), to.join(&name));
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if top && EMPTY.contains(&name_str.as_ref()) {
                    std::fs::create_dir_all(&dst)?;
                    if name_str == "pg_wal" {
                        std::fs::create_dir_all(dst.join("archive_status"))?;
                    }
                    continue;
                }
                walk(&src, &dst, false)?;
            } else if kind.is_file() {
                match std::fs::copy(&src, &dst) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("copying {}", src.display())),
                }
            }
        }
        Ok(())
    }
    walk(from, to, true)?;
    // PostgreSQL refuses a data directory others may read.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}

fn chown_tree(path: &Path, uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> anyhow::Result<()> {
    chown(path, Some(uid), Some(gid)).with_context(|| format!("chown {}", path.display()))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}
