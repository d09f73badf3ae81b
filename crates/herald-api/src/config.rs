//! `herald api`'s settings: each flag's default and its rules, once. The binary layers a
//! `--config` file, `HERALD_*` variables and flags onto this struct; `herald dev` and the test
//! kit build it directly.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{ensure, read_secret};
use herald_core::ConfigError;
use herald_queue::config::{PressureConfig, RedisTlsConfig};
use herald_store::config::DatabaseConfig;
use herald_store::group::GroupSettings;
use serde::Serialize;

use crate::auth::{parse_pairs, CredentialError, Credentials};
use crate::guard::RateLimit;
use crate::{Groups, Limits};

#[derive(Debug, Clone, Args, Serialize)]
pub struct ApiConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub database: DatabaseConfig,
    /// Address the API listens on: the /v1 routes, /healthz and /readyz (and /metrics
    /// unless --admin-listen is given).
    #[arg(long, env = "HERALD_API_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /healthz, /readyz and /metrics apart from the API's own port, so metrics
    /// are not served to the API's clients (the chart sets it).
    #[arg(long, env = "HERALD_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// On SIGTERM, keep serving this long with /readyz answering 503, so load balancers take
    /// this replica out before it stops accepting; then finish in-flight requests and exit.
    /// Set it above the time your load balancer or Kubernetes takes to drop an endpoint.
    #[arg(long, env = "HERALD_API_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub shutdown_delay: Duration,
    /// The send job type's queue store shards. Not on the accept path: `/readyz` names one
    /// that is full or unreachable (and stays ready: messages wait in the outbox).
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_REDIS_SEND_URL",
        value_delimiter = ','
    )]
    pub redis_send_url: Vec<String>,
    /// The status job type's queue store shards (readiness only, like --redis-send-url).
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_REDIS_STATUS_URL",
        value_delimiter = ','
    )]
    pub redis_status_url: Vec<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub pressure: PressureConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub redis_tls: RedisTlsConfig,
    /// Largest request body in bytes; larger requests get 413.
    #[arg(long, env = "HERALD_API_MAX_BODY_BYTES", default_value_t = 256 * 1024)]
    pub max_body_bytes: usize,
    /// Most messages in one batch request.
    #[arg(long, env = "HERALD_API_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: usize,
    /// Refuse messages without an idempotency key (400 for a request without the header, 422
    /// for a batch item without `idempotency_key`), so no client retry can store one twice.
    #[arg(long, env = "HERALD_API_REQUIRE_IDEMPOTENCY_KEY")]
    pub require_idempotency_key: bool,
    /// Longest a request may go without an answer: then 503 with Retry-After (a POST is
    /// answered `outcome-unknown`, since it may still commit; retry it with the same
    /// Idempotency-Key). Well past a healthy commit and a group's wait, well inside the 30 s a
    /// client or load balancer usually waits.
    #[arg(long, env = "HERALD_API_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub request_timeout: Duration,
    /// Requests per second each client or operator key may make (a token bucket per key;
    /// receipts are not limited); past it, 429 with Retry-After. 0: unlimited.
    #[arg(long, env = "HERALD_API_RATE_LIMIT", default_value_t = 0)]
    pub rate_limit: u32,
    /// Requests a key may make at once above its rate (the bucket's size; default: one
    /// second's worth, --rate-limit).
    #[arg(long, env = "HERALD_API_RATE_LIMIT_BURST")]
    pub rate_limit_burst: Option<u32>,
    /// Most single-message accepts that share one transaction (group commit); receipts are
    /// grouped likewise. Every request is still answered only after its own commit.
    #[arg(long, env = "HERALD_API_GROUP_MAX", default_value_t = 256)]
    pub group_max: usize,
    /// Group transactions written at once (each for accepts and for receipts); while they
    /// run, the next group gathers. 1 makes the largest groups, more the lowest latency.
    /// `herald-loadtest accept` (32 clients, durable) measured one and two equal within noise
    /// and four 16 % slower; two keeps one slow group (waiting on a key an open batch holds)
    /// from stalling every single accept.
    #[arg(long, env = "HERALD_API_GROUP_PARALLEL", default_value_t = 2)]
    pub group_parallel: usize,
    /// How long a receipt group that starts alone waits for more receipt requests to share its
    /// transaction and status jobs (0s: none). Single-message accepts never wait: their
    /// clients do, and concurrent ones gather a group anyway. Without it, a receipt group at
    /// 1,200 messages a second held about five receipts, and the status jobs were 0.3 outbox
    /// rows per message (loadtest/README.md).
    #[arg(long, env = "HERALD_API_RECEIPT_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub receipt_linger: Duration,
    #[command(flatten)]
    #[serde(flatten)]
    pub auth: ApiAuthConfig,
    /// How often the API reads the outbox backlog for its gauges (backlog rows and oldest
    /// PENDING age per partition, DEAD rows). One API replica of a deployment reads and exports
    /// them: the holder of an advisory lock, which every replica asks for at this interval.
    #[arg(long, env = "HERALD_BACKLOG_GAUGE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub backlog_gauge_interval: Duration,
}

