//! Pause points for the end-to-end tests, compiled only with the `failpoints` feature (the
//! crash points are `relay_core::failpoint`). `RELAY_PAUSE=<name>:<file>`: the first time a
//! session reaches `<name>`, the relay logs `paused at <name>` and waits until `<file>`
//! exists, so a test can change the database at exactly that moment; later sessions go on.
//!
//! | name | where |
//! |---|---|
//! | `after_checkpoint_read` | a session read the stored checkpoint, and not yet the slot |
//! | `before_start_replication` | the start-up checks passed; START_REPLICATION not sent yet |

/// Waits here if `RELAY_PAUSE` names this point and it was not reached before.
#[cfg(feature = "failpoints")]
pub(super) async fn pause(name: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static REACHED: AtomicBool = AtomicBool::new(false);
    let Ok(spec) = std::env::var("RELAY_PAUSE") else {
        return;
    };
    let Some((point, file)) = spec.split_once(':') else {
        return;
    };
    if point != name || REACHED.swap(true, Ordering::SeqCst) {
        return;
    }
    tracing::warn!(failpoint = name, file, "paused at {name}");
    while !std::path::Path::new(file).exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tracing::warn!(failpoint = name, "resumed at {name}");
}

/// No-op without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(super) async fn pause(_name: &str) {}
