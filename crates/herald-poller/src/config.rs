//! `herald poller`'s settings: each flag's default and its rules, once. The binary layers a
//! `--config` file, `HERALD_*` variables and flags onto this struct; `herald dev` and the test
//! kit build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{client_tls, ensure, read_secret};
use herald_core::ConfigError;
use herald_queue::config::QueueConfig;
use herald_store::config::DatabaseConfig;
use serde::Serialize;

use crate::fleet::FleetSettings;
use crate::PollerSettings;

#[derive(Debug, Clone, Args, Serialize)]
pub struct PollerConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub queue: QueueConfig,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "HERALD_ADMIN_LISTEN", default_value = "127.0.0.1:9091")]
    pub admin_listen: SocketAddr,
    /// This poller's name in the fleet and in partition leases (default: host name and
    /// process id). Must be unique among live pollers.
    #[arg(long, env = "HERALD_POLLER_ID")]
    pub poller_id: Option<String>,
    /// etcd endpoints (comma-separated). With them, pollers share the partitions as a fleet;
    /// without, this poller takes every partition (a single poller).
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of this Herald cluster in etcd.
    #[arg(long, env = "HERALD_ETCD_PREFIX", default_value = "/herald")]
    pub etcd_prefix: String,
    /// CA certificates (PEM) to trust for https:// etcd endpoints instead of the system's
    /// roots.
    #[arg(long, env = "HERALD_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that requires one (--client-cert-auth), with
    /// --etcd-key-file.
    #[arg(long, env = "HERALD_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert-file.
    #[arg(long, env = "HERALD_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// etcd user, for an etcd with authentication enabled (its password from
    /// HERALD_ETCD_PASSWORD or HERALD_ETCD_PASSWORD_FILE).
    #[arg(long, env = "HERALD_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// Password of --etcd-user. Environment only.
    #[arg(long, env = "HERALD_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// A file holding the etcd password, instead of HERALD_ETCD_PASSWORD.
    #[arg(long, env = "HERALD_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// TTL of the poller's etcd lease; it stops claiming after TTL/2 without a renewal.
    #[arg(long, env = "HERALD_LEASE_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub lease_ttl: Duration,
    /// Longest wait for in-flight batches when handing partitions off or shutting down
    /// (keep the pod's termination grace period above it).
    #[arg(long, env = "HERALD_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub drain_timeout: Duration,
    /// Rows claimed per statement.
    #[arg(long, env = "HERALD_POLLER_BATCH_SIZE", default_value_t = 500)]
    pub batch_size: u32,
    /// Batches drained from one partition before it yields, when --publish-concurrency is
    /// above 0 (the shared drain round claims one batch per partition per round).
    #[arg(long, env = "HERALD_POLLER_MAX_BATCHES_PER_TICK", default_value_t = 20)]
    pub max_batches_per_tick: u32,
    /// 0: every owned partition's claim and publish go through one shared drain round (up to
    /// 32 partitions claimed in one statement and published in one pipeline per queue store,
    /// two rounds in flight). Above 0: each partition claims, publishes and marks on its own,
    /// at most this many batches published at once; 1 is the serial publisher of Herald's
    /// first version.
    #[arg(long, env = "HERALD_POLLER_PUBLISH_CONCURRENCY", default_value_t = 0)]
    pub publish_concurrency: usize,
    /// How long a claim that starts alone waits for other partitions' claims to share its
    /// statement (0s: none). At low rates every claim would carry a few rows, and a statement
    /// on the outbox costs about as much for one row as for fifty (10ms against none:
    /// loadtest/README.md).
    #[arg(long, env = "HERALD_BATCH_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub batch_linger: Duration,
    /// How long a partition whose claim came back short waits before claiming again (NOTIFY
    /// wakes it sooner): the pace at which rows due later (retries) and rows whose NOTIFY was
    /// lost are found.
    #[arg(long, env = "HERALD_POLLER_POLL_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub poll_interval: Duration,
    /// Longest wait of an idle partition: each short claim in a row with no NOTIFY between
    /// doubles the wait from --poll-interval up to this (at or below --poll-interval: no
    /// doubling). An idle poller then asks the database a quarter as often
    /// (loadtest/README.md); a NOTIFY or a full claim starts again from --poll-interval.
    #[arg(long, env = "HERALD_POLLER_IDLE_POLL_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub idle_poll_interval: Duration,
    /// How often stale PROCESSING/PUBLISHED rows are looked for.
    #[arg(long, env = "HERALD_POLLER_REDRIVE_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub redrive_interval: Duration,
    /// A claimed or published row not confirmed by a worker within this goes back to PENDING,
    /// if its queue store no longer holds it (a job waiting in its stream is never re-driven).
    #[arg(long, env = "HERALD_POLLER_STALE_AFTER", default_value = "2m", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub stale_after: Duration,
    /// DONE rows of the outbox (sends and status jobs) older than this are removed by the
    /// maintenance loop (0s: kept for ever). Open work and DEAD rows are never removed.
    #[arg(long, env = "HERALD_RETAIN_DONE_JOBS", default_value = "1d", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub retain_done_jobs: Duration,
    /// Closed messages (DELIVERED, UNDELIVERED, EXPIRED, FAILED) accepted longer ago than this
    /// get their history folded into one compact event that still answers every state and
    /// time (0s: never). Open messages keep every event.
    #[arg(long, env = "HERALD_COMPACT_HISTORIES_AFTER", default_value = "7d", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub compact_histories_after: Duration,
    /// Closed messages accepted longer ago than this are removed whole, with their events
    /// and ledger rows, and so are receipts received longer ago with their replayed parking
    /// rows (0s: kept for ever). Open messages, held receipts and unresolved parked rows are
    /// never removed. Needs --retain-done-jobs, no longer than this (a message goes after
    /// its send row).
    #[arg(long, env = "HERALD_RETAIN_MESSAGES", default_value = "30d", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub retain_messages: Duration,
    /// Write every message and receipt retention removes to this directory first, as
    /// gzip-compressed JSON Lines with a manifest per file, one per removal statement, rolled
    /// up into files of up to 64 MB once their hour is over (`herald archive verify` checks
    /// them). Without it, removed rows are gone.
    #[arg(long, env = "HERALD_ARCHIVE_DIR")]
    pub archive_dir: Option<PathBuf>,
    /// Time between two passes of the maintenance loop (run by the owner of partition 0).
    #[arg(long, env = "HERALD_MAINTENANCE_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub maintenance_interval: Duration,
    /// Rows looked at per statement of the maintenance loop: per partition (DONE outbox
    /// rows), or messages (compaction, message removal), or receipts; a pass runs statements
    /// until nothing more is due.
    #[arg(long, env = "HERALD_MAINTENANCE_BATCH", default_value_t = 200)]
    pub maintenance_batch: u32,
}

