//! `herald-loadtest`: benchmarks that run Herald's roles in one process against real local
//! servers. Figures are ratios measured in one run; the machine is shared and noisy.

mod bulkheads;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "herald-loadtest",
    about = "Herald's benchmarks, against real local PostgreSQL and Redis"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send throughput with no receipt flood, with a flood of 10x the send rate on separate
    /// worker servers (bulkheads), and with the flood sharing one semaphore with the sends.
    Bulkheads(bulkheads::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bulkheads(args) => bulkheads::run(args).await,
    }
}
