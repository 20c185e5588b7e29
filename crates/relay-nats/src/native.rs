//! Whether the server and the stream honour the broker-native headers a mapping sets
//! (`ttl_column` → `Nats-TTL`, `schedule_column` → `Nats-Schedule`). An older server ignores
//! these headers and stores the message as if they were absent (never expiring, delivered at
//! once on the schedule subject), and a stream without the setting refuses every such message:
//! both are refused at start, naming the column, the setting and the fix.

use async_nats::jetstream::stream;
use relay_core::route::{BrokerFeature, BrokerNeed};

use crate::error::NatsError;

/// The oldest nats-server that acts on the header, and the stream setting it needs.
fn requirement(
    feature: BrokerFeature,
) -> ((u64, u64, u64), &'static str, &'static str, &'static str) {
    match feature {
        BrokerFeature::MessageTtl => ((2, 11, 0), "Nats-TTL", "allow_msg_ttl", "--allow-msg-ttl"),
        BrokerFeature::MessageSchedules => (
            (2, 12, 0),
            "Nats-Schedule",
            "allow_msg_schedules",
            "--allow-schedules",
        ),
    }
}

/// `major.minor.patch` of a server version (`v2.11.3`, `2.12.0-RC.1`; unreadable parts 0).
pub(crate) fn version_triple(version: &str) -> (u64, u64, u64) {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// Whether a stream created for `needs` on a server of `version` should enable each feature.
pub(crate) fn creation_flags(version: &str, needs: &[BrokerNeed]) -> (bool, bool) {
    let wants = |feature: BrokerFeature| {
        needs.iter().any(|n| n.feature == feature)
            && version_triple(version) >= requirement(feature).0
    };
    (
        wants(BrokerFeature::MessageTtl),
        wants(BrokerFeature::MessageSchedules),
    )
}

/// Refuses the first need the server (of `version`) or the stream (`config`) cannot honour.
/// A schedule with a TTL also needs `allow_msg_ttl` (`Nats-Schedule-TTL`); that need is listed
/// separately by the mapping, so every column is checked for what its header needs.
pub fn check_broker_needs(
    version: &str,
    config: &stream::Config,
    needs: &[BrokerNeed],
) -> Result<(), NatsError> {
    for need in needs {
        let (min, header, setting, flag) = requirement(need.feature);
        let role = match need.feature {
            BrokerFeature::MessageTtl => "ttl_column",
            BrokerFeature::MessageSchedules => "schedule_column",
        };
        let what = format!(
            "outbox table `{}`: {role} `{}` ({header})",
            need.table, need.column
        );
        if version_triple(version) < min {
            return Err(NatsError::BrokerFeature {
                problem: format!(
                    "{what} needs nats-server {}.{} or later, and the server is {version} (it would store the header without acting on it)",
                    min.0, min.1
                ),
                fix: format!("upgrade nats-server, or remove {role} from the mapping"),
            });
        }
        let enabled = match need.feature {
            BrokerFeature::MessageTtl => config.allow_message_ttl,
            BrokerFeature::MessageSchedules => config.allow_message_schedules,
        };
        if !enabled {
            let stream = &config.name;
            return Err(NatsError::BrokerFeature {
                problem: format!(
                    "{what} needs stream `{stream}` to have {setting}, which it does not (every such message would be refused)"
                ),
                fix: format!(
                    "nats stream edit {stream} {flag}{}, or remove {role} from the mapping",
                    match need.feature {
                        BrokerFeature::MessageTtl => " (it cannot be turned off again)",
                        BrokerFeature::MessageSchedules => "",
                    }
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(feature: BrokerFeature) -> BrokerNeed {
        BrokerNeed {
            table: "public.outbox".into(),
            column: "c".into(),
            feature,
        }
    }

    #[test]
    fn old_servers_and_streams_without_the_setting_are_refused_by_name() {
        let ttl = [need(BrokerFeature::MessageTtl)];
        let schedule = [need(BrokerFeature::MessageSchedules)];
        let mut config = stream::Config {
            name: "OUTBOX".into(),
            ..Default::default()
        };
        let err = check_broker_needs("2.9.10", &config, &ttl)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ttl_column `c` (Nats-TTL) needs nats-server 2.11"),
            "{err}"
        );
        let err = check_broker_needs("2.11.0", &config, &ttl)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("allow_msg_ttl") && err.contains("--allow-msg-ttl"),
            "{err}"
        );
        let err = check_broker_needs("2.11.9", &config, &schedule)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs nats-server 2.12"), "{err}");
        let err = check_broker_needs("2.12.0", &config, &schedule)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--allow-schedules"), "{err}");
        config.allow_message_ttl = true;
        config.allow_message_schedules = true;
        assert!(
            check_broker_needs("2.12.0", &config, &[ttl[0].clone(), schedule[0].clone()]).is_ok()
        );
        assert!(check_broker_needs("2.9.10", &config, &[]).is_ok());
        assert_eq!(
            creation_flags("2.11.1", &[ttl[0].clone(), schedule[0].clone()]),
            (true, false)
        );
        assert_eq!(creation_flags("2.15.0", &schedule), (false, true));
    }
}
