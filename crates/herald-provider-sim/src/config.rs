//! `herald provider-sim`'s settings: each flag's default and its rules, once. The binary
//! layers a `--config` file, `HERALD_*` variables and flags onto this struct; `herald dev` and
//! the test kit build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use herald_core::config::{parse_pairs, read_secret};
use herald_core::ConfigError;
use serde::Serialize;

use crate::{ReceiptRates, ReceiptSecrets, SimSettings};

#[derive(Debug, Clone, Args, Serialize)]
pub struct SimConfig {
    /// Address the simulator (and its /healthz, /readyz, /metrics) listens on.
    #[arg(long, env = "HERALD_SIM_LISTEN", default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// Gateway names (comma-separated); each key is routed to one by hash.
    #[arg(
        long,
        env = "HERALD_SIM_GATEWAYS",
        value_delimiter = ',',
        default_value = "gw-a,gw-b"
    )]
    pub gateways: Vec<String>,
    /// Provider ids count 1..=N per gateway, then wrap.
    #[arg(long, env = "HERALD_SIM_ID_WRAP", default_value_t = 65_535)]
    pub id_wrap: u32,
    /// Fixed latency of every submit.
    #[arg(long, env = "HERALD_SIM_LATENCY", default_value = "0ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub latency: Duration,
    /// Extra random latency, uniform between 0 and this.
    #[arg(long, env = "HERALD_SIM_JITTER", default_value = "0ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub jitter: Duration,
    /// Share of submits answered 503 without effect (0 to 1).
    #[arg(long, env = "HERALD_SIM_ERROR_RATE", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of submits that take effect but answer only after --timeout-delay (0 to 1).
    #[arg(long, env = "HERALD_SIM_TIMEOUT_RATE", default_value_t = 0.0)]
    pub timeout_rate: f64,
    /// Share of submits refused for their content with 422 and no effect (0 to 1): a
    /// permanent rejection, which Herald records as FAILED.
    #[arg(long, env = "HERALD_SIM_REJECT_RATE", default_value_t = 0.0)]
    pub reject_rate: f64,
    /// Answer every submit with this HTTP status and take no effect, as a gateway Herald is
    /// misconfigured for would (404: wrong URL, 401: wrong credentials).
    #[arg(long, env = "HERALD_SIM_REFUSE_STATUS")]
    pub refuse_status: Option<u16>,
    /// How late a "timed out" submit answers.
    #[arg(long, env = "HERALD_SIM_TIMEOUT_DELAY", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub timeout_delay: Duration,
    /// Append-only record of every submit (read back on start).
    #[arg(
        long,
        env = "HERALD_SIM_LOG",
        default_value = "provider-sim-submits.jsonl"
    )]
    pub log_path: PathBuf,
    /// Herald API base URL to post delivery receipts to (none: no receipts).
    #[arg(long, hide_env_values = true, env = "HERALD_SIM_CALLBACK_URL")]
    pub callback_url: Option<String>,
    /// The secret each gateway signs its receipt posts with, as GATEWAY=SECRET pairs (the same
    /// values as the API's HERALD_RECEIPT_SECRETS; a gateway given twice signs with the last).
    /// A gateway without one posts unsigned, which an API with secrets refuses. Environment
    /// only.
    #[arg(
        long,
        env = "HERALD_SIM_RECEIPT_SECRETS",
        hide_env_values = true,
        value_name = "GATEWAY=SECRET,..."
    )]
    pub receipt_secrets: Option<String>,
    /// A file of receipt secrets, instead of HERALD_SIM_RECEIPT_SECRETS.
    #[arg(long, env = "HERALD_SIM_RECEIPT_SECRETS_FILE")]
    pub receipt_secrets_file: Option<PathBuf>,
    /// Wait before each receipt.
    #[arg(long, env = "HERALD_SIM_RECEIPT_DELAY", default_value = "50ms", value_parser = humantime::parse_duration)]
    #[serde(serialize_with = "herald_core::config::human")]
    pub receipt_delay: Duration,
    /// Share of submits with an intermediate ENROUTE receipt before the final one.
    #[arg(long, env = "HERALD_SIM_ENROUTE_RATE", default_value_t = 0.5)]
    pub enroute_rate: f64,
    /// Share of submits that get ENROUTE and never a final receipt (a silent gateway).
    #[arg(long, env = "HERALD_SIM_SILENT_RATE", default_value_t = 0.0)]
    pub silent_rate: f64,
    /// Share of final receipts with a status outside the known vocabulary.
    #[arg(long, env = "HERALD_SIM_UNKNOWN_STATUS_RATE", default_value_t = 0.0)]
    pub unknown_status_rate: f64,
    /// Share of receipts with a malformed timestamp.
    #[arg(long, env = "HERALD_SIM_BAD_TIMESTAMP_RATE", default_value_t = 0.0)]
    pub bad_timestamp_rate: f64,
    /// Share of final receipts that say UNDELIV.
    #[arg(long, env = "HERALD_SIM_UNDELIVERED_RATE", default_value_t = 0.0)]
    pub undelivered_rate: f64,
    /// Share of final receipts that say EXPIRED.
    #[arg(long, env = "HERALD_SIM_EXPIRED_RATE", default_value_t = 0.0)]
    pub expired_rate: f64,
    /// Most receipts in one post to Herald's batch endpoint; 1 posts each on its own to the
    /// single endpoint (a gateway that cannot batch).
    #[arg(long, env = "HERALD_SIM_RECEIPT_BATCH", default_value_t = 100)]
    pub receipt_batch: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        herald_core::config::defaults(&[])
    }
}

