//! Named crash and pause points for the fault-injection and end-to-end suites, compiled only
//! with the `failpoints` feature.
//!
//! - `RELAY_FAILPOINT=<name>[:<n>]` ([`hit`]) aborts the process (no unwinding, no cleanup, like
//!   `kill -9`) the n-th time (default 1st) execution reaches `<name>`.
//! - `RELAY_PAUSE=<name>:<file>` ([`pause`]): the first time a session reaches `<name>`, the
//!   relay logs `paused at <name>` and waits until `<file>` exists, so a test can change the
//!   database at exactly that moment; later sessions go on.
//! - `RELAY_DELAY=<name>:<ms>` ([`pause`]): every session waits `<ms>` milliseconds at `<name>`,
//!   widening a window a test wants to hit often.
//!
//! | crash point | where |
//! |---|---|
//! | `after_ack_before_store` | the frontier moved over acknowledged events; nothing stored yet |
//! | `after_store_before_confirm` | the checkpoint is stored; the slot has not heard of it |
//! | `atomic_batch_before_commit` | an atomic batch's messages are on the wire (flushed), its commit is not |
//!
//! | pause point | where |
//! |---|---|
//! | `after_checkpoint_read` | a session read the stored checkpoint, and not yet the slot |
//! | `before_start_replication` | the start-up checks passed; START_REPLICATION not sent yet |
//! | `cleanup_selected` | a cleanup batch selected, its horizon read |
//! | `cleanup_confirmed` | the stored checkpoint seen past the horizon, nothing applied yet |
//! | `cleanup_detached` | a round of drop-partitions done |

/// The armed point and the hit that crashes, from `RELAY_FAILPOINT`.
#[cfg(feature = "failpoints")]
fn armed() -> Option<&'static (String, u64)> {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("RELAY_FAILPOINT").ok()?;
            let (point, nth) = match spec.split_once(':') {
                Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            Some((point, nth))
        })
        .as_ref()
}

/// Whether `RELAY_FAILPOINT` names `name`: a caller that must prepare the crash (flush what
/// it wrote, so the crash lands where the table says) does so only then.
#[cfg(feature = "failpoints")]
pub fn is_armed(name: &str) -> bool {
    armed().is_some_and(|(point, _)| point == name)
}

/// Crashes here if `RELAY_FAILPOINT` names this point and its hit count is reached.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((point, nth)) = armed()
        && point == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 >= *nth
    {
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// Always false without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn is_armed(_name: &str) -> bool {
    false
}

/// No-op without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Waits here if `RELAY_PAUSE` or `RELAY_DELAY` names this point. One `RELAY_PAUSE` per
/// process: it holds the first point reached only.
#[cfg(feature = "failpoints")]
pub async fn pause(name: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    static REACHED: AtomicBool = AtomicBool::new(false);
    let at = |var: &str| {
        let spec = std::env::var(var).ok()?;
        let (point, arg) = spec.split_once(':')?;
        (point == name).then(|| arg.to_owned())
    };
    if let Some(ms) = at("RELAY_DELAY").and_then(|ms| ms.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let Some(file) = at("RELAY_PAUSE") else {
        return;
    };
    if REACHED.swap(true, Ordering::SeqCst) {
        return;
    }
    tracing::warn!(failpoint = name, file, "paused at {name}");
    while !std::path::Path::new(&file).exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(failpoint = name, "resumed at {name}");
}

/// No-op without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn pause(_name: &str) {}
