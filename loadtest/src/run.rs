//! `herald-loadtest run`: open-loop load against a deployment, the drain, the proof, the
//! latencies, the per-stage breakdown, chaos steps, and the report (text, JSON, SVG).
//!
//! Longer than 400 lines: the `run` command's phases (load, chaos, drain, proof, breakdown,
//! report) in the order they happen; each phase's machinery is in its own file (`load.rs`,
//! `chaos.rs`, `breakdown.rs`, `report.rs`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_testkit::{DeploymentOptions, LocalDeployment};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::breakdown::{self, Scraper};
use crate::chaos::{self, Scenario};
use crate::latency::{self, Percentiles};
use crate::load::{self, LoadSettings, Phase};
use crate::proof::{self, Facts};
use crate::report::{Drain, Latency, LoadCounts, Report, Throughput, TimelineSecond};
use herald_core::verdict::{Expectations, Fate};

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Messages per second (constant rate), for --duration.
    #[arg(long, default_value_t = 500.0, conflicts_with = "steps")]
    pub rate: f64,
    /// How long the load runs (with --rate), e.g. 60s.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stepped rates instead of --rate, e.g. 500,1000,2000,4000, each for --step-duration.
    #[arg(long)]
    pub steps: Option<String>,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub step_duration: Duration,
    /// Messages per request: 1 sends POST /v1/messages, more sends batches.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Bytes of text in each message body.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Distinct recipients, picked at random.
    #[arg(long, default_value_t = 10_000)]
    pub recipients: u64,
    /// Distinct partition keys, picked at random (0: the recipient is the partition key).
    #[arg(long, default_value_t = 0)]
    pub partition_keys: u64,
    /// Share of accepted requests sent again with the same Idempotency-Key (0 to 1); the
    /// answer must name the same ids.
    #[arg(long, default_value_t = 0.0)]
    pub replay_rate: f64,
    /// Retries (same Idempotency-Key) of a request that failed in transport or with a 5xx.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Requests in flight at most; a due request beyond it is counted as not sent.
    #[arg(long, default_value_t = 4096)]
    pub max_in_flight: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,
    /// Seed of the recipients, keys and replays (printed in the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Longest wait after the load for every accepted message to have an outcome (its
    /// final receipt included).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Ends the run declares, exactly: CLASS=COUNT,… with CLASS one of dead, failed_wrongly,
    /// unknown, receipt_parked, parked (e.g. `--expect dead=200` for a provider outage). Any
    /// other end that is not delivered or rejected fails the run.
    #[arg(long, default_value = "", value_parser = parse_expectations)]
    pub expect: Expectations,
}

fn parse_expectations(text: &str) -> Result<Expectations, String> {
    text.parse()
        .map_err(|err: herald_core::verdict::BadExpectation| err.to_string())
}

