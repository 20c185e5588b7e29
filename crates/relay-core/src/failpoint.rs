//! Named crash points for the fault-injection suite, compiled only with the `failpoints`
//! feature. `RELAY_FAILPOINT=<name>[:<n>]` aborts the process (no unwinding, no cleanup, like
//! `kill -9`) the n-th time (default 1st) execution reaches `<name>`.
//!
//! | name | where |
//! |---|---|
//! | `after_ack_before_store` | the frontier moved over acknowledged events; nothing stored yet |
//! | `after_store_before_confirm` | the checkpoint is stored; the slot has not heard of it |

/// Crashes here if `RELAY_FAILPOINT` names this point and its hit count is reached.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let armed = ARMED.get_or_init(|| {
        let spec = std::env::var("RELAY_FAILPOINT").ok()?;
        let (point, nth) = match spec.split_once(':') {
            Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some((point, nth))
    });
    if let Some((point, nth)) = armed
        && point == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 >= *nth
    {
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// No-op without the `failpoints` feature.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
