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

pub mod replay_retention;

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
    pub otlp: crate::otlp::OtlpSettings,
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

fn default_outbox() -> OutboxTables {
    vec![OutboxTableConfig::with_defaults("public.outbox")].into()
}

/// The `[[outbox]]` tables: each table's mapping (relay-core's [`OutboxTableConfig`]) and its
/// optional `[outbox.cleanup]`. Derefs to the mappings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxTables {
    tables: Vec<OutboxTableConfig>,
    cleanup: Vec<Option<CleanupSettings>>,
    backfill: Vec<BackfillSetting>,
}

/// `[[outbox]] backfill`: whether the rows a table already holds when the relay creates its
/// slot are published (docs/replay.md, "Backfill at slot creation").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackfillSetting {
    /// Only rows committed after the slot's creation are published (`outbox-relay backfill`
    /// publishes older ones on demand).
    #[default]
    Off,
    /// When the relay creates the slot, it publishes the rows committed before the slot's
    /// consistent point from the slot's exported snapshot, then streams.
    OnCreate,
}

impl From<Vec<OutboxTableConfig>> for OutboxTables {
    fn from(tables: Vec<OutboxTableConfig>) -> Self {
        let cleanup = vec![None; tables.len()];
        let backfill = vec![BackfillSetting::Off; tables.len()];
        Self {
            tables,
            cleanup,
            backfill,
        }
    }
}

impl std::ops::Deref for OutboxTables {
    type Target = [OutboxTableConfig];

    fn deref(&self) -> &Self::Target {
        &self.tables
    }
}

impl OutboxTables {
    /// Every table with an `[outbox.cleanup]`, and its settings.
    pub fn cleanup(&self) -> impl Iterator<Item = (&OutboxTableConfig, &CleanupSettings)> {
        self.tables
            .iter()
            .zip(&self.cleanup)
            .filter_map(|(t, c)| c.as_ref().map(|c| (t, c)))
    }

    /// The tables with `backfill = "on-create"`.
    pub fn backfill_on_create(&self) -> impl Iterator<Item = &OutboxTableConfig> {
        self.tables
            .iter()
            .zip(&self.backfill)
            .filter(|(_, b)| **b == BackfillSetting::OnCreate)
            .map(|(t, _)| t)
    }

    /// The `[outbox.cleanup]` of `table` (`schema.table`), if any.
    pub fn cleanup_of(&self, schema: &str, table: &str) -> Option<&CleanupSettings> {
        self.cleanup()
            .find(|(t, _)| t.qualified_name() == (schema, table))
            .map(|(_, c)| c)
    }
}

// Each entry is the mapping's keys plus `cleanup`: the mapping is read by relay-core's own
// (strict) deserializer, the cleanup by [`CleanupSettings`]'s, so an unknown key in either is
// an error naming it.
impl Serialize for OutboxTables {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        let mut seq = serializer.serialize_seq(Some(self.tables.len()))?;
        for ((table, cleanup), backfill) in
            self.tables.iter().zip(&self.cleanup).zip(&self.backfill)
        {
            let mut entry = serde_json::to_value(table).map_err(S::Error::custom)?;
            if let (BackfillSetting::OnCreate, Some(map)) = (backfill, entry.as_object_mut()) {
                map.insert(
                    "backfill".into(),
                    serde_json::to_value(backfill).map_err(S::Error::custom)?,
                );
            }
            if let (Some(cleanup), Some(map)) = (cleanup, entry.as_object_mut()) {
                map.insert(
                    "cleanup".into(),
                    serde_json::to_value(cleanup).map_err(S::Error::custom)?,
                );
            }
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for OutboxTables {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let entries = Vec::<serde_json::Map<String, serde_json::Value>>::deserialize(deserializer)?;
        let mut out = Self::default();
        for mut entry in entries {
            let table = entry
                .get("table")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_owned();
            let cleanup = entry
                .remove("cleanup")
                .map(serde_json::from_value::<CleanupSettings>)
                .transpose()
                .map_err(|e| {
                    D::Error::custom(format!("[[outbox]] table `{table}`: [outbox.cleanup]: {e}"))
                })?;
            let backfill = entry
                .remove("backfill")
                .map(serde_json::from_value::<BackfillSetting>)
                .transpose()
                .map_err(|e| {
                    D::Error::custom(format!(
                        "[[outbox]] table `{table}`: backfill: {e} (\"off\" or \"on-create\")"
                    ))
                })?
                .unwrap_or_default();
            let mapping = serde_json::from_value(serde_json::Value::Object(entry))
                .map_err(|e| D::Error::custom(format!("[[outbox]] table `{table}`: {e}")))?;
            out.tables.push(mapping);
            out.cleanup.push(cleanup);
            out.backfill.push(backfill);
        }
        Ok(out)
    }
}

/// What `[outbox.cleanup]` does with rows whose events are at or behind the stored checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanupMode {
    /// Delete them (older than `retain`), in batches.
    Delete,
    /// Detach and drop whole partitions whose range is older than `retain` (a table
    /// range-partitioned on one time column), once the checkpoint is past their rows.
    DropPartitions,
    /// Set `status_column` and/or `sent_at_column` (for teams coming from a polling relay).
    Mark,
}

