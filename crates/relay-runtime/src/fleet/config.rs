//! The fleet's configuration: one file of what the process and every pipeline share, and the
//! pipelines, as `[[pipeline]]` entries in that file and/or one file each in `[fleet]
//! pipelines_dir`. A pipeline's values are merged over the shared file's (tables key by key,
//! lists such as `[[outbox]]` replaced whole), so a pipeline file names only what is its own:
//! usually `[postgres] url` and `slot`, `[nats] stream` and its `[[outbox]]` tables.
//!
//! A file without `[fleet]` or `[[pipeline]]` is today's single-relay configuration: a fleet
//! of one, run exactly as before (same metrics, status and exit codes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Value};
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, HttpSettings, RelayConfig};

/// The `[fleet]` section of the shared file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetSettings {
    /// A directory of pipeline files: every `<name>.toml` in it is one pipeline named
    /// `<name>`, merged over this file. Relative to this file's directory. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipelines_dir: Option<PathBuf>,
    /// The processes running this fleet's configuration (on several hosts) find each other
    /// by this name. Default `outbox-relay`.
    pub name: String,
    /// Spread the pipelines over the processes running the fleet: each takes the pipelines
    /// placed on it and hands over the others (`_outbox_relay.fleet.<name>.heartbeat` on the
    /// shared `[nats]`: every process's user needs to publish and subscribe to it). Without
    /// it, whichever process finds a slot free takes it. Default `true`.
    pub spread: bool,
    /// How often a process says it is alive; one not heard for three intervals is gone and its
    /// pipelines are taken by the others. Default `1s`.
    #[serde(with = "humantime_serde")]
    pub heartbeat_interval: std::time::Duration,
    /// The threads the process runs its pipelines on. Default: one per core (a single relay
    /// runs on one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            pipelines_dir: None,
            name: "outbox-relay".into(),
            spread: true,
            heartbeat_interval: std::time::Duration::from_secs(1),
            threads: None,
        }
    }
}

impl FleetSettings {
    /// The `[fleet]` section's value (`None`: not given), checked.
    fn read(value: Option<Value>) -> Result<Self, ConfigError> {
        let fleet: Self = match value {
            Some(value) => Figment::from(Serialized::defaults(value))
                .extract()
                .map_err(|e| invalid_section("[fleet]", e))?,
            None => Self::default(),
        };
        if fleet.heartbeat_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "[fleet] heartbeat_interval must be positive".into(),
            ));
        }
        if fleet.name.is_empty() || fleet.name.contains(['.', '*', '>', ' ']) {
            return Err(ConfigError::Invalid(format!(
                "[fleet] name `{}` must be one NATS subject token (no `.`, `*`, `>` or spaces)",
                fleet.name
            )));
        }
        Ok(fleet)
    }
}

/// Where a pipeline's own values come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configuration without `[fleet]` or `[[pipeline]]`: a fleet of one.
    Single,
    /// `[[pipeline]]` number `index` (from 0) of the shared file.
    Inline { file: PathBuf, index: usize },
    /// A file in `[fleet] pipelines_dir`.
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Single => f.write_str("the configuration"),
            Origin::Inline { file, index } => {
                write!(f, "[[pipeline]] {} of {}", index + 1, file.display())
            }
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One pipeline of the fleet: a database, its slot and publication, its outbox tables and
/// the stream they go to, as one single-relay configuration describes them.
#[derive(Debug, Clone)]
pub struct PipelineEntry {
    /// Its name: the `pipeline` label of every metric, its key in `/status`, `--pipeline`.
    pub name: String,
    pub origin: Origin,
    pub config: RelayConfig,
    /// The merged values it was built from, secrets included: a reload restarts the pipeline
    /// when they differ.
    pub fingerprint: Value,
    /// Its sources, with where each value came from (for `config print`).
    pub figment: Figment,
}

/// A pipeline that cannot run as configured, and why.
#[derive(Debug, Clone)]
pub struct RefusedPipeline {
    /// Its name (the file's stem, or what its entry says, else the origin).
    pub name: String,
    pub origin: Origin,
    pub reason: String,
}

impl std::fmt::Display for RefusedPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pipeline `{}` ({}): {}",
            self.name, self.origin, self.reason
        )
    }
}

/// The whole fleet as configured.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The shared file (`None`: defaults plus environment, a fleet of one).
    pub file: Option<PathBuf>,
    /// `false` for a single-relay configuration: no `pipeline` label, today's exits.
    pub is_fleet: bool,
    /// The process's `[http]` (one listener for every pipeline).
    pub http: HttpSettings,
    /// The shared `[nats]` (the fleet's processes hear each other there).
    pub nats: relay_nats::NatsSettings,
    pub fleet: FleetSettings,
    /// The pipelines that can run, in name order.
    pub pipelines: Vec<PipelineEntry>,
    /// The pipelines that cannot, each with its reason (a fleet with any does not start; a
    /// running fleet reloading keeps the previous version of each).
    pub refused: Vec<RefusedPipeline>,
}

