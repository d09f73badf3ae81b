//! `--config <file.toml>` (or `HERALD_CONFIG`): settings from a file, a layer between the
//! defaults and the environment. Precedence: flags > `HERALD_*` variables > the file >
//! defaults.
//!
//! Keys are the flags' names without the dashes (`max_batch` or `max-batch`). Top-level keys
//! apply to every role that has the flag; a `[<role>]` table (`[api]`, `[poller]`, `[worker]`,
//! `[migrate]`, `[provider-sim]`) applies to that role and wins over the top level. Arrays are
//! joined with commas (for the flags that take lists). A key no role knows, or a table of no
//! role, is refused: a typo must not be a silent default.
//!
//! It works by filling the `HERALD_*` variable of each key that is not set already, before the
//! command line is parsed, so clap's own precedence (flag, then variable, then default) does the
//! rest and `--print-config` shows the merged result.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{Cli, ConfigError};

/// Reads the file named by `--config` (or `HERALD_CONFIG`) and sets the variables it implies.
/// Call before parsing the command line, while the process has one thread.
pub fn apply(args: &[OsString]) -> Result<(), ConfigError> {
    // Nothing to do, and no command to build, without a file.
    let Some(path) = config_path(args) else {
        return Ok(());
    };
    let Some(role) = args
        .iter()
        .skip(1)
        .filter_map(|arg| arg.to_str())
        .find(|arg| !arg.starts_with('-'))
    else {
        return Ok(());
    };
    // Only the roles whose --config is this file (`herald plan --config` is a deployment plan).
    if !takes_settings_file(role) {
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|err| ConfigError(format!("--config: cannot read {}: {err}", path.display())))?;
    for (variable, value) in settings(&text, role)
        .map_err(|err| ConfigError(format!("--config {}: {err}", path.display())))?
    {
        if std::env::var_os(&variable).is_none() {
            // The process has one thread here: nothing reads the environment concurrently.
            std::env::set_var(&variable, value);
        }
    }
    Ok(())
}

fn takes_settings_file(role: &str) -> bool {
    let command = <Cli as clap::CommandFactory>::command();
    command.find_subcommand(role).is_some_and(|sub| {
        sub.get_arguments()
            .any(|arg| arg.get_env().is_some_and(|env| env == "HERALD_CONFIG"))
    })
}

fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut args = args.iter().filter_map(|arg| arg.to_str());
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("HERALD_CONFIG").map(PathBuf::from)
}

/// The variables (name, value) that `text` sets for `role`, top level first, then the role's
/// table over it.
pub fn settings(text: &str, role: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = text.parse().map_err(|err| format!("not TOML: {err}"))?;
    let roles = flag_variables();
    let mut out = BTreeMap::new();
    let mut tables = Vec::new();
    for (key, value) in &table {
        if let toml::Value::Table(inner) = value {
            let Some(flags) = roles.get(key.as_str()) else {
                let known: Vec<&str> = roles.keys().map(String::as_str).collect();
                return Err(format!("[{key}] is no role (roles: {})", known.join(", ")));
            };
            for (inner_key, inner_value) in inner {
                let variable = lookup(flags, inner_key).ok_or_else(|| {
                    format!("[{key}] {inner_key}: `herald {key}` has no such flag")
                })?;
                let text =
                    value_text(inner_value).map_err(|err| format!("[{key}] {inner_key}: {err}"))?;
                if key == role {
                    tables.push((variable.to_owned(), text));
                }
            }
            continue;
        }
        let for_role = roles.get(role).and_then(|flags| lookup(flags, key));
        if for_role.is_none() && !roles.values().any(|flags| lookup(flags, key).is_some()) {
            return Err(format!("{key}: no role has such a flag"));
        }
        let text = value_text(value).map_err(|err| format!("{key}: {err}"))?;
        if let Some(variable) = for_role {
            out.insert(variable.to_owned(), text);
        }
    }
    out.extend(tables);
    Ok(out)
}

fn lookup<'a>(flags: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    flags.get(&key.replace('-', "_")).map(String::as_str)
}

/// Each role's flags that have a variable, by the flag's name with underscores.
fn flag_variables() -> BTreeMap<String, HashMap<String, String>> {
    let command = <Cli as clap::CommandFactory>::command();
    let mut roles = BTreeMap::new();
    for sub in command.get_subcommands() {
        let flags: HashMap<String, String> = sub
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let env = arg.get_env()?.to_str()?;
                (env != "HERALD_CONFIG").then(|| (long.replace('-', "_"), env.to_owned()))
            })
            .collect();
        roles.insert(sub.get_name().to_owned(), flags);
    }
    roles
}

fn value_text(value: &toml::Value) -> Result<String, String> {
    Ok(match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) => items
            .iter()
            .map(|item| match item {
                toml::Value::Array(_) | toml::Value::Table(_) => {
                    Err("a list of lists or tables is not a flag's value".to_owned())
                }
                other => value_text(other),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        toml::Value::Datetime(at) => at.to_string(),
        toml::Value::Table(_) => return Err("a table is not a flag's value".to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::settings;

    #[test]
    fn a_role_table_wins_over_the_top_level_and_keys_take_either_spelling() {
        let text = r#"
            log_format = "pretty"
            max-batch = 10
            redis_send_url = ["redis://a/", "redis://b/"]
            [api]
            max_batch = 20
            require-idempotency-key = true
            [poller]
            batch_size = 100
        "#;
        let api = settings(text, "api").unwrap();
        assert_eq!(api["HERALD_LOG_FORMAT"], "pretty");
        assert_eq!(api["HERALD_API_MAX_BATCH"], "20");
        assert_eq!(api["HERALD_API_REQUIRE_IDEMPOTENCY_KEY"], "true");
        assert_eq!(api["HERALD_REDIS_SEND_URL"], "redis://a/,redis://b/");
        assert!(!api.contains_key("HERALD_POLLER_BATCH_SIZE"));
        let poller = settings(text, "poller").unwrap();
        assert_eq!(poller["HERALD_POLLER_BATCH_SIZE"], "100");
        // max_batch at the top level is the API's and the worker's flag, not the poller's.
        assert!(!poller.values().any(|v| v == "10"));
    }

    #[test]
    fn the_example_file_is_valid_for_every_role() {
        let text = include_str!("../../../examples/herald.toml");
        for role in ["api", "poller", "worker", "migrate", "provider-sim"] {
            settings(text, role).unwrap_or_else(|err| panic!("{role}: {err}"));
        }
        assert_eq!(
            settings(text, "api").unwrap()["HERALD_API_SHUTDOWN_DELAY"],
            "5s"
        );
    }

    #[test]
    fn unknown_keys_and_tables_are_refused() {
        let err = settings("max_bacth = 3", "api").unwrap_err();
        assert!(err.contains("max_bacth"), "{err}");
        let err = settings("[api]\nbatch_size = 3", "api").unwrap_err();
        assert!(err.contains("[api] batch_size"), "{err}");
        let err = settings("[apu]\nmax_batch = 3", "api").unwrap_err();
        assert!(err.contains("[apu] is no role"), "{err}");
        let err = settings("max_batch = [[1]]", "api").unwrap_err();
        assert!(err.contains("list of lists"), "{err}");
        assert!(settings("not = toml = here", "api")
            .unwrap_err()
            .contains("not TOML"));
    }
}
