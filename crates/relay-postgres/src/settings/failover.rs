//! `[postgres] failover`: whether the slot is created as a failover slot (PostgreSQL 17+).

use serde::{Deserialize, Serialize};

use crate::PgError;
use crate::server_version::version_text;

/// `[postgres] failover`: whether the slot is created as a failover slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailoverSetting {
    /// On where the server supports failover slots (PostgreSQL 17+), off below.
    #[default]
    Auto,
    /// On; the relay refuses to start on a server without failover slots.
    On,
    /// Off: the slot stays on the server it was created on.
    Off,
}

/// The first PostgreSQL version with failover slots (`server_version_num`).
pub(crate) const FAILOVER_SLOTS_SINCE: i32 = 170_000;

impl FailoverSetting {
    /// Whether the slot should be a failover slot on a server of `server_version_num`; an error
    /// naming the setting when `true` was asked for and the server has no failover slots.
    pub fn wanted(self, server_version_num: i32) -> Result<bool, PgError> {
        let supported = server_version_num >= FAILOVER_SLOTS_SINCE;
        match self {
            FailoverSetting::Off => Ok(false),
            FailoverSetting::Auto => Ok(supported),
            FailoverSetting::On if supported => Ok(true),
            FailoverSetting::On => Err(PgError::Settings(format!(
                "postgres.failover = true, but PostgreSQL {} has no failover slots (they exist \
                 since 17): remove postgres.failover (or set it false) to run without, and see \
                 docs/operations.md, \"Failover\", for what a failover then takes",
                version_text(server_version_num)
            ))),
        }
    }

    /// `auto`, `true` or `false`, as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            FailoverSetting::Auto => "auto",
            FailoverSetting::On => "true",
            FailoverSetting::Off => "false",
        }
    }
}

impl Serialize for FailoverSetting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            FailoverSetting::Auto => serializer.serialize_str("auto"),
            FailoverSetting::On => serializer.serialize_bool(true),
            FailoverSetting::Off => serializer.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for FailoverSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bool(true) => Ok(FailoverSetting::On),
            Raw::Bool(false) => Ok(FailoverSetting::Off),
            Raw::Text(t) => match t.to_ascii_lowercase().as_str() {
                "auto" => Ok(FailoverSetting::Auto),
                "true" | "on" => Ok(FailoverSetting::On),
                "false" | "off" => Ok(FailoverSetting::Off),
                other => Err(serde::de::Error::custom(format!(
                    "postgres.failover must be true, false or \"auto\", not {other:?}"
                ))),
            },
        }
    }
}
