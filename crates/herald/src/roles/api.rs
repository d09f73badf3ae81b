//! `herald api`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use herald_api::auth::{Credentials, Scope};
use herald_api::{ApiConfig, ApiState};
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, ApiArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: ApiArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args.config, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(config: ApiConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    // Every rule and file is checked before anything connects: a bad one is a configuration
    // error (exit 64).
    let herald_api::config::PreparedApi {
        limits,
        groups,
        redis_tls,
        credentials,
    } = config.prepare()?;
    let metrics = telemetry::init_metrics()?;
    let pool = super::connect(&config.database, false).await?;
    let partitions = herald_store::migrate::partition_count(&pool).await?;
    let state = ApiState::new(pool.clone(), partitions, limits, credentials, groups);
    announce(&state.credentials);
    // The queue stores are read for readiness only; the accept path never touches them.
    let monitors_cancel = cancel.child_token();
    let mut stores = Vec::new();
    for (urls, job_type) in [
        (&config.redis_send_url, herald_core::JobType::Send),
        (&config.redis_status_url, herald_core::JobType::Status),
    ] {
        if !urls.is_empty() {
            stores.extend(super::monitored_stores(
                urls,
                job_type,
                2,
                &config.pressure,
                &redis_tls,
                &monitors_cancel,
            )?);
        }
    }
    if stores.is_empty() {
        tracing::warn!("no queue store URLs given: /readyz checks PostgreSQL only");
    }
    let exporting = Arc::new(AtomicBool::new(false));
    tokio::spawn(export_backlog(
        pool.clone(),
        partitions.get(),
        config.backlog_gauge_interval,
        monitors_cancel.clone(),
        exporting.clone(),
    ));
    let redis = stores.iter().map(|m| m.store.clone()).collect();
    let draining = Arc::new(AtomicBool::new(false));
    let readiness = super::api_ready(pool.clone(), stores, draining.clone());
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
    let serving = drain_after(cancel, config.shutdown_delay, draining);
    let backlog = telemetry::Conditional {
        shown: exporting,
        names: &[
            herald_api::metrics::BACKLOG_ROWS,
            herald_api::metrics::OLDEST_PENDING_AGE,
            herald_api::metrics::DEAD_ROWS,
            herald_api::metrics::PARTITIONS,
        ],
    };
    let admin = telemetry::admin_router(metrics, "api", readiness.clone(), Some(backlog));
    match config.admin_listen {
        None => {
            let router = herald_api::router(state).merge(admin);
            telemetry::serve(config.listen, router, serving).await
        }
        Some(admin_addr) => {
            // Probes on both ports (a load balancer may check the serving port); metrics only
            // on the admin port.
            let router = herald_api::router(state).merge(telemetry::probe_router(readiness));
            tokio::try_join!(
                telemetry::serve(config.listen, router, serving.clone()),
                telemetry::serve(admin_addr, admin, serving)
            )?;
            Ok(())
        }
    }
}

/// The token the servers stop on: `delay` after `cancel` (a SIGTERM), during which `draining`
/// is set, so `/readyz` answers 503 while every request still gets its answer.
fn drain_after(
    cancel: CancellationToken,
    delay: std::time::Duration,
    draining: Arc<AtomicBool>,
) -> CancellationToken {
    let serving = CancellationToken::new();
    let stop = serving.clone();
    tokio::spawn(async move {
        cancel.cancelled().await;
        draining.store(true, Ordering::Relaxed);
        if !delay.is_zero() {
            tracing::info!(
                ?delay,
                "draining: /readyz answers 503, requests are still served"
            );
            tokio::time::sleep(delay).await;
        }
        tracing::info!("no longer accepting connections; finishing in-flight requests");
        stop.cancel();
    });
    serving
}

/// Logs what protects the API, and warns about what does not.
fn announce(credentials: &Credentials) {
    tracing::info!(
        client_keys = credentials.key_count(Scope::Client),
        operator_keys = credentials.key_count(Scope::Operator),
        receipt_gateways = ?credentials.gateways(),
        signature_window = ?credentials.signature_window,
        "API credentials"
    );
    if credentials.bearer_open() {
        tracing::warn!(
            "development run without API keys: every /v1 route is open to anyone who can reach it"
        );
    }
    if credentials.receipts_open() {
        tracing::warn!("development run without receipt secrets: receipts are accepted unsigned");
    }
}

/// Sets the backlog gauges every `interval` until `cancel`, on the one API replica of the
/// deployment that holds the exporter's advisory lock (on a connection of its own, so the lock
/// lives exactly as long as that session): `exporting` says whether this is it, and `/metrics`
/// hides the gauges otherwise. Every replica tries for the lock each interval, so another takes
/// over within one when the exporter goes. A failed read keeps the last values (and is counted
/// by the store).
async fn export_backlog(
    pool: sqlx::PgPool,
    partitions: u32,
    interval: std::time::Duration,
    cancel: CancellationToken,
    exporting: Arc<AtomicBool>,
) {
    use herald_api::metrics as m;
    use sqlx::ConnectOptions;
    ::metrics::gauge!(m::PARTITIONS).set(partitions as f64);
    let mut session: Option<sqlx::PgConnection> = None;
    while !cancel.is_cancelled() {
        if session.is_none() {
            match pool.connect_options().connect().await {
                Ok(conn) => session = Some(conn),
                Err(err) => {
                    tracing::warn!(error = %err, "no connection for the backlog exporter's lock")
                }
            }
        }
        // A session that hangs must not keep this replica exporting frozen values.
        let bound = interval.max(std::time::Duration::from_secs(2));
        let leads = match session.as_mut() {
            Some(conn) => {
                match tokio::time::timeout(bound, herald_store::backlog::try_lead_exporter(conn))
                    .await
                {
                    Ok(Ok(leads)) => leads,
                    Ok(Err(err)) => {
                        tracing::warn!(error = %err, "the backlog exporter's session broke");
                        session = None;
                        false
                    }
                    Err(_) => {
                        tracing::warn!("the backlog exporter's session did not answer");
                        session = None;
                        false
                    }
                }
            }
            None => false,
        };
        if leads != exporting.swap(leads, Ordering::Relaxed) {
            tracing::info!(
                exporting = leads,
                "backlog gauges: this replica's turn changed"
            );
        }
        if leads {
            let read = tokio::time::timeout(
                bound,
                herald_store::backlog::outbox_backlog(&pool, partitions),
            )
            .await
            .unwrap_or_else(|_| {
                Err(herald_store::StoreError::OutcomeUnknown(
                    "the backlog query did not answer in time".into(),
                ))
            });
            match read {
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
                Err(err) => {
                    // Stale values must not stand for the backlog: hide them until a read works.
                    exporting.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %err, "reading the outbox backlog failed");
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(interval) => {}
        }
    }
    // A draining replica stops exporting; another takes over.
    exporting.store(false, Ordering::Relaxed);
}
