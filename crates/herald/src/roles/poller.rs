//! `herald poller`.

use std::collections::HashMap;

use herald_core::JobType;
use herald_poller::{Ownership, Poller, PollerSettings, StaticOwnership};
use herald_queue::{QueueStore, StoreSettings};
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
    if args.batch_size == 0 || args.max_batches_per_tick == 0 || args.max_attempts == 0 {
        return Err(ConfigError(
            "--batch-size, --max-batches-per-tick and --max-attempts must be at least 1".into(),
        )
        .into());
    }
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&args.database).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let send_store = QueueStore::new(&StoreSettings {
        url: args.queue.redis_send_url.clone(),
        job_type: JobType::Send,
        max_connections: args.queue.redis_max_connections,
    })
    .map_err(|err| ConfigError(format!("--redis-send-url: {err}")))?;
    let admin = telemetry::admin_router(
        metrics,
        super::database_and_queue_ready(pool.clone(), send_store.clone()),
    );
    let admin_cancel = CancellationToken::new();
    let admin_task = tokio::spawn(telemetry::serve(
        args.admin_listen,
        admin,
        admin_cancel.clone(),
    ));

    let owner = args
        .poller_id
        .clone()
        .unwrap_or_else(|| process_name("poller"));
    let fences = StaticOwnership {
        pool: pool.clone(),
        owner: owner.clone(),
        partitions,
    }
    .acquire()
    .await?;
    tracing::info!(%owner, partitions = fences.len(), "owning every partition");
    let poller = Poller::new(
        pool,
        HashMap::from([(JobType::Send, send_store)]),
        PollerSettings {
            batch_size: args.batch_size,
            max_batches_per_tick: args.max_batches_per_tick,
            poll_interval: args.poll_interval,
            redrive_interval: args.redrive_interval,
            stale_after: args.stale_after,
            max_attempts: args.max_attempts,
            ..PollerSettings::default()
        },
    );
    let result = poller.run(fences, cancel).await;
    admin_cancel.cancel();
    let _ = admin_task.await;
    tracing::info!("poller stopped");
    result
}
