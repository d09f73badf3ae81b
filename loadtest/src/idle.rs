//! `herald-loadtest idle`: what a deployment with nothing to do costs the machine.
//!
//! A local deployment starts, settles for `--warmup`, and then every process (each role,
//! each Redis, etcd, PostgreSQL with its backends) is measured for `--duration` with no load.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::chaos::Scenario;
use crate::cost::Cost;
use crate::run::{LocalArgs, TargetArgs};

#[derive(Debug, clap::Args)]
pub struct IdleArgs {
    /// How long the idle deployment is measured.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// How long it settles after its start before the measurement.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    #[command(flatten)]
    pub local: LocalArgs,
    /// Folder for the JSON report.
    #[arg(long, default_value = "loadtest-reports")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleReport {
    pub started_at: String,
    pub load_average_before: String,
    pub shape: Vec<String>,
    pub seconds: f64,
    /// Every process together, as a share of the whole machine (1.0: every core busy).
    pub machine_share: f64,
    pub share_by_process: std::collections::BTreeMap<String, f64>,
    /// Row writes and WAL written while idle, per second.
    pub row_writes_per_s: f64,
    pub wal_bytes_per_s: f64,
}

pub async fn main(mut args: IdleArgs) -> anyhow::Result<i32> {
    args.local.local = true;
    let load_average_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started_at = chrono::Utc::now();
    let target =
        crate::run::target(&args.local, &TargetArgs::default(), &Scenario::default()).await?;
    let pool = crate::cost::tester_pool(&target.database_url, 1).await?;
    println!(
        "idle deployment started; settling for {:?}, then measuring for {:?}",
        args.warmup, args.duration
    );
    tokio::time::sleep(args.warmup).await;
    let probe = target.probe(&pool).await;
    let before = probe.sample().await?;
    tokio::time::sleep(args.duration).await;
    let after = probe.sample().await?;
    // Divided by one "message" per second of the window: the per-message figures become
    // per-second ones.
    let seconds = args.duration.as_secs_f64().round().max(1.0) as u64;
    let cost = Cost::between(&before, &after, seconds);
    let report = IdleReport {
        started_at: started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        load_average_before,
        shape: target.shape.clone(),
        seconds: cost.seconds,
        machine_share: cost.machine_share,
        share_by_process: cost.share_by_process.clone(),
        row_writes_per_s: cost.row_writes_per_message,
        wal_bytes_per_s: cost.wal_bytes_per_message,
    };
    crate::cost::write_report(&args.out, "idle", started_at, &report, &render(&report))?;
    Ok(0)
}

pub fn render(report: &IdleReport) -> String {
    let mut by_share: Vec<_> = report.share_by_process.iter().collect();
    by_share.sort_by(|a, b| b.1.total_cmp(a.1));
    let parts: Vec<String> = by_share
        .iter()
        .map(|(name, share)| format!("{name} {:.2}%", *share * 100.0))
        .collect();
    format!(
        "== idle deployment ({}, load before: {}) ==\n\
         {:.0}s measured: {:.2}% of the machine ({})\n\
         while idle: {:.1} row writes/s, {:.0} B of WAL/s",
        report.started_at,
        report.load_average_before.trim(),
        report.seconds,
        report.machine_share * 100.0,
        parts.join(", "),
        report.row_writes_per_s,
        report.wal_bytes_per_s
    )
}
