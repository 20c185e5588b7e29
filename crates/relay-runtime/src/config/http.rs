//! The `[http]` section: where a running relay's endpoints and console are served (by its
//! caller: relay-runtime serves nothing) and the console's token file, read here like the other
//! files the settings name.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `[http]` section: `/livez`, `/readyz`, `/metrics`, `/status`, and the console.
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
    /// Serve the console (`/console`: overview, events, dead letters, consumers, backfills,
    /// configuration), read-only. Default `false`.
    #[serde(default)]
    pub console: bool,
    /// A file holding the console's token. Without one the console answers only requests
    /// from loopback; with one, only requests that carry it (`Authorization: Bearer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console_token_file: Option<std::path::PathBuf>,
    /// Let the console change state (re-publish dead letters). Needs `console_token_file`.
    /// Default `false`: read-only.
    #[serde(default)]
    pub console_write: bool,
}

fn default_sample_interval() -> Duration {
    Duration::from_secs(5)
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: None,
            sample_interval: default_sample_interval(),
            console: false,
            console_token_file: None,
            console_write: false,
        }
    }
}

impl HttpSettings {
    /// The token in `console_token_file`, trimmed (`None` without one); a file that cannot be
    /// read, or does not hold one token of at least 16 characters, is an error naming the file
    /// (never its contents).
    pub fn console_token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.console_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "[http] console_token_file `{}` cannot be read: {e}",
                path.display()
            )
        })?;
        let token = text.trim().to_owned();
        if token.len() < 16 || token.chars().any(|c| c.is_control() || c == ' ') {
            anyhow::bail!(
                "[http] console_token_file `{}` must hold one token of at least 16 characters without spaces (e.g. `openssl rand -hex 32`)",
                path.display()
            );
        }
        Ok(Some(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_from_file(text: Option<&str>) -> anyhow::Result<Option<String>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = HttpSettings {
            console: true,
            ..HttpSettings::default()
        };
        if let Some(text) = text {
            let path = dir.path().join("token");
            std::fs::write(&path, text).expect("write token");
            settings.console_token_file = Some(path);
        }
        settings.console_token()
    }

    #[test]
    fn the_token_is_read_trimmed_and_must_be_long_enough() {
        let token = token_from_file(Some("0123456789abcdef0123\n")).expect("token");
        assert_eq!(token.as_deref(), Some("0123456789abcdef0123"));
        let short = token_from_file(Some("short")).unwrap_err();
        assert!(short.to_string().contains("at least 16"), "{short}");
        let spaced = token_from_file(Some("0123456789 abcdef0123")).unwrap_err();
        assert!(spaced.to_string().contains("without spaces"));
        assert!(token_from_file(None).expect("no token").is_none());
    }

    #[test]
    fn a_missing_token_file_is_named() {
        let settings = HttpSettings {
            console_token_file: Some("/nonexistent/console.token".into()),
            ..HttpSettings::default()
        };
        let error = settings.console_token().unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/console.token"),
            "{error}"
        );
    }
}
