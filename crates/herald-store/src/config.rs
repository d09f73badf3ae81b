//! The database settings every role shares, and `herald migrate`'s own: each flag's default
//! and its rules, once.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{ensure, read_secret};
use herald_core::{ConfigError, PartitionCount};
use serde::Serialize;

use crate::migrate::LockPolicy;
use crate::PoolSettings;

#[derive(Debug, Clone, Args, Serialize)]
pub struct DatabaseConfig {
    /// PostgreSQL URL, e.g. postgres://herald:secret@db:5432/herald.
    #[arg(long, hide_env_values = true, env = "HERALD_DATABASE_URL")]
    pub database_url: String,
    /// Largest number of PostgreSQL connections this process holds.
    #[arg(long, env = "HERALD_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
}

impl DatabaseConfig {
    /// `url` with the default pool size.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            database_url: url.into(),
            ..herald_core::config::defaults(&["--database-url", ""])
        }
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        ensure(!self.database_url.trim().is_empty(), || {
            "--database-url (HERALD_DATABASE_URL) is required".into()
        })?;
        ensure(self.database_max_connections >= 1, || {
            "--database-max-connections must be at least 1".into()
        })
    }

    /// The pool this configuration opens. `generic_plans`: the role runs a few batched
    /// statements all the time (workers, pollers; see [`crate::GENERIC_PLANS`]).
    pub fn pool(&self, generic_plans: bool) -> PoolSettings {
        PoolSettings {
            url: self.database_url.clone(),
            max_connections: self.database_max_connections,
            acquire_timeout: Duration::from_secs(5),
            generic_plans,
        }
    }
}

/// `herald migrate`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct MigrateConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub database: DatabaseConfig,
    /// Outbox partitions, fixed at the first install; a later run must ask for the same count.
    #[arg(long, env = "HERALD_PARTITIONS", default_value_t = 64)]
    pub partitions: u32,
    /// Create (or update) this PostgreSQL role for the API, pollers and workers to connect as:
    /// it may read and write what they write, DELETE only from the working tables the pipeline
    /// deletes from, and never TRUNCATE or DELETE history. Run with it on every upgrade, so new
    /// tables are granted too. The role running the migration needs CREATEROLE.
    #[arg(long, env = "HERALD_RUNTIME_ROLE")]
    pub runtime_role: Option<String>,
    /// The runtime role's password (at least 16 printable ASCII characters), needed to create
    /// it; given for an existing role, it replaces the password. Read from the environment
    /// only, never from a command line. It reaches PostgreSQL as a SCRAM verifier.
    #[arg(long, env = "HERALD_RUNTIME_ROLE_PASSWORD", hide_env_values = true)]
    pub runtime_role_password: Option<String>,
    /// A file holding the runtime role's password, instead of HERALD_RUNTIME_ROLE_PASSWORD.
    #[arg(long, env = "HERALD_RUNTIME_ROLE_PASSWORD_FILE")]
    pub runtime_role_password_file: Option<PathBuf>,
    /// Longest one schema change waits for a table lock. While it waits (behind a long
    /// transaction) every accept on that table waits behind it; past this it gives up, its
    /// migration is rolled back whole, accepts go on, and it is tried again after a pause.
    #[arg(long, env = "HERALD_MIGRATE_LOCK_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub lock_timeout: Duration,
    /// Tries of a migration that ran out of lock time before `herald migrate` fails (exit 1,
    /// nothing of that migration applied).
    #[arg(long, env = "HERALD_MIGRATE_LOCK_ATTEMPTS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub lock_attempts: u32,
}

impl MigrateConfig {
    /// Migrating the database at `url`, every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            database: DatabaseConfig::new(url),
            ..herald_core::config::defaults(&["--database-url", ""])
        }
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        self.prepare().map(drop)
    }

    /// [`MigrateConfig::check`], answering the partition count and the runtime role's
    /// password (read once, from the environment or its file).
    pub fn prepare(&self) -> Result<(PartitionCount, Option<String>), ConfigError> {
        self.database.check()?;
        let partitions = self.partition_count()?;
        ensure(self.lock_attempts >= 1, || {
            "--lock-attempts must be at least 1".into()
        })?;
        let password = self.password()?;
        ensure(password.is_none() || self.runtime_role.is_some(), || {
            "a runtime role password is set but no --runtime-role (HERALD_RUNTIME_ROLE) names \
             the role"
                .into()
        })?;
        Ok((partitions, password))
    }

    pub fn partition_count(&self) -> Result<PartitionCount, ConfigError> {
        PartitionCount::new(self.partitions).map_err(|err| ConfigError(err.to_string()))
    }

    /// The runtime role's password, from the environment or its file.
    pub fn password(&self) -> Result<Option<String>, ConfigError> {
        read_secret(
            self.runtime_role_password.as_deref(),
            self.runtime_role_password_file.as_deref(),
            "HERALD_RUNTIME_ROLE_PASSWORD",
        )
    }

    pub fn locks(&self) -> LockPolicy {
        LockPolicy {
            lock_timeout: self.lock_timeout,
            attempts: self.lock_attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_flags_and_a_missing_url_is_named() {
        let config = MigrateConfig::new("postgres://herald@db/herald");
        assert_eq!(config.partitions, 64);
        assert_eq!(config.lock_timeout, Duration::from_secs(2));
        assert_eq!(config.database.database_max_connections, 16);
        config.check().unwrap();
        let err = MigrateConfig::new(" ").check().unwrap_err();
        assert!(err.0.contains("--database-url"), "{err}");
    }

    #[test]
    fn a_password_without_a_role_and_a_bad_partition_count_are_refused() {
        let mut config = MigrateConfig::new("postgres://herald@db/herald");
        config.runtime_role_password = Some("0123456789abcdefXYZ".into());
        assert!(config.check().unwrap_err().0.contains("--runtime-role"));
        config.runtime_role = Some("herald_runtime".into());
        config.check().unwrap();
        config.partitions = 0;
        assert!(config.check().is_err());
    }
}
