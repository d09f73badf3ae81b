//! `herald-loadtest capacity`: the highest offered rate a whole deployment sustains.
//!
//! Each step is a full `run` at one rate for `--hold` on the same deployment: load, drain,
//! proof, cost. A step passes when every message due was accepted, every accepted message
//! was delivered or rejected for a reason a user accepts (lost 0, doubled 0, DEAD 0, nothing
//! UNKNOWN), the drain finished, and accept → ACCEPTED p99 stayed under `--p99-limit` (a
//! growing backlog shows up there first). Rates grow by `--factor` until a step fails, then
//! `--refine` steps bisect between the last pass and the first failure. The capacity is the
//! highest passing rate, reported with its cost per delivered message; a last step at half
//! that rate gives the accept → provider submit p99 at a comfortable load.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::chaos::Scenario;
use crate::cost::Cost;
use crate::report::Report;
use crate::run::{LoadArgs, LocalArgs, OutputArgs, TargetArgs};

#[derive(Debug, clap::Args)]
pub struct CapacityArgs {
    /// The first rate tried, in messages per second.
    #[arg(long, default_value_t = 250.0)]
    pub from: f64,
    /// Each passing step multiplies the rate by this.
    #[arg(long, default_value_t = 1.5)]
    pub factor: f64,
    /// No rate above this is tried.
    #[arg(long, default_value_t = 20_000.0)]
    pub max_rate: f64,
    /// Bisecting steps between the last pass and the first failure.
    #[arg(long, default_value_t = 2)]
    pub refine: u32,
    /// How long each rate is held.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub hold: Duration,
    /// A step fails when accept → ACCEPTED p99 exceeds this.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub p99_limit: Duration,
    /// Skip the closing step at half the capacity.
    #[arg(long)]
    pub no_half_step: bool,
    /// Messages per request.
    #[arg(long, default_value_t = 10)]
    pub batch: usize,
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Longest drain after each step's load; a step whose drain times out fails, and the
    /// search stops there (the backlog left would spoil the next step).
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    #[command(flatten)]
    pub local: LocalArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Folder for the capacity report and every step's run report.
    #[arg(long, default_value = "loadtest-reports")]
    pub out: PathBuf,
}

/// One rate tried.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub rate: f64,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub reasons: Vec<String>,
    pub accepted: u64,
    pub delivered: u64,
    pub delivered_per_s: f64,
    pub accept_to_accepted_p99_ms: f64,
    pub accept_to_submit_p99_ms: Option<f64>,
    pub report: PathBuf,
    pub cost: Option<Cost>,
    /// Re-drives and DEAD sends among the step's messages.
    #[serde(default)]
    pub redriven: crate::report::Redriven,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CapacityReport {
    pub started_at: String,
    pub load_average_before: String,
    pub hold_s: f64,
    pub p99_limit_ms: f64,
    pub batch: usize,
    pub shape: Vec<String>,
    pub steps: Vec<Step>,
    /// The highest passing rate (None: not even the first passed).
    pub capacity: Option<f64>,
    /// The step at half the capacity.
    pub half: Option<Step>,
}

pub async fn main(args: CapacityArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.factor > 1.0, "--factor must be above 1");
    anyhow::ensure!(args.from > 0.0, "--from must be above 0");
    let load_average_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started_at = chrono::Utc::now();
    let target = crate::run::target(&args.local, &args.target, &Scenario::default()).await?;
    let mut steps: Vec<Step> = Vec::new();
    let (mut pass, mut fail): (Option<f64>, Option<f64>) = (None, None);
    let mut rate = args.from;
    let mut spoiled = false;
    while fail.is_none() && rate <= args.max_rate {
        let step = step(&args, &target, rate, steps.len()).await?;
        spoiled = step.reasons.iter().any(|r| r.starts_with("drain"));
        if step.passed {
            pass = Some(rate);
            rate = (rate * args.factor).round();
        } else {
            fail = Some(rate);
        }
        steps.push(step);
        if spoiled {
            break;
        }
    }
    for _ in 0..args.refine {
        let Some(high) = fail else { break };
        let low = pass.unwrap_or(0.0);
        let mid = ((low + high) / 2.0).round();
        if spoiled || mid <= low || mid >= high || high - low < high * 0.05 {
            break;
        }
        let step = step(&args, &target, mid, steps.len()).await?;
        spoiled = step.reasons.iter().any(|r| r.starts_with("drain"));
        if step.passed {
            pass = Some(mid);
        } else {
            fail = Some(mid);
        }
        steps.push(step);
    }
    let half = match pass {
        Some(capacity) if !args.no_half_step && !spoiled => {
            Some(step(&args, &target, (capacity / 2.0).round(), steps.len()).await?)
        }
        _ => None,
    };
    let report = CapacityReport {
        started_at: started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        load_average_before,
        hold_s: args.hold.as_secs_f64(),
        p99_limit_ms: args.p99_limit.as_secs_f64() * 1000.0,
        batch: args.batch,
        shape: target.shape.clone(),
        steps,
        capacity: pass,
        half,
    };
    crate::cost::write_report(&args.out, "capacity", started_at, &report, &render(&report))?;
    Ok(if report.capacity.is_some() { 0 } else { 1 })
}

