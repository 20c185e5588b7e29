//! The relay's configuration: one TOML file plus `RELAY_<SECTION>__<KEY>` environment overrides
//! (e.g. `RELAY_POSTGRES__URL`, `RELAY_POSTGRES__PASSWORD`, `RELAY_NATS__URL`).

use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use relay_core::pipeline::PipelineConfig;
use relay_core::route::{MessageRouteConfig, OutboxTableConfig, Router};
use relay_nats::NatsSettings;
use relay_postgres::PostgresSettings;
use serde::{Deserialize, Serialize};

/// Prefix of environment overrides; `__` separates section and key.
pub const ENV_PREFIX: &str = "RELAY_";

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// PostgreSQL connection, slot and publication.
    #[serde(default)]
    pub postgres: PostgresSettings,
    /// NATS connection and target stream.
    #[serde(default)]
    pub nats: NatsSettings,
    /// Pipeline tuning.
    #[serde(default)]
    pub relay: PipelineSettings,
    /// Outbox tables and their mappings. Default: `public.outbox` in Debezium's shape.
    #[serde(default = "default_outbox")]
    pub outbox: Vec<OutboxTableConfig>,
    /// The table-free outbox: `pg_logical_emit_message` prefixes whose messages are published
    /// (a JSON envelope each). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageRouteConfig>,
    /// Health, metrics and status endpoints.
    #[serde(default)]
    pub http: HttpSettings,
}

/// The `[http]` section: `/livez`, `/readyz`, `/metrics`, `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// `host:port` to serve on, e.g. `0.0.0.0:9464`. Default: unset (no HTTP server).
    #[serde(default)]
    pub listen: Option<String>,
    /// How often the slot (lag, `wal_status`) and the stream are sampled for metrics and
    /// readiness. Default `5s`.
    #[serde(default = "default_sample_interval", with = "humantime_serde")]
    pub sample_interval: Duration,
}

fn default_sample_interval() -> Duration {
    Duration::from_secs(5)
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: None,
            sample_interval: default_sample_interval(),
        }
    }
}

fn default_outbox() -> Vec<OutboxTableConfig> {
    vec![OutboxTableConfig::with_defaults("public.outbox")]
}

/// The `[relay]` section. A key left out takes its value from [`PipelineSettings::default`]:
/// for the pipeline's own settings that is relay-core's [`PipelineConfig::default`], the one
/// place their defaults are set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineSettings {
    /// Events published and awaiting their PubAck, at most. Default 1024.
    pub max_in_flight: usize,
    /// How often the ack frontier is stored and confirmed to the slot. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// How often a position reached only through WAL without outbox events (keepalives) is
    /// stored and confirmed; bounds slot lag on a quiet outbox. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub idle_checkpoint_interval: Duration,
    /// On shutdown, how long to wait for outstanding acks. Default `20s`.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Longest delay between re-publishes of a message whose outcome is unknown. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// How long "no stream answered" (no responders) is retried before the relay stops.
    /// Default `30s`.
    #[serde(with = "humantime_serde")]
    pub no_stream_grace: Duration,
    /// Longest delay between reconnect attempts after PostgreSQL or the store failed.
    /// Default `10s`.
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
    /// Opt-in: rows that cannot be routed are published here (raw row as JSON, the reason in
    /// headers) and the relay continues, instead of stopping. Must be captured by the stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter_subject: Option<String>,
    /// How often the publication is checked (still there, publishing inserts, holding every
    /// outbox table) while running. Default `30s`.
    #[serde(with = "humantime_serde")]
    pub publication_check_interval: Duration,
    /// The longest outage of the relay planned for: a standby relay taking over, or someone
    /// restoring it. `validate --connect`, `status` and the metrics warn when the slot's
    /// retention window (how long it survives a stopped relay at the current WAL rate) is
    /// shorter. Default `1h`.
    #[serde(with = "humantime_serde")]
    pub takeover_budget: Duration,
    /// How long rows of the position map (`outbox_relay.position_map`, where each checkpoint's
    /// events are in the stream) are kept; `outbox-relay position` and `replay` find older
    /// positions by searching the stream instead. Default `7d`.
    #[serde(with = "humantime_serde")]
    pub position_retention: Duration,
}

fn default_takeover_budget() -> Duration {
    Duration::from_secs(3600)
}

fn default_publication_check_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_reconnect_max() -> Duration {
    Duration::from_secs(10)
}

