//! `herald worker`.

use std::sync::Arc;

use herald_core::JobType;
use herald_worker::config::WorkerConfig;
use herald_worker::send::SendHandler;
use herald_worker::status::{reconcile_silent, release_held, StatusHandler};
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, WorkerArgs};
use crate::{shutdown, telemetry};

pub async fn main(mut args: WorkerArgs) -> anyhow::Result<i32> {
    args.config = args.config.with_job_type_defaults();
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args.config, shutdown::on_signal()).await?;
    Ok(0)
}

/// How often held receipts are checked against the ledger: a receipt that outran its send's
/// write waits about this long after the write.
const HELD_RECEIPTS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub async fn run(config: WorkerConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    // Every rule and file is checked before anything connects: a bad one is a configuration
    // error (exit 64).
    let herald_worker::config::PreparedWorker {
        redis_tls,
        provider,
    } = config.prepare()?;
    // Bound before anything connects: a taken admin port fails the start, as the API's does.
    let admin_listener = telemetry::bind(config.admin_listen).await?;
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&config.database, true).await?;
    let admin_cancel = CancellationToken::new();
    let stores: Vec<_> = super::monitored_stores(
        &config.redis_url,
        config.job_type,
        config.redis_max_connections,
        &config.pressure,
        &redis_tls,
        &admin_cancel,
    )?
    .into_iter()
    .map(|monitored| monitored.store)
    .collect();
    let readiness = super::database_and_queue_ready(pool.clone(), stores.clone());
    let role = match config.job_type {
        JobType::Send => "worker_send",
        JobType::Status => "worker_status",
    };
    telemetry::spawn_role_gauges(
        telemetry::Watched {
            role,
            readiness: readiness.clone(),
            postgres: Some(pool.clone()),
            redis: stores.clone(),
        },
        telemetry::ROLE_GAUGE_INTERVAL,
        admin_cancel.clone(),
    );
    let admin = telemetry::admin_router(metrics, role, readiness, None);
    let admin_task = tokio::spawn(telemetry::serve_on(
        admin_listener,
        admin,
        admin_cancel.clone(),
    ));

    let consumer = config.consumer();
    let settings = config.worker_settings(&consumer);
    let concurrency = settings.concurrency;
    tracing::info!(job_type = %config.job_type, %consumer, concurrency, shards = stores.len(), "worker started");
    match provider {
        Some(provider) => {
            let handler = Arc::new(SendHandler::new(
                pool,
                provider,
                config.send_settings(&consumer),
                cancel.clone(),
            ));
            herald_worker::run(stores, handler, settings, cancel).await;
        }
        None => {
            let reconciler = tokio::spawn(reconcile_silent(
                pool.clone(),
                config.receipt_window,
                config.reconcile_interval,
                cancel.clone(),
            ));
            let releaser = tokio::spawn(release_held(
                pool.clone(),
                config.hold_receipts_for,
                HELD_RECEIPTS_INTERVAL,
                cancel.clone(),
            ));
            let handler = Arc::new(StatusHandler {
                pool,
                settings: config.status_settings(),
            });
            herald_worker::run(stores, handler, settings, cancel).await;
            let _ = reconciler.await;
            let _ = releaser.await;
        }
    }
    admin_cancel.cancel();
    if let Ok(Err(err)) = admin_task.await {
        tracing::warn!(
            error = format!("{err:#}"),
            "the admin server stopped with an error"
        );
    }
    tracing::info!("worker stopped");
    Ok(())
}