async fn step(
    args: &CapacityArgs,
    target: &crate::run::Target,
    rate: f64,
    index: usize,
) -> anyhow::Result<Step> {
    let load = LoadArgs {
        rate,
        duration: args.hold,
        steps: None,
        step_duration: args.hold,
        batch: args.batch,
        payload_bytes: args.payload_bytes,
        recipients: 10_000,
        partition_keys: 0,
        replay_rate: 0.0,
        retries: 3,
        max_in_flight: 4096,
        request_timeout: Duration::from_secs(10),
        seed: args.seed.map(|seed| seed.wrapping_add(index as u64)),
        drain_timeout: args.drain_timeout,
        expect: Default::default(),
    };
    let output = OutputArgs {
        name: format!("capacity-step{index}-{rate:.0}"),
        out: args.out.clone(),
        previous: None,
        no_plot: true,
    };
    println!(
        "\n--- capacity step {index}: {rate:.0} msg/s for {:?}",
        args.hold
    );
    let (report, path) = crate::run::run_on(target, &load, &output, Scenario::default()).await?;
    Ok(judge(&report, rate, args.p99_limit, path))
}

/// Whether one step's run sustained its rate, and why not.
fn judge(report: &Report, rate: f64, p99_limit: Duration, path: PathBuf) -> Step {
    let mut reasons = Vec::new();
    let l = &report.load;
    if l.accepted < l.messages_due {
        reasons.push(format!(
            "accepted {} of {} due ({} failed, {} not sent)",
            l.accepted, l.messages_due, l.failed, l.not_sent
        ));
    }
    if !report.drain.complete {
        reasons.push(format!(
            "drain timed out after {:.0}s",
            report.drain.seconds
        ));
    }
    if !report.proof.ok() {
        let wrong: Vec<String> = report
            .proof
            .verdict
            .violations()
            .iter()
            .map(|v| format!("{} {}", v.class, v.found))
            .collect();
        reasons.push(format!(
            "proof failed: lost {}, doubled {}; {}",
            report.proof.lost,
            report.proof.doubled(),
            wrong.join(", ")
        ));
    }
    let p99 = report.latency.accept_to_accepted.p99_ms;
    let limit_ms = p99_limit.as_secs_f64() * 1000.0;
    if p99 > limit_ms {
        reasons.push(format!(
            "accept → ACCEPTED p99 {p99:.0} ms above {limit_ms:.0} ms"
        ));
    }
    Step {
        rate,
        passed: reasons.is_empty(),
        reasons,
        accepted: report.proof.accepted,
        delivered: report.proof.delivered,
        delivered_per_s: report.throughput.delivered_per_s,
        accept_to_accepted_p99_ms: p99,
        accept_to_submit_p99_ms: report.latency.accept_to_submit.as_ref().map(|p| p.p99_ms),
        report: path,
        cost: report.cost.clone(),
        redriven: report.redriven,
    }
}

pub fn render(report: &CapacityReport) -> String {
    let mut out = format!(
        "== capacity ({}, load before: {}) ==\n\
         each rate held {:.0}s, {} per request, pass: all accepted, lost 0, doubled 0, \
         DEAD 0, accept → ACCEPTED p99 ≤ {:.0} ms\n\n\
         {:>8} {:>6} {:>10} {:>12} {:>10} {:>10} {:>8} {:>8} {:>10} {:>9} {:>5}\n",
        report.started_at,
        report.load_average_before.trim(),
        report.hold_s,
        report.batch,
        report.p99_limit_ms,
        "rate",
        "pass",
        "delivered",
        "delivered/s",
        "p99 e2e",
        "p99 submit",
        "rows/msg",
        "WAL kB",
        "CPU s/1k",
        "redriven",
        "DEAD"
    );
    let line = |s: &Step| {
        let cost = s.cost.clone().unwrap_or_default();
        format!(
            "{:>8.0} {:>6} {:>10} {:>12.0} {:>8.0}ms {:>10} {:>8.1} {:>8.2} {:>10.3} {:>9} {:>5}\n",
            s.rate,
            if s.passed { "yes" } else { "NO" },
            s.delivered,
            s.delivered_per_s,
            s.accept_to_accepted_p99_ms,
            s.accept_to_submit_p99_ms
                .map(|p| format!("{p:.0}ms"))
                .unwrap_or_else(|| "-".to_owned()),
            cost.row_writes_per_message,
            cost.wal_bytes_per_message / 1000.0,
            cost.cpu_total_per_1000(),
            s.redriven.lost_jobs + s.redriven.expired_claims,
            s.redriven.dead
        )
    };
    for s in &report.steps {
        out.push_str(&line(s));
        for reason in &s.reasons {
            out.push_str(&format!("{:>8}   {reason}\n", ""));
        }
    }
    match report.capacity {
        Some(rate) => {
            out.push_str(&format!("\ncapacity: {rate:.0} msg/s sustained\n"));
            if let Some(cost) = report
                .steps
                .iter()
                .find(|s| s.passed && s.rate == rate)
                .and_then(|s| s.cost.as_ref())
            {
                out.push_str(&cost.render());
            }
        }
        None => out.push_str("\ncapacity: not even the first rate was sustained\n"),
    }
    if let Some(half) = &report.half {
        out.push_str(&format!("\nat half the capacity:\n{}", line(half)));
    }
    out
}
