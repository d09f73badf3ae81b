//! The bulkheads benchmark: does a flood of delivery receipts slow down sends?
//!
//! Three scenarios on the same servers, each on a fresh database: sends alone; sends with a
//! receipt flood at `--flood-factor` times the measured send rate, each job type on its own
//! worker server and semaphore (Herald's design); and the same flood with both job types
//! forced through one shared semaphore (the outage this design prevents). Send throughput is
//! the growth of the ledger during a fixed window while a backlog of sends waits.
//!
//! Longer than 400 lines: one benchmark with its three scenarios and their in-process roles.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_client::wire::BatchItem;
use herald_core::{Fence, JobType, PartitionCount};
use herald_poller::{Ownership, Poller, PollerSettings, StaticOwnership};
use herald_queue::monitor::MonitoredStore;
use herald_queue::{QueueStore, StoreSettings};
use herald_testkit::keys::CLIENT;
use herald_testkit::{DeploymentKeys, LocalPostgres, LocalRedis};
use herald_worker::provider::ProviderClient;
use herald_worker::send::{SendHandler, SendSettings};
use herald_worker::status::{StatusHandler, StatusSettings};
use herald_worker::WorkerSettings;
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Length of each measurement window.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Worker slots per job type (the shared scenario gets both in one semaphore).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The provider's latency per submit: it makes sends slot-bound, like real gateways.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    provider_latency: Duration,
    /// Receipts per second, as a multiple of the send rate measured without a flood.
    #[arg(long, default_value_t = 10.0)]
    flood_factor: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    NoFlood,
    FloodBulkheads,
    FloodSharedSemaphore,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::NoFlood => "no flood",
            Scenario::FloodBulkheads => "flood, one worker server per job type",
            Scenario::FloodSharedSemaphore => "flood, one shared semaphore",
        }
    }
}

struct Outcome {
    sends_per_second: f64,
    receipts_offered: f64,
    receipts_per_second: f64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    herald_testkit::packages::ensure_installed().await?;
    let pg = LocalPostgres::start().await?;
    let (send_redis, status_redis) = (LocalRedis::start().await?, LocalRedis::start().await?);
    println!(
        "bulkheads: window {:?}, {} slots per job type, provider latency {:?}, flood {}x",
        args.window, args.concurrency, args.provider_latency, args.flood_factor
    );
    let mut results = Vec::new();
    let mut baseline = 0.0;
    for (n, scenario) in [
        Scenario::NoFlood,
        Scenario::FloodBulkheads,
        Scenario::FloodSharedSemaphore,
    ]
    .into_iter()
    .enumerate()
    {
        let flood_rate = if scenario == Scenario::NoFlood {
            0.0
        } else {
            baseline * args.flood_factor
        };
        let url = pg.create_database(&format!("bench_{n}")).await?;
        let outcome = scenario_run(
            &args,
            scenario,
            &url,
            &send_redis,
            &status_redis,
            flood_rate,
        )
        .await?;
        if scenario == Scenario::NoFlood {
            baseline = outcome.sends_per_second;
        }
        println!(
            "  {:<40} sends {:>7.1}/s   receipts offered {:>7.1}/s, applied {:>7.1}/s",
            scenario.name(),
            outcome.sends_per_second,
            outcome.receipts_offered,
            outcome.receipts_per_second
        );
        results.push((scenario, outcome));
    }
    println!();
    println!("| scenario | sends/s | receipts offered/s | receipts applied/s | sends vs no flood | receipts applied / offered |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (scenario, outcome) in &results {
        let kept_up = if outcome.receipts_offered > 0.0 {
            format!(
                "{:.2}",
                outcome.receipts_per_second / outcome.receipts_offered
            )
        } else {
            "-".to_owned()
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2} | {kept_up} |",
            scenario.name(),
            outcome.sends_per_second,
            outcome.receipts_offered,
            outcome.receipts_per_second,
            outcome.sends_per_second / baseline
        );
    }
    Ok(())
}

