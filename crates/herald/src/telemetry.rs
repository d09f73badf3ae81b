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
    describe();
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

/// 1 when the role's `/readyz` would answer 200, else 0, by role.
pub const READY: &str = "herald_ready";
/// A connection pool's limit, by pool (`postgres`, `redis`; Redis pools also by job type and
/// shard).
pub const POOL_MAX: &str = "herald_pool_max_connections";
/// Open connections of a pool, idle or in use.
pub const POOL_OPEN: &str = "herald_pool_connections";
pub const POOL_IN_USE: &str = "herald_pool_in_use_connections";
/// Callers waiting for a connection (Redis pools; sqlx does not expose its waiters).
pub const POOL_WAITERS: &str = "herald_pool_waiters";

fn describe() {
    metrics::describe_gauge!(
        READY,
        "1 when the role's /readyz answers 200, else 0, by role."
    );
    metrics::describe_gauge!(POOL_MAX, "A connection pool's limit, by pool.");
    metrics::describe_gauge!(POOL_OPEN, "Open connections of a pool, idle or in use.");
    metrics::describe_gauge!(POOL_IN_USE, "Connections of a pool in use now.");
    metrics::describe_gauge!(
        POOL_WAITERS,
        "Callers waiting for a Redis pool connection, by job type and shard."
    );
}

/// What a role's gauges watch besides its own work: readiness and its connection pools.
pub struct Watched {
    pub role: &'static str,
    pub readiness: Readiness,
    pub postgres: Option<sqlx::PgPool>,
    pub redis: Vec<herald_queue::QueueStore>,
}

/// Sets `herald_ready` and the pool gauges every `interval` until `cancel`, so an alert on
/// readiness does not depend on somebody probing `/readyz`.
pub fn spawn_role_gauges(watched: Watched, interval: Duration, cancel: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let ready = matches!(
                tokio::time::timeout(Duration::from_secs(2), (watched.readiness)()).await,
                Ok(Ok(_))
            );
            metrics::gauge!(READY, "role" => watched.role).set(if ready { 1.0 } else { 0.0 });
            if let Some(pool) = &watched.postgres {
                let (open, idle) = (pool.size() as f64, pool.num_idle() as f64);
                let max = pool.options().get_max_connections() as f64;
                metrics::gauge!(POOL_MAX, "pool" => "postgres").set(max);
                metrics::gauge!(POOL_OPEN, "pool" => "postgres").set(open);
                metrics::gauge!(POOL_IN_USE, "pool" => "postgres").set(open - idle);
            }
            for store in &watched.redis {
                let status = store.pool_status();
                let labels = [
                    ("pool", "redis".to_owned()),
                    ("job_type", store.job_type().as_str().to_owned()),
                    ("shard", store.shard().to_string()),
                ];
                metrics::gauge!(POOL_MAX, &labels).set(status.max_size as f64);
                metrics::gauge!(POOL_OPEN, &labels).set(status.size as f64);
                let in_use = status.size.saturating_sub(status.available);
                metrics::gauge!(POOL_IN_USE, &labels).set(in_use as f64);
                metrics::gauge!(POOL_WAITERS, &labels).set(status.waiting as f64);
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });
}

/// How often [`spawn_role_gauges`] reads readiness and the pools.
pub const ROLE_GAUGE_INTERVAL: Duration = Duration::from_secs(2);

/// A readiness check: `Err(reason)` turns `/readyz` into 503 with the reason.
/// A role's readiness check: `Ok(notes)` when it can serve (notes: what an operator should know,
/// e.g. a full queue store the API does not need), `Err(reason)` when it cannot.
pub type Readiness = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Vec<String>, String>> + Send>> + Send + Sync,
>;

/// `/healthz` and `/readyz` without `/metrics`, for a port the API's clients reach.
pub fn probe_router(readiness: Readiness) -> Router {
    probes(readiness, None)
}

/// Metrics a process exports only while `shown` is true (the API's backlog gauges: one
/// replica of a deployment exports them).
#[derive(Clone)]
pub struct Conditional {
    pub shown: Arc<std::sync::atomic::AtomicBool>,
    pub names: &'static [&'static str],
}

impl Conditional {
    /// `text` without the series (and HELP/TYPE lines) of `names` while not shown.
    fn filter(&self, text: String) -> String {
        if self.shown.load(std::sync::atomic::Ordering::Relaxed) {
            return text;
        }
        text.lines()
            .filter(|line| {
                let name = match line.strip_prefix("# ") {
                    Some(comment) => comment.split_whitespace().nth(1).unwrap_or_default(),
                    None => line.split(['{', ' ']).next().unwrap_or_default(),
                };
                !self.names.contains(&name)
            })
            .flat_map(|line| [line, "\n"])
            .collect()
    }
}

/// `/healthz` (the process answers), `/readyz` (its dependencies answer) and `/metrics`
/// (without `conditional`'s metrics while it hides them).
pub fn admin_router(
    handle: PrometheusHandle,
    role: &'static str,
    readiness: Readiness,
    conditional: Option<Conditional>,
) -> Router {
    probes(readiness, Some(role)).route(
        "/metrics",
        get(move || {
            let (handle, conditional) = (handle.clone(), conditional.clone());
            async move {
                let mut text = handle.render();
                if let Some(conditional) = &conditional {
                    text = conditional.filter(text);
                }
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
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
    serve_on(bind(addr).await?, router, cancel).await
}

/// Binds `addr` now, so a role whose server runs in a task of its own fails at start when
/// the address is taken, instead of running on without it.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("cannot listen on {addr}: {err}"))?;
    tracing::info!(%addr, "listening");
    Ok(listener)
}

/// Serves `router` on a bound listener until `cancel`.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await?;
    Ok(())
}

/// `/healthz` and `/readyz`; with a role, each readiness answer also sets its `herald_ready`.
fn probes(readiness: Readiness, role: Option<&'static str>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    let answer = tokio::time::timeout(Duration::from_secs(2), readiness()).await;
                    if let Some(role) = role {
                        let ready = matches!(answer, Ok(Ok(_)));
                        metrics::gauge!(READY, "role" => role).set(if ready { 1.0 } else { 0.0 });
                    }
                    match answer {
                        Ok(Ok(notes)) if notes.is_empty() => (StatusCode::OK, "ready\n".to_owned()),
                        Ok(Ok(notes)) => (StatusCode::OK, format!("ready; {}\n", notes.join("; "))),
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
}
