//! Pause points for the end-to-end tests, compiled only with the `failpoints` feature (the
//! crash points are `relay_core::failpoint`).
//!
//! - `RELAY_PAUSE=<name>:<file>`: the first time a session reaches `<name>`, the relay logs
//!   `paused at <name>` and waits until `<file>` exists, so a test can change the database at
//!   exactly that moment; later sessions go on.
//! - `RELAY_DELAY=<name>:<ms>`: every session waits `<ms>` milliseconds at `<name>`, widening
//!   a window a test wants to hit often.
//!
//! | name | where |
//! |---|---|
//! | `after_checkpoint_read` | a session read the stored checkpoint, and not yet the slot |
//! | `before_start_replication` | the start-up checks passed; START_REPLICATION not sent yet |

/// Waits here if `RELAY_PAUSE` or `RELAY_DELAY` names this point.
#[cfg(feature = "failpoints")]
pub(super) async fn pause(name: &str) {
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
pub(super) async fn pause(_name: &str) {}