/// `[outbox.cleanup]`: opt-in cleanup of one outbox table, tied to the confirmed position: no
/// row is deleted, marked or dropped before the stored checkpoint is past its transaction
/// (`relay_postgres::cleanup`). Off unless present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupSettings {
    /// `delete`, `drop-partitions` or `mark`.
    pub mode: CleanupMode,
    /// How long rows (partitions: the end of a partition's range) are kept after `age_column`,
    /// even when confirmed. Default `7d` for `delete` and `drop-partitions`, `0s` for `mark`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub retain: Option<Duration>,
    /// The row's time column `retain` counts from. Default `created_at`.
    #[serde(default = "default_age_column")]
    pub age_column: String,
    /// How often a round runs. Default `1m`.
    #[serde(default = "default_cleanup_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Rows per statement (`delete`, `mark`). Default 1000.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Pause between batches of a round, so cleanup stays off the hot path. Default `100ms`.
    #[serde(default = "default_batch_pause", with = "humantime_serde")]
    pub batch_pause: Duration,
    /// `statement_timeout` of every cleanup statement. Default `5s`.
    #[serde(default = "default_statement_timeout", with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// `lock_timeout` of every cleanup statement. Default `1s`.
    #[serde(default = "default_lock_timeout", with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `mark`: the status column to set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_column: Option<String>,
    /// `mark`: the value `status_column` gets. Default `sent`.
    #[serde(default = "default_status_value")]
    pub status_value: String,
    /// `mark`: a timestamp column set to `now()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at_column: Option<String>,
    /// `mark`: also delete confirmed rows once `age_column` is older than this (what a polling
    /// relay's cleanup job did after marking). Off unless set; at least `retain`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub delete_after: Option<Duration>,
    /// `drop-partitions`: create the partitions after the newest one, each as wide as it, so
    /// that they cover at least this far past now (e.g. `"3d"`). Off unless set.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub create_ahead: Option<Duration>,
}

fn default_age_column() -> String {
    "created_at".into()
}
fn default_cleanup_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_batch_size() -> u32 {
    1000
}
fn default_batch_pause() -> Duration {
    Duration::from_millis(100)
}
fn default_statement_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_lock_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_status_value() -> String {
    "sent".into()
}

impl CleanupSettings {
    /// `retain`, or the mode's default.
    pub fn retain(&self) -> Duration {
        self.retain.unwrap_or(match self.mode {
            CleanupMode::Mark => Duration::ZERO,
            CleanupMode::Delete | CleanupMode::DropPartitions => Duration::from_secs(7 * 86400),
        })
    }

