//! `herald dev`: local PostgreSQL, Redis and etcd under one folder, every role in this
//! process, a demo load, and the proof that nothing was lost. It runs with credentials, as
//! production does: random client and operator keys, a receipt secret per gateway shared by
//! the API and the simulator, and the roles connected as the runtime database role. They are
//! handed to the roles in memory, never on a command line.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use herald_client::wire::{BatchItem, SendRequest};
use herald_testkit::keys::{CLIENT, OPERATOR, RUNTIME_ROLE};
use herald_testkit::{
    DeploymentKeys, LocalEtcd, LocalPostgres, LocalRedis, PostgresOptions, RedisOptions,
};
use tokio_util::sync::CancellationToken;

use herald_api::ApiConfig;
use herald_core::JobType;
use herald_poller::config::PollerConfig;
use herald_provider_sim::config::SimConfig;
use herald_store::config::MigrateConfig;
use herald_worker::config::WorkerConfig;

use crate::cli::{DevArgs, LogFormat};
use crate::telemetry;

pub async fn main(args: DevArgs) -> anyhow::Result<i32> {
    telemetry::init_logs(LogFormat::Pretty);
    herald_testkit::packages::ensure_installed().await?;
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir)?;
    }
    std::fs::create_dir_all(&args.dir)?;
    let dir = std::fs::canonicalize(&args.dir)?;
    println!("herald dev: servers and logs in {}", dir.display());

    let pg = LocalPostgres::start_in(
        &dir.join("postgres"),
        &PostgresOptions {
            durable: true,
            max_connections: 200,
            ..PostgresOptions::default()
        },
    )
    .await?;
    let send_redis =
        LocalRedis::start_in(&dir.join("redis-send"), &RedisOptions::default()).await?;
    let status_redis =
        LocalRedis::start_in(&dir.join("redis-status"), &RedisOptions::default()).await?;
    let etcd = LocalEtcd::start_in(&dir.join("etcd")).await?;
    let database_url = pg.create_database("herald").await?;
    let keys = DeploymentKeys::generate();
    let runtime_url = keys.runtime_url(&database_url)?;
    println!(
        "PostgreSQL {}  Redis send {} status {}  etcd {}",
        crate::cli::masked_url(&database_url),
        send_redis.url(),
        status_redis.url(),
        etcd.endpoint()
    );

    // Each role's settings are its typed configuration, built here: the defaults a deployment
    // gets, with this run's addresses, pool sizes and keys. Each role's run checks its own.
    let mut migrate = MigrateConfig::new(&database_url);
    migrate.partitions = args.partitions;
    migrate.runtime_role = Some(RUNTIME_ROLE.to_owned());
    migrate.runtime_role_password = Some(keys.runtime_password.clone());
    super::migrate::migrate(&migrate).await?;

    let cancel = CancellationToken::new();
    let api_addr = api_address(args.api_port)?;
    let sim_addr = free_address()?;
    let poller_admin = free_address()?;
    let send_admin = free_address()?;
    let status_admin = free_address()?;
    let api = format!("http://{api_addr}");
    let sim = format!("http://{sim_addr}");
    let mut roles = tokio::task::JoinSet::new();

    let sim_config = SimConfig {
        listen: sim_addr,
        log_path: dir.join("provider-sim-submits.jsonl"),
        callback_url: Some(api.clone()),
        receipt_secrets: Some(keys.receipt_secrets_value()),
        ..SimConfig::default()
    };
    roles.spawn(super::sim::run(sim_config, cancel.clone()));

    let mut api_config = ApiConfig::new(&runtime_url);
    api_config.listen = api_addr;
    api_config.database.database_max_connections = 32;
    api_config.redis_send_url = vec![send_redis.url()];
    api_config.redis_status_url = vec![status_redis.url()];
    api_config.auth.client_keys = Some(format!("{CLIENT}={}", keys.client_key));
    api_config.auth.operator_keys = Some(format!("{OPERATOR}={}", keys.operator_key));
    api_config.auth.receipt_secrets = Some(keys.receipt_secrets_value());
    roles.spawn(super::api::run(api_config, cancel.clone()));

    let mut poller = PollerConfig::new(&runtime_url, send_redis.url(), status_redis.url());
    poller.poller_id = Some("dev-poller".to_owned());
    poller.admin_listen = poller_admin;
    poller.poll_interval = Duration::from_millis(200);
    poller.etcd_endpoints = vec![etcd.endpoint()];
    poller.database.database_max_connections = 24;
    roles.spawn(super::poller::run(poller, cancel.clone()));

    for (job_type, redis, admin) in [
        (JobType::Send, &send_redis, send_admin),
        (JobType::Status, &status_redis, status_admin),
    ] {
        let mut worker = WorkerConfig::new(job_type, &runtime_url, redis.url());
        worker.admin_listen = admin;
        worker.database.database_max_connections = 32;
        worker.worker_id = Some(format!("dev-{job_type}-worker"));
        if job_type == JobType::Send {
            worker.provider_url = Some(sim.clone());
        }
        roles.spawn(super::worker::run(worker, cancel.clone()));
    }

    wait_healthy(&api, &mut roles).await?;
    println!("API {api}  provider simulator {sim}  poller admin http://{poller_admin}  send worker admin http://{send_admin}  status worker admin http://{status_admin}");

    let mut code = 0;
    if args.messages > 0 {
        let client = herald_client::Client::new(&api, Some(&keys.client_key))?;
        code = demo(&args, &client, &database_url, &sim).await?;
    }
    if args.keep_running {
        println!(
            "every role keeps running with these keys (this run's only):\n  client key ({CLIENT}): {}\n  operator key ({OPERATOR}): {}\ntry:\n  curl -s -X POST {api}/v1/messages -H \"Authorization: Bearer {}\" -H 'content-type: application/json' -d '{{\"recipient\":\"+15550100\",\"body\":{{\"text\":\"hi\"}}}}'\nCtrl-C stops.",
            keys.client_key, keys.operator_key, keys.client_key
        );
        let signal = crate::shutdown::on_signal();
        signal.cancelled().await;
    }
    cancel.cancel();
    while let Some(joined) = roles.join_next().await {
        if let Ok(Err(err)) = joined {
            tracing::warn!(error = format!("{err:#}"), "a role stopped with an error");
        }
    }
    drop((pg, send_redis, status_redis, etcd));
    Ok(code)
}

