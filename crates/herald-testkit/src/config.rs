//! A role's typed configuration (`herald_api::ApiConfig`, `herald_poller::config::PollerConfig`,
//! …) as the `--config` file its process reads: the test kit builds the struct, and the role
//! runs with exactly that struct's values (`herald <role> --config FILE --print-config` prints
//! them back; a test holds the two equal).

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

/// `config` as a `--config` file's TOML: one top-level key per flag, lists as arrays. Settings
/// that are unset (an absent option, an empty list) are left out, so the role's own default
/// (none) applies.
pub fn role_config_toml<T: Serialize>(config: &T) -> anyhow::Result<String> {
    let serde_json::Value::Object(fields) = serde_json::to_value(config)? else {
        anyhow::bail!("a role's configuration is a struct");
    };
    let kept: serde_json::Map<String, serde_json::Value> = fields
        .into_iter()
        .filter(|(_, value)| match value {
            serde_json::Value::Null => false,
            serde_json::Value::Array(items) => !items.is_empty(),
            _ => true,
        })
        .collect();
    toml::to_string(&kept).context("writing a role's configuration as TOML")
}

/// Writes `config` to `path` for `herald <role> --config path`.
pub fn write_role_config<T: Serialize>(config: &T, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, role_config_toml(config)?)
        .with_context(|| format!("writing {}", path.display()))
}