/// What [`PollerConfig::prepare`] reads from a configuration that passes its checks.
pub struct PreparedPoller {
    pub redis_tls: herald_core::ClientTls,
    pub etcd_access: herald_coord::EtcdAccess,
}

/// Pause of a partition after its queue store refused a publish.
const PUBLISH_BACKOFF: Duration = Duration::from_secs(1);

impl Default for PollerConfig {
    /// Every flag at its default; the database and Redis URLs are empty, which
    /// [`PollerConfig::check`] refuses.
    fn default() -> Self {
        herald_core::config::defaults(&["--database-url", ""])
    }
}

impl PollerConfig {
    /// Polling the database at `database_url` into the two job types' queue stores, every
    /// other setting at its default (a single poller: no etcd).
    pub fn new(
        database_url: impl Into<String>,
        redis_send_url: impl Into<String>,
        redis_status_url: impl Into<String>,
    ) -> Self {
        let mut config = Self {
            database: DatabaseConfig::new(database_url),
            ..Self::default()
        };
        config.queue.redis_send_url = vec![redis_send_url.into()];
        config.queue.redis_status_url = vec![redis_status_url.into()];
        config
    }

    /// Every rule about these values, with the etcd files and password read: a poller that
    /// passes it fails later only on what it connects to.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.prepare().map(drop)
    }

    /// [`PollerConfig::check`], answering what it read on the way (the queue stores' TLS
    /// material, etcd's TLS and user), so the role reads each file once.
    pub fn prepare(&self) -> Result<PreparedPoller, ConfigError> {
        self.database.check()?;
        self.queue.check()?;
        ensure(self.lease_ttl >= Duration::from_secs(2), || {
            "--lease-ttl must be at least 2s".into()
        })?;
        ensure(
            self.batch_size >= 1 && self.max_batches_per_tick >= 1,
            || "--batch-size and --max-batches-per-tick must be at least 1".into(),
        )?;
        ensure(
            !self.poll_interval.is_zero() && !self.redrive_interval.is_zero(),
            || "--poll-interval and --redrive-interval must be more than 0".into(),
        )?;
        ensure(
            self.retain_messages.is_zero()
                || (!self.retain_done_jobs.is_zero()
                    && self.retain_done_jobs <= self.retain_messages),
            || {
                "--retain-messages needs --retain-done-jobs on and no longer than it: a message goes after its send row"
                    .into()
            },
        )?;
        ensure(
            !self.maintenance_interval.is_zero() && self.maintenance_batch >= 1,
            || {
                "--maintenance-interval must be more than 0 and --maintenance-batch at least 1"
                    .into()
            },
        )?;
        let etcd_access = self.etcd_access()?;
        herald_coord::check_endpoints(&self.etcd_endpoints, &etcd_access)
            .map_err(|err| ConfigError(format!("--etcd-endpoints: {err}")))?;
        Ok(PreparedPoller {
            redis_tls: self.queue.redis_tls.load()?,
            etcd_access,
        })
    }

    /// How the poller paces itself.
    pub fn settings(&self) -> PollerSettings {
        PollerSettings {
            batch_size: self.batch_size,
            max_batches_per_tick: self.max_batches_per_tick,
            poll_interval: self.poll_interval,
            idle_poll_interval: self.idle_poll_interval,
            redrive_interval: self.redrive_interval,
            stale_after: self.stale_after,
            publish_backoff: PUBLISH_BACKOFF,
            publish_concurrency: self.publish_concurrency,
            linger: self.batch_linger,
            retention: crate::maintenance::RetentionSettings {
                done_jobs: (!self.retain_done_jobs.is_zero()).then_some(self.retain_done_jobs),
                compact_after: (!self.compact_histories_after.is_zero())
                    .then_some(self.compact_histories_after),
                messages: (!self.retain_messages.is_zero()).then_some(self.retain_messages),
                interval: self.maintenance_interval,
                batch: self.maintenance_batch,
                archive: self.archive_dir.clone(),
            },
        }
    }

    /// This poller's name: `--poller-id`, or host name and process id.
    pub fn member(&self) -> String {
        self.poller_id
            .clone()
            .unwrap_or_else(|| herald_core::config::process_name("poller"))
    }

    pub fn fleet_settings(&self) -> FleetSettings {
        FleetSettings {
            member: self.member(),
            lease_ttl: self.lease_ttl,
            drain_timeout: self.drain_timeout,
        }
    }

    /// TLS material and the user for etcd, from their files and variables.
    pub fn etcd_access(&self) -> Result<herald_coord::EtcdAccess, ConfigError> {
        let tls = client_tls(
            "--etcd",
            self.etcd_ca_file.as_deref(),
            self.etcd_cert_file.as_deref(),
            self.etcd_key_file.as_deref(),
        )?;
        let password = read_secret(
            self.etcd_password.as_deref(),
            self.etcd_password_file.as_deref(),
            "HERALD_ETCD_PASSWORD",
        )?;
        let user = match (&self.etcd_user, password) {
            (None, None) => None,
            (Some(user), Some(password)) => Some((user.clone(), password)),
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "--etcd-user needs HERALD_ETCD_PASSWORD or HERALD_ETCD_PASSWORD_FILE",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "HERALD_ETCD_PASSWORD is set without --etcd-user",
                ))
            }
        };
        Ok(herald_coord::EtcdAccess { tls, user })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PollerConfig {
        PollerConfig::new("postgres://herald@db/herald", "redis://a/", "redis://b/")
    }

    #[test]
    fn the_defaults_are_the_documented_pace() {
        let config = config();
        config.check().unwrap();
        let settings = config.settings();
        assert_eq!(settings.batch_size, 500);
        assert_eq!(settings.poll_interval, Duration::from_millis(500));
        assert_eq!(settings.idle_poll_interval, Duration::from_secs(2));
        assert_eq!(settings.linger, Duration::from_millis(10));
        assert_eq!(config.lease_ttl, Duration::from_secs(10));
        assert!(config.member().starts_with("poller-"));
        let day = Duration::from_secs(86_400);
        assert_eq!(
            settings.retention,
            crate::maintenance::RetentionSettings {
                done_jobs: Some(day),
                compact_after: Some(7 * day),
                messages: Some(30 * day),
                interval: Duration::from_secs(60),
                batch: 200,
                archive: None,
            }
        );
        let mut off = config.clone();
        off.retain_done_jobs = Duration::ZERO;
        off.compact_histories_after = Duration::ZERO;
        off.retain_messages = Duration::ZERO;
        off.check().unwrap();
        assert!(!off.settings().retention.enabled());
    }

    #[test]
    fn each_rule_names_its_flag() {
        let refused = |change: fn(&mut PollerConfig), flag: &str| {
            let mut config = config();
            change(&mut config);
            let err = config.check().unwrap_err();
            assert!(err.0.contains(flag), "{flag}: {err}");
        };
        refused(|c| c.lease_ttl = Duration::from_secs(1), "--lease-ttl");
        refused(|c| c.batch_size = 0, "--batch-size");
        refused(|c| c.poll_interval = Duration::ZERO, "--poll-interval");
        refused(|c| c.etcd_user = Some("herald".into()), "--etcd-user needs");
        refused(
            |c| c.etcd_password = Some("pw".into()),
            "without --etcd-user",
        );
        refused(|c| c.queue.redis_status_url.clear(), "--redis-status-url");
        refused(
            |c| c.retain_done_jobs = Duration::ZERO,
            "--retain-messages needs",
        );
        refused(
            |c| c.retain_messages = Duration::from_secs(3600),
            "--retain-messages needs",
        );
        refused(|c| c.maintenance_batch = 0, "--maintenance-batch");
        refused(
            |c| c.etcd_endpoints = vec!["http://a:2379".into(), "https://b:2379".into()],
            "--etcd-endpoints: etcd configuration: the etcd endpoints mix",
        );
    }
}
