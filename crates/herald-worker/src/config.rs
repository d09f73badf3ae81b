//! `herald worker`'s settings: each flag's default and its rules, once. The binary layers a
//! `--config` file, `HERALD_*` variables and flags onto this struct; `herald dev` and the test
//! kit build it directly.
//!
//! Longer than 400 lines with its unit tests (the code is about 345).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{client_tls, ensure};
use herald_core::{ConfigError, JobType};
use herald_queue::config::{PressureConfig, RedisTlsConfig};
use herald_store::config::DatabaseConfig;
use serde::Serialize;

use crate::provider::ProviderClient;
use crate::send::SendSettings;
use crate::status::StatusSettings;
use crate::WorkerSettings;

#[derive(Debug, Clone, Args, Serialize)]
pub struct WorkerConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub database: DatabaseConfig,
    /// The job type this worker server runs (each type has its own servers and queue store).
    #[arg(long, env = "HERALD_JOB_TYPE", value_parser = parse_job_type, default_value = "send")]
    #[serde(serialize_with = "herald_core::config::display")]
    pub job_type: JobType,
    /// Redis URLs of this job type's queue store, one per shard (comma-separated); the worker
    /// consumes every shard.
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_REDIS_URL",
        value_delimiter = ',',
        required = true
    )]
    pub redis_url: Vec<String>,
    /// Connections to the queue store.
    #[arg(long, env = "HERALD_REDIS_MAX_CONNECTIONS", default_value_t = 16)]
    pub redis_max_connections: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub pressure: PressureConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub redis_tls: RedisTlsConfig,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "HERALD_ADMIN_LISTEN", default_value = "127.0.0.1:9092")]
    pub admin_listen: SocketAddr,
    /// Jobs handled at once by this server. Default: 512 for send (a job waits on its provider
    /// call, so throughput is this many jobs per call's round trip: a drain benchmark chose it,
    /// loadtest/README.md), 64 for status (its batches are bounded by --batches-in-flight).
    #[arg(long, env = "HERALD_WORKER_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// Most entries read and handled together: send confirms them in one statement and
    /// group-commits their outcomes; status applies their receipts in one statement. 1 moves
    /// one job per transaction, as Herald started (for comparison).
    #[arg(long, env = "HERALD_WORKER_MAX_BATCH", default_value_t = 256)]
    pub max_batch: usize,
    /// Most batches handled at once per shard (0: as many as --concurrency allows). Default:
    /// 0 for send (its batches wait on provider calls), 2 for status, whose cost is per
    /// statement: while two batches are written, the next gathers in the stream.
    #[arg(long, env = "HERALD_WORKER_BATCHES_IN_FLIGHT")]
    pub batches_in_flight: Option<usize>,
    /// send: how long a confirm or ledger write that starts alone waits for other batches' to
    /// share its statement (0s: none). At low rates every statement would carry a few jobs, and
    /// a statement on the outbox costs about as much for one row as for fifty (10ms against
    /// none: loadtest/README.md).
    #[arg(long, env = "HERALD_BATCH_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub batch_linger: Duration,
    /// This consumer's name in the stream's group (default: host name and process id).
    #[arg(long, env = "HERALD_WORKER_ID")]
    pub worker_id: Option<String>,
    /// send: base URL of the provider (the simulator, or a real gateway adapter).
    #[arg(long, hide_env_values = true, env = "HERALD_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// send: CA certificates (PEM) to trust for an https:// provider, besides the public roots.
    #[arg(long, env = "HERALD_PROVIDER_CA_FILE")]
    pub provider_ca_file: Option<PathBuf>,
    /// send: client certificate (PEM) for a provider that requires mutual TLS, with
    /// --provider-key-file.
    #[arg(long, env = "HERALD_PROVIDER_CERT_FILE")]
    pub provider_cert_file: Option<PathBuf>,
    /// send: private key (PEM) of --provider-cert-file.
    #[arg(long, env = "HERALD_PROVIDER_KEY_FILE")]
    pub provider_key_file: Option<PathBuf>,
    /// A provider call that takes longer is abandoned and retried with the same key.
    #[arg(long, env = "HERALD_PROVIDER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub provider_timeout: Duration,
    /// send: provider attempts a send may use (an attempt is charged when a provider call
    /// starts). Past them a send the provider surely did not take becomes DEAD; one whose last
    /// outcome is unknown (timeout, 5xx) is settled by asking the provider by key.
    #[arg(long, env = "HERALD_MAX_ATTEMPTS", default_value_t = 10)]
    pub max_attempts: u32,
    /// send: a claim not renewed for this long (its worker died or froze) is re-driven and
    /// sent again with the same key. Renewed every third of it while the call runs, so it need
    /// not outlast the provider timeout. At least 3s.
    #[arg(long, env = "HERALD_CLAIM_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub claim_lease: Duration,
    /// Back-off after the first failed provider call; doubles per attempt up to --retry-max.
    #[arg(long, env = "HERALD_RETRY_BASE", default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub retry_base: Duration,
    /// Longest back-off between two provider attempts of one send. At least --retry-base.
    #[arg(long, env = "HERALD_RETRY_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub retry_max: Duration,
    /// An entry another consumer left unacknowledged this long is taken over.
    #[arg(long, env = "HERALD_WORKER_RECLAIM_IDLE", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub reclaim_idle: Duration,
    /// send: recipients an internal check refuses (comma-separated); their messages end FAILED
    /// with the reason and are never claimed.
    #[arg(long, env = "HERALD_BLOCKED_RECIPIENTS", value_delimiter = ',')]
    pub blocked_recipients: Vec<String>,
    /// status: extra provider statuses, as FROM=TO with TO in the known vocabulary (DELIVRD,
    /// UNDELIV, EXPIRED, ENROUTE, ACCEPTD, REJECTD, DELETED); comma-separated.
    #[arg(long, env = "HERALD_STATUS_ALIASES", value_delimiter = ',', value_parser = parse_alias)]
    #[serde(serialize_with = "aliases")]
    pub status_alias: Vec<(String, String)>,
    /// status: an accepted message with no final receipt after this becomes UNKNOWN.
    #[arg(long, env = "HERALD_RECEIPT_WINDOW", default_value = "1h", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub receipt_window: Duration,
    /// status: a receipt whose send is not recorded yet is held this long (and applied as soon
    /// as the send is recorded), then parked with its raw body. Longer than 5m, the wait of a
    /// receipt held against an already settled send.
    #[arg(long, env = "HERALD_HOLD_RECEIPTS_FOR", default_value = "1h", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub hold_receipts_for: Duration,
    /// status: how often silent messages are looked for.
    #[arg(long, env = "HERALD_RECONCILE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub reconcile_interval: Duration,
}

