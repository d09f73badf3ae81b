//! `herald poller`.

use std::collections::HashMap;

use herald_coord::Coordinator;
use herald_core::JobType;
use herald_poller::config::PollerConfig;
use herald_poller::fleet::{Fleet, FleetSettings};
use herald_poller::{Ownership, Poller, StaticOwnership};

use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, PollerArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: PollerArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args.config, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(config: PollerConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    // Every rule and file is checked before anything connects: a bad one is a configuration
    // error (exit 64).
    let herald_poller::config::PreparedPoller {
        redis_tls,
        etcd_access,
    } = config.prepare()?;
    // Bound before anything connects: a taken admin port fails the start, as the API's does.
    let admin_listener = telemetry::bind(config.admin_listen).await?;
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&config.database, true).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let admin_cancel = CancellationToken::new();
    let (queue, pressure) = (&config.queue, &config.queue.pressure);
    let send_stores = super::monitored_stores(
        &queue.redis_send_url,
        JobType::Send,
        queue.redis_max_connections,
        pressure,
        &redis_tls,
        &admin_cancel,
    )?;
    let status_stores = super::monitored_stores(
        &queue.redis_status_url,
        JobType::Status,
        queue.redis_max_connections,
        pressure,
        &redis_tls,
        &admin_cancel,
    )?;
    let redis: Vec<_> = send_stores
        .iter()
        .chain(&status_stores)
        .map(|m| m.store.clone())
        .collect();
    let readiness = super::database_and_queue_ready(pool.clone(), redis.clone());
    telemetry::spawn_role_gauges(
        telemetry::Watched {
            role: "poller",
            readiness: readiness.clone(),
            postgres: Some(pool.clone()),
            redis,
        },
        telemetry::ROLE_GAUGE_INTERVAL,
        admin_cancel.clone(),
    );
    let admin = telemetry::admin_router(metrics, "poller", readiness, None);
    let admin_task = tokio::spawn(telemetry::serve_on(
        admin_listener,
        admin,
        admin_cancel.clone(),
    ));

    let owner = config.member();
    let poller = Poller::new(
        pool.clone(),
        HashMap::from([
            (JobType::Send, send_stores),
            (JobType::Status, status_stores),
        ]),
        config.settings(),
    );
    let result = if config.etcd_endpoints.is_empty() {
        let fences = StaticOwnership {
            pool: pool.clone(),
            owner: owner.clone(),
            partitions,
        }
        .acquire()
        .await?;
        tracing::info!(%owner, partitions = fences.len(), "no etcd configured: owning every partition");
        poller.run_static(fences, cancel).await
    } else {
        let coord = Coordinator::connect_with(
            &config.etcd_endpoints,
            &config.etcd_prefix,
            std::time::Duration::from_secs(2),
            &etcd_access,
        )
        .await
        .map_err(|err| {
            anyhow::anyhow!("cannot reach etcd at {:?}: {err}", config.etcd_endpoints)
        })?;
        let fleet = Fleet {
            poller,
            coord,
            pool,
            partitions,
            settings: FleetSettings {
                member: owner,
                ..config.fleet_settings()
            },
        };
        fleet.run(cancel).await
    };
    admin_cancel.cancel();
    if let Ok(Err(err)) = admin_task.await {
        tracing::warn!(
            error = format!("{err:#}"),
            "the admin server stopped with an error"
        );
    }
    tracing::info!("poller stopped");
    Ok(result?)
}
