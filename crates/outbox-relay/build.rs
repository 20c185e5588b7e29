//! Records the commit the relay is built from, for `outbox-relay --version`, the `/status`
//! endpoint and the `outbox_relay_build_info` metric: `OUTBOX_RELAY_COMMIT` when set (a build
//! without the git checkout, e.g. from a source archive), else `git rev-parse`, with `-dirty`
//! for uncommitted changes; `unknown` without either.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=OUTBOX_RELAY_COMMIT");
    let commit = match std::env::var("OUTBOX_RELAY_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(commit) => {
                // A new commit or checkout changes HEAD or the ref it names.
                for path in ["HEAD", "packed-refs"] {
                    if let Some(file) = git(&["rev-parse", "--git-path", path]) {
                        println!("cargo:rerun-if-changed={file}");
                    }
                }
                if let Some(name) = git(&["symbolic-ref", "-q", "HEAD"])
                    && let Some(file) = git(&["rev-parse", "--git-path", &name])
                {
                    println!("cargo:rerun-if-changed={file}");
                }
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                    .is_some_and(|status| !status.is_empty());
                if dirty {
                    format!("{commit}-dirty")
                } else {
                    commit
                }
            }
            None => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=OUTBOX_RELAY_COMMIT={commit}");
}
