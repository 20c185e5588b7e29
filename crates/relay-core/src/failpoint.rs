//! Named crash points for the fault-injection suite, compiled only with the `failpoints`
//! feature. `RELAY_FAILPOINT=<name>[:<n>]` aborts the process (no unwinding, no cleanup, like
//! `kill -9`) the n-th time (default 1st) execution reaches `<name>`.
//!
//! | name | where |
//! |---|---|
//! | `after_ack_before_store` | the frontier moved over acknowledged events; nothing stored yet |
//! | `after_store_before_confirm` | the checkpoint is stored; the slot has not heard of it |
//! | `atomic_batch_before_commit` | an atomic batch's messages are on the wire (flushed), its commit is not |

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
