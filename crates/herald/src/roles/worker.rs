//! `herald worker`.

use std::collections::HashMap;
use std::sync::Arc;

use herald_core::JobType;
use herald_worker::provider::ProviderClient;
use herald_worker::send::{SendHandler, SendSettings};
use herald_worker::status::{reconcile_silent, release_held, StatusHandler, StatusSettings};
use herald_worker::WorkerSettings;
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, process_name, ConfigError, WorkerArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: WorkerArgs) -> anyhow::Result<i32> {
    let args = args.with_job_type_defaults();
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args, shutdown::on_signal()).await?;
    Ok(0)
}

/// How often held receipts are checked against the ledger: a receipt that outran its send's
/// write waits about this long after the write.
const HELD_RECEIPTS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub async fn run(args: WorkerArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let concurrency = args.concurrency();
    if concurrency == 0 || args.max_attempts == 0 || args.max_batch == 0 {
        return Err(ConfigError(
            "--concurrency, --max-attempts and --max-batch must be at least 1".into(),
        )
        .into());
    }
    if args.retry_max < args.retry_base {
        return Err(ConfigError(format!(
            "--retry-max ({}) must be at least --retry-base ({})",
            humantime::format_duration(args.retry_max),
            humantime::format_duration(args.retry_base)
        ))
        .into());
    }
    let send_settings = SendSettings {
        max_attempts: args.max_attempts,
        retry_base: args.retry_base,
        retry_max: args.retry_max,
        max_group: args.max_batch,
        blocked_recipients: args
            .blocked_recipients
            .iter()
            .map(|r| r.trim().to_owned())
            .collect(),
        claim_lease: args.claim_lease,
        linger: args.batch_linger,
        ..SendSettings::default()
    };
    send_settings
        .validate()
        .map_err(|err| ConfigError(format!("--claim-lease / --max-attempts: {err}")))?;
    // Every file is read before anything connects: a bad one is a configuration error.
    let redis_tls = args.redis_tls.load()?;
    let provider = match (args.job_type, &args.provider_url) {
        (JobType::Send, None) => {
            return Err(ConfigError("--provider-url is required for --job-type send".into()).into())
        }
        (JobType::Send, Some(url)) => {
            let tls = crate::cli::client_tls(
                "--provider",
                args.provider_ca_file.as_deref(),
                args.provider_cert_file.as_deref(),
                args.provider_key_file.as_deref(),
            )?;
            Some(
                ProviderClient::with_tls(url, args.provider_timeout, &tls)
                    .map_err(|err| ConfigError(format!("--provider-url: {err:#}")))?,
            )
        }
        (JobType::Status, _) => None,
    };
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&args.database, true).await?;
    let admin_cancel = CancellationToken::new();
    let stores: Vec<_> = super::monitored_stores(
        &args.redis_url,
        args.job_type,
        args.redis_max_connections,
        &args.pressure,
        &redis_tls,
        &admin_cancel,
    )?
    .into_iter()
    .map(|monitored| monitored.store)
    .collect();
    let readiness = super::database_and_queue_ready(pool.clone(), stores.clone());
    let role = match args.job_type {
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
    let admin_task = tokio::spawn(telemetry::serve(
        args.admin_listen,
        admin,
        admin_cancel.clone(),
    ));

    let consumer = args
        .worker_id
        .clone()
        .unwrap_or_else(|| process_name("worker"));
    let settings = WorkerSettings {
        consumer: consumer.clone(),
        concurrency,
        max_batch: args.max_batch,
        batches_in_flight: args.batches_in_flight(),
        reclaim_idle: args.reclaim_idle,
        ..WorkerSettings::default()
    };
    tracing::info!(job_type = %args.job_type, %consumer, concurrency, shards = stores.len(), "worker started");
    match provider {
        Some(provider) => {
            let handler = Arc::new(SendHandler::new(
                pool,
                provider,
                SendSettings {
                    worker: consumer,
                    ..send_settings
                },
                cancel.clone(),
            ));
            herald_worker::run(stores, handler, settings, cancel).await;
        }
        None => {
            let reconciler = tokio::spawn(reconcile_silent(
                pool.clone(),
                args.receipt_window,
                args.reconcile_interval,
                cancel.clone(),
            ));
            let releaser = tokio::spawn(release_held(
                pool.clone(),
                args.hold_receipts_for,
                HELD_RECEIPTS_INTERVAL,
                cancel.clone(),
            ));
            let handler = Arc::new(StatusHandler {
                pool,
                settings: StatusSettings {
                    aliases: args.status_alias.iter().cloned().collect::<HashMap<_, _>>(),
                },
            });
            herald_worker::run(stores, handler, settings, cancel).await;
            let _ = reconciler.await;
            let _ = releaser.await;
        }
    }
    admin_cancel.cancel();
    let _ = admin_task.await;
    tracing::info!("worker stopped");
    Ok(())
}
