//! What every role's configuration shares. Each role's settings are one typed struct in its
//! library crate (`herald_api::ApiConfig`, `herald_poller::PollerConfig`,
//! `herald_worker::WorkerConfig`, `herald_provider_sim::SimConfig`,
//! `herald_store::config::MigrateConfig`): its fields are the role's flags, each default is
//! written once, on its field, and `check` holds every rule about their values. The binary
//! layers a `--config` file, `HERALD_*` variables and flags onto them; `herald dev` and the test
//! kit build them directly, starting from [`defaults`].

use std::path::Path;
use std::time::Duration;

use crate::tls::{ClientIdentity, ClientTls};

/// A configuration a role refuses to start with (the binary exits 64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A role's configuration with every flag at its default. `required` gives values to the
/// flags that have none (e.g. `["--database-url", ""]`), which a role's `check` then refuses
/// until they are set. The environment is not read: these are the written defaults.
pub fn defaults<T: clap::Args + clap::FromArgMatches>(required: &[&str]) -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true))
        .mut_args(|arg| arg.env(None).required(false));
    let matches = command
        .try_get_matches_from(required)
        .unwrap_or_else(|err| panic!("the defaults of a role's flags must parse: {err}"));
    T::from_arg_matches(&matches)
        .unwrap_or_else(|err| panic!("the defaults of a role's flags must parse: {err}"))
}

/// The URL with any password replaced by `***`.
pub fn masked_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Serialises a duration as the flags write it (`1m 30s`), so a printed or written
/// configuration reads back the same.
pub fn human<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*duration).to_string())
}

/// Serialises a value through its `Display` (job types, statuses).
pub fn display<S: serde::Serializer, T: std::fmt::Display>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// A secret given directly or as a file (`variable` names the direct form, for errors);
/// None when neither is given.
pub fn read_secret(
    value: Option<&str>,
    file: Option<&Path>,
    variable: &str,
) -> Result<Option<String>, ConfigError> {
    match (value, file) {
        (Some(_), Some(_)) => Err(ConfigError(format!(
            "{variable} and {variable}_FILE are both set; set one"
        ))),
        (Some(value), None) => Ok(Some(value.to_owned())),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|text| Some(text.trim().to_owned()))
            .map_err(|err| {
                ConfigError(format!(
                    "{variable}_FILE: cannot read {}: {err}",
                    path.display()
                ))
            }),
        (None, None) => Ok(None),
    }
}

/// A client's TLS material read from its files; `flag` prefixes the flags in errors
/// (`--redis` names `--redis-ca-file`).
pub fn client_tls(
    flag: &str,
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<ClientTls, ConfigError> {
    let read = |path: &Path, which: &str| {
        let bytes = std::fs::read(path).map_err(|err| {
            ConfigError(format!(
                "{flag}-{which}-file: cannot read {}: {err}",
                path.display()
            ))
        })?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
            return Err(ConfigError(format!(
                "{flag}-{which}-file: {} holds no PEM block (-----BEGIN …)",
                path.display()
            )));
        }
        Ok(bytes)
    };
    let identity = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(ClientIdentity {
            cert: read(cert, "cert")?,
            key: read(key, "key")?,
        }),
        _ => {
            return Err(ConfigError(format!(
                "{flag}-cert-file and {flag}-key-file go together: set both or neither"
            )))
        }
    };
    Ok(ClientTls {
        ca: ca.map(|path| read(path, "ca")).transpose()?,
        identity,
    })
}

/// Reads `NAME=SECRET` pairs separated by commas or line breaks (the form of the environment
/// variables and of their files); blank entries and lines starting with `#` are skipped. The
/// secret is everything after the first `=`.
pub fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|entry| !entry.is_empty() && !entry.starts_with('#'))
        .enumerate()
        .map(|(index, entry)| match entry.split_once('=') {
            Some((name, secret)) if !name.trim().is_empty() && !secret.trim().is_empty() => {
                Ok((name.trim().to_owned(), secret.trim().to_owned()))
            }
            Some((name, _)) if !name.trim().is_empty() => {
                Err(format!("{:?} has nothing after '='", name.trim()))
            }
            // The entry is not shown: it may be a secret given without its name.
            _ => Err(format!("entry {} is not NAME=SECRET", index + 1)),
        })
        .collect()
}

/// A name unique to this process: host name and process id (a poller's or worker's default
/// name).
pub fn process_name(prefix: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("{prefix}-{host}-{}", std::process::id())
}

/// Fails with `message` unless `ok`.
pub fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError(message()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords_only() {
        assert_eq!(
            masked_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            masked_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(masked_url("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[derive(Debug, clap::Args)]
    struct Example {
        #[arg(long, env = "HERALD_TEST_EXAMPLE_URL")]
        url: String,
        #[arg(long, env = "HERALD_TEST_EXAMPLE_WAIT", default_value = "1m 5s", value_parser = humantime::parse_duration)]
        wait: Duration,
        #[arg(
            long,
            env = "HERALD_TEST_EXAMPLE_ITEMS",
            value_delimiter = ',',
            required = true
        )]
        items: Vec<String>,
    }

    #[test]
    fn defaults_are_the_written_ones_whatever_the_environment_says() {
        // A variable of the same name must not become a "default".
        std::env::set_var("HERALD_TEST_EXAMPLE_WAIT", "9s");
        let example: Example = defaults(&["--url", ""]);
        assert_eq!(example.wait, Duration::from_secs(65));
        assert!(example.url.is_empty() && example.items.is_empty());
    }

    #[test]
    fn a_secret_comes_from_one_place() {
        let dir = std::env::temp_dir().join(format!("herald-secret-{}", std::process::id()));
        std::fs::write(&dir, "  s3cret\n").unwrap();
        assert_eq!(
            read_secret(None, Some(&dir), "X").unwrap().unwrap(),
            "s3cret"
        );
        assert!(read_secret(Some("a"), Some(&dir), "X")
            .unwrap_err()
            .0
            .contains("X and X_FILE are both set"));
        std::fs::remove_file(&dir).unwrap();
        assert!(read_secret(None, Some(&dir), "X")
            .unwrap_err()
            .0
            .contains("X_FILE: cannot read"));
    }
}
