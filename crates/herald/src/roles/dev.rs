//! `herald dev`: local PostgreSQL, Redis and etcd under one folder, every role as its own
//! process of this binary, a demo load, and the proof that nothing was lost. The deployment is
//! the test kit's `LocalDeployment`, the one the load tester and its chaos steps run. It runs
//! with credentials, as production does: random client and operator keys, a receipt secret per
//! gateway shared by the API and the simulator, and the roles connected as the runtime
//! database role. They are handed to the roles in their environment, never on a command line.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use herald_client::wire::{BatchItem, SendRequest};
use herald_testkit::keys::{CLIENT, OPERATOR};
use herald_testkit::{DeploymentOptions, LocalDeployment};

use crate::cli::{DevArgs, LogFormat};
use crate::telemetry;

pub async fn main(args: DevArgs) -> anyhow::Result<i32> {
    telemetry::init_logs(LogFormat::Pretty);
    let api_port = api_address(args.api_port)?.port();
    // The same deployment the load tester and the chaos steps run: servers under one folder,
    // each role a process of this binary with its typed configuration as its `--config` file,
    // every setting at its default (the pools as the benchmarks run them, loadtest/README.md).
    let mut options = DeploymentOptions::new(std::env::current_exe()?);
    options.dir = Some(args.dir.clone());
    options.partitions = args.partitions;
    options.durable = true;
    options.api_port = Some(api_port);
    println!(
        "herald dev: starting PostgreSQL, Redis and etcd, then every role, in {}",
        args.dir.display()
    );
    let deployment = LocalDeployment::start(&options).await?;
    let (api, sim) = (&deployment.api_url, &deployment.sim_url);
    println!(
        "PostgreSQL {}  Redis send {} status {}  etcd {}",
        crate::cli::masked_url(&deployment.database_url),
        deployment.send_redis.url(),
        deployment.status_redis.url(),
        deployment.etcd.endpoint()
    );
    println!("API {api}  provider simulator {sim}");
    for (name, admin) in deployment.metrics_urls() {
        println!("  {name:<14} {admin}/metrics");
    }
    println!(
        "each role's log: {}",
        deployment.dir().join("logs").join("<role>.log").display()
    );

    let keys = &deployment.keys;
    let mut code = 0;
    if args.messages > 0 {
        let client = herald_client::Client::new(api, Some(&keys.client_key))?;
        code = demo(&args, &client, &deployment.database_url, sim).await?;
    }
    if args.keep_running {
        println!(
            "every role keeps running with these keys (this run's only):\n  client key ({CLIENT}): {}\n  operator key ({OPERATOR}): {}\ntry:\n  curl -s -X POST {api}/v1/messages -H \"Authorization: Bearer {}\" -H 'content-type: application/json' -d '{{\"recipient\":\"+15550100\",\"body\":{{\"text\":\"hi\"}}}}'\nCtrl-C stops.",
            keys.client_key, keys.operator_key, keys.client_key
        );
        let signal = crate::shutdown::on_signal();
        signal.cancelled().await;
    }
    // Dropping the deployment stops every role and server.
    drop(deployment);
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
        .connect_with(herald_store::proof_options(database_url)?)
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

/// A free local port's address.
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
