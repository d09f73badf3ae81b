//! `herald-loadtest soak`: retention under a steady load, in compressed time.
//!
//! A local deployment runs with a retention of minutes instead of days (`--retention`: closed
//! messages and receipts go after it, DONE outbox rows and whole histories after half of it)
//! and takes a steady rate for `--duration`. Every `--sample` the size (heap, indexes and
//! TOAST) and live rows of each of Herald's tables are read, with the messages accepted and
//! the effects recorded so far. The run passes when, from twice the retention on (the first
//! period fills the tables, the second lets autovacuum make the removed rows' space
//! reusable), the tables' total size stays within `--flat` of its smallest sample; accept and delivery in the last `--compare` are at least 0.9 of the first; and
//! every message accepted inside the last half retention period is delivered (the proof over
//! those messages, none missing).
//!
//! Longer than 400 lines: one benchmark's arguments, report, sampling, judgement and text,
//! each short; the plot is in `plot.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::chaos::Scenario;
use crate::load::{self, LoadSettings};
use crate::proof::{self, Proof};
use crate::run::{LocalArgs, TargetArgs};

/// Herald's tables whose size the soak follows.
pub const TABLES: [&str; 8] = [
    "messages",
    "message_events",
    "outbox",
    "ledger",
    "receipts",
    "parking",
    "held_receipts",
    "in_flight_sends",
];

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Offered rate, in messages per second, for the whole run.
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    /// How long the load runs.
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// The compressed retention: closed messages and receipts are removed this long after
    /// they came, DONE outbox rows and whole histories after half of it.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// The maintenance loop's interval in the run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub maintenance_interval: Duration,
    /// Time between two size samples.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub sample: Duration,
    /// Throughput of the last this-long against the first.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub compare: Duration,
    /// Largest growth of the tables' total size from twice the retention on, as a share
    /// of its smallest sample.
    #[arg(long, default_value_t = 0.10)]
    pub flat: f64,
    /// Messages per request.
    #[arg(long, default_value_t = 10)]
    pub batch: usize,
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Longest wait for the last messages to settle after the load.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    #[command(flatten)]
    pub local: LocalArgs,
    /// Folder for the JSON report and the plot (SVG).
    #[arg(long, default_value = "loadtest-reports")]
    pub out: PathBuf,
}

/// One table at one sample.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct TableSize {
    /// Heap, indexes and TOAST, every partition included.
    pub bytes: i64,
    pub live_rows: i64,
}

/// The tables at one moment of the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeSample {
    /// Seconds since the load started.
    pub at_s: f64,
    pub tables: BTreeMap<String, TableSize>,
    /// Messages accepted so far (rows ever inserted into `messages`).
    pub accepted: i64,
    /// Effects recorded so far (rows ever inserted into `ledger`).
    pub delivered: i64,
}

impl SizeSample {
    pub fn total_bytes(&self) -> i64 {
        self.tables.values().map(|t| t.bytes).sum()
    }
}

/// How much one table (or all of them) moved from twice the retention on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flatness {
    pub table: String,
    pub min_bytes: i64,
    pub max_bytes: i64,
    /// max / min - 1.
    pub growth: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakReport {
    pub started_at: String,
    pub load_average_before: String,
    pub shape: Vec<String>,
    pub rate: f64,
    pub duration_s: f64,
    pub retention_s: f64,
    /// Samples from this second on are judged for flatness.
    pub steady_from_s: f64,
    pub samples: Vec<SizeSample>,
    /// The total first, then each table.
    pub flatness: Vec<Flatness>,
    pub accepted_first: i64,
    pub accepted_last: i64,
    pub delivered_first: i64,
    pub delivered_last: i64,
    pub accept_ratio: f64,
    pub delivery_ratio: f64,
    /// Accept latency over the run, as the client saw it.
    pub accept_p99_ms: f64,
    pub accept_max_ms: f64,
    /// The worst second's p99 and max accept latency from twice the retention on.
    pub steady_worst_second_p99_ms: f64,
    pub steady_worst_second_max_ms: f64,
    /// Messages accepted and failed by the load.
    pub accepted: u64,
    pub load_failed: u64,
    /// The messages accepted in the last half retention period, and the proof over them.
    pub window_messages: u64,
    pub window_settled: bool,
    pub window_proof: Proof,
    pub passed: bool,
    pub reasons: Vec<String>,
}

