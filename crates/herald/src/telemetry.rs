//! Logs, metrics and the health endpoints every role serves.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::cli::LogFormat;

/// Starts logging: JSON lines for production roles, human-readable for `herald dev`.
/// `RUST_LOG` filters (default `info`).
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}

/// The process's one recorder; `herald dev` runs several roles that all ask for it.
static METRICS: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder once per process and declares every metric.
pub fn init_metrics() -> anyhow::Result<PrometheusHandle> {
    let mut installed = METRICS
        .lock()
        .map_err(|_| anyhow::anyhow!("metrics lock poisoned"))?;
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0,
        ])?
        .install_recorder()?;
    herald_store::metrics::describe();
    herald_queue::metrics::describe();
    herald_queue::monitor::describe();
    herald_api::metrics::describe();
    herald_poller::metrics::describe();
    herald_worker::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    *installed = Some(handle.clone());
    Ok(handle)
}

/// A readiness check: `Err(reason)` turns `/readyz` into 503 with the reason.
pub type Readiness =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// `/healthz` (the process answers), `/readyz` (its dependencies answer) and `/metrics`.
pub fn admin_router(handle: PrometheusHandle, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match tokio::time::timeout(Duration::from_secs(2), readiness()).await {
                        Ok(Ok(())) => (StatusCode::OK, "ready\n".to_owned()),
                        Ok(Err(reason)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {reason}\n"),
                        ),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "not ready: checks timed out\n".to_owned(),
                        ),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        handle.render(),
                    )
                        .into_response()
                }
            }),
        )
}

/// Serves `router` on `addr` until `cancel`.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("cannot listen on {addr}: {err}"))?;
    tracing::info!(%addr, "listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await?;
    Ok(())
}
