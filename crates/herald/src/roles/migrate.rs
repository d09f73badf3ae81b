//! `herald migrate`.

use herald_core::PartitionCount;

use crate::cli::{print_config, ConfigError, MigrateArgs};
use crate::telemetry;

pub async fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    let partitions =
        PartitionCount::new(args.partitions).map_err(|err| ConfigError(err.to_string()))?;
    let pool = super::connect(&args.database).await?;
    match herald_store::migrate::migrate(&pool, partitions).await {
        Ok(()) => {
            tracing::info!(%partitions, "schema is up to date");
            Ok(0)
        }
        Err(err @ herald_store::StoreError::PartitionCountMismatch { .. }) => {
            Err(ConfigError(err.to_string()).into())
        }
        Err(err) => Err(err.into()),
    }
}