async fn demo(
    args: &DevArgs,
    client: &herald_client::Client,
    database_url: &str,
    sim: &str,
) -> anyhow::Result<i32> {
    let batch = args.batch.clamp(1, 1000);
    println!(
        "sending {} messages ({} per request, {} in flight)…",
        args.messages, batch, args.concurrency
    );
    let started = Instant::now();
    let chunks: Vec<std::ops::Range<usize>> = (0..args.messages)
        .step_by(batch)
        .map(|start| start..(start + batch).min(args.messages))
        .collect();
    let results: Vec<anyhow::Result<usize>> = futures::stream::iter(chunks)
        .map(|range| send_chunk(client, range, batch))
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let mut accepted = 0;
    for result in results {
        accepted += result?;
    }
    let accept_secs = started.elapsed().as_secs_f64();

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(database_url)
        .await?;
    let deadline = Instant::now() + args.drain_timeout;
    let delivered = loop {
        let delivered: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
            .fetch_one(&pool)
            .await?;
        if delivered as usize >= accepted || Instant::now() >= deadline {
            break delivered;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let total_secs = started.elapsed().as_secs_f64();
    // Receipts follow the sends: the proof waits for them too (it checks final states).
    let verdict = loop {
        let verdict = super::verify::verify(&pool, sim, Default::default()).await?;
        if verdict.count(herald_core::verdict::Fate::Unsettled) == 0 || Instant::now() >= deadline {
            break verdict;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!();
    println!("demo summary");
    println!(
        "accept throughput:          {:.0} messages/s ({accepted} in {accept_secs:.2}s)",
        accepted as f64 / accept_secs
    );
    println!(
        "end-to-end throughput:      {:.0} messages/s (accept to ACCEPTED, {total_secs:.2}s)",
        delivered as f64 / total_secs
    );
    for line in verdict.lines() {
        println!("{line}");
    }
    Ok(if verdict.ok() && verdict.messages as usize == accepted {
        0
    } else {
        1
    })
}

async fn send_chunk(
    client: &herald_client::Client,
    range: std::ops::Range<usize>,
    batch: usize,
) -> anyhow::Result<usize> {
    let count = range.len();
    if batch == 1 {
        let i = range.start;
        let request = SendRequest {
            recipient: format!("+1555{:07}", i % 5000),
            body: serde_json::json!({ "text": format!("demo message {i}") }),
            partition_key: None,
        };
        client.send(&request, None).await?;
        return Ok(1);
    }
    let messages = range
        .map(|i| BatchItem {
            recipient: format!("+1555{:07}", i % 5000),
            body: serde_json::json!({ "text": format!("demo message {i}") }),
            partition_key: None,
            idempotency_key: Some(format!("demo-{i}")),
        })
        .collect();
    client.send_batch(messages).await?;
    Ok(count)
}

async fn wait_healthy(
    api: &str,
    roles: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let client = herald_client::Client::new(api, None)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(Ok(Err(err))) = roles.try_join_next() {
            return Err(err.context("a role failed to start"));
        }
        if client.ready().await {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API did not become ready in 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Role arguments parsed exactly as the command line would be, so `herald dev` runs every role
/// with the same defaults and validation as production.
fn free_address() -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        herald_testkit::free_port()?,
    )))
}

/// The asked-for API port, or a free one (with a note) when it is taken.
fn api_address(port: u16) -> anyhow::Result<SocketAddr> {
    let wanted = SocketAddr::from(([127, 0, 0, 1], port));
    if std::net::TcpListener::bind(wanted).is_ok() {
        return Ok(wanted);
    }
    let fallback = free_address()?;
    println!("port {port} is taken; the API listens on {fallback} instead");
    Ok(fallback)
}