impl LoadArgs {
    pub fn settings(&self) -> anyhow::Result<LoadSettings> {
        let phases = match &self.steps {
            Some(steps) => load::parse_rates(steps)?
                .into_iter()
                .map(|rate| Phase {
                    rate,
                    duration: self.step_duration,
                })
                .collect(),
            None => {
                anyhow::ensure!(self.rate > 0.0, "--rate must be above 0");
                vec![Phase {
                    rate: self.rate,
                    duration: self.duration,
                }]
            }
        };
        anyhow::ensure!(
            (1..=1000).contains(&self.batch),
            "--batch must be 1 to 1000"
        );
        Ok(LoadSettings {
            phases,
            batch: self.batch,
            payload_bytes: self.payload_bytes,
            recipients: self.recipients.max(1),
            partition_keys: self.partition_keys,
            replay_rate: self.replay_rate,
            retries: self.retries,
            max_in_flight: self.max_in_flight,
            request_timeout: self.request_timeout,
            seed: self.seed.unwrap_or_else(rand::random),
        })
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// Start a local deployment for this run: PostgreSQL, Redis per job type, etcd, and every
    /// role as its own process of the `herald` binary (so chaos steps can signal them).
    #[arg(long)]
    pub local: bool,
    /// The `herald` binary (default: next to this executable, e.g. target/release/herald).
    #[arg(long, env = "HERALD_BIN")]
    pub herald_bin: Option<PathBuf>,
    /// Folder of the local deployment's data and logs (default: a temporary one, removed).
    #[arg(long)]
    pub local_dir: Option<PathBuf>,
    /// Pollers of the local deployment (they share the partitions through etcd); at least 1,
    /// or nothing would be delivered.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub pollers: usize,
    /// Outbox partitions of the local deployment.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
    /// PostgreSQL with fsync and synchronous commit, as `herald dev` runs it.
    #[arg(long)]
    pub durable: bool,
    /// Short recovery timers (lease TTL 3s, re-drive after 20s, claim leases of 8s,
    /// reclaim after 3s), so chaos is recovered within a short run. On by itself when the
    /// scenario has steps; otherwise every role runs with Herald's defaults.
    #[arg(long)]
    pub quick_recovery: bool,
    /// Extra flag for every poller (repeat), e.g. --poller-flag=--batch-size=100.
    #[arg(long = "poller-flag", allow_hyphen_values = true)]
    pub poller_flags: Vec<String>,
    /// Extra flag for the send worker (repeat), e.g. --send-worker-flag=--concurrency=128.
    #[arg(long = "send-worker-flag", allow_hyphen_values = true)]
    pub send_worker_flags: Vec<String>,
    /// Extra flag for the status worker (repeat).
    #[arg(long = "status-worker-flag", allow_hyphen_values = true)]
    pub status_worker_flags: Vec<String>,
    /// Extra flag for the provider simulator (repeat), e.g. --sim-flag=--latency=20ms.
    #[arg(long = "sim-flag", allow_hyphen_values = true)]
    pub sim_flags: Vec<String>,
    /// Extra flag for the API (repeat).
    #[arg(long = "api-flag", allow_hyphen_values = true)]
    pub api_flags: Vec<String>,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct TargetArgs {
    /// The API of a running deployment (without --local). Its client key is read from the
    /// environment variable HERALD_LOADTEST_API_KEY (never a flag: keys stay off command
    /// lines); a local deployment makes its own.
    #[arg(long)]
    pub api_url: Option<String>,
    /// Its PostgreSQL, for the proof.
    #[arg(long, env = "HERALD_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Its provider simulator, whose record of submits the proof checks.
    #[arg(long)]
    pub sim_url: Option<String>,
    /// The simulator's submit log, for the accept → provider submit latency.
    #[arg(long)]
    pub sim_log: Option<PathBuf>,
    /// Every role's admin address, as role=url,role=url (for the breakdown).
    #[arg(long, value_delimiter = ',')]
    pub metrics_url: Vec<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// The run's name in the report and file names.
    #[arg(long, default_value = "run")]
    pub name: String,
    /// Folder for the JSON report and the SVG plot.
    #[arg(long, default_value = "loadtest-reports")]
    pub out: PathBuf,
    /// The report to compare the breakdown with (default: the newest one in --out).
    #[arg(long)]
    pub previous: Option<PathBuf>,
    /// Do not draw the SVG.
    #[arg(long)]
    pub no_plot: bool,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub local: LocalArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Chaos steps to run during the load (TOML; local deployments only), see
    /// loadtest/scenarios/.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
}

/// The variable holding the client key for a deployment the load tester did not start.
pub const API_KEY_VARIABLE: &str = "HERALD_LOADTEST_API_KEY";

/// Where the load goes and where the proof looks.
pub struct Target {
    pub api_url: String,
    /// The client key the load is sent with (None: the API runs without keys).
    pub api_key: Option<String>,
    pub database_url: String,
    pub sim_url: String,
    pub sim_log: Option<PathBuf>,
    pub metrics: Vec<(String, String)>,
    pub deployment: Option<Arc<Mutex<LocalDeployment>>>,
    pub label: String,
    pub shape: Vec<String>,
}

impl Target {
    /// What [`cost`](crate::cost) measures here: every process of a local deployment and its
    /// PostgreSQL; of a remote one, only the database's row writes and WAL.
    pub async fn probe(&self, pool: &sqlx::PgPool) -> crate::cost::Probe {
        let (processes, pg_data_dir) = match &self.deployment {
            Some(deployment) => {
                let deployment = deployment.lock().await;
                (
                    deployment.pids(),
                    Some(deployment.pg.data_dir().to_path_buf()),
                )
            }
            None => (Vec::new(), None),
        };
        crate::cost::Probe {
            processes,
            pg_data_dir,
            pool: pool.clone(),
        }
    }
}

pub async fn main(args: RunArgs) -> anyhow::Result<i32> {
    let scenario = match &args.scenario {
        Some(path) => Scenario::load(path)?,
        None => Scenario::default(),
    };
    let (report, _) = run(
        &args.load,
        &args.local,
        &args.target,
        &args.output,
        scenario,
    )
    .await?;
    // 1 when anything was lost or doubled, and also when a chaos step could not be carried out.
    Ok(report.proof.exit_code().max(i32::from(!report.ok)))
}

/// One whole run; returns the report and where it was written.
pub async fn run(
    load_args: &LoadArgs,
    local: &LocalArgs,
    target_args: &TargetArgs,
    output: &OutputArgs,
    scenario: Scenario,
) -> anyhow::Result<(Report, PathBuf)> {
    let target = target(local, target_args, &scenario).await?;
    run_on(&target, load_args, output, scenario).await
}

/// One run against a deployment that is already there (a step of `capacity` shares one).
pub async fn run_on(
    target: &Target,
    load_args: &LoadArgs,
    output: &OutputArgs,
    scenario: Scenario,
) -> anyhow::Result<(Report, PathBuf)> {
    let settings = load_args.settings()?;
    if let Some(deployment) = &target.deployment {
        let roles = deployment.lock().await.role_names();
        scenario.validate(&roles)?;
    }
    let pool = crate::cost::tester_pool(&target.database_url, 4).await?;
    let previous = output
        .previous
        .clone()
        .or_else(|| crate::report::latest_in(&output.out));
    println!(
        "{}: {} messages over {:.0}s against {} (seed {})",
        output.name,
        settings.offered(),
        settings.duration().as_secs_f64(),
        target.label,
        settings.seed
    );

    if !scenario.steps.is_empty() {
        println!(
            "chaos: {} ({} steps){}",
            scenario.name.as_deref().unwrap_or("unnamed scenario"),
            scenario.steps.len(),
            scenario
                .description
                .as_deref()
                .map(|d| format!("\n  {}", d.trim().replace('\n', "\n  ")))
                .unwrap_or_default()
        );
    }
    let probe = target.probe(&pool).await;
    let cost_before = probe.settled_sample().await?;
    let scraper = Scraper::start(target.metrics.clone(), Duration::from_secs(2)).await;
    let run_id = format!("lt-{}-{:x}", output.name, settings.seed);
    let started_wall = Utc::now();
    let started = Instant::now();
    let chaos_task = target.deployment.clone().map(|deployment| {
        let steps = scenario.steps.clone();
        tokio::spawn(chaos::run(steps, deployment, scraper.handle(), started))
    });
    let progress = load::Progress::default();
    let (bar, bar_task) = load_bar(&settings, progress.clone(), started);
    let outcome = load::run(
        &target.api_url,
        target.api_key.as_deref(),
        &settings,
        &run_id,
        progress,
        started,
        CancellationToken::new(),
    )
    .await?;
    bar_task.abort();
    bar.finish_and_clear();
    let load_seconds = outcome.elapsed.as_secs_f64();
    let chaos_records = match chaos_task {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };

    let ids: Vec<Uuid> = outcome.accepted.iter().map(|(id, _)| *id).collect();
    let drain_started = Instant::now();
    let complete = drain(&pool, &ids, &target.sim_url, load_args.drain_timeout).await?;
    let drain = Drain {
        complete,
        seconds: drain_started.elapsed().as_secs_f64(),
    };
    let accumulator = scraper.finish().await;
    // The cost ends with the drain: the proof and the whole-database verdict below are the
    // tester's work, not the deployment's.
    let cost = {
        // A role restarted by a chaos step has a new pid: measure the ones running now.
        let probe = target.probe(&pool).await;
        let after = probe.settled_sample().await?;
        (cost_before, after)
    };

    let (proof, facts) = proof::prove(
        &pool,
        &ids,
        &target.sim_url,
        load_args.expect.clone(),
        outcome.replay_mismatches,
    )
    .await?;
    let database = {
        let gathered = herald_store::verify::gather(&pool, None).await?;
        let provider = proof::provider_views(&target.sim_url).await?;
        let whole =
            herald_store::verify::conclude(&pool, &gathered, &provider, load_args.expect.clone())
                .await?;
        serde_json::to_value(whole)?
    };
    let redriven = crate::report::Redriven::of(&pool, &ids).await?;
    let (cost_from, cost_to) = cost;
    let mut cost = crate::cost::Cost::between(&cost_from, &cost_to, proof.delivered);
    cost.read_wal_by_table(&pool, &cost_from, &cost_to, target.deployment.is_some())
        .await;
    let first_submits = match &target.sim_log {
        Some(log) => Some(proof::first_submits(log)?),
        None => None,
    };
    let (latency, timeline, last_accepted) =
        latencies(&outcome, &facts, first_submits.as_ref(), started_wall);
    let delivered_seconds = last_accepted
        .map(|at| (at - started_wall).num_milliseconds() as f64 / 1000.0)
        .unwrap_or(load_seconds)
        .max(0.001);
    let stages = accumulator.stages(proof.delivered);
    let previous_report = previous.as_deref().and_then(|p| {
        crate::report::Report::read(p)
            .ok()
            .map(|r| (p.to_owned(), r))
    });
    let wall = breakdown::wall(
        &stages,
        previous_report
            .as_ref()
            .map(|(p, r)| (p.to_str().unwrap_or("previous"), r.breakdown.as_slice())),
    );
    let failed: u64 = outcome.errors.values().sum();
    let report = Report {
        name: output.name.clone(),
        started_at: started_wall.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        target: target.label.clone(),
        shape: target.shape.clone(),
        load: LoadCounts {
            seconds: load_seconds,
            requests: outcome.requests,
            messages_due: outcome.messages_due,
            accepted: outcome.accepted.len() as u64,
            not_sent: outcome.not_sent,
            failed,
            errors: outcome.errors.clone(),
            retries: outcome.retries,
            replays: outcome.replays,
        },
        throughput: Throughput {
            offered_per_s: outcome.messages_due as f64 / settings.duration().as_secs_f64(),
            accepted_per_s: outcome.accepted.len() as f64 / load_seconds.max(0.001),
            delivered_per_s: proof.delivered as f64 / delivered_seconds,
        },
        settings,
        drain,
        ok: proof.ok() && chaos_records.iter().all(|c| c.ok),
        proof,
        database,
        latency,
        breakdown: stages,
        wall,
        restarted_roles: accumulator.resets.keys().cloned().collect(),
        chaos: chaos_records,
        timeline,
        cost: Some(cost),
        redriven,
    };
    let stamp = started_wall.format("%Y%m%d-%H%M%S");
    let path = output.out.join(format!("{}-{stamp}.json", output.name));
    report.write(&path)?;
    report.print_summary();
    println!("report: {}", path.display());
    if !output.no_plot {
        let svg = path.with_extension("svg");
        crate::plot::draw(&report, &svg)?;
        println!("plot:   {}", svg.display());
    }
    if let Some(deployment) = &target.deployment {
        let deployment = deployment.lock().await;
        println!(
            "local deployment's logs: {}",
            deployment.dir().join("logs").display()
        );
    }
    Ok((report, path))
}

pub async fn target(
    local: &LocalArgs,
    args: &TargetArgs,
    scenario: &Scenario,
) -> anyhow::Result<Target> {
    if !local.local {
        anyhow::ensure!(
            scenario.steps.is_empty(),
            "chaos steps need a local deployment (--local): the load tester only signals \
             processes it started itself"
        );
        let need = |value: &Option<String>, flag: &str| {
            value
                .clone()
                .ok_or_else(|| anyhow::anyhow!("{flag} is required without --local"))
        };
        let metrics = args
            .metrics_url
            .iter()
            .map(|pair| {
                pair.split_once('=')
                    .map(|(role, url)| (role.to_owned(), url.to_owned()))
                    .ok_or_else(|| anyhow::anyhow!("--metrics-url wants role=url, got {pair:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let api_url = need(&args.api_url, "--api-url")?;
        let api_key = std::env::var(API_KEY_VARIABLE)
            .ok()
            .filter(|k| !k.is_empty());
        if api_key.is_none() {
            println!("{API_KEY_VARIABLE} is not set: the load is sent without an API key");
        }
        return Ok(Target {
            label: api_url.clone(),
            api_url,
            api_key,
            database_url: need(&args.database_url, "--database-url")?,
            sim_url: need(&args.sim_url, "--sim-url")?,
            sim_log: args.sim_log.clone(),
            metrics,
            deployment: None,
            shape: Vec::new(),
        });
    }
    let herald_bin = find_herald(local.herald_bin.clone())?;
    let options = DeploymentOptions {
        herald_bin: herald_bin.clone(),
        dir: local.local_dir.clone(),
        partitions: local.partitions,
        pollers: local.pollers,
        durable: local.durable,
        quick_recovery: local.quick_recovery || !scenario.steps.is_empty(),
        api_flags: local.api_flags.clone(),
        poller_flags: local.poller_flags.clone(),
        send_worker_flags: local.send_worker_flags.clone(),
        status_worker_flags: local.status_worker_flags.clone(),
        sim_flags: local.sim_flags.clone(),
        ..DeploymentOptions::new(herald_bin.clone())
    };
    println!(
        "starting a local deployment ({} poller(s), {} partitions) from {}",
        local.pollers,
        local.partitions,
        herald_bin.display()
    );
    let deployment = LocalDeployment::start(&options).await?;
    let mut shape = vec![
        format!("pollers={}", local.pollers),
        format!("partitions={}", local.partitions),
    ];
    if options.quick_recovery {
        shape.push("quick-recovery".to_owned());
    }
    if options.durable {
        shape.push("durable".to_owned());
    }
    shape.extend(local.poller_flags.iter().map(|f| format!("poller:{f}")));
    shape.extend(
        local
            .send_worker_flags
            .iter()
            .map(|f| format!("send-worker:{f}")),
    );
    shape.extend(
        local
            .status_worker_flags
            .iter()
            .map(|f| format!("status-worker:{f}")),
    );
    shape.extend(local.api_flags.iter().map(|f| format!("api:{f}")));
    shape.extend(local.sim_flags.iter().map(|f| format!("sim:{f}")));
    Ok(Target {
        api_url: deployment.api_url.clone(),
        api_key: Some(deployment.keys.client_key.clone()),
        database_url: deployment.database_url.clone(),
        sim_url: deployment.sim_url.clone(),
        sim_log: Some(deployment.sim_log.clone()),
        metrics: deployment.metrics_urls(),
        label: "local".to_owned(),
        shape,
        deployment: Some(Arc::new(Mutex::new(deployment))),
    })
}

/// `--herald-bin`, or `herald` next to this executable (also from `target/*/deps/`).
pub fn find_herald(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        anyhow::ensure!(
            path.is_file(),
            "--herald-bin {} does not exist",
            path.display()
        );
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for candidate in [dir.join("herald"), dir.join("../herald")] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!(
        "no herald binary next to {}: build it (cargo build -p herald, with the same profile) \
         or pass --herald-bin",
        exe.display()
    )
}

/// Waits until every id has an outcome (its final receipt included, when the provider sends
/// one), up to `timeout`.
pub async fn drain(
    pool: &sqlx::PgPool,
    ids: &[Uuid],
    sim_url: &str,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let bar = ProgressBar::new(ids.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("drain {elapsed_precise} [{bar:30}] {pos}/{len} settled")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let deadline = Instant::now() + timeout;
    let mut waiting: Vec<Uuid> = ids
        .iter()
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let total = waiting.len() as u64;
    loop {
        let facts = proof::facts(pool, &waiting).await?;
        // Only messages with an effect need the provider's word (their receipts).
        let with_effect = waiting
            .iter()
            .any(|id| facts.get(id).is_some_and(|f| !f.ledger_keys.is_empty()));
        let provider = if with_effect {
            proof::provider_views(sim_url).await?
        } else {
            HashMap::new()
        };
        waiting.retain(|id| {
            let fact = facts.get(id).cloned().unwrap_or_default();
            let view = provider
                .get(&herald_core::send_effect_key(*id))
                .copied()
                .unwrap_or_default();
            herald_core::verdict::classify(*id, &fact.evidence(view)) == Fate::Unsettled
        });
        bar.set_position(total - waiting.len() as u64);
        if waiting.is_empty() {
            bar.finish_and_clear();
            return Ok(true);
        }
        if Instant::now() >= deadline {
            bar.abandon();
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}

/// The three latencies, the per-second timeline and the time of the last ACCEPTED.
fn latencies(
    outcome: &load::LoadOutcome,
    facts: &HashMap<Uuid, Facts>,
    first_submits: Option<&HashMap<String, DateTime<Utc>>>,
    started: DateTime<Utc>,
) -> (Latency, Vec<TimelineSecond>, Option<DateTime<Utc>>) {
    let seconds =
        |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6;
    let mut to_accepted = latency::histogram();
    let mut to_submit = latency::histogram();
    let mut timeline: Vec<TimelineSecond> = outcome
        .timeline
        .iter()
        .enumerate()
        .map(|(n, s)| TimelineSecond {
            second: n as u64,
            offered: s.offered,
            accepted: s.accepted,
            errors: s.errors,
            accept_p99_ms: s.accept_p99_ms,
            ..TimelineSecond::default()
        })
        .collect();
    let mut per_second: HashMap<usize, hdrhistogram::Histogram<u64>> = HashMap::new();
    let mut last = None;
    let mut seen = HashSet::new();
    for (id, due_s) in &outcome.accepted {
        if !seen.insert(*id) {
            continue;
        }
        let Some(fact) = facts.get(id) else { continue };
        let Some(created) = fact.created_at else {
            continue;
        };
        if let Some(accepted) = fact.accepted_at {
            let e2e = seconds(created, accepted);
            latency::record(&mut to_accepted, e2e);
            latency::record(
                per_second
                    .entry(*due_s as usize)
                    .or_insert_with(latency::histogram),
                e2e,
            );
            let at = seconds(started, accepted).max(0.0) as usize;
            if timeline.len() <= at {
                timeline.resize_with(at + 1, TimelineSecond::default);
            }
            timeline[at].delivered += 1;
            last = last.max(Some(accepted));
        }
        if let Some(submit) =
            first_submits.and_then(|log| log.get(&herald_core::idempotency::send_effect_key(*id)))
        {
            latency::record(&mut to_submit, seconds(created, *submit));
        }
    }
    for (n, second) in timeline.iter_mut().enumerate() {
        second.second = n as u64;
        if let Some(h) = per_second.get(&n) {
            second.end_to_end_p99_ms = h.value_at_quantile(0.99) as f64 / 1000.0;
        }
    }
    let latency = Latency {
        accept: Percentiles::of(&outcome.accept_latency),
        accept_to_submit: first_submits.map(|_| Percentiles::of(&to_submit)),
        accept_to_accepted: Percentiles::of(&to_accepted),
    };
    (latency, timeline, last)
}

/// The progress bar of the load: elapsed against the schedule, accepted, failed, not sent.
/// Drawn only on a terminal.
fn load_bar(
    settings: &LoadSettings,
    progress: load::Progress,
    started: Instant,
) -> (ProgressBar, tokio::task::JoinHandle<()>) {
    let total = settings.duration();
    let bar = ProgressBar::new(total.as_millis() as u64);
    bar.set_style(
        ProgressStyle::with_template("load  {elapsed_precise} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let task = tokio::spawn({
        let bar = bar.clone();
        async move {
            loop {
                let (accepted, failed, not_sent) = progress.counts();
                let elapsed = started.elapsed();
                bar.set_position(elapsed.min(total).as_millis() as u64);
                bar.set_message(format!(
                    "accepted {accepted}  failed {failed}  not sent {not_sent}  ({:.0}/s)",
                    accepted as f64 / elapsed.as_secs_f64().max(0.001)
                ));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    (bar, task)
}

/// A count of at least 1.
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(err) => Err(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_needs_a_poller() {
        assert!(at_least_one("0").is_err());
        assert_eq!(at_least_one("2"), Ok(2));
        assert!(at_least_one("two").is_err());
    }
}
