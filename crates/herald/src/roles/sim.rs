//! `herald provider-sim`.

use std::sync::Arc;

use herald_provider_sim::config::SimConfig;
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, ConfigError, SimArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: SimArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args.config, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(config: SimConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    let settings = config.settings()?;
    if settings.receipt_secrets.0.is_empty() && settings.callback_url.is_some() {
        tracing::warn!(
            "no receipt secrets: receipts are posted unsigned, and an API with secrets refuses them"
        );
    }
    let metrics = telemetry::init_metrics()?;
    let (router, background) =
        herald_provider_sim::simulator(settings).map_err(|err| ConfigError(err.to_string()))?;
    let always_ready: telemetry::Readiness = Arc::new(|| Box::pin(async { Ok(Vec::new()) }));
    telemetry::spawn_role_gauges(
        telemetry::Watched {
            role: "provider_sim",
            readiness: always_ready.clone(),
            postgres: None,
            redis: Vec::new(),
        },
        telemetry::ROLE_GAUGE_INTERVAL,
        cancel.clone(),
    );
    let router = router.merge(telemetry::admin_router(
        metrics,
        "provider_sim",
        always_ready,
        None,
    ));
    telemetry::serve(config.listen, router, cancel).await?;
    let running = background.running();
    if running > 0 {
        tracing::info!(
            running,
            grace = ?SHUTDOWN_GRACE,
            "waiting for receipt deliveries still running"
        );
    }
    let dropped = background.finish(SHUTDOWN_GRACE).await;
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "stopping with receipt deliveries still running: their receipts are never posted \
             (Herald marks such messages UNKNOWN after its reconciliation window)"
        );
    }
    Ok(())
}

/// How long a stopping simulator waits for the receipts it still owes: inside Kubernetes'
/// default 30 s termination grace period.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);