/// What [`WorkerConfig::prepare`] builds from a configuration that passes its checks.
pub struct PreparedWorker {
    pub redis_tls: herald_core::ClientTls,
    /// The provider's client of a send worker; None for status.
    pub provider: Option<ProviderClient>,
}

/// `--concurrency` of a send worker when none is given: `herald-loadtest drain --durable
/// --messages 50000` delivered 1,457 msg/s at 64, 2,483 at 256, 3,385 at 512 and 3,587 at
/// 1,024 (one run each, loadtest/README.md); 512 is past the knee at half the provider
/// connections of 1,024.
pub const DEFAULT_SEND_CONCURRENCY: usize = 512;
/// `--concurrency` of a status worker when none is given (its batches are bounded by
/// `--batches-in-flight`, not by this).
pub const DEFAULT_STATUS_CONCURRENCY: usize = 64;

impl Default for WorkerConfig {
    /// Every flag at its default (a send worker); the database and Redis URLs are empty, which
    /// [`WorkerConfig::check`] refuses.
    fn default() -> Self {
        herald_core::config::defaults(&["--database-url", ""])
    }
}

impl WorkerConfig {
    /// A worker of `job_type` on the database at `database_url` and the queue store at
    /// `redis_url`, every other setting at its default (a send worker still needs
    /// `provider_url`).
    pub fn new(
        job_type: JobType,
        database_url: impl Into<String>,
        redis_url: impl Into<String>,
    ) -> Self {
        Self {
            database: DatabaseConfig::new(database_url),
            job_type,
            redis_url: vec![redis_url.into()],
            ..Self::default()
        }
    }

