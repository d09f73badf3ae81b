//! `herald plan`: the pool and memory budgets of a whole deployment, on paper, before a run.
//! The deployment is described by a TOML file (`--config`) or by the Helm chart's values files
//! (`--values`), which are read into the same plan.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cli::{ConfigError, PlanArgs};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plan {
    postgres: Postgres,
    #[serde(rename = "role")]
    roles: Vec<Role>,
    #[serde(rename = "store", default)]
    stores: Vec<Store>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Postgres {
    max_connections: u64,
    #[serde(default)]
    reserved_connections: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Role {
    name: String,
    replicas: u64,
    database_max_connections: u64,
    #[serde(default)]
    redis_max_connections: u64,
    /// Job types whose queue stores the role connects to.
    #[serde(default)]
    uses: Vec<String>,
    #[serde(default)]
    listen_connections: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Store {
    job_type: String,
    #[serde(default = "one")]
    shards: u64,
    maxmemory_bytes: u64,
    #[serde(default = "default_maxclients")]
    maxclients: u64,
    peak_backlog_jobs: u64,
    #[serde(default = "default_bytes_per_job")]
    bytes_per_job: u64,
}

fn one() -> u64 {
    1
}

fn default_maxclients() -> u64 {
    10_000
}

fn default_bytes_per_job() -> u64 {
    256
}

/// Redis's own footprint before any job.
const REDIS_BASELINE_BYTES: u64 = 1 << 20;

/// One budget line: what is needed against what is available.
struct Line {
    budget: String,
    needed: u64,
    limit: u64,
    detail: String,
}

/// The fill level at which pollers pause publishing, unless a flag or the values say otherwise.
const DEFAULT_QUEUE_FULL_THRESHOLD: f64 = 0.8;

pub async fn main(args: PlanArgs) -> anyhow::Result<i32> {
    let (plan, threshold) = match &args.config {
        Some(path) => (
            load(path)?,
            args.queue_full_threshold
                .unwrap_or(DEFAULT_QUEUE_FULL_THRESHOLD),
        ),
        None => {
            let release = chart::load(&args.values)?;
            println!(
                "release of {}: each Deployment at its most replicas (the autoscaler's maximum) plus one surge pod",
                release.sources
            );
            let threshold = args
                .queue_full_threshold
                .unwrap_or(release.queue_full_threshold);
            (release.plan, threshold)
        }
    };
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(ConfigError(format!(
            "the queue full threshold must be above 0 and at most 1, not {threshold}"
        ))
        .into());
    }
    let lines = budgets(&plan, threshold)?;
    println!(
        "{:<34} {:>14} {:>14} {:>7}  detail",
        "budget", "needed", "limit", "use"
    );
    let mut over = 0;
    for line in &lines {
        let share = if line.limit == 0 {
            f64::INFINITY
        } else {
            line.needed as f64 / line.limit as f64
        };
        let verdict = if line.needed > line.limit {
            over += 1;
            "  OVER"
        } else {
            ""
        };
        println!(
            "{:<34} {:>14} {:>14} {:>6.0}%  {}{verdict}",
            line.budget,
            line.needed,
            line.limit,
            share * 100.0,
            line.detail
        );
    }
    if over > 0 {
        println!("{over} budget(s) exceeded");
        Ok(1)
    } else {
        println!("every budget fits");
        Ok(0)
    }
}

fn load(path: &Path) -> anyhow::Result<Plan> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| ConfigError(format!("cannot read {}: {err}", path.display())))?;
    toml::from_str(&text).map_err(|err| ConfigError(format!("{}: {err}", path.display())).into())
}

fn budgets(plan: &Plan, threshold: f64) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    let pools: u64 = plan
        .roles
        .iter()
        .map(|r| r.replicas * (r.database_max_connections + r.listen_connections))
        .sum();
    let parts: Vec<String> = plan
        .roles
        .iter()
        .map(|r| {
            format!(
                "{} {}x{}",
                r.name,
                r.replicas,
                r.database_max_connections + r.listen_connections
            )
        })
        .collect();
    lines.push(Line {
        budget: "postgres connections".to_owned(),
        needed: pools + plan.postgres.reserved_connections,
        limit: plan.postgres.max_connections,
        detail: format!(
            "{} + {} reserved",
            parts.join(" + "),
            plan.postgres.reserved_connections
        ),
    });
    for store in &plan.stores {
        if store.shards == 0 {
            return Err(ConfigError(format!(
                "store {}: shards must be at least 1",
                store.job_type
            ))
            .into());
        }
        let users: Vec<&Role> = plan
            .roles
            .iter()
            .filter(|r| r.uses.contains(&store.job_type))
            .collect();
        let clients: u64 = users
            .iter()
            .map(|r| r.replicas * r.redis_max_connections)
            .sum();
        lines.push(Line {
            budget: format!("redis {} clients per shard", store.job_type),
            needed: clients,
            limit: store.maxclients,
            detail: users
                .iter()
                .map(|r| format!("{} {}x{}", r.name, r.replicas, r.redis_max_connections))
                .collect::<Vec<_>>()
                .join(" + "),
        });
        let per_shard_jobs = store.peak_backlog_jobs.div_ceil(store.shards);
        lines.push(Line {
            budget: format!("redis {} memory per shard", store.job_type),
            needed: REDIS_BASELINE_BYTES + per_shard_jobs * store.bytes_per_job,
            limit: (store.maxmemory_bytes as f64 * threshold) as u64,
            detail: format!(
                "{per_shard_jobs} jobs x {} B + 1 MiB, against {:.0}% of maxmemory (publishing pauses there)",
                store.bytes_per_job,
                threshold * 100.0
            ),
        });
    }
    Ok(lines)
}

mod chart;
