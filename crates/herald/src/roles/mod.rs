//! One module per subcommand. Each role has `main` (the subcommand: logs, signals, exit code)
//! and `run` (the role itself, cancelled by a token), so `herald dev` can run them all in one
//! process.

pub mod api;
pub mod dev;
pub mod migrate;
pub mod poller;
pub mod sim;
pub mod verify;
pub mod worker;

use std::sync::Arc;

use herald_store::PoolSettings;
use sqlx::PgPool;

use crate::cli::{ConfigError, DatabaseArgs};
use crate::telemetry::Readiness;

/// Opens the role's PostgreSQL pool.
pub async fn connect(database: &DatabaseArgs) -> anyhow::Result<PgPool> {
    if database.database_max_connections == 0 {
        return Err(ConfigError("--database-max-connections must be at least 1".to_owned()).into());
    }
    let pool = herald_store::connect(&PoolSettings {
        url: database.database_url.clone(),
        max_connections: database.database_max_connections,
        acquire_timeout: std::time::Duration::from_secs(5),
    })
    .await
    .map_err(|err| {
        anyhow::anyhow!(
            "cannot connect to PostgreSQL at {}: {err}",
            crate::cli::masked_url(&database.database_url)
        )
    })?;
    Ok(pool)
}

/// Ready when PostgreSQL answers.
pub fn database_ready(pool: PgPool) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            herald_store::ping(&pool)
                .await
                .map_err(|err| format!("PostgreSQL: {err}"))
        })
    })
}

/// Ready when PostgreSQL and the queue store answer.
pub fn database_and_queue_ready(pool: PgPool, store: herald_queue::QueueStore) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        let store = store.clone();
        Box::pin(async move {
            herald_store::ping(&pool)
                .await
                .map_err(|err| format!("PostgreSQL: {err}"))?;
            store
                .ping()
                .await
                .map_err(|err| format!("queue store {}: {err}", store.job_type()))
        })
    })
}
