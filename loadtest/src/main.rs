//! `herald-loadtest`: Herald's load tester and benchmarks.
//!
//! `run` sends open-loop load (constant or stepped rate) to a deployment — one it starts
//! itself with `--local`, or yours — then proves that every accepted message reached the
//! provider once in effect, prints latencies and a per-stage breakdown, runs chaos steps from
//! a scenario file, and writes a JSON report and an SVG plot. `compare` puts two reports side
//! by side; `baseline` measures Herald's starting-point shape against its defaults;
//! `bulkheads` is the receipt-flood benchmark; `accept`, `capacity`, `drain` and `idle`
//! measure intake against pgbench, the sustained rate, a backlog's drain and an idle fleet.

mod accept;
mod baseline;
mod breakdown;
mod bulkheads;
mod capacity;
mod chaos;
mod cost;
mod drain;
mod idle;
mod latency;
mod load;
mod plot;
mod proof;
mod report;
mod run;
mod soak;
mod wal;

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
    /// The highest offered rate the whole deployment sustains (every message accepted and
    /// delivered, nothing lost, doubled or DEAD, accept → ACCEPTED p99 under a limit), found
    /// by raising the rate step by step on one deployment; with each step's cost per
    /// delivered message (CPU per process, row writes, WAL). Exits 1 when no rate passed.
    Capacity(Box<capacity::CapacityArgs>),
    /// A backlog accepted with the pollers stopped, then drained by the fleet: messages
    /// delivered per second until empty, the proof over all of them, and the cost.
    Drain(Box<drain::DrainArgs>),
    /// What a deployment with nothing to do costs: CPU share of every process, row writes
    /// and WAL per second.
    Idle(Box<idle::IdleArgs>),
    /// Retention under a steady load in compressed time (a retention of minutes): table sizes
    /// over time as a plot, flat once retention runs, throughput that does not
    /// degrade, and every message inside the retention window delivered. Exits 1 otherwise.
    Soak(Box<soak::SoakArgs>),
}

#[tokio::main]
async fn main() {
    let code = match Cli::parse().command {
        Command::Run(args) => run::main(*args).await,
        Command::Compare { a, b } => compare(&a, &b),
        Command::Baseline(args) => baseline::main(*args).await,
        Command::Bulkheads(args) => bulkheads::run(args).await.map(|()| 0),
        Command::Accept(args) => accept::main(*args).await,
        Command::Capacity(args) => capacity::main(*args).await,
        Command::Drain(args) => drain::main(*args).await,
        Command::Idle(args) => idle::main(*args).await,
        Command::Soak(args) => soak::main(*args).await,
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