impl FleetConfig {
    /// Loads the shared file (or, without one, defaults plus environment) and its pipelines.
    /// A shared file that cannot be read is an error; a pipeline that cannot is listed in
    /// [`FleetConfig::refused`]. `running` names the pipelines a running fleet has now: when two
    /// pipelines claim one slot or publication, one of those keeps it.
    pub fn load(file: Option<&Path>, running: &[String]) -> Result<Self, ConfigError> {
        let shared = RelayConfig::figment(file)?;
        let mut values: Dict = shared.extract().map_err(load_error)?;
        let fleet_value = values.remove("fleet");
        let inline = values.remove("pipeline");
        if fleet_value.is_none() && inline.is_none() {
            let config = RelayConfig::load(file)?;
            let entry = PipelineEntry {
                name: config.postgres.slot.clone(),
                origin: Origin::Single,
                fingerprint: Value::from(values),
                figment: shared,
                config,
            };
            return Ok(Self {
                file: file.map(Path::to_path_buf),
                is_fleet: false,
                http: entry.config.http.clone(),
                nats: entry.config.nats.clone(),
                fleet: FleetSettings::default(),
                pipelines: vec![entry],
                refused: Vec::new(),
            });
        }
        let fleet = FleetSettings::read(fleet_value)?;
        // What every pipeline shares, checked as a configuration of its own first: a bad
        // shared key is the shared file's error, not each pipeline's.
        let defaults: RelayConfig = Figment::from(Serialized::defaults(values.clone()))
            .extract()
            .map_err(load_error)?;
        let sources = pipeline_sources(file, &fleet, inline)?;
        let mut pipelines = Vec::new();
        let mut refused = Vec::new();
        for source in sources {
            match source.build(&values, &shared) {
                Ok(entry) => pipelines.push(entry),
                Err(reason) => refused.push(RefusedPipeline {
                    name: source.name,
                    origin: source.origin,
                    reason,
                }),
            }
        }
        refuse_conflicts(&mut pipelines, &mut refused, running);
        if pipelines.is_empty() && refused.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "the fleet has no pipeline: add [[pipeline]] entries or files to [fleet] pipelines_dir{}",
                fleet
                    .pipelines_dir
                    .as_ref()
                    .map(|d| format!(" ({})", d.display()))
                    .unwrap_or_default()
            )));
        }
        pipelines.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Self {
            file: file.map(Path::to_path_buf),
            is_fleet: true,
            http: defaults.http,
            nats: defaults.nats,
            fleet,
            pipelines,
            refused,
        })
    }

    /// The pipeline named `name`; `None` names the only one (an error when there are more).
    pub fn pipeline(&self, name: Option<&str>) -> Result<&PipelineEntry, ConfigError> {
        let names = || {
            self.pipelines
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match name {
            Some(name) => self
                .pipelines
                .iter()
                .find(|p| p.name == name)
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "no pipeline named `{name}` in this fleet (it has: {})",
                        names()
                    ))
                }),
            None => match self.pipelines.as_slice() {
                [only] => Ok(only),
                _ => Err(ConfigError::Invalid(format!(
                    "this fleet has {} pipelines: name one with --pipeline ({})",
                    self.pipelines.len(),
                    names()
                ))),
            },
        }
    }

    /// The refused pipelines as one error (a fleet starting with any does not start).
    pub fn refused_error(&self) -> Option<ConfigError> {
        if self.refused.is_empty() {
            return None;
        }
        let lines: Vec<String> = self.refused.iter().map(ToString::to_string).collect();
        Some(ConfigError::Invalid(lines.join("; ")))
    }
}

/// A pipeline's own values before they are merged.
struct PipelineSource {
    name: String,
    origin: Origin,
    values: Figment,
}

impl PipelineSource {
    /// Merges the pipeline's values over the shared ones and checks the result.
    fn build(&self, shared: &Dict, shared_sources: &Figment) -> Result<PipelineEntry, String> {
        check_name(&self.name)?;
        let own: Dict = self.values.extract().map_err(|e| figment_text(&e))?;
        for key in ["http", "fleet", "pipeline"] {
            if own.contains_key(key) {
                return Err(format!(
                    "[{key}] belongs to the shared file, not to a pipeline: move it there (one listener and one [fleet] serve every pipeline)"
                ));
            }
        }
        let merged = Figment::from(Serialized::defaults(shared.clone())).merge(self.values.clone());
        let fingerprint: Value = merged.extract().map_err(|e| figment_text(&e))?;
        let config: RelayConfig = merged.extract().map_err(|e| figment_text(&e))?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(PipelineEntry {
            name: self.name.clone(),
            origin: self.origin.clone(),
            config,
            fingerprint,
            // Read only for where a value came from: the shared file's keys, then its own.
            figment: shared_sources.clone().merge(self.values.clone()),
        })
    }
}