    /// Why these settings cannot be used, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if self.interval.is_zero() {
            return Some("interval must be positive".into());
        }
        if self.batch_size == 0 {
            return Some("batch_size must be at least 1".into());
        }
        if self.statement_timeout.is_zero() || self.lock_timeout.is_zero() {
            return Some("statement_timeout and lock_timeout must be positive".into());
        }
        if self.age_column.is_empty() {
            return Some("age_column must name a column".into());
        }
        let marks = self.status_column.is_some() || self.sent_at_column.is_some();
        match self.mode {
            CleanupMode::Mark if !marks => Some(
                "mode = \"mark\" needs status_column (set to status_value) or sent_at_column (set to now()), or both".into(),
            ),
            CleanupMode::Delete | CleanupMode::DropPartitions if marks => Some(format!(
                "status_column and sent_at_column are for mode = \"mark\", not \"{}\"",
                self.mode.as_str()
            )),
            CleanupMode::Delete | CleanupMode::Mark if self.create_ahead.is_some() => {
                Some(format!(
                    "create_ahead is for mode = \"drop-partitions\", not \"{}\"",
                    self.mode.as_str()
                ))
            }
            CleanupMode::DropPartitions if self.create_ahead.is_some_and(|d| d.is_zero()) => {
                Some("create_ahead must be positive (or left out)".into())
            }
            CleanupMode::Delete | CleanupMode::DropPartitions if self.delete_after.is_some() => {
                Some(format!(
                    "delete_after is for mode = \"mark\" (mode = \"{}\" removes rows after retain already)",
                    self.mode.as_str()
                ))
            }
            CleanupMode::Mark if self.delete_after.is_some_and(|d| d < self.retain()) => {
                Some("delete_after must be at least retain: rows are kept for retain, then marked, then deleted".into())
            }
            _ => None,
        }
    }

    /// The row cleanups of `schema.table`, in the order a round runs them: `delete`; `mark`, then
    /// with `delete_after` a delete of the rows older than that; none for `drop-partitions`.
    pub fn row_plans(&self, schema: &str, table: &str) -> Vec<relay_postgres::cleanup::RowPlan> {
        use relay_postgres::cleanup::{CleanupAction, RowPlan};
        let plan = |action, retain| RowPlan {
            schema: schema.to_owned(),
            table: table.to_owned(),
            action,
            retain,
            age_column: self.age_column.clone(),
            batch_size: i64::from(self.batch_size),
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
        };
        match self.mode {
            CleanupMode::Delete => vec![plan(CleanupAction::Delete, self.retain())],
            CleanupMode::Mark => {
                let mark = CleanupAction::Mark {
                    status: self
                        .status_column
                        .clone()
                        .map(|c| (c, self.status_value.clone())),
                    sent_at: self.sent_at_column.clone(),
                };
                let mut plans = vec![plan(mark, self.retain())];
                plans.extend(
                    self.delete_after
                        .map(|after| plan(CleanupAction::Delete, after)),
                );
                plans
            }
            CleanupMode::DropPartitions => Vec::new(),
        }
    }

    /// The partition cleanup of `schema.table`; `None` unless `drop-partitions`.
    pub fn drop_plan(
        &self,
        schema: &str,
        table: &str,
    ) -> Option<relay_postgres::cleanup::DropPlan> {
        (self.mode == CleanupMode::DropPartitions).then(|| relay_postgres::cleanup::DropPlan {
            schema: schema.to_owned(),
            table: table.to_owned(),
            retain: self.retain(),
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
            create_ahead: self.create_ahead,
        })
    }
}