/// What [`ApiConfig::prepare`] builds from a configuration that passes its checks.
pub struct PreparedApi {
    pub limits: Limits,
    pub groups: Groups,
    pub redis_tls: herald_core::ClientTls,
    pub credentials: Credentials,
}

/// Who may call the API. Keys and secrets are read from the environment (or from files named
/// there), never from a command line: `herald` refuses them as flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ApiAuthConfig {
    /// Client keys, as NAME=KEY pairs (comma-separated): a client key may POST messages and GET
    /// the messages it accepted (`Authorization: Bearer <KEY>`). Environment only.
    #[arg(
        long,
        env = "HERALD_API_CLIENT_KEYS",
        hide_env_values = true,
        value_name = "NAME=KEY,..."
    )]
    pub client_keys: Option<String>,
    /// A file of client keys (NAME=KEY, one per line or comma-separated), instead of
    /// HERALD_API_CLIENT_KEYS.
    #[arg(long, env = "HERALD_API_CLIENT_KEYS_FILE")]
    pub client_keys_file: Option<PathBuf>,
    /// Operator keys, as NAME=KEY pairs: an operator key may do what a client key may, for
    /// every message, and list and re-drive DEAD rows, read and replay parking, and list
    /// partitions. Environment only.
    #[arg(
        long,
        env = "HERALD_API_OPERATOR_KEYS",
        hide_env_values = true,
        value_name = "NAME=KEY,..."
    )]
    pub operator_keys: Option<String>,
    /// A file of operator keys, instead of HERALD_API_OPERATOR_KEYS.
    #[arg(long, env = "HERALD_API_OPERATOR_KEYS_FILE")]
    pub operator_keys_file: Option<PathBuf>,
    /// Each gateway's receipt secret, as GATEWAY=SECRET pairs (a gateway given twice has two
    /// secrets, for a rotation): a receipt post must carry `Herald-Signature: t=<unix
    /// seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` made with one. Environment only.
    #[arg(
        long,
        env = "HERALD_RECEIPT_SECRETS",
        hide_env_values = true,
        value_name = "GATEWAY=SECRET,..."
    )]
    pub receipt_secrets: Option<String>,
    /// A file of receipt secrets, instead of HERALD_RECEIPT_SECRETS.
    #[arg(long, env = "HERALD_RECEIPT_SECRETS_FILE")]
    pub receipt_secrets_file: Option<PathBuf>,
    /// How far a receipt signature's timestamp may be from the API's clock, either way.
    #[arg(long, env = "HERALD_RECEIPT_SIGNATURE_WINDOW", default_value = "5m", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub receipt_signature_window: Duration,
    /// A development run: start without credentials (no key: every /v1 route is open; no
    /// receipt secret: receipts need no signature). Credentials that are configured are still
    /// enforced. Never in production.
    #[arg(long, env = "HERALD_INSECURE_DEV")]
    pub insecure_dev: bool,
}

impl Default for ApiConfig {
    /// Every flag at its default; the database URL is empty, which [`ApiConfig::check`]
    /// refuses.
    fn default() -> Self {
        herald_core::config::defaults(&["--database-url", ""])
    }
}

