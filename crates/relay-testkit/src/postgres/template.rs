//! One `initdb` per PostgreSQL build, copied for each new cluster.
//!
//! `initdb` costs about 0.6 s of CPU and the e2e suite starts a few hundred clusters per run on
//! each server pair; a copy of a finished data directory costs a few milliseconds. The template
//! lives in the system's temporary directory under a name made of the binaries' directory, their
//! version and the `initdb` options, so test processes (and later runs) share it, and a change of
//! any of those makes a new one. It is made under a temporary name and renamed into place, so a
//! process never copies a half-made template.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash as _, Hasher as _};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use nix::unistd::chown;

use super::binaries::INITDB_ARGS;
use super::{PASSWORD, PostgresServer, SUPERUSER};

impl PostgresServer {
    /// Makes this server's data directory: a copy of the template for its binaries, made first
    /// if there is none yet.
    pub(super) async fn initdb(&self) -> anyhow::Result<()> {
        let template = self.template().await?;
        let mut cmd = tokio::process::Command::new("cp");
        // `-a` keeps the owner (the `postgres` OS user when we are root) and the 0700 mode the
        // server insists on.
        cmd.arg("-a").arg(&template).arg(&self.data_dir);
        let output = self.run(cmd, "copying the initdb template").await?;
        if !output.status.success() {
            bail!(
                "copying the initdb template {} to {} failed ({}): {}",
                template.display(),
                self.data_dir.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    async fn template(&self) -> anyhow::Result<PathBuf> {
        let root = std::env::temp_dir().join("relay-testkit-initdb");
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let template = root.join(self.template_key().await?);
        if template.join("PG_VERSION").exists() {
            return Ok(template);
        }
        // Made in a directory of its own that the server's OS user owns, then renamed: a rename
        // within one file system is atomic, and a process that loses the race keeps the winner's.
        let staging = tempfile::Builder::new()
            .prefix("staging-")
            .tempdir_in(&root)
            .with_context(|| format!("creating a staging directory in {}", root.display()))?;
        if let Some((uid, gid)) = self.owner {
            chown(staging.path(), Some(uid), Some(gid))
                .with_context(|| format!("chown {} to postgres", staging.path().display()))?;
        }
        let data = staging.path().join("data");
        self.initdb_into(&data).await?;
        if std::fs::rename(&data, &template).is_err() && !template.join("PG_VERSION").exists() {
            bail!(
                "could not move the initdb template into {}",
                template.display()
            );
        }
        Ok(template)
    }

    /// Names the template: the binaries' directory, their version and every option of `initdb`.
    async fn template_key(&self) -> anyhow::Result<String> {
        let version = self.binary_version("postgres").await?;
        let mut hasher = DefaultHasher::new();
        (
            self.bin_dir.as_path(),
            version.as_str(),
            INITDB_ARGS,
            SUPERUSER,
            PASSWORD,
        )
            .hash(&mut hasher);
        self.owner.map(|(uid, _)| uid.as_raw()).hash(&mut hasher);
        Ok(format!("{:016x}", hasher.finish()))
    }

    async fn binary_version(&self, program: &str) -> anyhow::Result<String> {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join(program));
        cmd.arg("--version");
        let output = self.run(cmd, &format!("{program} --version")).await?;
        if !output.status.success() {
            bail!("{program} --version failed ({})", output.status);
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}
