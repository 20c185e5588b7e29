//! The `[nats] publish_mode`s the bench runs: each one's config spelling, and the oldest
//! nats-server that does it (older servers get a row saying so instead of a run). Read by the
//! publish-mode rows (`modes`) and the latency runs (`latency`).

/// A `[nats] publish_mode` the bench runs (`--publish-modes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PublishModeArg {
    /// Every message on its own.
    #[default]
    PerMessage,
    /// Each transaction as one JetStream atomic batch.
    AtomicBatch,
    /// Fast-ingest batches with flow-controlled acks.
    FastBatch,
}

impl PublishModeArg {
    /// The value of `[nats] publish_mode`.
    pub fn as_config(self) -> &'static str {
        match self {
            Self::PerMessage => "per-message",
            Self::AtomicBatch => "atomic-batch",
            Self::FastBatch => "fast-batch",
        }
    }

    /// The oldest nats-server that does this mode (`None`: any).
    fn min_server(self) -> Option<(u64, u64, u64)> {
        match self {
            Self::PerMessage => None,
            // Nats-Msg-Id inside atomic batches (docs/message-format.md, "Batch publishing").
            Self::AtomicBatch => Some((2, 12, 1)),
            // Fast-ingest batches (docs/message-format.md, "Fast batches").
            Self::FastBatch => Some((2, 14, 0)),
        }
    }

    /// Why a nats-server of `version` cannot run this mode, if it cannot.
    pub fn unsupported_on(self, version: &str) -> Option<String> {
        let (a, b, c) = self.min_server()?;
        (version_triple(version) < (a, b, c)).then(|| {
            format!(
                "not run: {} needs nats-server >= {a}.{b}.{c}, this run's is {version} (the relay would publish per message)",
                self.as_config()
            )
        })
    }

    /// `[nats]` keys of this mode, for the bench's relay config.
    pub fn nats_keys(self) -> String {
        format!("publish_mode = \"{}\"", self.as_config())
    }

    /// The variant part of the slot and log names of this mode's runs: `""` for per-message
    /// (the names of the runs before modes existed).
    pub fn variant(self) -> &'static str {
        match self {
            Self::PerMessage => "",
            Self::AtomicBatch => "_atomic_batch",
            Self::FastBatch => "_fast_batch",
        }
    }

    /// The variant part of the slot and log names of `--compare-bin`'s runs in this mode.
    pub fn compare_variant(self) -> &'static str {
        match self {
            Self::PerMessage => "_compare",
            Self::AtomicBatch => "_atomic_batch_compare",
            Self::FastBatch => "_fast_batch_compare",
        }
    }
}

/// `2.12.1-RC.2` → (2, 12, 1); missing or unreadable parts count as 0.
fn version_triple(version: &str) -> (u64, u64, u64) {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_batch_needs_2_12_1() {
        for old in ["2.9.25", "2.11.9", "2.12.0", "2.12.0-RC.1"] {
            assert!(
                PublishModeArg::AtomicBatch.unsupported_on(old).is_some(),
                "{old}"
            );
        }
        for new in ["2.12.1", "2.12.3", "2.13.0", "3.0.0"] {
            assert_eq!(
                PublishModeArg::AtomicBatch.unsupported_on(new),
                None,
                "{new}"
            );
        }
        assert_eq!(PublishModeArg::PerMessage.unsupported_on("2.9.0"), None);
    }

    #[test]
    fn per_message_keeps_the_old_slot_names() {
        assert_eq!(PublishModeArg::PerMessage.variant(), "");
        assert_eq!(PublishModeArg::AtomicBatch.variant(), "_atomic_batch");
        assert_eq!(
            PublishModeArg::AtomicBatch.nats_keys(),
            "publish_mode = \"atomic-batch\""
        );
    }
}
