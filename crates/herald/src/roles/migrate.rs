//! `herald migrate`.

use crate::cli::{print_config, ConfigError, MigrateArgs};
use crate::telemetry;

pub async fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    migrate(&args.config).await?;
    Ok(0)
}

/// Brings the schema up to date and sets up the runtime role, if one is named.
pub async fn migrate(config: &herald_store::config::MigrateConfig) -> anyhow::Result<()> {
    let (partitions, password) = config.prepare()?;
    let pool = super::connect(&config.database, false).await?;
    match herald_store::migrate::migrate_with_locks(&pool, partitions, config.locks()).await {
        Ok(()) => tracing::info!(%partitions, "schema is up to date"),
        Err(err @ herald_store::StoreError::PartitionCountMismatch { .. }) => {
            return Err(ConfigError(err.to_string()).into())
        }
        Err(err) => return Err(err.into()),
    }
    if let Some(role) = &config.runtime_role {
        use herald_store::runtime_role::{ensure_runtime_role, RuntimeRoleError};
        match ensure_runtime_role(&pool, role, password.as_deref()).await {
            Ok(()) => tracing::info!(role, "runtime role is set up"),
            Err(RuntimeRoleError::Database(err)) => {
                return Err(anyhow::anyhow!("setting up runtime role {role:?}: {err}"))
            }
            Err(err) => return Err(ConfigError(err.to_string()).into()),
        }
    }
    Ok(())
}
