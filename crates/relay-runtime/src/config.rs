//! The relay's configuration: one TOML file plus `RELAY_<SECTION>__<KEY>` environment overrides
//! (e.g. `RELAY_POSTGRES__URL`, `RELAY_POSTGRES__PASSWORD`, `RELAY_NATS__URL`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use relay_core::pipeline::PipelineConfig;
use relay_core::route::{MessageRouteConfig, OutboxTableConfig, Router};
use relay_nats::NatsSettings;
use relay_postgres::PostgresSettings;
use serde::{Deserialize, Serialize};

mod contracts;
mod flat;
mod http;
mod outbox_tables;
pub mod presets;
pub mod replay_retention;

pub use contracts::ContractCache;
pub use flat::flattened;
pub use http::HttpSettings;
pub use outbox_tables::{BackfillSetting, OutboxTables};
pub use presets::AppliedPreset;
pub use relay_cleanup::{CleanupMode, CleanupSettings};

/// A command-line duration (`5s`, `1m30s`), in the grammar the configuration's durations use.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime_serde::re::humantime::parse_duration(s).map_err(|e| e.to_string())
}

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
    /// Outbox tables and their mappings (each with an optional `[outbox.cleanup]`). Default:
    /// `public.outbox` in Debezium's shape.
    #[serde(default = "default_outbox")]
    pub outbox: OutboxTables,
    /// The table-free outbox: `pg_logical_emit_message` prefixes whose messages are published
    /// (a JSON envelope each). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageRouteConfig>,
    /// Health, metrics and status endpoints.
    #[serde(default)]
    pub http: HttpSettings,
    /// OpenTelemetry spans over OTLP/HTTP. Default: off.
    #[serde(default)]
    pub otlp: relay_telemetry::otlp::OtlpSettings,
    /// The `[outbox.contracts]` files, compiled once per process (shared by every clone).
    #[serde(skip)]
    pub contract_cache: Arc<ContractCache>,
}

fn default_outbox() -> OutboxTables {
    vec![OutboxTableConfig::with_defaults("public.outbox")].into()
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
    /// While another process streams the slot (a standby relay of an active/standby pair), how
    /// often this relay asks PostgreSQL whether the slot is free, on one kept session: how soon
    /// it takes over once the active relay's walsender is gone. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub standby_poll_interval: Duration,
    /// Opt-in, with `replay_retention`: every this often, the relay checks the events committed
    /// since its last audit against the stream, by the WAL the slot keeps (as `outbox-relay
    /// verify`), and reports what the stream lost after it said "stored". Default: off.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub audit_interval: Option<Duration>,
    /// With `audit_interval`: publish what an audit finds missing again from the WAL (as
    /// `outbox-relay restore`), with the same `Nats-Msg-Id`. Default `false`.
    pub audit_heal: bool,
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
    /// Opt-in: the position confirmed to the slot trails the stored checkpoint by this window,
    /// a duration (`"6h"`) or a WAL size (`"2GB"`), so PostgreSQL keeps that WAL for
    /// `outbox-relay restore`. Restarts still resume at the checkpoint. See docs/replay.md.
    #[serde(skip_serializing_if = "Option::is_none", with = "replay_retention")]
    pub replay_retention: Option<relay_core::trail::ReplayRetention>,
    /// Rows per second at most for the backfill at slot creation (`[[outbox]] backfill =
    /// "on-create"`), to spare the database and the broker on the first start; 0: as fast as
    /// JetStream acknowledges. Default 0.
    pub backfill_rate: u64,
    /// Carry out the signals inserted into `outbox_relay.signal` (a backfill started from SQL),
    /// creating the table when missing. Default `true`.
    pub sql_signals: bool,
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

fn default_standby_poll_interval() -> Duration {
    Duration::from_secs(1)
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
            standby_poll_interval: default_standby_poll_interval(),
            audit_interval: None,
            audit_heal: false,
            dead_letter_subject: pipeline.dead_letter_subject,
            publication_check_interval: default_publication_check_interval(),
            takeover_budget: default_takeover_budget(),
            position_retention: relay_postgres::checkpoint::DEFAULT_RETENTION,
            replay_retention: None,
            backfill_rate: 0,
            sql_signals: true,
        }
    }
}

