//! One module per subcommand. Each role has `main` (the subcommand: logs, signals, exit code)
//! and `run` (the role itself, cancelled by a token), so `herald dev` can run them all in one
//! process.

pub mod api;
pub mod archive;
#[cfg(feature = "dev")]
pub mod dev;
pub mod migrate;
pub mod plan;
pub mod poller;
pub mod sim;
pub mod verify;
pub mod worker;

use std::sync::Arc;

use herald_core::JobType;
use herald_queue::config::PressureConfig;
use herald_queue::monitor::MonitoredStore;
use herald_queue::{QueueStore, StoreSettings};
use herald_store::config::DatabaseConfig;
use sqlx::PgPool;

use crate::cli::ConfigError;
use crate::telemetry::Readiness;

/// Opens the role's PostgreSQL pool (its settings checked by the role's `prepare`).
/// `generic_plans`: the role runs a few batched statements
/// all the time (workers, pollers; see `herald_store::GENERIC_PLANS`).
pub async fn connect(database: &DatabaseConfig, generic_plans: bool) -> anyhow::Result<PgPool> {
    let pool = herald_store::connect(&database.pool(generic_plans))
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {}: {err}",
                crate::cli::masked_url(&database.database_url)
            )
        })?;
    Ok(pool)
}

/// Ready when PostgreSQL and every queue store shard answer.
pub fn database_and_queue_ready(pool: PgPool, stores: Vec<QueueStore>) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        let stores = stores.clone();
        Box::pin(async move {
            herald_store::ping(&pool)
                .await
                .map_err(|err| format!("PostgreSQL: {err}"))?;
            for store in &stores {
                store
                    .ping()
                    .await
                    .map_err(|err| format!("queue store {}: {err}", store.stream_key()))?;
            }
            Ok(Vec::new())
        })
    })
}

/// The queue stores of `job_type`, each read in the background (gauges, backpressure).
pub fn monitored_stores(
    urls: &[String],
    job_type: JobType,
    max_connections: usize,
    pressure: &PressureConfig,
    tls: &herald_core::ClientTls,
    cancel: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Vec<MonitoredStore>> {
    Ok(queue_stores(urls, job_type, max_connections, tls)?
        .into_iter()
        .map(|store| {
            MonitoredStore::start(
                store,
                pressure.queue_full_threshold,
                pressure.queue_check_interval,
                cancel.clone(),
            )
        })
        .collect())
}

/// The API's readiness: this replica can take requests when PostgreSQL answers and it is not
/// draining for a shutdown. A full or unreachable queue store does not make it unready (the
/// accept path never touches Redis, messages wait in the outbox; every replica shares the
/// store, so turning them all unready would leave the Service with no endpoint at all): it is
/// reported as a note in `/readyz`'s answer instead.
pub fn api_ready(
    pool: PgPool,
    stores: Vec<MonitoredStore>,
    draining: Arc<std::sync::atomic::AtomicBool>,
) -> Readiness {
    Arc::new(move || {
        let pool = pool.clone();
        let notes: Vec<String> = stores
            .iter()
            .filter_map(|s| s.describe_pressure())
            .collect();
        let draining = draining.load(std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move {
            if draining {
                return Err("shutting down: finishing in-flight requests".to_owned());
            }
            herald_store::ping(&pool)
                .await
                .map_err(|err| format!("PostgreSQL: {err}"))?;
            Ok(notes)
        })
    })
}

/// One queue store per shard URL of `job_type`; `rediss://` URLs connect with `tls`.
pub fn queue_stores(
    urls: &[String],
    job_type: JobType,
    max_connections: usize,
    tls: &herald_core::ClientTls,
) -> anyhow::Result<Vec<QueueStore>> {
    if urls.is_empty() {
        return Err(ConfigError(format!("no Redis URL for job type {job_type}")).into());
    }
    urls.iter()
        .enumerate()
        .map(|(shard, url)| {
            QueueStore::with_tls(
                &StoreSettings {
                    url: url.trim().to_owned(),
                    job_type,
                    shard: shard as u32,
                    max_connections,
                },
                tls,
            )
            .map_err(|err| {
                ConfigError(format!("Redis URL {}: {err}", crate::cli::masked_url(url))).into()
            })
        })
        .collect()
}