pub async fn main(mut args: SoakArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.rate > 0.0, "--rate must be above 0");
    anyhow::ensure!(
        args.duration > args.retention * 2 + args.compare,
        "--duration must be longer than twice --retention and --compare together"
    );
    args.local.local = true;
    let half = args.retention / 2;
    for flag in [
        format!("--retain-done-jobs={}s", half.as_secs_f64()),
        format!("--compact-histories-after={}s", half.as_secs_f64()),
        format!("--retain-messages={}s", args.retention.as_secs_f64()),
        format!(
            "--maintenance-interval={}s",
            args.maintenance_interval.as_secs_f64()
        ),
    ] {
        args.local.poller_flags.push(flag);
    }
    // A receipt for a send not recorded yet is held for an hour by default: in compressed
    // time, for half the retention, but not below the wait of a receipt held against an
    // already settled send (herald_store::receipts::SUPERSEDED_HOLD, after which it is
    // applied as a duplicate): shorter, such a receipt would be parked instead.
    let hold = half.max(herald_store::receipts::SUPERSEDED_HOLD + Duration::from_secs(60));
    args.local
        .status_worker_flags
        .push(format!("--hold-receipts-for={}s", hold.as_secs_f64()));
    let load_average_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started_at = chrono::Utc::now();
    let target =
        crate::run::target(&args.local, &TargetArgs::default(), &Scenario::default()).await?;
    let pool = crate::cost::tester_pool(&target.database_url, 2).await?;
    let settings = LoadSettings {
        max_in_flight: 1024,
        request_timeout: Duration::from_secs(10),
        ..LoadSettings::steady(
            args.rate,
            args.duration,
            args.batch,
            args.payload_bytes,
            args.seed,
        )
    };
    println!(
        "soak: {:.0} msg/s for {:?}, retention {:?} (DONE rows and histories after {:?}), a size sample every {:?}",
        args.rate, args.duration, args.retention, half, args.sample
    );
    let load_started = Instant::now();
    let stop_sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample_until(
        pool.clone(),
        args.sample,
        load_started,
        stop_sampling.clone(),
    ));
    let outcome = load::run(
        &target.api_url,
        target.api_key.as_deref(),
        &settings,
        &format!("soak-{:x}", settings.seed),
        load::Progress::default(),
        load_started,
        CancellationToken::new(),
    )
    .await?;
    // One more sample at the end of the load, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_sampling.cancel();
    let samples = sampler.await.context("the size sampler")??;

    let window_from = (args.duration - half).as_secs_f64();
    let window: Vec<uuid::Uuid> = outcome
        .accepted
        .iter()
        .filter(|(_, due)| *due >= window_from)
        .map(|(id, _)| *id)
        .collect();
    println!(
        "load done: {} accepted; settling the {} accepted in the last {:?}",
        outcome.accepted.len(),
        window.len(),
        half
    );
    let window_settled =
        crate::run::drain(&pool, &window, &target.sim_url, args.drain_timeout).await?;
    let (window_proof, _) =
        proof::prove(&pool, &window, &target.sim_url, Default::default(), 0).await?;

    // The first retention period fills the tables; in the second, autovacuum's first visits
    // make the removed rows' space reusable. From then on the sizes must hold.
    let steady_from_s = (args.retention * 2 + args.maintenance_interval * 2 + args.sample)
        .as_secs_f64()
        .min(args.duration.as_secs_f64());
    let steady: Vec<&SizeSample> = samples
        .iter()
        .filter(|s| s.at_s >= steady_from_s && s.at_s <= args.duration.as_secs_f64() + 2.0)
        .collect();
    let mut flatness = vec![flat("all tables", steady.iter().map(|s| s.total_bytes()))];
    for table in TABLES {
        flatness.push(flat(
            table,
            steady
                .iter()
                .map(|s| s.tables.get(table).map(|t| t.bytes).unwrap_or(0)),
        ));
    }
    let compare = args.compare.as_secs_f64();
    let end = args.duration.as_secs_f64();
    let (accepted_first, delivered_first) = between(&samples, 0.0, compare);
    let (accepted_last, delivered_last) = between(&samples, end - compare, end);
    let ratio = |last: i64, first: i64| last as f64 / (first as f64).max(1.0);
    let steady_seconds = outcome
        .timeline
        .iter()
        .skip(steady_from_s as usize)
        .take((end - steady_from_s).max(0.0) as usize);
    let (worst_p99, worst_max) = steady_seconds.fold((0.0f64, 0.0f64), |(p, m), s| {
        (p.max(s.accept_p99_ms), m.max(s.accept_max_ms))
    });
    let load_failed = outcome.errors.values().sum::<u64>() + outcome.not_sent;
    let mut report = SoakReport {
        started_at: started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        load_average_before,
        shape: target.shape.clone(),
        rate: args.rate,
        duration_s: end,
        retention_s: args.retention.as_secs_f64(),
        steady_from_s,
        samples,
        flatness,
        accepted_first,
        accepted_last,
        delivered_first,
        delivered_last,
        accept_ratio: ratio(accepted_last, accepted_first),
        delivery_ratio: ratio(delivered_last, delivered_first),
        accept_p99_ms: outcome.accept_latency.value_at_quantile(0.99) as f64 / 1000.0,
        accept_max_ms: outcome.accept_latency.max() as f64 / 1000.0,
        steady_worst_second_p99_ms: worst_p99,
        steady_worst_second_max_ms: worst_max,
        accepted: outcome.accepted.len() as u64,
        load_failed,
        window_messages: window.len() as u64,
        window_settled,
        window_proof,
        passed: false,
        reasons: Vec::new(),
    };
    report.reasons = judge(&report, args.flat);
    report.passed = report.reasons.is_empty();
    let path = crate::cost::write_report(&args.out, "soak", started_at, &report, &render(&report))?;
    let svg = path.with_extension("svg");
    crate::plot::draw_soak(&report, &svg)?;
    println!("plot: {}", svg.display());
    Ok(i32::from(!report.passed))
}