/// The pipelines of `[[pipeline]]` and of `[fleet] pipelines_dir`.
fn pipeline_sources(
    file: Option<&Path>,
    fleet: &FleetSettings,
    inline: Option<Value>,
) -> Result<Vec<PipelineSource>, ConfigError> {
    let shared_file = file.map_or_else(PathBuf::new, Path::to_path_buf);
    let mut sources = Vec::new();
    if let Some(inline) = inline {
        let Value::Array(_, entries) = inline else {
            return Err(ConfigError::Invalid(
                "`pipeline` must be a list of tables: write each as [[pipeline]] with a `name`"
                    .into(),
            ));
        };
        for (index, entry) in entries.into_iter().enumerate() {
            let origin = Origin::Inline {
                file: shared_file.clone(),
                index,
            };
            let Value::Dict(_, mut own) = entry else {
                return Err(ConfigError::Invalid(format!(
                    "{origin}: each [[pipeline]] must be a table with a `name`"
                )));
            };
            let name = match own.remove("name") {
                Some(Value::String(_, name)) => name,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{origin}: `name` is missing or not a string: give every [[pipeline]] a name = \"…\""
                    )));
                }
            };
            sources.push(PipelineSource {
                name,
                origin,
                values: Figment::from(Serialized::defaults(own)),
            });
        }
    }
    if let Some(dir) = &fleet.pipelines_dir {
        let dir = match file.and_then(Path::parent) {
            Some(base) if dir.is_relative() => base.join(dir),
            _ => dir.clone(),
        };
        let listing = std::fs::read_dir(&dir).map_err(|e| {
            ConfigError::Invalid(format!(
                "[fleet] pipelines_dir {}: cannot read it ({e}): create it or fix the path",
                dir.display()
            ))
        })?;
        let mut files: Vec<PathBuf> = listing
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        for path in files {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            sources.push(PipelineSource {
                name,
                values: Figment::from(Toml::file_exact(&path)),
                origin: Origin::File(path),
            });
        }
    }
    Ok(sources)
}

/// Pipeline names are metric label values, URL path segments and command-line arguments.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the name `{name}` is not a pipeline name: use 1-64 letters, digits, `-` or `_` (a pipeline file's name is its stem)"
        ))
    }
}

/// Refuses a second pipeline with the same name, the same slot on one PostgreSQL server
/// (slot names are per server) or the same publication in one database: they would take each
/// other's slot or change each other's publication. Pipelines in `running` keep theirs.
fn refuse_conflicts(
    pipelines: &mut Vec<PipelineEntry>,
    refused: &mut Vec<RefusedPipeline>,
    running: &[String],
) {
    pipelines.sort_by_key(|p| (!running.contains(&p.name), p.name.clone()));
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut slots: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut publications: BTreeMap<(String, String), String> = BTreeMap::new();
    for name in refused.iter().map(|r| r.name.clone()) {
        names.insert(name.clone(), name);
    }
    let mut kept = Vec::new();
    for entry in pipelines.drain(..) {
        let pg = &entry.config.postgres;
        let database = pg.display_target();
        let server = database
            .rsplit_once('/')
            .map_or(database.clone(), |(s, _)| s.to_owned());
        let conflict = if let Some(other) = names.get(&entry.name) {
            Some(format!(
                "the name `{}` is taken by another pipeline ({other}): names must be unique",
                entry.name
            ))
        } else if let Some(other) = slots.get(&(server.clone(), pg.slot.clone())) {
            Some(format!(
                "postgres.slot `{}` on {server} is pipeline `{other}`'s too: one slot has one reader, give each pipeline a slot of its own",
                pg.slot
            ))
        } else {
            publications
                .get(&(database.clone(), pg.publication.clone()))
                .map(|other| format!(
                    "postgres.publication `{}` in {database} is pipeline `{other}`'s too: give each pipeline a publication of its own",
                    pg.publication
                ))
        };
        if let Some(reason) = conflict {
            refused.push(RefusedPipeline {
                name: entry.name,
                origin: entry.origin,
                reason,
            });
            continue;
        }
        names.insert(entry.name.clone(), entry.origin.to_string());
        slots.insert((server, pg.slot.clone()), entry.name.clone());
        publications.insert((database, pg.publication.clone()), entry.name.clone());
        kept.push(entry);
    }
    *pipelines = kept;
}

fn load_error(error: figment::Error) -> ConfigError {
    ConfigError::Load(Box::new(error))
}

fn invalid_section(section: &str, error: figment::Error) -> ConfigError {
    ConfigError::Invalid(format!("{section} {}", figment_text(&error)))
}

/// Every message of a figment error, with the key and file it names.
fn figment_text(error: &figment::Error) -> String {
    error
        .clone()
        .into_iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
