//! `herald-loadtest baseline`: the same open-loop load twice, each on a fresh local
//! deployment — once in the shape Herald started from (one poller, one publish at a time,
//! one batch per partition per tick, a send worker that moves one job per transaction), once
//! with Herald's defaults — and the two side by side with ratios, so the gain of the design is
//! a measured number.

use crate::chaos::Scenario;
use crate::report::{compare, Report};
use crate::run::{LoadArgs, LocalArgs, OutputArgs};

/// The poller flags of the starting point.
pub const STARTING_POINT_FLAGS: [&str; 2] = ["--publish-concurrency=1", "--max-batches-per-tick=1"];
/// The worker flags of the starting point (send and status): one job per transaction.
pub const STARTING_POINT_WORKER_FLAGS: [&str; 1] = ["--max-batch=1"];

#[derive(Debug, clap::Args)]
pub struct BaselineArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub local: LocalArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn main(args: BaselineArgs) -> anyhow::Result<i32> {
    let mut local = args.local.clone();
    local.local = true;
    let target = crate::run::TargetArgs {
        api_url: None,
        database_url: None,
        sim_url: None,
        sim_log: None,
        metrics_url: Vec::new(),
    };
    // The same seed for both, so both runs send the same messages.
    let mut load = args.load.clone();
    load.seed = Some(load.seed.unwrap_or_else(rand::random));

    let mut start_local = local.clone();
    start_local.pollers = 1;
    start_local
        .poller_flags
        .extend(STARTING_POINT_FLAGS.iter().map(|f| (*f).to_owned()));
    for flags in [
        &mut start_local.send_worker_flags,
        &mut start_local.status_worker_flags,
    ] {
        flags.extend(STARTING_POINT_WORKER_FLAGS.iter().map(|f| (*f).to_owned()));
    }
    let start_output = OutputArgs {
        name: format!("{}-starting-point", args.output.name),
        ..args.output.clone()
    };
    let (start, start_path) = crate::run::run(
        &load,
        &start_local,
        &target,
        &start_output,
        Scenario::default(),
    )
    .await?;

    let default_output = OutputArgs {
        name: format!("{}-defaults", args.output.name),
        previous: Some(start_path.clone()),
        ..args.output.clone()
    };
    let (defaults, default_path) =
        crate::run::run(&load, &local, &target, &default_output, Scenario::default()).await?;

    let table = compare(&start, &defaults);
    println!();
    println!("starting point (A) against Herald's defaults (B)");
    println!("{table}");
    let path = default_path.with_file_name(format!(
        "{}-compare.md",
        default_path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("baseline")
    ));
    std::fs::write(&path, &table)?;
    println!("comparison: {}", path.display());
    println!(
        "reports:    {} {}",
        start_path.display(),
        default_path.display()
    );
    Ok(exit_code(&[&start, &defaults]))
}

fn exit_code(reports: &[&Report]) -> i32 {
    if reports.iter().all(|r| r.ok) {
        0
    } else {
        1
    }
}
