//! The command line. Every flag can also be set through the `HERALD_*` environment variable
//! named in its help; flags win over the environment, which wins over the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use herald_core::JobType;
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(
    name = "herald",
    version,
    about = "Herald: a message pipeline that never drops a message",
    long_about = "Herald: a message pipeline that never drops a message.\n\n\
        A client POSTs a message to `herald api`; it is committed with an outbox row in one \
        PostgreSQL transaction. `herald poller` publishes outbox rows to Redis streams, \
        `herald worker` sends them to the provider and records the outcome with an \
        idempotency key, so a retry never becomes a second effect.\n\n\
        Every flag can also be set with the HERALD_* environment variable shown in its help, or \
        in a TOML file given with --config (flags win over variables, which win over the file).\n\
        In a source checkout, start with `scripts/dev` (`herald dev`): every role plus local         PostgreSQL, Redis and etcd, and a demo load."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install or upgrade the database schema and fix the outbox's partition count.
    Migrate(MigrateArgs),
    /// Serve the HTTP API: accept messages into the outbox and answer their history.
    Api(ApiArgs),
    /// Drain outbox partitions into the queue stores; with etcd, share them with other pollers.
    Poller(PollerArgs),
    /// Consume one job type's queue store: send (call the provider) or status (apply receipts).
    Worker(WorkerArgs),
    /// Run the simulated provider: latency, errors, timeouts, and delivery receipts posted back.
    ProviderSim(SimArgs),
    /// Prove that nothing was lost or doubled: compare the database with the provider's record.
    Verify(VerifyArgs),
    /// Check pool and memory budgets on paper: PostgreSQL connections, Redis clients and memory.
    Plan(PlanArgs),
    /// Run everything locally: PostgreSQL, Redis, etcd, every role, then a demo load.
    // Hidden where it cannot run (a build without the `dev` feature, as in the image).
    #[cfg_attr(not(feature = "dev"), command(hide = true))]
    Dev(DevArgs),
}

/// A configuration the process refuses to start with (exit status 64).
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Pretty,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct CommonArgs {
    /// Log format: JSON lines (production) or human-readable.
    #[arg(long, env = "HERALD_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Print the effective configuration (passwords masked) and exit.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    /// A TOML file of settings: keys are flag names (max_batch or max-batch), top-level keys
    /// for every role that has the flag, a [<role>] table for one role. Flags win over HERALD_*
    /// variables, which win over the file, which wins over defaults.
    #[arg(long, env = "HERALD_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct DatabaseArgs {
    /// PostgreSQL URL, e.g. postgres://herald:secret@db:5432/herald.
    #[arg(long, hide_env_values = true, env = "HERALD_DATABASE_URL")]
    #[serde(serialize_with = "mask_password")]
    pub database_url: String,
    /// Largest number of PostgreSQL connections this process holds.
    #[arg(long, env = "HERALD_DATABASE_MAX_CONNECTIONS", default_value_t = 16)]
    pub database_max_connections: u32,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
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
    #[serde(serialize_with = "mask_secret")]
    pub runtime_role_password: Option<String>,
    /// A file holding the runtime role's password, instead of HERALD_RUNTIME_ROLE_PASSWORD.
    #[arg(long, env = "HERALD_RUNTIME_ROLE_PASSWORD_FILE")]
    pub runtime_role_password_file: Option<PathBuf>,
    /// Longest one schema change waits for a table lock. While it waits (behind a long
    /// transaction) every accept on that table waits behind it; past this it gives up, its
    /// migration is rolled back whole, accepts go on, and it is tried again after a pause.
    #[arg(long, env = "HERALD_MIGRATE_LOCK_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub lock_timeout: Duration,
    /// Tries of a migration that ran out of lock time before `herald migrate` fails (exit 1,
    /// nothing of that migration applied).
    #[arg(long, env = "HERALD_MIGRATE_LOCK_ATTEMPTS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    pub lock_attempts: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct ApiArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
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
    #[serde(serialize_with = "human")]
    pub shutdown_delay: Duration,
    /// The send job type's queue store shards. Not on the accept path: `/readyz` names one
    /// that is full or unreachable (and stays ready: messages wait in the outbox).
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_REDIS_SEND_URL",
        value_delimiter = ','
    )]
    #[serde(serialize_with = "mask_passwords")]
    pub redis_send_url: Vec<String>,
    /// The status job type's queue store shards (readiness only, like --redis-send-url).
    #[arg(
        long,
        hide_env_values = true,
        env = "HERALD_REDIS_STATUS_URL",
        value_delimiter = ','
    )]
    #[serde(serialize_with = "mask_passwords")]
    pub redis_status_url: Vec<String>,
    #[command(flatten)]
    pub pressure: PressureArgs,
    #[command(flatten)]
    pub redis_tls: RedisTlsArgs,
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
    /// Idempotency-Key).
    #[arg(long, env = "HERALD_API_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
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
    #[arg(long, env = "HERALD_API_GROUP_MAX", default_value_t = herald_api::DEFAULT_GROUP.max_group)]
    pub group_max: usize,
    /// Group transactions written at once (each for accepts and for receipts); while they
    /// run, the next group gathers. 1 makes the largest groups, more the lowest latency.
    #[arg(long, env = "HERALD_API_GROUP_PARALLEL", default_value_t = herald_api::DEFAULT_GROUP.parallel)]
    pub group_parallel: usize,
    /// How long a receipt group that starts alone waits for more receipt requests to share its
    /// transaction and status jobs (0s: none). Single-message accepts never wait: their
    /// clients do, and concurrent ones gather a group anyway.
    #[arg(long, env = "HERALD_API_RECEIPT_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub receipt_linger: Duration,
    #[command(flatten)]
    pub auth: ApiAuthArgs,
    /// How often the API reads the outbox backlog for its gauges (backlog rows and oldest
    /// PENDING age per partition, DEAD rows). One API replica of a deployment reads and exports
    /// them: the holder of an advisory lock, which every replica asks for at this interval.
    #[arg(long, env = "HERALD_BACKLOG_GAUGE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub backlog_gauge_interval: Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Who may call the API. Keys and secrets are read from the environment (or from files named