impl SimConfig {
    pub fn check(&self) -> Result<(), ConfigError> {
        self.settings()?
            .validate()
            .map_err(|err| ConfigError(format!("{err:#}")))
    }

    /// The simulator's behaviour, with the receipt secrets read from the environment or their
    /// file.
    pub fn settings(&self) -> Result<SimSettings, ConfigError> {
        Ok(SimSettings {
            gateways: self
                .gateways
                .iter()
                .map(|g| g.trim().to_owned())
                .filter(|g| !g.is_empty())
                .collect(),
            id_wrap: self.id_wrap,
            latency: self.latency,
            jitter: self.jitter,
            error_rate: self.error_rate,
            timeout_rate: self.timeout_rate,
            timeout_delay: self.timeout_delay,
            reject_rate: self.reject_rate,
            refuse_status: self.refuse_status,
            log_path: self.log_path.clone(),
            callback_url: self.callback_url.clone(),
            receipt_secrets: self.receipt_secrets()?,
            receipts: ReceiptRates {
                delay: self.receipt_delay,
                post_batch: self.receipt_batch,
                enroute_rate: self.enroute_rate,
                silent_rate: self.silent_rate,
                unknown_status_rate: self.unknown_status_rate,
                bad_timestamp_rate: self.bad_timestamp_rate,
                undelivered_rate: self.undelivered_rate,
                expired_rate: self.expired_rate,
            },
        })
    }

    /// The gateways' signing secrets; for a gateway given twice, the last (a gateway rotating
    /// its secret signs with the new one).
    fn receipt_secrets(&self) -> Result<ReceiptSecrets, ConfigError> {
        let variable = "HERALD_SIM_RECEIPT_SECRETS";
        let text = read_secret(
            self.receipt_secrets.as_deref(),
            self.receipt_secrets_file.as_deref(),
            variable,
        )?;
        let pairs = parse_pairs(text.as_deref().unwrap_or_default())
            .map_err(|err| ConfigError(format!("{variable}: {err}")))?;
        Ok(ReceiptSecrets(
            pairs
                .into_iter()
                .map(|(gateway, secret)| (gateway, secret.into_bytes()))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_library_defaults_and_rates_are_checked() {
        let config = SimConfig::default();
        config.check().unwrap();
        let settings = config.settings().unwrap();
        assert_eq!(settings.gateways, ["gw-a", "gw-b"]);
        assert_eq!(settings.receipts, ReceiptRates::default());
        let mut config = SimConfig {
            error_rate: 1.5,
            ..SimConfig::default()
        };
        assert!(config.check().unwrap_err().0.contains("error rate"));
        config.error_rate = 0.0;
        config.receipt_secrets = Some("gw-a=old-secret,gw-a=new-secret".into());
        let secrets = config.settings().unwrap().receipt_secrets;
        assert_eq!(secrets.0["gw-a"], b"new-secret");
    }
}
