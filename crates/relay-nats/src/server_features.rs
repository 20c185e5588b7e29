//! Which nats-server versions (from the INFO) have the features the relay chooses between when
//! it decides how events go out (`publisher::choice`) and what a stream it creates may allow.

use crate::native::version_triple;

/// Whether a server of version `version` takes `Nats-Msg-Id` inside atomic batches: 2.12.1 or
/// later.
pub(crate) fn supports_atomic_batches(version: &str) -> bool {
    version_triple(version) >= (2, 12, 1)
}

/// Whether a server of version `version` has fast batches: 2.14.0 or later.
pub(crate) fn supports_fast_batches(version: &str) -> bool {
    version_triple(version) >= (2, 14, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_msg_id_in_batches_needs_2_12_1() {
        for yes in [
            "2.12.1",
            "2.12.15",
            "2.14.0",
            "2.15.1",
            "v2.14.5",
            "3.0.0",
            "2.13.0-RC.1",
        ] {
            assert!(supports_atomic_batches(yes), "{yes}");
        }
        for no in ["2.12.0", "2.11.9", "2.9.10", "", "garbage", "2.12.0-RC.5"] {
            assert!(!supports_atomic_batches(no), "{no}");
        }
    }

    #[test]
    fn fast_batches_need_2_14() {
        for yes in ["2.14.0", "v2.14.5", "2.15.1", "3.0.0"] {
            assert!(supports_fast_batches(yes), "{yes}");
        }
        for no in ["2.12.1", "2.13.9", "2.9.10", "", "garbage"] {
            assert!(!supports_fast_batches(no), "{no}");
        }
    }
}
