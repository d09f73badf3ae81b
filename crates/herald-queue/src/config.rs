//! The queue stores' settings, shared by the roles that use them: each flag's default and its
//! rules, once.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{client_tls, ensure};
use herald_core::{ClientTls, ConfigError};
use serde::Serialize;

/// The poller's queue stores: both job types'.
#[derive(Debug, Clone, Args, Serialize)]
pub struct QueueConfig {
    /// Redis URLs of the `send` job type's queue store, one per shard (comma-separated);
    /// partition p publishes to shard p mod shards.
    #[arg(
        long,
        env = "HERALD_REDIS_SEND_URL",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    pub redis_send_url: Vec<String>,
    /// Redis URLs of the `status` job type's queue store (delivery receipts), one per shard.
    #[arg(
        long,
        env = "HERALD_REDIS_STATUS_URL",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    pub redis_status_url: Vec<String>,
    /// Connections to each queue store.
    #[arg(long, env = "HERALD_REDIS_MAX_CONNECTIONS", default_value_t = 16)]
    pub redis_max_connections: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub pressure: PressureConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub redis_tls: RedisTlsConfig,
}

impl QueueConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        ensure(!self.redis_send_url.is_empty(), || {
            "--redis-send-url (HERALD_REDIS_SEND_URL) is required".into()
        })?;
        ensure(!self.redis_status_url.is_empty(), || {
            "--redis-status-url (HERALD_REDIS_STATUS_URL) is required".into()
        })?;
        ensure(self.redis_max_connections >= 1, || {
            "--redis-max-connections must be at least 1".into()
        })?;
        self.pressure.check()
    }
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct PressureConfig {
    /// Memory use (used / maxmemory) at which a queue store counts as full: pollers stop
    /// publishing to it until it drains below, and the API's /readyz names it.
    #[arg(long, env = "HERALD_QUEUE_FULL_THRESHOLD", default_value_t = 0.8)]
    pub queue_full_threshold: f64,
    /// How often each queue store's memory and streams are read. A store that fills between
    /// two reads refuses the overshoot with OOM, which releases the batch uncharged and
    /// reads the store again at once (1s rather than 500ms: a tenth of a percent of the
    /// machine less for an idle deployment, loadtest/README.md).
    #[arg(long, env = "HERALD_QUEUE_CHECK_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub queue_check_interval: Duration,
}

impl PressureConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        ensure(
            0.0 < self.queue_full_threshold && self.queue_full_threshold <= 1.0,
            || "--queue-full-threshold must be within (0, 1]".into(),
        )?;
        ensure(!self.queue_check_interval.is_zero(), || {
            "--queue-check-interval must be more than 0".into()
        })
    }
}

/// TLS to the queue stores: `rediss://` URLs connect over TLS, trusting the system's roots
/// unless a CA bundle is given.
#[derive(Debug, Clone, Default, Args, Serialize)]
pub struct RedisTlsConfig {
    /// CA certificates (PEM) to trust for rediss:// URLs instead of the system's roots.
    #[arg(long, env = "HERALD_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for Redis servers that ask for one (with --redis-key-file).
    #[arg(long, env = "HERALD_REDIS_CERT_FILE")]
    pub redis_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --redis-cert-file.
    #[arg(long, env = "HERALD_REDIS_KEY_FILE")]
    pub redis_key_file: Option<PathBuf>,
}

impl RedisTlsConfig {
    /// The TLS material, read from its files.
    pub fn load(&self) -> Result<ClientTls, ConfigError> {
        client_tls(
            "--redis",
            self.redis_ca_file.as_deref(),
            self.redis_cert_file.as_deref(),
            self.redis_key_file.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threshold_outside_zero_to_one_and_missing_urls_are_refused() {
        let mut queue: QueueConfig = herald_core::config::defaults(&[]);
        assert_eq!(queue.redis_max_connections, 16);
        assert_eq!(queue.pressure.queue_check_interval, Duration::from_secs(1));
        assert!(queue.check().unwrap_err().0.contains("--redis-send-url"));
        queue.redis_send_url = vec!["redis://a/".into()];
        queue.redis_status_url = vec!["redis://b/".into()];
        queue.check().unwrap();
        queue.pressure.queue_full_threshold = 1.5;
        assert!(queue.check().unwrap_err().0.contains("(0, 1]"));
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let tls = RedisTlsConfig {
            redis_cert_file: Some("/nonexistent/cert.pem".into()),
            ..RedisTlsConfig::default()
        };
        assert!(tls.load().unwrap_err().0.contains("go together"));
    }
}
