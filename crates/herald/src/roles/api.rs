//! `herald api`.

use std::sync::Arc;

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
    if args.max_batch == 0 || args.max_body_bytes == 0 {
        return Err(
            ConfigError("--max-batch and --max-body-bytes must be at least 1".into()).into(),
        );
    }
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&args.database).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let state = ApiState {
        pool: pool.clone(),
        partitions,
        limits: Limits {
            max_body_bytes: args.max_body_bytes,
            max_batch: args.max_batch,
        },
        api_keys: Arc::new(
            args.api_keys
                .into_iter()
                .filter(|k| !k.is_empty())
                .collect(),
        ),
    };
    if state.api_keys.is_empty() {
        tracing::warn!("no API keys configured: /v1 is open to anyone who can reach it");
    }
    let router = herald_api::router(state).merge(telemetry::admin_router(
        metrics,
        super::database_ready(pool),
    ));
    telemetry::serve(args.listen, router, cancel).await
}