/// there), never from a command line: `herald` refuses them as flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ApiAuthArgs {
    /// Client keys, as NAME=KEY pairs (comma-separated): a client key may POST messages and GET
    /// the messages it accepted (`Authorization: Bearer <KEY>`). Environment only.
    #[arg(
        long,
        env = "HERALD_API_CLIENT_KEYS",
        hide_env_values = true,
        value_name = "NAME=KEY,..."
    )]
    #[serde(serialize_with = "mask_secret")]
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
    #[serde(serialize_with = "mask_secret")]
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
    #[serde(serialize_with = "mask_secret")]
    pub receipt_secrets: Option<String>,
    /// A file of receipt secrets, instead of HERALD_RECEIPT_SECRETS.
    #[arg(long, env = "HERALD_RECEIPT_SECRETS_FILE")]
    pub receipt_secrets_file: Option<PathBuf>,
    /// How far a receipt signature's timestamp may be from the API's clock, either way.
    #[arg(long, env = "HERALD_RECEIPT_SIGNATURE_WINDOW", default_value = "5m", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub receipt_signature_window: Duration,
    /// A development run: start without credentials (no key: every /v1 route is open; no
    /// receipt secret: receipts need no signature). Credentials that are configured are still
    /// enforced. Never in production.
    #[arg(long, env = "HERALD_INSECURE_DEV")]
    pub insecure_dev: bool,
}

/// Arguments that hold secrets: accepted from their environment variable (or a file), and
/// refused on a command line, where every user of the machine could read them.
const ENVIRONMENT_ONLY: [&str; 5] = [
    "client_keys",
    "operator_keys",
    "receipt_secrets",
    "runtime_role_password",
    "etcd_password",
];

