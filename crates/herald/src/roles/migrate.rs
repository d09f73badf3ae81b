//! `herald migrate`.

use herald_core::PartitionCount;

use crate::cli::{print_config, read_secret, ConfigError, MigrateArgs};
use crate::telemetry;

pub async fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    let partitions =
        PartitionCount::new(args.partitions).map_err(|err| ConfigError(err.to_string()))?;
    let password = read_secret(
        args.runtime_role_password.as_deref(),
        args.runtime_role_password_file.as_deref(),
        "HERALD_RUNTIME_ROLE_PASSWORD",
    )?;
    if password.is_some() && args.runtime_role.is_none() {
        return Err(ConfigError(
            "a runtime role password is set but no --runtime-role (HERALD_RUNTIME_ROLE) names the role".into(),
        )
        .into());
    }
    let pool = super::connect(&args.database, false).await?;
    let locks = herald_store::migrate::LockPolicy {
        lock_timeout: args.lock_timeout,
        attempts: args.lock_attempts,
    };
    match herald_store::migrate::migrate_with_locks(&pool, partitions, locks).await {
        Ok(()) => tracing::info!(%partitions, "schema is up to date"),
        Err(err @ herald_store::StoreError::PartitionCountMismatch { .. }) => {
            return Err(ConfigError(err.to_string()).into())
        }
        Err(err) => return Err(err.into()),
    }
    if let Some(role) = &args.runtime_role {
        use herald_store::runtime_role::{ensure_runtime_role, RuntimeRoleError};
        match ensure_runtime_role(&pool, role, password.as_deref()).await {
            Ok(()) => tracing::info!(role, "runtime role is set up"),
            Err(RuntimeRoleError::Database(err)) => {
                return Err(anyhow::anyhow!("setting up runtime role {role:?}: {err}"))
            }
            Err(err) => return Err(ConfigError(err.to_string()).into()),
        }
    }
    Ok(0)
}
