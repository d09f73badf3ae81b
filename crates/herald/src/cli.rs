//! The command line. Every flag can also be set through the `HERALD_*` environment variable
//! named in its help; flags win over the environment, which wins over the defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use herald_api::ApiConfig;
use herald_poller::config::PollerConfig;
use herald_provider_sim::config::SimConfig;
use herald_store::config::MigrateConfig;
use herald_worker::config::WorkerConfig;
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
    /// Read back what retention archived (--archive-dir): verify files against their manifests,
    /// or restore their rows into the database.
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// Run everything locally: PostgreSQL, Redis, etcd, every role, then a demo load.
    // Hidden where it cannot run (a build without the `dev` feature, as in the image).
    #[cfg_attr(not(feature = "dev"), command(hide = true))]
    Dev(DevArgs),
}

/// A configuration the process refuses to start with (exit status 64).
pub use herald_core::config::{masked_url, ConfigError};

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

/// `herald migrate`: its settings ([`MigrateConfig`], in the store crate) and the flags every
/// subcommand has.
#[derive(Debug, Clone, Args, Serialize)]
pub struct MigrateArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub config: MigrateConfig,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `herald api`: [`ApiConfig`] and the common flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ApiArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub config: ApiConfig,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `herald poller`: [`PollerConfig`] and the common flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct PollerArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub config: PollerConfig,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `herald worker`: [`WorkerConfig`] and the common flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub config: WorkerConfig,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `herald provider-sim`: [`SimConfig`] and the common flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SimArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub config: SimConfig,
    #[command(flatten)]
    pub common: CommonArgs,
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

#[derive(Debug, Clone, Args, Serialize)]
pub struct VerifyArgs {
    /// PostgreSQL URL of the Herald database.
    #[arg(long, hide_env_values = true, env = "HERALD_DATABASE_URL")]
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

#[derive(Debug, Clone, Subcommand)]
pub enum ArchiveCommand {
    /// Check each archive file against its manifest: size, SHA-256, row count, first and last
    /// id, every line a row. Exits 1 when any does not match.
    Verify {
        /// Archive files, their manifests, or directories (searched for manifests).
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Put the rows of archive files back (each verified first, 1,000 lines a transaction);
    /// rows the database still has are left as they are, so running it again finishes a
    /// restore that stopped.
    Restore {
        /// PostgreSQL URL of the Herald database.
        #[arg(long, hide_env_values = true, env = "HERALD_DATABASE_URL")]
        database_url: String,
        /// Archive files, their manifests, or directories (searched for manifests).
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
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
    #[serde(serialize_with = "herald_core::config::human")]
    pub drain_timeout: Duration,
    /// Keep every role running after the demo (until Ctrl-C).
    #[arg(long)]
    pub keep_running: bool,
    /// Port of the API (the other roles take free ports).
    #[arg(long, env = "HERALD_DEV_API_PORT", default_value_t = 8080)]
    pub api_port: u16,
}

/// Prints `args` as JSON when `--print-config` was given; returns whether it did. Passwords in
/// URLs are masked, and a secret shows only that it is set.
pub fn print_config<T: Serialize>(common: &CommonArgs, args: &T) -> bool {
    if common.print_config {
        match serde_json::to_value(args) {
            Ok(mut value) => {
                mask(&mut value);
                println!("{value:#}");
            }
            Err(err) => eprintln!("cannot print the configuration: {err}"),
        }
    }
    common.print_config
}

/// Hides what `--print-config` must not show: the value of every environment-only setting,
/// and the password of every URL.
fn mask(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                if ENVIRONMENT_ONLY.contains(&key.as_str()) && !field.is_null() {
                    *field = serde_json::Value::from("(set, hidden)");
                } else {
                    mask(field);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(mask),
        serde_json::Value::String(text) => *text = masked_url(text),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printing_masks_secrets_and_passwords_and_nothing_else() {
        let mut value = serde_json::json!({
            "database_url": "postgres://herald:s3cret@db/herald",
            "redis_url": ["redis://:pw@queue:6379", "redis://queue:6380"],
            "client_keys": "shop=k1",
            "operator_keys": null,
            "max_batch": 7,
        });
        mask(&mut value);
        assert_eq!(
            value,
            serde_json::json!({
                "database_url": "postgres://herald:***@db/herald",
                "redis_url": ["redis://:***@queue:6379", "redis://queue:6380"],
                "client_keys": "(set, hidden)",
                "operator_keys": null,
                "max_batch": 7,
            })
        );
    }
}