/// Refuses a secret given as a flag, naming the variable to use instead.
pub fn refuse_secrets_on_the_command_line(matches: &clap::ArgMatches) -> Result<(), ConfigError> {
    let Some((name, sub)) = matches.subcommand() else {
        return Ok(());
    };
    let command = <Cli as clap::CommandFactory>::command();
    let Some(definition) = command.find_subcommand(name) else {
        return Ok(());
    };
    for arg in definition.get_arguments() {
        let id = arg.get_id().as_str();
        if ENVIRONMENT_ONLY.contains(&id)
            && sub.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
        {
            let env = arg
                .get_env()
                .map(|env| env.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(ConfigError(format!(
                "--{} is read from the environment only, so that it is on no command line: set \
                 {env} (or {env}_FILE to a file holding it) instead",
                arg.get_long().unwrap_or(id)
            )));
        }
    }
    Ok(())
}

/// A secret given directly or as a file (`variable` names the direct form, for errors);
/// None when neither is given.
pub fn read_secret(
    value: Option<&str>,
    file: Option<&std::path::Path>,
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

#[derive(Debug, Clone, Args, Serialize)]
pub struct QueueArgs {
    /// Redis URLs of the `send` job type's queue store, one per shard (comma-separated);
    /// partition p publishes to shard p mod shards.
    #[arg(
        long,
        env = "HERALD_REDIS_SEND_URL",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    #[serde(serialize_with = "mask_passwords")]
    pub redis_send_url: Vec<String>,
    /// Redis URLs of the `status` job type's queue store (delivery receipts), one per shard.
    #[arg(
        long,
        env = "HERALD_REDIS_STATUS_URL",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    #[serde(serialize_with = "mask_passwords")]
    pub redis_status_url: Vec<String>,
    /// Connections to each queue store.
    #[arg(long, env = "HERALD_REDIS_MAX_CONNECTIONS", default_value_t = 16)]
    pub redis_max_connections: usize,
    #[command(flatten)]
    pub pressure: PressureArgs,
    #[command(flatten)]
    pub redis_tls: RedisTlsArgs,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct PressureArgs {
    /// Memory use (used / maxmemory) at which a queue store counts as full: pollers stop
    /// publishing to it until it drains below, and the API's /readyz names it.
    #[arg(long, env = "HERALD_QUEUE_FULL_THRESHOLD", default_value_t = 0.8)]
    pub queue_full_threshold: f64,
    /// How often each queue store's memory and streams are read. A store that fills between
    /// two reads refuses the overshoot with OOM, which releases the batch uncharged and
    /// reads the store again at once (1s rather than 500ms: a tenth of a percent of the
    /// machine less for an idle deployment, loadtest/README.md).
    #[arg(long, env = "HERALD_QUEUE_CHECK_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub queue_check_interval: Duration,
}

/// TLS to the queue stores: `rediss://` URLs connect over TLS, trusting the system's roots
/// unless a CA bundle is given.
#[derive(Debug, Clone, Args, Serialize)]
pub struct RedisTlsArgs {
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

impl RedisTlsArgs {
    pub fn load(&self) -> Result<herald_core::ClientTls, ConfigError> {
        client_tls(
            "--redis",
            self.redis_ca_file.as_deref(),
            self.redis_cert_file.as_deref(),
            self.redis_key_file.as_deref(),
        )
    }
}

/// A client's TLS material read from its files; `flag` prefixes the flags in errors.
pub fn client_tls(
    flag: &str,
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) -> Result<herald_core::ClientTls, ConfigError> {
    let read = |path: &std::path::Path, which: &str| {
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
        (Some(cert), Some(key)) => Some(herald_core::ClientIdentity {
            cert: read(cert, "cert")?,
            key: read(key, "key")?,
        }),
        _ => {
            return Err(ConfigError(format!(
                "{flag}-cert-file and {flag}-key-file go together: set both or neither"
            )))
        }
    };
    Ok(herald_core::ClientTls {
        ca: ca.map(|path| read(path, "ca")).transpose()?,
        identity,
    })
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct PollerArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub queue: QueueArgs,
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
    #[serde(serialize_with = "mask_secret")]
    pub etcd_password: Option<String>,
    /// A file holding the etcd password, instead of HERALD_ETCD_PASSWORD.
    #[arg(long, env = "HERALD_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// TTL of the poller's etcd lease; it stops claiming after TTL/2 without a renewal.
    #[arg(long, env = "HERALD_LEASE_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub lease_ttl: Duration,
    /// Longest wait for in-flight batches when handing partitions off or shutting down
    /// (keep the pod's termination grace period above it).
    #[arg(long, env = "HERALD_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub drain_timeout: Duration,
    /// Rows claimed per statement.
    #[arg(long, env = "HERALD_POLLER_BATCH_SIZE", default_value_t = 500)]
    pub batch_size: u32,
    /// Batches drained from one partition before it yields.
    #[arg(long, env = "HERALD_POLLER_MAX_BATCHES_PER_TICK", default_value_t = 20)]
    pub max_batches_per_tick: u32,
    /// Most batches being published at once over all owned partitions (0: no limit, every
    /// partition publishes on its own). 1 is the serial publisher of Herald's first version.
    #[arg(long, env = "HERALD_POLLER_PUBLISH_CONCURRENCY", default_value_t = 0)]
    pub publish_concurrency: usize,
    /// How long a claim that starts alone waits for other partitions' claims to share its
    /// statement (0s: none). At low rates every claim would carry a few rows, and a statement
    /// on the outbox costs about as much for one row as for fifty (10ms against none:
    /// loadtest/README.md).
    #[arg(long, env = "HERALD_BATCH_LINGER", default_value = "10ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub batch_linger: Duration,
    /// How long a partition whose claim came back short waits before claiming again (NOTIFY
    /// wakes it sooner): the pace at which rows due later (retries) and rows whose NOTIFY was
    /// lost are found.
    #[arg(long, env = "HERALD_POLLER_POLL_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub poll_interval: Duration,
    /// Longest wait of an idle partition: each short claim in a row with no NOTIFY between
    /// doubles the wait from --poll-interval up to this (at or below --poll-interval: no
    /// doubling). An idle poller then asks the database a quarter as often
    /// (loadtest/README.md); a NOTIFY or a full claim starts again from --poll-interval.
    #[arg(long, env = "HERALD_POLLER_IDLE_POLL_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub idle_poll_interval: Duration,
    /// How often stale PROCESSING/PUBLISHED rows are looked for.
    #[arg(long, env = "HERALD_POLLER_REDRIVE_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub redrive_interval: Duration,
    /// A claimed or published row not confirmed by a worker within this goes back to PENDING,
    /// if its queue store no longer holds it (a job waiting in its stream is never re-driven).
    #[arg(long, env = "HERALD_POLLER_STALE_AFTER", default_value = "2m", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub stale_after: Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The job type this worker server runs (each type has its own servers and queue store).
    #[arg(long, env = "HERALD_JOB_TYPE", value_parser = parse_job_type, default_value = "send")]
    #[serde(serialize_with = "display")]
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
    #[serde(serialize_with = "mask_passwords")]
    pub redis_url: Vec<String>,
    /// Connections to the queue store.
    #[arg(long, env = "HERALD_REDIS_MAX_CONNECTIONS", default_value_t = 16)]
    pub redis_max_connections: usize,
    #[command(flatten)]
    pub pressure: PressureArgs,
    #[command(flatten)]
    pub redis_tls: RedisTlsArgs,
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
    #[serde(serialize_with = "human")]
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
    #[serde(serialize_with = "human")]
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
    #[serde(serialize_with = "human")]
    pub claim_lease: Duration,
    /// Back-off after the first failed provider call; doubles per attempt up to --retry-max.
    #[arg(long, env = "HERALD_RETRY_BASE", default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub retry_base: Duration,
    /// Longest back-off between two provider attempts of one send. At least --retry-base.
    #[arg(long, env = "HERALD_RETRY_MAX", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub retry_max: Duration,
    /// An entry another consumer left unacknowledged this long is taken over.
    #[arg(long, env = "HERALD_WORKER_RECLAIM_IDLE", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
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
    #[serde(serialize_with = "human")]
    pub receipt_window: Duration,
    /// status: a receipt whose send is not recorded yet is held this long (and applied as soon
    /// as the send is recorded), then parked with its raw body.
    #[arg(long, env = "HERALD_HOLD_RECEIPTS_FOR", default_value = "1h", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub hold_receipts_for: Duration,
    /// status: how often silent messages are looked for.
    #[arg(long, env = "HERALD_RECONCILE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub reconcile_interval: Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `--concurrency` of a send worker when none is given: `herald-loadtest drain --durable
/// --messages 50000` delivered 1,457 msg/s at 64, 2,483 at 256, 3,385 at 512 and 3,587 at
/// 1,024 (one run each, loadtest/README.md); 512 is past the knee at half the provider
/// connections of 1,024.
pub const DEFAULT_SEND_CONCURRENCY: usize = 512;
/// `--concurrency` of a status worker when none is given (its batches are bounded by
/// `--batches-in-flight`, not by this).
pub const DEFAULT_STATUS_CONCURRENCY: usize = 64;

impl WorkerArgs {
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
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct SimArgs {
    /// Address the simulator (and its /healthz, /readyz, /metrics) listens on.
    #[arg(long, env = "HERALD_SIM_LISTEN", default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// Gateway names (comma-separated); each key is routed to one by hash.
    #[arg(
        long,
        env = "HERALD_SIM_GATEWAYS",
        value_delimiter = ',',
        default_value = "gw-a,gw-b"
    )]
    pub gateways: Vec<String>,
    /// Provider ids count 1..=N per gateway, then wrap.
    #[arg(long, env = "HERALD_SIM_ID_WRAP", default_value_t = 65_535)]
    pub id_wrap: u32,
    /// Fixed latency of every submit.
    #[arg(long, env = "HERALD_SIM_LATENCY", default_value = "0ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub latency: Duration,
    /// Extra random latency, uniform between 0 and this.
    #[arg(long, env = "HERALD_SIM_JITTER", default_value = "0ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub jitter: Duration,
    /// Share of submits answered 503 without effect (0 to 1).
    #[arg(long, env = "HERALD_SIM_ERROR_RATE", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of submits that take effect but answer only after --timeout-delay (0 to 1).
    #[arg(long, env = "HERALD_SIM_TIMEOUT_RATE", default_value_t = 0.0)]
    pub timeout_rate: f64,
    /// Share of submits refused for their content with 422 and no effect (0 to 1): a
    /// permanent rejection, which Herald records as FAILED.
    #[arg(long, env = "HERALD_SIM_REJECT_RATE", default_value_t = 0.0)]
    pub reject_rate: f64,
    /// Answer every submit with this HTTP status and take no effect, as a gateway Herald is
    /// misconfigured for would (404: wrong URL, 401: wrong credentials).
    #[arg(long, env = "HERALD_SIM_REFUSE_STATUS")]
    pub refuse_status: Option<u16>,
    /// How late a "timed out" submit answers.
    #[arg(long, env = "HERALD_SIM_TIMEOUT_DELAY", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub timeout_delay: Duration,
    /// Append-only record of every submit (read back on start).
    #[arg(
        long,
        env = "HERALD_SIM_LOG",
        default_value = "provider-sim-submits.jsonl"
    )]
    pub log_path: PathBuf,
    /// Herald API base URL to post delivery receipts to (none: no receipts).
    #[arg(long, hide_env_values = true, env = "HERALD_SIM_CALLBACK_URL")]
    pub callback_url: Option<String>,
    /// The secret each gateway signs its receipt posts with, as GATEWAY=SECRET pairs (the same
    /// values as the API's HERALD_RECEIPT_SECRETS; a gateway given twice signs with the last).
    /// A gateway without one posts unsigned, which an API with secrets refuses. Environment
    /// only.
    #[arg(
        long,
        env = "HERALD_SIM_RECEIPT_SECRETS",
        hide_env_values = true,
        value_name = "GATEWAY=SECRET,..."
    )]
    #[serde(serialize_with = "mask_secret")]
    pub receipt_secrets: Option<String>,
    /// A file of receipt secrets, instead of HERALD_SIM_RECEIPT_SECRETS.
    #[arg(long, env = "HERALD_SIM_RECEIPT_SECRETS_FILE")]
    pub receipt_secrets_file: Option<PathBuf>,
    /// Wait before each receipt.
    #[arg(long, env = "HERALD_SIM_RECEIPT_DELAY", default_value = "50ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub receipt_delay: Duration,
    /// Share of submits with an intermediate ENROUTE receipt before the final one.
    #[arg(long, env = "HERALD_SIM_ENROUTE_RATE", default_value_t = 0.5)]
    pub enroute_rate: f64,
    /// Share of submits that get ENROUTE and never a final receipt (a silent gateway).
    #[arg(long, env = "HERALD_SIM_SILENT_RATE", default_value_t = 0.0)]
    pub silent_rate: f64,
    /// Share of final receipts with a status outside the known vocabulary.
    #[arg(long, env = "HERALD_SIM_UNKNOWN_STATUS_RATE", default_value_t = 0.0)]
    pub unknown_status_rate: f64,
    /// Share of receipts with a malformed timestamp.
    #[arg(long, env = "HERALD_SIM_BAD_TIMESTAMP_RATE", default_value_t = 0.0)]
    pub bad_timestamp_rate: f64,
    /// Share of final receipts that say UNDELIV.
    #[arg(long, env = "HERALD_SIM_UNDELIVERED_RATE", default_value_t = 0.0)]
    pub undelivered_rate: f64,
    /// Share of final receipts that say EXPIRED.
    #[arg(long, env = "HERALD_SIM_EXPIRED_RATE", default_value_t = 0.0)]
    pub expired_rate: f64,
    /// Most receipts in one post to Herald's batch endpoint; 1 posts each on its own to the
    /// single endpoint (a gateway that cannot batch).
    #[arg(long, env = "HERALD_SIM_RECEIPT_BATCH", default_value_t = 100)]
    pub receipt_batch: usize,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct VerifyArgs {
    /// PostgreSQL URL of the Herald database.
    #[arg(long, hide_env_values = true, env = "HERALD_DATABASE_URL")]
    #[serde(serialize_with = "mask_password")]
    pub database_url: String,
    /// Base URL of the provider simulator whose record proves each submit and receipt.
    #[arg(long, hide_env_values = true, env = "HERALD_PROVIDER_SIM_URL")]
    pub provider_sim: String,
    /// Ends the run is allowed to have, exactly: CLASS=COUNT,… with CLASS one of dead,
    /// failed_wrongly, unknown, receipt_parked, parked (e.g. `--expect dead=5` after a
    /// provider outage). Any other end that is not delivered or rejected fails the proof.
    #[arg(long, default_value = "", value_parser = parse_expectations)]
    #[serde(skip)]
    pub expect: herald_core::verdict::Expectations,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_expectations(text: &str) -> Result<herald_core::verdict::Expectations, String> {
    text.parse()
        .map_err(|err: herald_core::verdict::BadExpectation| err.to_string())
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct PlanArgs {
    /// The deployment to check, as TOML (see examples/plan.toml).
    #[arg(
        long,
        env = "HERALD_PLAN_CONFIG",
        required_unless_present = "values",
        conflicts_with = "values"
    )]
    pub config: Option<PathBuf>,
    /// Instead of --config: the Helm chart's values files, merged as Helm merges them (later
    /// files win), e.g. `--values helm/herald/values.yaml --values mine.yaml`; the release
    /// they describe is checked, each Deployment at its most replicas plus one surge pod.
    #[arg(long = "values", env = "HERALD_PLAN_VALUES", value_delimiter = ',')]
    pub values: Vec<PathBuf>,
    /// The fill level at which pollers pause publishing; peak memory must fit below it
    /// (default: 0.8, or queueFullThreshold of the values files).
    #[arg(long, env = "HERALD_QUEUE_FULL_THRESHOLD")]
    pub queue_full_threshold: Option<f64>,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct DevArgs {
    /// Folder for the local servers' data and logs (wiped at start).
    #[arg(long, env = "HERALD_DEV_DIR", default_value = ".herald-dev")]
    pub dir: PathBuf,
    /// Messages in the demo load (0: none).
    #[arg(long, env = "HERALD_DEV_MESSAGES", default_value_t = 10_000)]
    pub messages: usize,
    /// Messages per batch request of the demo load (1 sends single requests).
    #[arg(long, env = "HERALD_DEV_BATCH", default_value_t = 100)]
    pub batch: usize,
    /// Requests in flight at once during the demo load.
    #[arg(long, env = "HERALD_DEV_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Outbox partitions.
    #[arg(long, env = "HERALD_PARTITIONS", default_value_t = 64)]
    pub partitions: u32,
    /// Longest wait for the demo load to be delivered.
    #[arg(long, env = "HERALD_DEV_DRAIN_TIMEOUT", default_value = "120s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "human")]
    pub drain_timeout: Duration,
    /// Keep every role running after the demo (until Ctrl-C).
    #[arg(long)]
    pub keep_running: bool,
    /// Port of the API (the other roles take free ports).
    #[arg(long, env = "HERALD_DEV_API_PORT", default_value_t = 8080)]
    pub api_port: u16,
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

/// Prints `args` as JSON when `--print-config` was given; returns whether it did.
pub fn print_config<T: Serialize>(common: &CommonArgs, args: &T) -> bool {
    if common.print_config {
        match serde_json::to_string_pretty(args) {
            Ok(text) => println!("{text}"),
            Err(err) => eprintln!("cannot print the configuration: {err}"),
        }
    }
    common.print_config
}

fn mask_password<S: serde::Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&masked_url(url))
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

fn mask_passwords<S: serde::Serializer>(urls: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(urls.iter().map(|url| masked_url(url)))
}

fn mask_secret<S: serde::Serializer>(
    secret: &Option<String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match secret {
        Some(_) => serializer.serialize_str("(set, hidden)"),
        None => serializer.serialize_none(),
    }
}

fn human<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&humantime::format_duration(*duration).to_string())
}

fn display<S: serde::Serializer, T: std::fmt::Display>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// A name unique to this process: host name and process id.
pub fn process_name(prefix: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("{prefix}-{host}-{}", std::process::id())
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
}