impl Default for PipelineSettings {
    fn default() -> Self {
        let pipeline = PipelineConfig::default();
        Self {
            max_in_flight: pipeline.max_in_flight,
            checkpoint_interval: pipeline.checkpoint_interval,
            idle_checkpoint_interval: pipeline.idle_checkpoint_interval,
            drain_timeout: pipeline.drain_timeout,
            retry_max: pipeline.retry_max,
            no_stream_grace: pipeline.no_stream_grace,
            reconnect_max: default_reconnect_max(),
            dead_letter_subject: pipeline.dead_letter_subject,
            publication_check_interval: default_publication_check_interval(),
            takeover_budget: default_takeover_budget(),
            position_retention: relay_postgres::checkpoint::DEFAULT_RETENTION,
        }
    }
}

impl PipelineSettings {
    /// The core loop's configuration.
    pub fn pipeline_config(&self) -> PipelineConfig {
        PipelineConfig {
            max_in_flight: self.max_in_flight,
            checkpoint_interval: self.checkpoint_interval,
            idle_checkpoint_interval: self.idle_checkpoint_interval,
            retry_max: self.retry_max,
            no_stream_grace: self.no_stream_grace,
            drain_timeout: self.drain_timeout,
            dead_letter_subject: self.dead_letter_subject.clone(),
            ..PipelineConfig::default()
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing, or TOML/env values do not parse or have unknown keys.
    #[error("cannot load configuration")]
    Load(#[source] Box<figment::Error>),
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl RelayConfig {
    /// Loads `file` (if any), then the environment overrides.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let config: RelayConfig = Self::figment(file)?
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// The merged sources (file, then environment), with metadata on where each value came from.
    pub fn figment(file: Option<&Path>) -> Result<Figment, ConfigError> {
        let mut figment = Figment::new();
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        // Only RELAY_<SECTION>__<KEY> are overrides: RELAY_CONFIG, RELAY_LOG_FORMAT (flags)
        // and unrelated RELAY_* variables must not be read as config keys.
        Ok(figment.merge(
            Env::prefixed(ENV_PREFIX)
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        ))
    }

    /// Checks everything that can be checked without connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.postgres
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("[postgres] {e}")))?;
        if self.outbox.is_empty() {
            return Err(ConfigError::Invalid(
                "no [[outbox]] table configured".into(),
            ));
        }
        self.router()?;
        if self.relay.max_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "[relay] max_in_flight must be at least 1".into(),
            ));
        }
        if self.relay.checkpoint_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "[relay] checkpoint_interval must be positive".into(),
            ));
        }
        if self.relay.publication_check_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "[relay] publication_check_interval must be positive".into(),
            ));
        }
        if self.relay.takeover_budget.is_zero() {
            return Err(ConfigError::Invalid(
                "[relay] takeover_budget must be positive".into(),
            ));
        }
        if self.relay.position_retention.is_zero() {
            return Err(ConfigError::Invalid(
                "[relay] position_retention must be positive".into(),
            ));
        }
        if let Some(dlq) = &self.relay.dead_letter_subject {
            let literal = relay_core::subject::SubjectTemplate::parse(dlq)
                .ok()
                .filter(|t| t.columns().next().is_none());
            if literal.is_none() || dlq.contains(char::is_whitespace) {
                return Err(ConfigError::Invalid(format!(
                    "[relay] dead_letter_subject `{dlq}` is not a plain subject (non-empty tokens, no wildcards, no `$` prefix, no `{{column}}` placeholders)"
                )));
            }
        }
        if let Some(listen) = &self.http.listen
            && listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::Invalid(format!(
                "[http] listen `{listen}` is not an address such as 0.0.0.0:9464"
            )));
        }
        if self.http.sample_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "[http] sample_interval must be positive".into(),
            ));
        }
        if self.nats.stream.is_empty() || self.nats.stream.contains(['.', '*', '>', ' ']) {
            return Err(ConfigError::Invalid(format!(
                "[nats] stream name `{}` is not a valid JetStream stream name",
                self.nats.stream
            )));
        }
        Ok(())
    }

    /// The router for the `[[outbox]]` tables and the `[[messages]]` prefixes.
    pub fn router(&self) -> Result<Router, ConfigError> {
        fn invalid(section: &str, e: &dyn std::error::Error) -> ConfigError {
            let mut text = format!("{section} {e}");
            if let Some(source) = e.source() {
                text.push_str(&format!(": {source}"));
            }
            ConfigError::Invalid(text)
        }
        Router::new(&self.outbox)
            .map_err(|e| invalid("[[outbox]]", &e))?
            .with_messages(&self.messages)
            .map_err(|e| invalid("[[messages]]", &e))
    }

    /// `(table, sample subject)` for every mapping (`[[messages]] prefix "…"` for a message
    /// prefix), for the stream check.
    pub fn sample_subjects(&self) -> Vec<(String, String)> {
        let mut samples: Vec<(String, String)> = self
            .outbox
            .iter()
            .filter_map(|o| o.validate().ok().map(|t| (o.table.clone(), t.sample("x"))))
            .collect();
        for m in &self.messages {
            for sample in m.sample_subjects() {
                samples.push((format!("[[messages]] prefix \"{}\"", m.prefix), sample));
            }
        }
        if let Some(dlq) = &self.relay.dead_letter_subject {
            samples.push(("[relay] dead_letter_subject".into(), dlq.clone()));
        }
        samples
    }

    /// `(schema, table)` of every outbox table.
    pub fn tables(&self) -> Vec<(String, String)> {
        self.outbox
            .iter()
            .map(|o| {
                let (s, t) = o.qualified_name();
                (s.to_owned(), t.to_owned())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use relay_core::secret::Secret;

    use super::*;

    #[test]
    fn pipeline_defaults_are_the_pipelines_own() {
        let core = PipelineConfig::default();
        let relay: PipelineSettings = figment::Figment::new()
            .merge(figment::providers::Toml::string("reconnect_max = \"3s\""))
            .extract()
            .expect("a partial [relay]");
        let loaded = relay.pipeline_config();
        assert_eq!(
            (
                loaded.max_in_flight,
                loaded.checkpoint_interval,
                loaded.idle_checkpoint_interval,
                loaded.retry_max,
                loaded.no_stream_grace,
                loaded.drain_timeout,
                loaded.dead_letter_subject,
            ),
            (
                core.max_in_flight,
                core.checkpoint_interval,
                core.idle_checkpoint_interval,
                core.retry_max,
                core.no_stream_grace,
                core.drain_timeout,
                core.dead_letter_subject,
            )
        );
        assert_eq!(relay.reconnect_max, Duration::from_secs(3));
    }

    /// Every secret the configuration can hold, from the file and the environment: none is in
    /// `Debug` (plain or pretty) or in the serialized configuration (`validate`, `config
    /// print`).
    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn no_secret_is_printed_or_serialized() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "relay.toml",
                r#"
                [postgres]
                url = "postgres://relay:pg-url-secret@db:5432/app"
                password = "pg-secret"

                [nats]
                url = "nats://relay:nats-url-secret@broker:4222"
                user = "relay"
                password = "nats-secret"
                token = "token-secret"
                nkey_seed = "SUAseed-secret"
                "#,
            )?;
            jail.set_env("RELAY_NATS__TOKEN", "env-token-secret");
            let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
            assert_eq!(
                c.nats.token.as_ref().map(Secret::expose),
                Some("env-token-secret")
            );
            let shown = format!(
                "{c:?}\n{c:#?}\n{}\n{}",
                serde_json::to_string(&c).expect("serializes"),
                serde_json::to_string_pretty(&c).expect("serializes"),
            );
            for secret in [
                "pg-url-secret",
                "pg-secret",
                "nats-url-secret",
                "nats-secret",
                "token-secret",
                "SUAseed-secret",
            ] {
                assert!(!shown.contains(secret), "{secret} in:\n{shown}");
            }
            let json = serde_json::to_value(&c).expect("serializes");
            assert_eq!(
                json["postgres"]["url"],
                "postgres://relay:<redacted>@db:5432/app"
            );
            for (section, key) in [
                ("postgres", "password"),
                ("nats", "password"),
                ("nats", "token"),
                ("nats", "nkey_seed"),
            ] {
                assert_eq!(json[section][key], "<redacted>", "{section}.{key}");
            }
            Ok(())
        });
    }

    #[test]
    fn defaults_need_no_file() {
        let c = RelayConfig::default();
        let c = RelayConfig {
            outbox: default_outbox(),
            ..c
        };
        c.validate().unwrap();
        assert_eq!(
            c.sample_subjects(),
            [("public.outbox".to_owned(), "outbox.x.x".to_owned())]
        );
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn messages_are_parsed_checked_and_sampled() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "relay.toml",
                r#"
                [[messages]]
                prefix = "outbox"

                [[messages]]
                prefix = "audit"
                subject = "audit.{kind}"
                subjects = ["audit.>"]
                allow_non_transactional = true
                "#,
            )?;
            let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
            assert_eq!(c.messages.len(), 2);
            assert_eq!(c.messages[0].subjects, ["outbox.>"]);
            assert!(!c.messages[0].allow_non_transactional);
            assert!(c.messages[1].allow_non_transactional);
            let samples = c.sample_subjects();
            assert!(samples.contains(&(
                "[[messages]] prefix \"outbox\"".to_owned(),
                "outbox.x".to_owned()
            )));
            assert!(samples.contains(&(
                "[[messages]] prefix \"audit\"".to_owned(),
                "audit.x".to_owned()
            )));
            c.router().expect("router");

            jail.create_file(
                "twice.toml",
                "[[messages]]\nprefix = \"a\"\n[[messages]]\nprefix = \"a\"\n",
            )?;
            let err = RelayConfig::load(Some(Path::new("twice.toml"))).unwrap_err();
            assert!(
                err.to_string()
                    .contains("[[messages]] prefix `a` is configured twice"),
                "{err}"
            );
            jail.create_file(
                "typo.toml",
                "[[messages]]\nprefix = \"a\"\nallow_nontransactional = true\n",
            )?;
            let err = RelayConfig::load(Some(Path::new("typo.toml"))).unwrap_err();
            assert!(
                format!("{err:?}").contains("allow_nontransactional"),
                "{err:?}"
            );
            Ok(())
        });
    }

    #[test]
    fn dead_letter_subject_is_checked_and_sampled() {
        let mut c = RelayConfig {
            outbox: default_outbox(),
            ..RelayConfig::default()
        };
        c.relay.dead_letter_subject = Some("outbox.dlq".into());
        c.validate().unwrap();
        assert_eq!(
            c.sample_subjects().last(),
            Some(&(
                "[relay] dead_letter_subject".to_owned(),
                "outbox.dlq".to_owned()
            ))
        );
        assert_eq!(
            c.relay.pipeline_config().dead_letter_subject.as_deref(),
            Some("outbox.dlq")
        );
        for bad in [
            "",
            "outbox.>",
            "outbox.*",
            "$JS.API.X",
            "outbox..dlq",
            "dlq.{id}",
            "a b",
        ] {
            c.relay.dead_letter_subject = Some(bad.into());
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("dead_letter_subject"), "{bad}: {err}");
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn file_and_env_merge_and_unknown_keys_are_refused() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "relay.toml",
                r#"
                [postgres]
                url = "postgres://relay@db:5432/app"
                slot = "orders_relay"

                [nats]
                stream = "ORDERS"

                [[outbox]]
                table = "public.notification_outbox"
                subject = "notifications.{tenant_id}.{event_type}"
                payload = "*"
                headers = { "Tenant-Id" = "tenant_id" }
                "#,
            )?;
            jail.set_env("RELAY_POSTGRES__PASSWORD", "from-env");
            jail.set_env("RELAY_NATS__URL", "nats://broker:4222");
            jail.set_env("RELAY_CONFIG", "relay.toml");
            jail.set_env("RELAY_LOG_FORMAT", "json");
            jail.set_env("RELAY_TEST_NATS_SERVER", "/usr/bin/nats-server");
            let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
            assert_eq!(c.postgres.slot, "orders_relay");
            assert_eq!(
                c.postgres.password.as_ref().map(Secret::expose),
                Some("from-env")
            );
            assert_eq!(c.nats.url, "nats://broker:4222");
            assert_eq!(c.outbox[0].payload, "*");
            assert_eq!(c.outbox[0].event_id, "id");
            assert!(
                !format!("{c:?}").contains("from-env"),
                "password redacted in Debug"
            );
            assert_eq!(c.relay, PipelineSettings::default(), "[relay] left out");

            jail.create_file("typo.toml", "[postgres]\nslott = \"x\"\n")?;
            let err = RelayConfig::load(Some(Path::new("typo.toml"))).unwrap_err();
            let text = format!("{:?}", err);
            assert!(text.contains("slott"), "{text}");

            jail.create_file("badslot.toml", "[postgres]\nslot = \"Bad-Slot\"\n")?;
            let err = RelayConfig::load(Some(Path::new("badslot.toml"))).unwrap_err();
            assert!(err.to_string().contains("Bad-Slot"), "{err}");
            Ok(())
        });
    }
}