impl PipelineSettings {
    /// `replay_retention` when given as a WAL size.
    pub fn replay_retention_bytes(&self) -> Option<u64> {
        match self.replay_retention? {
            relay_core::trail::ReplayRetention::Bytes(b) => Some(b),
            relay_core::trail::ReplayRetention::Time(_) => None,
        }
    }

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
    // Long: a list of independent checks without connecting, each a few lines with its own error
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
        self.outbox
            .check_row_filters()
            .map_err(ConfigError::Invalid)?;
        for (table, cleanup) in self.outbox.cleanup() {
            if let Some(problem) = cleanup.problem() {
                return Err(ConfigError::Invalid(format!(
                    "[[outbox]] table `{}`: [outbox.cleanup] {problem}",
                    table.table
                )));
            }
            if table.row_filter.is_some() && cleanup.mode == CleanupMode::DropPartitions {
                return Err(ConfigError::Invalid(format!(
                    "[[outbox]] table `{}`: [outbox.cleanup] mode = \"drop-partitions\" drops every row of a partition, also those row_filter leaves out (which the relay never publishes): use mode = \"delete\" or \"mark\", which touch only rows row_filter keeps",
                    table.table
                )));
            }
        }
        if self.relay.max_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "[relay] max_in_flight must be at least 1".into(),
            ));
        }
        // A fast batch's first message waits for a second one (or its transaction's end)
        // before it is sent: with a window of one the relay would never read on to either.
        if self.relay.max_in_flight < self.nats.publish_mode.min_in_flight() {
            return Err(ConfigError::Invalid(format!(
                "[relay] max_in_flight = {} is too small for [nats] publish_mode = \"fast-batch\" (a batch's first message waits for the next one): set max_in_flight to at least 2, or publish_mode = \"per-message\"",
                self.relay.max_in_flight
            )));
        }
        if let Some(problem) = replay_retention::audit_problem(&self.relay) {
            return Err(ConfigError::Invalid(problem));
        }
        for (key, value) in [
            ("checkpoint_interval", self.relay.checkpoint_interval),
            (
                "publication_check_interval",
                self.relay.publication_check_interval,
            ),
            ("takeover_budget", self.relay.takeover_budget),
            ("position_retention", self.relay.position_retention),
            ("standby_poll_interval", self.relay.standby_poll_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Invalid(format!(
                    "[relay] {key} must be positive"
                )));
            }
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
        if self.http.console && self.http.listen.is_none() {
            return Err(ConfigError::Invalid(
                "[http] console = true needs [http] listen: the console is served by that listener"
                    .into(),
            ));
        }
        if self.http.console_write && self.http.console_token_file.is_none() {
            return Err(ConfigError::Invalid(
                "[http] console_write = true needs [http] console_token_file: a console that changes state needs a token".into(),
            ));
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
        if let Some(problem) = self
            .nats
            .domain
            .as_deref()
            .and_then(relay_nats::domain_problem)
        {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.nats.inbox_prefix_problem() {
            return Err(ConfigError::Invalid(problem));
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
            .map_err(|e| invalid("[[messages]]", &e))?
            .with_contracts(|table, _| self.compiled_contracts(table))
    }

    /// The router of one `[[outbox]]` mapping alone (a backfill's), with its contracts.
    pub fn router_for(&self, mapping: &OutboxTableConfig) -> Result<Router, ConfigError> {
        Router::new(std::slice::from_ref(mapping))
            .map_err(|e| ConfigError::Invalid(format!("[[outbox]] {e}")))?
            .with_contracts(|table, _| self.compiled_contracts(table))
    }

    /// The compiled `[outbox.contracts]` of `table`, from the process's cache.
    fn compiled_contracts(
        &self,
        table: &OutboxTableConfig,
    ) -> Result<Arc<relay_core::route::TableContracts>, ConfigError> {
        let contracts = self.contract_cache.tables(&self.outbox)?;
        contracts.get(&table.table).cloned().ok_or_else(|| {
            ConfigError::Invalid(format!(
                "[[outbox]] table `{}`: [outbox.contracts] is not in the configuration's [[outbox]] list",
                table.table
            ))
        })
    }

    /// `(table, contract)` for every `[outbox.contracts]` contract, compiled once per process
    /// (the ones every router of the process checks against).
    pub fn contracts(
        &self,
    ) -> Result<Vec<(String, Arc<relay_core::route::LoadedContract>)>, ConfigError> {
        let tables = self.contract_cache.tables(&self.outbox)?;
        Ok(self
            .outbox
            .iter()
            .filter_map(|o| Some((o.display_name(), tables.get(&o.table)?)))
            .flat_map(|(name, set)| set.contracts().into_iter().map(move |c| (name.clone(), c)))
            .collect())
    }

    /// `(table, sample subject)` for every mapping (`[[messages]] prefix "…"` for a message
    /// prefix), for the stream check.
    pub fn sample_subjects(&self) -> Vec<(String, String)> {
        let mut samples: Vec<(String, String)> = self
            .outbox
            .iter()
            .filter_map(|o| o.validate().ok().map(|t| (o, t)))
            .filter(|(_, t)| !t.starts_with_placeholder())
            .flat_map(|(o, t)| t.samples("x").into_iter().map(|s| (o.table.clone(), s)))
            .collect();
        for o in self.outbox.iter() {
            if let Some(sample) = o.schedule_sample() {
                samples.push((format!("{} schedule_subject", o.table), sample));
            }
        }
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

    /// `(table, subject template)` of every mapping whose template starts with a placeholder
    /// (a framework's topic as the whole subject): the stream check cannot sample it.
    pub fn unsampled_subjects(&self) -> Vec<(String, String)> {
        self.outbox
            .iter()
            .filter(|o| o.validate().is_ok_and(|t| t.starts_with_placeholder()))
            .map(|o| (o.table.clone(), o.subject.clone()))
            .collect()
    }

    /// What a template `unsampled_subjects` names means for the stream check.
    pub fn unsampled_warning(&self, table: &str, template: &str) -> String {
        format!(
            "the subject template `{template}` of outbox table `{table}` starts with a column, so the relay cannot check at start that stream `{}` captures its subjects: give the stream every subject the column can hold ([nats] stream_subjects); a row whose subject it does not capture is retried for [relay] no_stream_grace and then stops the relay, before its transaction (nothing is skipped)",
            self.nats.stream
        )
    }

    /// What the mappings' broker-native headers need from the server and stream.
    pub fn broker_needs(&self) -> Vec<relay_core::route::BrokerNeed> {
        self.outbox.iter().flat_map(|o| o.broker_needs()).collect()
    }

    /// `(schema, table)` of every outbox table, as the catalog stores them.
    pub fn tables(&self) -> Vec<(String, String)> {
        self.outbox
            .iter()
            .map(|o| {
                let (s, t) = o.qualified_name();
                (s.into_owned(), t.into_owned())
            })
            .collect()
    }

    /// Every outbox table with its `row_filter`, for the start-up checks.
    pub fn published_tables(&self) -> Vec<relay_postgres::bootstrap::PublishedTable> {
        self.outbox
            .iter()
            .map(|o| {
                let (s, t) = o.qualified_name();
                relay_postgres::bootstrap::PublishedTable {
                    row_filter: o.row_filter.clone(),
                    ..relay_postgres::bootstrap::PublishedTable::new(s, t)
                }
            })
            .collect()
    }
}

/// The time column a table's age is read from: its `[outbox.cleanup]`'s, else `created_at`.
pub fn age_spec_of(cleanup: Option<&CleanupSettings>) -> relay_cleanup::AgeSpec {
    cleanup.map_or_else(
        || relay_cleanup::AgeSpec {
            column: "created_at".into(),
            unit: None,
            time_zone: None,
        },
        CleanupSettings::age_spec,
    )
}

#[cfg(test)]
mod tests;