    /// `--concurrency`, or the default of this job type.
    pub fn concurrency(&self) -> usize {
        self.concurrency.unwrap_or(match self.job_type {
            JobType::Send => DEFAULT_SEND_CONCURRENCY,
            JobType::Status => DEFAULT_STATUS_CONCURRENCY,
        })
    }

    /// `--batches-in-flight`, or the default of this job type.
    pub fn batches_in_flight(&self) -> usize {
        self.batches_in_flight.unwrap_or(match self.job_type {
            JobType::Send => 0,
            JobType::Status => 2,
        })
    }

    /// The same settings with the job type's defaults filled in, so `--print-config` shows
    /// the values the worker runs with.
    pub fn with_job_type_defaults(mut self) -> Self {
        self.concurrency = Some(self.concurrency());
        self.batches_in_flight = Some(self.batches_in_flight());
        self
    }

    /// Every rule about these values, with the provider's TLS files read: a worker that passes
    /// it fails later only on what it connects to.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.prepare().map(drop)
    }

    /// [`WorkerConfig::check`], answering what it built on the way (the queue stores' TLS
    /// material, the provider's client), so the role reads each file once.
    pub fn prepare(&self) -> Result<PreparedWorker, ConfigError> {
        self.database.check()?;
        self.pressure.check()?;
        ensure(!self.redis_url.is_empty(), || {
            "--redis-url (HERALD_REDIS_URL) is required".into()
        })?;
        ensure(self.redis_max_connections >= 1, || {
            "--redis-max-connections must be at least 1".into()
        })?;
        ensure(
            self.concurrency() >= 1 && self.max_attempts >= 1 && self.max_batch >= 1,
            || "--concurrency, --max-attempts and --max-batch must be at least 1".into(),
        )?;
        ensure(self.retry_max >= self.retry_base, || {
            format!(
                "--retry-max ({}) must be at least --retry-base ({})",
                humantime::format_duration(self.retry_max),
                humantime::format_duration(self.retry_base)
            )
        })?;
        // A receipt held against an already settled send waits SUPERSEDED_HOLD for a newer
        // send with its provider id before it is applied as a duplicate; parked before that,
        // a receipt Herald can apply would end in the parking table.
        let superseded = herald_store::receipts::SUPERSEDED_HOLD;
        ensure(self.hold_receipts_for > superseded, || {
            format!(
                "--hold-receipts-for ({}) must be longer than {} (the wait of a receipt held against a settled send)",
                humantime::format_duration(self.hold_receipts_for),
                humantime::format_duration(superseded)
            )
        })?;
        self.send_settings("check")
            .validate()
            .map_err(|err| ConfigError(format!("--claim-lease / --max-attempts: {err}")))?;
        Ok(PreparedWorker {
            redis_tls: self.redis_tls.load()?,
            provider: self.provider()?,
        })
    }

    /// This consumer's name: `--worker-id`, or host name and process id.
    pub fn consumer(&self) -> String {
        self.worker_id
            .clone()
            .unwrap_or_else(|| herald_core::config::process_name("worker"))
    }

    /// How the worker server consumes its stream, as `consumer`.
    pub fn worker_settings(&self, consumer: &str) -> WorkerSettings {
        WorkerSettings {
            consumer: consumer.to_owned(),
            concurrency: self.concurrency(),
            max_batch: self.max_batch,
            batches_in_flight: self.batches_in_flight(),
            reclaim_idle: self.reclaim_idle,
            ..WorkerSettings::default()
        }
    }

    /// The send handler's settings, its CLAIMED events naming `worker`.
    pub fn send_settings(&self, worker: &str) -> SendSettings {
        SendSettings {
            max_attempts: self.max_attempts,
            retry_base: self.retry_base,
            retry_max: self.retry_max,
            max_group: self.max_batch,
            worker: worker.to_owned(),
            blocked_recipients: self
                .blocked_recipients
                .iter()
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
                .collect(),
            claim_lease: self.claim_lease,
            linger: self.batch_linger,
        }
    }

    pub fn status_settings(&self) -> StatusSettings {
        StatusSettings {
            aliases: self.status_alias.iter().cloned().collect::<HashMap<_, _>>(),
        }
    }

    /// The provider's client of a send worker (None for status), with its TLS files read.
    pub fn provider(&self) -> Result<Option<ProviderClient>, ConfigError> {
        match (self.job_type, &self.provider_url) {
            (JobType::Send, None) => Err(ConfigError::new(
                "--provider-url is required for --job-type send",
            )),
            (JobType::Send, Some(url)) => {
                let tls = client_tls(
                    "--provider",
                    self.provider_ca_file.as_deref(),
                    self.provider_cert_file.as_deref(),
                    self.provider_key_file.as_deref(),
                )?;
                ProviderClient::with_tls(url, self.provider_timeout, &tls)
                    .map(Some)
                    .map_err(|err| ConfigError(format!("--provider-url: {err:#}")))
            }
            (JobType::Status, _) => Ok(None),
        }
    }
}

