//! `herald`: one binary, one subcommand per role, so one container image serves every
//! deployment. `main` parses the command line, starts telemetry, builds the role from its
//! library crate and waits for shutdown.

mod cli;
mod config_file;
mod roles;
mod shutdown;
mod telemetry;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};

/// Exit status for a configuration the process refuses to start with (EX_USAGE).
const EXIT_CONFIG: i32 = 64;

fn main() {
    // A --config file fills the HERALD_* variables it names before the command line is parsed.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Err(err) = config_file::apply(&args) {
        eprintln!("herald: invalid configuration: {err}");
        std::process::exit(EXIT_CONFIG);
    }
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let cli = match parsed {
        Ok((cli, matches)) => {
            if let Err(err) = cli::refuse_secrets_on_the_command_line(&matches) {
                eprintln!("herald: invalid configuration: {err}");
                std::process::exit(EXIT_CONFIG);
            }
            cli
        }
        Err(err) => {
            let code = if err.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = err.print();
            std::process::exit(code);
        }
    };
    // One TLS implementation for every client (PostgreSQL, Redis, etcd, the provider): rustls
    // on ring. Several crates could each pick a provider; naming it once avoids the ambiguity.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("herald: cannot start the async runtime: {err}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(run(cli));
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            if let Some(config) = err.downcast_ref::<cli::ConfigError>() {
                eprintln!("herald: invalid configuration: {config}");
                std::process::exit(EXIT_CONFIG);
            }
            tracing::error!(error = format!("{err:#}"), "herald stopped on an error");
            eprintln!("herald: {err:#}");
            std::process::exit(1);
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Migrate(args) => roles::migrate::run(args).await,
        Command::Api(args) => roles::api::main(args).await,
        Command::Poller(args) => roles::poller::main(args).await,
        Command::Worker(args) => roles::worker::main(args).await,
        Command::ProviderSim(args) => roles::sim::main(args).await,
        Command::Verify(args) => roles::verify::main(args).await,
        Command::Plan(args) => roles::plan::main(args).await,
        Command::Archive(command) => roles::archive::main(command).await,
        #[cfg(feature = "dev")]
        Command::Dev(args) => roles::dev::main(args).await,
        #[cfg(not(feature = "dev"))]
        Command::Dev(_) => Err(cli::ConfigError(
            "this herald is built without the dev role (as the container image is): run \
             scripts/dev from a source checkout, or build with the default features"
                .to_owned(),
        )
        .into()),
    }
}