/// Why the run failed (empty: it passed).
fn judge(report: &SoakReport, flat: f64) -> Vec<String> {
    let mut reasons = Vec::new();
    match report.flatness.first() {
        Some(total) if total.min_bytes > 0 => {
            if total.growth > flat {
                reasons.push(format!(
                    "the tables grew {:.1} % once retention ran (at most {:.0} %)",
                    total.growth * 100.0,
                    flat * 100.0
                ));
            }
        }
        _ => reasons.push("no size sample once retention ran".to_owned()),
    }
    for (what, ratio) in [
        ("accept", report.accept_ratio),
        ("delivery", report.delivery_ratio),
    ] {
        if ratio < 0.9 {
            reasons.push(format!(
                "{what} in the last period was {ratio:.2} of the first (at least 0.90)"
            ));
        }
    }
    if report.load_failed > 0 {
        reasons.push(format!("{} messages were not accepted", report.load_failed));
    }
    if !report.window_settled {
        reasons.push("the last messages did not settle in time".to_owned());
    }
    if !report.window_proof.ok() || report.window_proof.lost > 0 {
        let wrong: Vec<String> = report
            .window_proof
            .verdict
            .violations()
            .iter()
            .map(|v| format!("{} {} (expected {})", v.class, v.found, v.expected))
            .collect();
        reasons.push(format!(
            "the proof over the retention window failed: {} lost; {}",
            report.window_proof.lost,
            wrong.join(", ")
        ));
    }
    reasons
}

fn flat(table: &str, sizes: impl Iterator<Item = i64>) -> Flatness {
    let (min, max) = sizes.fold((i64::MAX, 0i64), |(lo, hi), b| (lo.min(b), hi.max(b)));
    let min = if min == i64::MAX { 0 } else { min };
    Flatness {
        table: table.to_owned(),
        min_bytes: min,
        max_bytes: max,
        growth: if min > 0 {
            max as f64 / min as f64 - 1.0
        } else {
            0.0
        },
    }
}

