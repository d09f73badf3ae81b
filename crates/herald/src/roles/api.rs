//! `herald api`.

use herald_api::{ApiState, Limits};
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, ApiArgs, ConfigError};
use crate::{shutdown, telemetry};

pub async fn main(args: ApiArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(args: ApiArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    if args.max_batch == 0
        || args.max_body_bytes == 0
        || args.group_max == 0
        || args.group_parallel == 0
    {
        return Err(ConfigError(
            "--max-batch, --max-body-bytes, --group-max and --group-parallel must be at least 1"
                .into(),
        )
        .into());
    }
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&args.database).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let state = ApiState::new(
        pool.clone(),
        partitions,
        Limits {
            max_body_bytes: args.max_body_bytes,
            max_batch: args.max_batch,
            require_idempotency_key: args.require_idempotency_key,
        },
        args.api_keys,
        herald_store::group::GroupSettings {
            max_group: args.group_max,
            parallel: args.group_parallel,
        },
    );
    if state.api_keys.is_empty() {
        tracing::warn!("no API keys configured: /v1 is open to anyone who can reach it");
    }
    // The queue stores are read for readiness only; the accept path never touches them.
    let monitors_cancel = cancel.child_token();
    let mut stores = Vec::new();
    for (urls, job_type) in [
        (&args.redis_send_url, herald_core::JobType::Send),
        (&args.redis_status_url, herald_core::JobType::Status),
    ] {
        if !urls.is_empty() {
            stores.extend(super::monitored_stores(
                urls,
                job_type,
                2,
                &args.pressure,
                &monitors_cancel,
            )?);
        }
    }
    if stores.is_empty() {
        tracing::warn!("no queue store URLs given: /readyz checks PostgreSQL only");
    }
    tokio::spawn(export_backlog(
        pool.clone(),
        partitions.get(),
        args.backlog_gauge_interval,
        monitors_cancel.clone(),
    ));
    let redis = stores.iter().map(|m| m.store.clone()).collect();
    let readiness = super::database_and_pressure_ready(pool.clone(), stores);
    telemetry::spawn_role_gauges(
        telemetry::Watched {
            role: "api",
            readiness: readiness.clone(),
            postgres: Some(pool),
            redis,
        },
        telemetry::ROLE_GAUGE_INTERVAL,
        monitors_cancel,
    );
    let router =
        herald_api::router(state).merge(telemetry::admin_router(metrics, "api", readiness));
    telemetry::serve(args.listen, router, cancel).await
}

/// Sets the backlog gauges every `interval` until `cancel`: one query over the rows a partial
/// index covers. A failed read keeps the last values (and is counted by the store).
async fn export_backlog(
    pool: sqlx::PgPool,
    partitions: u32,
    interval: std::time::Duration,
    cancel: CancellationToken,
) {
    use herald_api::metrics as m;
    ::metrics::gauge!(m::PARTITIONS).set(partitions as f64);
    while !cancel.is_cancelled() {
        match herald_store::backlog::outbox_backlog(&pool, partitions).await {
            Ok(backlog) => {
                for p in &backlog.partitions {
                    let partition = p.partition.to_string();
                    ::metrics::gauge!(m::BACKLOG_ROWS, "partition" => partition.clone())
                        .set(p.rows as f64);
                    ::metrics::gauge!(m::OLDEST_PENDING_AGE, "partition" => partition)
                        .set(p.oldest_pending_age_seconds);
                }
                ::metrics::gauge!(m::DEAD_ROWS).set(backlog.dead_rows as f64);
            }
            Err(err) => tracing::warn!(error = %err, "reading the outbox backlog failed"),
        }
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
