//! `herald-loadtest drain`: how fast the fleet empties a backlog.
//!
//! A local deployment starts, its pollers are stopped, and `--messages` messages are accepted
//! through the batch API with nothing moving them on. Then the pollers start again and the
//! clock runs until every send job is done (the provider answered each message); the figure is
//! messages delivered per second over that time, read from each message's ACCEPTED event. The
//! receipts that follow are waited for, the proof runs over every message, and the cost (CPU
//! per process, row writes and WAL per message) covers the drain from the pollers' start to the
//! last receipt.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::chaos::Scenario;
use crate::cost::Cost;
use crate::load::{self, LoadSettings};
use crate::proof::{self, Proof};
use crate::run::{LocalArgs, TargetArgs};

#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Messages in the backlog.
    #[arg(long, default_value_t = 500_000)]
    pub messages: u64,
    /// Messages per batch request while the backlog is filled.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Offered rate while the backlog is filled (messages per second).
    #[arg(long, default_value_t = 20_000.0)]
    pub fill_rate: f64,
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Longest wait for the backlog to empty.
    #[arg(long, default_value = "60m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub local: LocalArgs,
    /// Folder for the JSON report.
    #[arg(long, default_value = "loadtest-reports")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainReport {
    pub started_at: String,
    pub load_average_before: String,
    pub shape: Vec<String>,
    pub messages: u64,
    /// Messages the API accepted while filling (the backlog).
    pub backlog: u64,
    pub fill_seconds: f64,
    pub fill_failed: u64,
    /// From the pollers' start to the last ACCEPTED event.
    pub drain_seconds: f64,
    pub delivered_per_s: f64,
    /// Messages delivered in each 5 seconds of the drain.
    pub delivered_per_5s: Vec<u64>,
    /// Every receipt settled before the timeout.
    pub settled: bool,
    pub proof: Proof,
    pub cost: Cost,
}

pub async fn main(mut args: DrainArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.messages > 0, "--messages must be at least 1");
    anyhow::ensure!(args.fill_rate > 0.0, "--fill-rate must be above 0");
    args.local.local = true;
    let load_average_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started_at = chrono::Utc::now();
    let target =
        crate::run::target(&args.local, &TargetArgs::default(), &Scenario::default()).await?;
    let deployment = target
        .deployment
        .clone()
        .context("drain runs on a local deployment")?;
    let pollers: Vec<String> = deployment
        .lock()
        .await
        .role_names()
        .into_iter()
        .filter(|name| name.starts_with("poller"))
        .collect();
    for name in &pollers {
        deployment
            .lock()
            .await
            .role(name)?
            .terminate(Duration::from_secs(30))
            .await?;
    }
    let pool = crate::cost::tester_pool(&target.database_url, 4).await?;

    let settings = LoadSettings::steady(
        args.fill_rate,
        Duration::from_secs_f64(args.messages as f64 / args.fill_rate),
        args.batch,
        args.payload_bytes,
        args.seed,
    );
    println!(
        "filling a backlog of {} messages ({} per request, pollers stopped)",
        settings.offered(),
        args.batch
    );
    let fill = load::run(
        &target.api_url,
        target.api_key.as_deref(),
        &settings,
        &format!("drain-{:x}", settings.seed),
        load::Progress::default(),
        Instant::now(),
        CancellationToken::new(),
    )
    .await?;
    let ids: Vec<uuid::Uuid> = fill.accepted.iter().map(|(id, _)| *id).collect();
    println!(
        "backlog: {} accepted in {:.1}s; starting {} poller(s)",
        ids.len(),
        fill.elapsed.as_secs_f64(),
        pollers.len()
    );

    let probe = target.probe(&pool).await;
    let before = probe.settled_sample().await?;
    let drain_wall = chrono::Utc::now();
    let drain_started = Instant::now();
    for name in &pollers {
        deployment.lock().await.role(name)?.restart().await?;
    }
    let bar = indicatif::ProgressBar::new(ids.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "drain {elapsed_precise} [{bar:30}] {pos}/{len} sent to the provider ({per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let deadline = drain_started + args.timeout;
    loop {
        // What is left, counted through the outbox's partial indexes (PENDING, and the
        // claimed rows), instead of the proof's per-message facts or a count of the DONE
        // rows: both read more of the database the further the drain got, and took CPU from
        // the drain they measure (a count of DONE rows: 138 ms every 2 s at 200,000).
        let remaining: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM outbox WHERE job_type = 'send' AND status = 'PENDING')
                  + (SELECT count(*) FROM outbox
                     WHERE job_type = 'send' AND status IN ('PROCESSING', 'PUBLISHED'))",
        )
        .fetch_one(&pool)
        .await?;
        let done = (ids.len() as i64 - remaining).max(0);
        bar.set_position(done as u64);
        if done as usize >= ids.len() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    bar.finish_and_clear();
    let remaining = deadline.saturating_duration_since(Instant::now());
    let settled = crate::run::drain(&pool, &ids, &target.sim_url, remaining).await?;
    let after = target.probe(&pool).await.settled_sample().await?;

    let (proof, facts) = proof::prove(&pool, &ids, &target.sim_url, Default::default(), 0).await?;
    let mut cost = Cost::between(&before, &after, proof.delivered);
    cost.read_wal_by_table(&pool, &before, &after, target.deployment.is_some())
        .await;
    let mut per_5s: BTreeMap<i64, u64> = BTreeMap::new();
    let mut last = drain_wall;
    for fact in facts.values() {
        if let Some(at) = fact.accepted_at {
            *per_5s
                .entry((at - drain_wall).num_seconds().max(0) / 5)
                .or_default() += 1;
            last = last.max(at);
        }
    }
    let buckets = per_5s.keys().max().map(|m| m + 1).unwrap_or(0);
    let drain_seconds = ((last - drain_wall).num_milliseconds() as f64 / 1000.0).max(0.001);
    let report = DrainReport {
        started_at: started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        load_average_before,
        shape: target.shape.clone(),
        messages: args.messages,
        backlog: ids.len() as u64,
        fill_seconds: fill.elapsed.as_secs_f64(),
        fill_failed: fill.errors.values().sum::<u64>() + fill.not_sent,
        drain_seconds,
        delivered_per_s: proof.delivered as f64 / drain_seconds,
        delivered_per_5s: (0..buckets)
            .map(|b| per_5s.get(&b).copied().unwrap_or(0))
            .collect(),
        settled,
        proof,
        cost,
    };
    crate::cost::write_report(&args.out, "drain", started_at, &report, &render(&report))?;
    Ok(i32::from(!(report.proof.ok() && report.settled)))
}

pub fn render(report: &DrainReport) -> String {
    let p = &report.proof;
    format!(
        "== drain ({}, load before: {}) ==\n\
         backlog: {} messages accepted in {:.1}s ({} not accepted)\n\
         drained: {} delivered in {:.1}s = {:.0} msg/s{}\n\
         proof:   lost {}, doubled {}, verdict {}\n\
         delivered per 5 s: {:?}\n{}",
        report.started_at,
        report.load_average_before.trim(),
        report.backlog,
        report.fill_seconds,
        report.fill_failed,
        p.delivered,
        report.drain_seconds,
        report.delivered_per_s,
        if report.settled {
            ""
        } else {
            " (TIMED OUT before every receipt settled)"
        },
        p.lost,
        p.doubled(),
        if p.ok() { "OK" } else { "FAILED" },
        report.delivered_per_5s,
        report.cost.render()
    )
}