/// Messages accepted and effects recorded between two moments, from the samples nearest them.
fn between(samples: &[SizeSample], from_s: f64, to_s: f64) -> (i64, i64) {
    let nearest = |at: f64| {
        samples.iter().min_by(|a, b| {
            (a.at_s - at)
                .abs()
                .partial_cmp(&(b.at_s - at).abs())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    };
    match (nearest(from_s), nearest(to_s)) {
        (Some(a), Some(b)) => (b.accepted - a.accepted, b.delivered - a.delivered),
        _ => (0, 0),
    }
}

/// Samples the tables every `every` until `stop`, and once more when stopped.
async fn sample_until(
    pool: sqlx::PgPool,
    every: Duration,
    started: Instant,
    stop: CancellationToken,
) -> anyhow::Result<Vec<SizeSample>> {
    let mut samples = vec![sample(&pool, started).await?];
    loop {
        let stopped = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(every) => false,
        };
        samples.push(sample(&pool, started).await?);
        if stopped {
            return Ok(samples);
        }
    }
}

async fn sample(pool: &sqlx::PgPool, started: Instant) -> anyhow::Result<SizeSample> {
    let at_s = started.elapsed().as_secs_f64();
    // A table with every partition it has (pg_partition_tree lists nothing for a plain
    // table); live rows and inserts from the statistics, which lag by about a second.
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "WITH rels AS (
             SELECT t.name, r.relid
             FROM unnest($1::text[]) AS t(name)
             CROSS JOIN LATERAL (
                 SELECT p.relid FROM pg_partition_tree(t.name::regclass) p
                 UNION SELECT t.name::regclass) r
             WHERE to_regclass(t.name) IS NOT NULL
         )
         SELECT r.name,
                sum(pg_total_relation_size(r.relid))::bigint,
                coalesce(sum(s.n_live_tup), 0)::bigint,
                coalesce(sum(s.n_tup_ins), 0)::bigint
         FROM rels r LEFT JOIN pg_stat_user_tables s ON s.relid = r.relid
         GROUP BY r.name",
    )
    .bind(TABLES)
    .fetch_all(pool)
    .await?;
    let mut tables = BTreeMap::new();
    let (mut accepted, mut delivered) = (0, 0);
    for (name, bytes, live_rows, inserted) in rows {
        match name.as_str() {
            "messages" => accepted = inserted,
            "ledger" => delivered = inserted,
            _ => {}
        }
        tables.insert(name, TableSize { bytes, live_rows });
    }
    Ok(SizeSample {
        at_s,
        tables,
        accepted,
        delivered,
    })
}

pub fn render(report: &SoakReport) -> String {
    let mb = |b: i64| b as f64 / 1_048_576.0;
    let mut out = format!(
        "== soak ({}, load before: {}) ==\n\
         load:      {:.0} msg/s for {:.0}s, {} accepted, {} not accepted\n\
         retention: {:.0}s (DONE rows and histories after {:.0}s); sizes judged from {:.0}s on\n\
         sizes from then on (min → max MB, growth):\n",
        report.started_at,
        report.load_average_before.trim(),
        report.rate,
        report.duration_s,
        report.accepted,
        report.load_failed,
        report.retention_s,
        report.retention_s / 2.0,
        report.steady_from_s,
    );
    for f in &report.flatness {
        out.push_str(&format!(
            "  {:<16} {:>8.1} → {:>8.1}  {:>+6.1} %\n",
            f.table,
            mb(f.min_bytes),
            mb(f.max_bytes),
            f.growth * 100.0
        ));
    }
    out.push_str(&format!(
        "throughput, last against first period: accept {} / {} = {:.2}, delivery {} / {} = {:.2}\n\
         accept latency: p99 {:.1} ms, max {:.1} ms; worst second from then on: p99 {:.1} ms, max {:.1} ms\n\
         retention window: {} messages, {}; proof: lost {}, verdict {}\n\
         verdict: {}",
        report.accepted_last,
        report.accepted_first,
        report.accept_ratio,
        report.delivered_last,
        report.delivered_first,
        report.delivery_ratio,
        report.accept_p99_ms,
        report.accept_max_ms,
        report.steady_worst_second_p99_ms,
        report.steady_worst_second_max_ms,
        report.window_messages,
        if report.window_settled {
            "settled"
        } else {
            "NOT settled"
        },
        report.window_proof.lost,
        if report.window_proof.ok() {
            "OK"
        } else {
            "FAILED"
        },
        if report.passed {
            "PASSED".to_owned()
        } else {
            format!("FAILED: {}", report.reasons.join("; "))
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, bytes: i64, accepted: i64, delivered: i64) -> SizeSample {
        SizeSample {
            at_s,
            tables: BTreeMap::from([(
                "messages".to_owned(),
                TableSize {
                    bytes,
                    live_rows: 0,
                },
            )]),
            accepted,
            delivered,
        }
    }

    #[test]
    fn flatness_is_the_growth_over_the_smallest_sample() {
        let f = flat("t", [100, 110, 105].into_iter());
        assert_eq!((f.min_bytes, f.max_bytes), (100, 110));
        assert!((f.growth - 0.10).abs() < 1e-9);
        assert_eq!(flat("t", std::iter::empty()).growth, 0.0);
    }

    #[test]
    fn throughput_between_two_moments_comes_from_the_nearest_samples() {
        let samples = vec![
            sample(0.0, 1, 0, 0),
            sample(30.0, 1, 900, 880),
            sample(60.0, 1, 1800, 1790),
        ];
        assert_eq!(between(&samples, 0.0, 31.0), (900, 880));
        assert_eq!(between(&samples, 29.0, 60.0), (900, 910));
    }
}