async fn scenario_run(
    args: &Args,
    scenario: Scenario,
    database_url: &str,
    send_redis: &LocalRedis,
    status_redis: &LocalRedis,
    flood_rate: f64,
) -> anyhow::Result<Outcome> {
    let partitions = PartitionCount::new(16)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(48)
        .connect(database_url)
        .await?;
    herald_store::migrate::migrate(&pool, partitions).await?;
    let cancel = CancellationToken::new();
    let stores = |url: String, job_type| {
        QueueStore::new(&StoreSettings {
            url,
            job_type,
            shard: 0,
            max_connections: 16,
        })
    };
    // Each scenario starts with empty streams.
    for redis in [send_redis, status_redis] {
        flush(&redis.url()).await?;
    }
    let send_store = stores(send_redis.url(), JobType::Send)?;
    let status_store = stores(status_redis.url(), JobType::Status)?;

    let temp = tempfile::tempdir()?;
    let sim_addr = serve(
        herald_provider_sim::router(herald_provider_sim::SimSettings {
            latency: args.provider_latency,
            log_path: temp.path().join("submits.jsonl"),
            ..Default::default()
        })?,
        cancel.clone(),
    )
    .await?;
    // The API authenticates as in production: the load with a client key, the flood's
    // receipts signed with their gateway's secret.
    let keys = DeploymentKeys::generate();
    let credentials = herald_api::auth::Credentials::new(
        vec![(CLIENT.to_owned(), keys.client_key.clone())],
        Vec::new(),
        keys.receipt_secrets.clone(),
        Duration::from_secs(herald_core::signature::DEFAULT_WINDOW_SECS),
        false,
    )?;
    let api_addr = serve(
        herald_api::router(herald_api::ApiState::new(
            pool.clone(),
            partitions,
            herald_api::Limits::default(),
            credentials,
            herald_api::Groups::default(),
        )),
        cancel.clone(),
    )
    .await?;
    let monitored = |store: QueueStore| {
        MonitoredStore::start(store, 0.8, Duration::from_millis(500), cancel.clone())
    };
    let poller = Poller::new(
        pool.clone(),
        HashMap::from([
            (JobType::Send, vec![monitored(send_store.clone())]),
            (JobType::Status, vec![monitored(status_store.clone())]),
        ]),
        PollerSettings {
            poll_interval: Duration::from_millis(50),
            ..PollerSettings::default()
        },
    );
    let fences: Vec<Fence> = StaticOwnership {
        pool: pool.clone(),
        owner: "bench".to_owned(),
        partitions,
    }
    .acquire()
    .await?;
    let poller_cancel = cancel.clone();
    let poller_task = tokio::spawn(async move { poller.run_static(fences, poller_cancel).await });

    let send = Arc::new(SendHandler::new(
        pool.clone(),
        ProviderClient::new(&format!("http://{sim_addr}"), Duration::from_secs(10))?,
        SendSettings::default(),
        cancel.clone(),
    ));
    let status = Arc::new(StatusHandler {
        pool: pool.clone(),
        settings: StatusSettings::default(),
    });
    let (send_slots, status_slots) = match scenario {
        Scenario::FloodSharedSemaphore => {
            let shared = Arc::new(Semaphore::new(2 * args.concurrency));
            (shared.clone(), shared)
        }
        _ => (
            Arc::new(Semaphore::new(args.concurrency)),
            Arc::new(Semaphore::new(args.concurrency)),
        ),
    };
    let settings = |name: &str| WorkerSettings {
        consumer: name.to_owned(),
        concurrency: args.concurrency,
        ..WorkerSettings::default()
    };
    let workers = [
        tokio::spawn(herald_worker::run_with_semaphore(
            vec![send_store],
            send,
            settings("send"),
            send_slots,
            cancel.clone(),
        )),
        tokio::spawn(herald_worker::run_with_semaphore(
            vec![status_store],
            status,
            settings("status"),
            status_slots,
            cancel.clone(),
        )),
    ];

    let api = format!("http://{api_addr}");
    let client = herald_client::Client::new(&api, Some(&keys.client_key))?;
    // Seed messages whose provider ids the flood's receipts name.
    post_messages(&client, "seed", 100).await?;
    wait_ledger(&pool, 100).await?;
    let targets: Vec<(String, String)> = sqlx::query_as("SELECT gateway, provider_id FROM ledger")
        .fetch_all(&pool)
        .await?;

    // A backlog of sends larger than the window can drain, so workers are the bottleneck.
    let backlog = ((2.0 * args.concurrency as f64 / args.provider_latency.as_secs_f64())
        * args.window.as_secs_f64()) as usize
        + 1000;
    post_messages(&client, "load", backlog).await?;

    let flood_stop = CancellationToken::new();
    let flood = tokio::spawn(flood_receipts(
        herald_client::Client::new(&api, None)?,
        keys,
        targets,
        flood_rate,
        flood_stop.clone(),
    ));
    // Let the flood build up before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sent_before, applied_before) = counts(&pool).await?;
    let started = Instant::now();
    tokio::time::sleep(args.window).await;
    let (sent_after, applied_after) = counts(&pool).await?;
    let elapsed = started.elapsed().as_secs_f64();
    flood_stop.cancel();
    let _ = flood.await;
    cancel.cancel();
    let _ = poller_task.await;
    for worker in workers {
        let _ = worker.await;
    }
    pool.close().await;
    Ok(Outcome {
        sends_per_second: (sent_after - sent_before) as f64 / elapsed,
        receipts_offered: flood_rate,
        receipts_per_second: (applied_after - applied_before) as f64 / elapsed,
    })
}

