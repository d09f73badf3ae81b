//! `herald poller`.

use std::collections::HashMap;

use herald_coord::Coordinator;
use herald_core::JobType;
use herald_poller::fleet::{Fleet, FleetSettings};
use herald_poller::{Ownership, Poller, PollerSettings, StaticOwnership};

use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, process_name, ConfigError, PollerArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: PollerArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(args: PollerArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    if args.lease_ttl < std::time::Duration::from_secs(2) {
        return Err(ConfigError("--lease-ttl must be at least 2s".into()).into());
    }
    if args.batch_size == 0 || args.max_batches_per_tick == 0 {
        return Err(ConfigError(
            "--batch-size and --max-batches-per-tick must be at least 1".into(),
        )
        .into());
    }
    // Every file is read before anything connects: a bad one is a configuration error.
    let redis_tls = args.queue.redis_tls.load()?;
    let etcd_access = etcd_access(&args)?;
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&args.database, true).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let admin_cancel = CancellationToken::new();
    let (queue, pressure) = (&args.queue, &args.queue.pressure);
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
    let admin_task = tokio::spawn(telemetry::serve(
        args.admin_listen,
        admin,
        admin_cancel.clone(),
    ));

    let owner = args
        .poller_id
        .clone()
        .unwrap_or_else(|| process_name("poller"));
    let poller = Poller::new(
        pool.clone(),
        HashMap::from([
            (JobType::Send, send_stores),
            (JobType::Status, status_stores),
        ]),
        PollerSettings {
            batch_size: args.batch_size,
            max_batches_per_tick: args.max_batches_per_tick,
            publish_concurrency: args.publish_concurrency,
            linger: args.batch_linger,
            poll_interval: args.poll_interval,
            idle_poll_interval: args.idle_poll_interval,
            redrive_interval: args.redrive_interval,
            stale_after: args.stale_after,
            ..PollerSettings::default()
        },
    );
    let result = if args.etcd_endpoints.is_empty() {
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
            &args.etcd_endpoints,
            &args.etcd_prefix,
            std::time::Duration::from_secs(2),
            &etcd_access,
        )
        .await
        .map_err(|err| anyhow::anyhow!("cannot reach etcd at {:?}: {err}", args.etcd_endpoints))?;
        let fleet = Fleet {
            poller,
            coord,
            pool,
            partitions,
            settings: FleetSettings {
                member: owner,
                lease_ttl: args.lease_ttl,
                drain_timeout: args.drain_timeout,
            },
        };
        fleet.run(cancel).await
    };
    admin_cancel.cancel();
    let _ = admin_task.await;
    tracing::info!("poller stopped");
    result
}

/// TLS material and the user for etcd, from their files and variables.
fn etcd_access(args: &PollerArgs) -> anyhow::Result<herald_coord::EtcdAccess> {
    let tls = crate::cli::client_tls(
        "--etcd",
        args.etcd_ca_file.as_deref(),
        args.etcd_cert_file.as_deref(),
        args.etcd_key_file.as_deref(),
    )?;
    let password = crate::cli::read_secret(
        args.etcd_password.as_deref(),
        args.etcd_password_file.as_deref(),
        "HERALD_ETCD_PASSWORD",
    )?;
    let user = match (&args.etcd_user, password) {
        (None, None) => None,
        (Some(user), Some(password)) => Some((user.clone(), password)),
        (Some(_), None) => {
            return Err(ConfigError(
                "--etcd-user needs HERALD_ETCD_PASSWORD or HERALD_ETCD_PASSWORD_FILE".into(),
            )
            .into())
        }
        (None, Some(_)) => {
            return Err(
                ConfigError("HERALD_ETCD_PASSWORD is set without --etcd-user".into()).into(),
            )
        }
    };
    Ok(herald_coord::EtcdAccess { tls, user })
}