impl CleanupMode {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::DropPartitions => "drop-partitions",
            Self::Mark => "mark",
        }
    }
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
    /// Opt-in: the position confirmed to the slot trails the stored checkpoint by this window,
    /// a duration (`"6h"`) or a WAL size (`"2GB"`), so PostgreSQL keeps that WAL for
    /// `outbox-relay restore`. Restarts still resume at the checkpoint. See docs/replay.md.
    #[serde(skip_serializing_if = "Option::is_none", with = "replay_retention")]
    pub replay_retention: Option<relay_core::trail::ReplayRetention>,
    /// Rows per second at most for the backfill at slot creation (`[[outbox]] backfill =
    /// "on-create"`), to spare the database and the broker on the first start; 0: as fast as
    /// JetStream acknowledges. Default 0.
    pub backfill_rate: u64,
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
            replay_retention: None,
            backfill_rate: 0,
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
        for (table, cleanup) in self.outbox.cleanup() {
            if let Some(problem) = cleanup.problem() {
                return Err(ConfigError::Invalid(format!(
                    "[[outbox]] table `{}`: [outbox.cleanup] {problem}",
                    table.table
                )));
            }
        }
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

    /// What the mappings' broker-native headers need from the server and stream.
    pub fn broker_needs(&self) -> Vec<relay_core::route::BrokerNeed> {
        self.outbox.iter().flat_map(|o| o.broker_needs()).collect()
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
    #[allow(clippy::result_large_err)] // figment's Jail API
    fn cleanup_is_per_table_and_strict() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "relay.toml",
                r#"
                [[outbox]]
                table = "public.outbox"
                [outbox.cleanup]
                mode = "delete"
                retain = "3d"
                batch_size = 500

                [[outbox]]
                table = "public.polled"
                payload = "*"
                [outbox.cleanup]
                mode = "mark"
                status_column = "status"
                sent_at_column = "sent_at"

                [[outbox]]
                table = "public.plain"
                "#,
            )?;
            let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
            assert_eq!(c.outbox.len(), 3);
            assert_eq!(c.outbox[1].payload, "*");
            let cleanup: Vec<_> = c
                .outbox
                .cleanup()
                .map(|(t, s)| (t.table.clone(), s.mode, s.retain(), s.batch_size))
                .collect();
            assert_eq!(
                cleanup,
                [
                    (
                        "public.outbox".to_owned(),
                        CleanupMode::Delete,
                        Duration::from_secs(3 * 86400),
                        500
                    ),
                    (
                        "public.polled".to_owned(),
                        CleanupMode::Mark,
                        Duration::ZERO,
                        1000
                    ),
                ]
            );
            assert!(c.outbox.cleanup_of("public", "plain").is_none());
            jail.create_file(
                "zero.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nretain = \"0s\"\n",
            )?;
            let zero = RelayConfig::load(Some(Path::new("zero.toml"))).expect("loads");
            let retain = zero.outbox.cleanup().map(|(_, s)| s.retain()).next();
            assert_eq!(retain, Some(Duration::ZERO));
            let plans = c
                .outbox
                .cleanup_of("public", "polled")
                .map(|s| s.row_plans("public", "polled"))
                .expect("a cleanup");
            assert_eq!(plans.len(), 1, "mark without delete_after only marks");
            assert_eq!(plans[0].batch_size, 1000);
            jail.create_file(
                "mark_delete.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\nsent_at_column = \"sent_at\"\nretain = \"1h\"\ndelete_after = \"2d\"\n",
            )?;
            let both = RelayConfig::load(Some(Path::new("mark_delete.toml"))).expect("loads");
            let plans: Vec<_> = both
                .outbox
                .cleanup()
                .flat_map(|(_, s)| s.row_plans("public", "t"))
                .map(|p| (p.action, p.retain))
                .collect();
            assert_eq!(
                plans,
                [
                    (
                        relay_postgres::cleanup::CleanupAction::Mark {
                            status: None,
                            sent_at: Some("sent_at".into())
                        },
                        Duration::from_secs(3600)
                    ),
                    (
                        relay_postgres::cleanup::CleanupAction::Delete,
                        Duration::from_secs(2 * 86400)
                    ),
                ],
                "marked after retain, deleted after delete_after"
            );
            // Printed back where it was written.
            let json = serde_json::to_value(&c).expect("serializes");
            assert_eq!(json["outbox"][0]["cleanup"]["mode"], "delete");
            assert_eq!(json["outbox"][0]["cleanup"]["retain"], "3days");
            assert!(json["outbox"][2].get("cleanup").is_none());

            for (file, text, needle) in [
                (
                    "typo.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nretian = \"1d\"\n",
                    "retian",
                ),
                (
                    "mapping.toml",
                    "[[outbox]]\ntable = \"t\"\nsubjekt = \"x\"\n",
                    "subjekt",
                ),
                (
                    "mode.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"truncate\"\n",
                    "truncate",
                ),
                (
                    "mark.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\n",
                    "needs status_column",
                ),
                (
                    "delete.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nstatus_column = \"s\"\n",
                    "are for mode = \"mark\"",
                ),
                (
                    "delete_after.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\ndelete_after = \"1d\"\n",
                    "delete_after is for mode = \"mark\"",
                ),
                (
                    "delete_before_retain.toml",
                    "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\nsent_at_column = \"s\"\nretain = \"2d\"\ndelete_after = \"1d\"\n",
                    "delete_after must be at least retain",
                ),
            ] {
                jail.create_file(file, text)?;
                let err = RelayConfig::load(Some(Path::new(file))).unwrap_err();
                let shown = format!("{err} {err:?}");
                assert!(shown.contains(needle), "{file}: {shown}");
            }
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