impl ApiConfig {
    /// Serving the database at `url`, every other setting at its default.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database: DatabaseConfig::new(database_url),
            ..Self::default()
        }
    }

    /// Every rule about these values, and the credentials' files read and parsed: a role that
    /// passes it fails later only on what it connects to.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.prepare().map(drop)
    }

    /// [`ApiConfig::check`], answering what it built on the way, so the role reads each file
    /// once.
    pub fn prepare(&self) -> Result<PreparedApi, ConfigError> {
        self.database.check()?;
        self.pressure.check()?;
        ensure(!self.backlog_gauge_interval.is_zero(), || {
            "--backlog-gauge-interval must be more than 0".into()
        })?;
        Ok(PreparedApi {
            limits: self.limits()?,
            groups: self.groups()?,
            redis_tls: self.redis_tls.load()?,
            credentials: self.credentials()?,
        })
    }

    /// What a client may send.
    pub fn limits(&self) -> Result<Limits, ConfigError> {
        ensure(self.max_batch >= 1 && self.max_body_bytes >= 1, || {
            "--max-batch and --max-body-bytes must be at least 1".into()
        })?;
        ensure(!self.request_timeout.is_zero(), || {
            "--request-timeout must be more than 0".into()
        })?;
        let rate_limit = match (NonZeroU32::new(self.rate_limit), self.rate_limit_burst) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(ConfigError::new("--rate-limit-burst needs a --rate-limit"))
            }
            (Some(per_second), burst) => Some(RateLimit {
                per_second,
                burst: NonZeroU32::new(burst.unwrap_or(per_second.get()))
                    .ok_or_else(|| ConfigError::new("--rate-limit-burst must be at least 1"))?,
            }),
        };
        Ok(Limits {
            max_body_bytes: self.max_body_bytes,
            max_batch: self.max_batch,
            require_idempotency_key: self.require_idempotency_key,
            request_timeout: self.request_timeout,
            rate_limit,
        })
    }

    /// The two group writers: accepts never linger (their clients wait, and concurrent ones
    /// gather a group anyway), receipts linger `--receipt-linger`.
    pub fn groups(&self) -> Result<Groups, ConfigError> {
        ensure(self.group_max >= 1 && self.group_parallel >= 1, || {
            "--group-max and --group-parallel must be at least 1".into()
        })?;
        let accepts = GroupSettings {
            max_group: self.group_max,
            parallel: self.group_parallel,
            linger: Duration::ZERO,
        };
        Ok(Groups {
            accepts,
            receipts: GroupSettings {
                linger: self.receipt_linger,
                ..accepts
            },
        })
    }

    /// The API's keys and receipt secrets, from the environment or their files; without any,
    /// the API refuses to start unless this is a development run.
    pub fn credentials(&self) -> Result<Credentials, ConfigError> {
        let auth = &self.auth;
        let pairs = |value: &Option<String>, file: &Option<PathBuf>, variable: &str| {
            let text = read_secret(value.as_deref(), file.as_deref(), variable)?;
            parse_pairs(text.as_deref().unwrap_or_default())
                .map_err(|err| ConfigError(format!("{variable}: {err}")))
        };
        let client = pairs(
            &auth.client_keys,
            &auth.client_keys_file,
            "HERALD_API_CLIENT_KEYS",
        )?;
        let operator = pairs(
            &auth.operator_keys,
            &auth.operator_keys_file,
            "HERALD_API_OPERATOR_KEYS",
        )?;
        let receipt = pairs(
            &auth.receipt_secrets,
            &auth.receipt_secrets_file,
            "HERALD_RECEIPT_SECRETS",
        )?;
        Credentials::new(
            client,
            operator,
            receipt,
            auth.receipt_signature_window,
            auth.insecure_dev,
        )
        .map_err(|err| ConfigError(explain(&err)))
    }
}

/// What to set, for each way credentials can be refused.
fn explain(err: &CredentialError) -> String {
    let hint = match err {
        CredentialError::NoKeys => {
            "set HERALD_API_CLIENT_KEYS and/or HERALD_API_OPERATOR_KEYS to NAME=KEY pairs \
             (comma-separated), or HERALD_API_CLIENT_KEYS_FILE / HERALD_API_OPERATOR_KEYS_FILE to \
             files holding them"
        }
        CredentialError::NoReceiptSecrets => {
            "set HERALD_RECEIPT_SECRETS to GATEWAY=SECRET pairs (comma-separated), one for every \
             gateway that posts receipts, or HERALD_RECEIPT_SECRETS_FILE to a file holding them"
        }
        _ => return err.to_string(),
    };
    let renamed = if std::env::var_os("HERALD_API_KEYS").is_some() {
        " (HERALD_API_KEYS is no longer read: give each of its keys a name and a scope)"
    } else {
        ""
    };
    format!(
        "the API will not start without credentials: {err}; {hint}{renamed}. For a development \
         run without credentials, pass --insecure-dev (HERALD_INSECURE_DEV=true)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> ApiConfig {
        let mut config = ApiConfig::new("postgres://herald@db/herald");
        config.auth.insecure_dev = true;
        config
    }

    #[test]
    fn the_defaults_make_the_documented_limits_and_groups() {
        let config = open();
        config.check().unwrap();
        let limits = config.limits().unwrap();
        assert_eq!(limits.max_body_bytes, 256 * 1024);
        assert_eq!(limits.request_timeout, Duration::from_secs(10));
        assert!(limits.rate_limit.is_none());
        let groups = config.groups().unwrap();
        assert_eq!(groups.accepts.linger, Duration::ZERO);
        assert_eq!(groups.receipts.linger, Duration::from_millis(10));
        assert_eq!(groups.accepts.max_group, 256);
    }

    #[test]
    fn each_rule_names_its_flag() {
        let refused = |change: fn(&mut ApiConfig), flag: &str| {
            let mut config = open();
            change(&mut config);
            let err = config.check().unwrap_err();
            assert!(err.0.contains(flag), "{flag}: {err}");
        };
        refused(|c| c.max_batch = 0, "--max-batch");
        refused(|c| c.group_parallel = 0, "--group-parallel");
        refused(|c| c.request_timeout = Duration::ZERO, "--request-timeout");
        refused(|c| c.rate_limit_burst = Some(5), "--rate-limit-burst needs");
        refused(
            |c| c.pressure.queue_full_threshold = 0.0,
            "--queue-full-threshold",
        );
        refused(|c| c.auth.insecure_dev = false, "--insecure-dev");
        refused(
            |c| c.database.database_max_connections = 0,
            "--database-max-connections",
        );
    }

    #[test]
    fn a_burst_defaults_to_one_seconds_worth() {
        let mut config = open();
        config.rate_limit = 40;
        let limit = config.limits().unwrap().rate_limit.unwrap();
        assert_eq!((limit.per_second.get(), limit.burst.get()), (40, 40));
    }
}
