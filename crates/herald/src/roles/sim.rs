//! `herald provider-sim`.

use std::sync::Arc;

use herald_provider_sim::{ReceiptRates, ReceiptSecrets, SimSettings};
use tokio_util::sync::CancellationToken;

use crate::cli::{print_config, read_secret, ConfigError, SimArgs};
use crate::{shutdown, telemetry};

pub async fn main(args: SimArgs) -> anyhow::Result<i32> {
    if print_config(&args.common, &args) {
        return Ok(0);
    }
    telemetry::init_logs(args.common.log_format);
    run(args, shutdown::on_signal()).await?;
    Ok(0)
}

pub async fn run(args: SimArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let receipt_secrets = receipt_secrets(&args)?;
    let metrics = telemetry::init_metrics()?;
    let settings = SimSettings {
        gateways: args
            .gateways
            .iter()
            .map(|g| g.trim().to_owned())
            .filter(|g| !g.is_empty())
            .collect(),
        id_wrap: args.id_wrap,
        latency: args.latency,
        jitter: args.jitter,
        error_rate: args.error_rate,
        timeout_rate: args.timeout_rate,
        timeout_delay: args.timeout_delay,
        reject_rate: args.reject_rate,
        refuse_status: args.refuse_status,
        log_path: args.log_path.clone(),
        callback_url: args.callback_url.clone(),
        receipt_secrets,
        receipts: ReceiptRates {
            delay: args.receipt_delay,
            post_batch: args.receipt_batch,
            enroute_rate: args.enroute_rate,
            silent_rate: args.silent_rate,
            unknown_status_rate: args.unknown_status_rate,
            bad_timestamp_rate: args.bad_timestamp_rate,
            undelivered_rate: args.undelivered_rate,
            expired_rate: args.expired_rate,
        },
    };
    let router =
        herald_provider_sim::router(settings).map_err(|err| ConfigError(err.to_string()))?;
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
    telemetry::serve(args.listen, router, cancel).await
}

/// The gateways' signing secrets, from HERALD_SIM_RECEIPT_SECRETS or its file; for each gateway
/// given twice, the last (a gateway rotating its secret signs with the new one).
fn receipt_secrets(args: &SimArgs) -> anyhow::Result<ReceiptSecrets> {
    let variable = "HERALD_SIM_RECEIPT_SECRETS";
    let text = read_secret(
        args.receipt_secrets.as_deref(),
        args.receipt_secrets_file.as_deref(),
        variable,
    )?;
    let pairs = herald_api::auth::parse_pairs(text.as_deref().unwrap_or_default())
        .map_err(|err| ConfigError(format!("{variable}: {err}")))?;
    if pairs.is_empty() && args.callback_url.is_some() {
        tracing::warn!(
            "no receipt secrets: receipts are posted unsigned, and an API with secrets refuses them"
        );
    }
    Ok(ReceiptSecrets(
        pairs
            .into_iter()
            .map(|(gateway, secret)| (gateway, secret.into_bytes()))
            .collect(),
    ))
}