async fn counts(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (SELECT count(*) FROM ledger),
                (SELECT count(*) FROM message_events WHERE state = 'ENROUTE')",
    )
    .fetch_one(pool)
    .await?)
}

async fn wait_ledger(pool: &PgPool, count: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(pool).await?.0 < count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "seed messages were not delivered in 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn post_messages(
    client: &herald_client::Client,
    prefix: &str,
    count: usize,
) -> anyhow::Result<()> {
    for start in (0..count).step_by(1000) {
        let messages = (start..(start + 1000).min(count))
            .map(|i| BatchItem {
                recipient: format!("{prefix}-{i}"),
                body: json!({"n": i}),
                partition_key: None,
                idempotency_key: None,
            })
            .collect();
        client.send_batch(messages).await?;
    }
    Ok(())
}

/// Posts ENROUTE receipts for the seeded messages at `rate` per second (open loop) until
/// stopped, each signed with its gateway's secret as a provider would.
async fn flood_receipts(
    client: herald_client::Client,
    keys: DeploymentKeys,
    targets: Vec<(String, String)>,
    rate: f64,
    stop: CancellationToken,
) {
    if rate <= 0.0 || targets.is_empty() {
        return;
    }
    let every = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(Semaphore::new(64));
    let mut n = 0usize;
    while !stop.is_cancelled() {
        tick.tick().await;
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let (gateway, provider_id) = targets[n % targets.len()].clone();
        n += 1;
        let client = client.clone();
        let body =
            json!({"provider_id": provider_id, "status": "ENROUTE", "timestamp": 1_764_687_845})
                .to_string();
        let secret = keys.receipt_secret(&gateway).unwrap_or_default().as_bytes();
        let signature =
            herald_core::signature::sign(secret, chrono::Utc::now().timestamp(), body.as_bytes());
        tokio::spawn(async move {
            let _ = client
                .receipt(&gateway, body.into_bytes(), Some(&signature))
                .await;
            drop(permit);
        });
    }
}

async fn serve(router: axum::Router, cancel: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    });
    Ok(addr)
}

/// Empties a Redis between scenarios.
async fn flush(url: &str) -> anyhow::Result<()> {
    let store = QueueStore::new(&StoreSettings {
        url: url.to_owned(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 1,
    })?;
    store.flush_all().await?;
    Ok(())
}
