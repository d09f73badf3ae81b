//! `herald-loadtest`: Herald's load tester and benchmarks.
//!
//! `run` sends open-loop load (constant or stepped rate) to a deployment — one it starts
//! itself with `--local`, or yours — then proves that every accepted message reached the
//! provider once in effect, prints latencies and a per-stage breakdown, runs chaos steps from
//! a scenario file, and writes a JSON report and an SVG plot. `compare` puts two reports side
//! by side; `baseline` measures Herald's starting-point shape against its defaults;
//! `bulkheads` is the receipt-flood benchmark.

mod accept;
mod baseline;
mod breakdown;
mod bulkheads;
mod chaos;
mod latency;
mod load;
mod plot;
mod proof;
mod report;
mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "herald-loadtest",
    about = "Herald's load tester: open-loop load, proof of delivery, per-stage breakdown, chaos steps"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Open-loop load against a deployment, then the proof, latencies and breakdown. Exits 1
    /// when a message was lost or doubled.
    Run(Box<run::RunArgs>),
    /// Two reports side by side, with the ratio B / A.
    Compare { a: PathBuf, b: PathBuf },
    /// The same load on Herald's starting-point shape (one poller, publish concurrency 1,
    /// one batch per tick) and on its defaults, each on a fresh local deployment, compared.
    Baseline(Box<baseline::BaselineArgs>),
    /// Send throughput with no receipt flood, with a flood of 10x the send rate on separate
    /// worker servers (bulkheads), and with the flood sharing one semaphore with the sends.
    Bulkheads(bulkheads::Args),
    /// Intake alone: single and batch accept against the API, and the accept statement through
    /// pgbench on the same database with the same connections; the ratio is the figure.
    Accept(Box<accept::AcceptArgs>),
}

#[tokio::main]
async fn main() {
    let code = match Cli::parse().command {
        Command::Run(args) => run::main(*args).await,
        Command::Compare { a, b } => compare(&a, &b),
        Command::Baseline(args) => baseline::main(*args).await,
        Command::Bulkheads(args) => bulkheads::run(args).await.map(|()| 0),
        Command::Accept(args) => accept::main(*args).await,
    };
    match code {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("herald-loadtest: {err:#}");
            std::process::exit(2);
        }
    }
}

fn compare(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<i32> {
    let (a, b) = (report::Report::read(a)?, report::Report::read(b)?);
    println!("{}", report::compare(&a, &b));
    Ok(0)
}