fn parse_job_type(value: &str) -> Result<JobType, String> {
    value.parse::<JobType>().map_err(|err| err.to_string())
}

fn parse_alias(value: &str) -> Result<(String, String), String> {
    let (from, to) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not FROM=TO"))?;
    let (from, to) = (
        from.trim().to_ascii_uppercase(),
        to.trim().to_ascii_uppercase(),
    );
    if from.is_empty() || herald_core::receipt::known_status(&to).is_none() {
        return Err(format!("{value:?}: TO must be a known status (DELIVRD, UNDELIV, EXPIRED, ENROUTE, ACCEPTD, REJECTD, DELETED)"));
    }
    Ok((from, to))
}

fn aliases<S: serde::Serializer>(
    aliases: &[(String, String)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(aliases.iter().map(|(from, to)| format!("{from}={to}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send() -> WorkerConfig {
        let mut config =
            WorkerConfig::new(JobType::Send, "postgres://herald@db/herald", "redis://a/");
        config.provider_url = Some("http://provider:8080".into());
        config
    }

    #[test]
    fn each_job_type_has_its_own_defaults() {
        let config = send();
        config.check().unwrap();
        assert_eq!(config.concurrency(), DEFAULT_SEND_CONCURRENCY);
        assert_eq!(config.batches_in_flight(), 0);
        let status = WorkerConfig::new(JobType::Status, "postgres://h@db/h", "redis://b/");
        status.check().unwrap();
        assert_eq!(status.concurrency(), DEFAULT_STATUS_CONCURRENCY);
        assert_eq!(status.batches_in_flight(), 2);
        let settings = config.send_settings("w");
        assert_eq!(settings.claim_lease, Duration::from_secs(30));
        assert_eq!(settings.max_attempts, 10);
        assert_eq!(settings.linger, Duration::from_millis(10));
    }

    #[test]
    fn each_rule_names_its_flag() {
        let refused = |change: fn(&mut WorkerConfig), flag: &str| {
            let mut config = send();
            change(&mut config);
            let err = config.check().unwrap_err();
            assert!(err.0.contains(flag), "{flag}: {err}");
        };
        refused(|c| c.provider_url = None, "--provider-url is required");
        refused(
            |c| c.retry_max = Duration::from_millis(100),
            "--retry-max (100ms)",
        );
        refused(|c| c.claim_lease = Duration::from_secs(1), "--claim-lease");
        refused(|c| c.max_batch = 0, "--max-batch");
        refused(|c| c.redis_url.clear(), "--redis-url");
        refused(
            |c| c.hold_receipts_for = Duration::from_secs(120),
            "--hold-receipts-for (2m) must be longer than 5m",
        );
        refused(
            |c| c.provider_cert_file = Some("/x.pem".into()),
            "go together",
        );
    }

    #[test]
    fn an_alias_must_name_a_known_status() {
        assert_eq!(
            parse_alias(" ackd = delivrd ").unwrap(),
            ("ACKD".into(), "DELIVRD".into())
        );
        assert!(parse_alias("ACKD=DONE").is_err());
        assert!(parse_alias("ACKD").is_err());
    }
}
