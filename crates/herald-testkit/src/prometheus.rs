//! A Prometheus server of our own (Debian's `prometheus` package): scrapes the given targets
//! every second and loads rule files, so tests can evaluate dashboard queries and alert rules
//! against the metrics the roles really export.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::process::{Launch, Managed};
use crate::redis::which;
use crate::{free_port, wait_until};

/// One scrape job: its `job` label and the `host:port` addresses serving `/metrics`.
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    pub job: String,
    pub targets: Vec<String>,
}

pub struct LocalPrometheus {
    _process: Managed,
    port: u16,
    client: reqwest::Client,
    _temp: tempfile::TempDir,
}

impl LocalPrometheus {
    /// Starts Prometheus scraping `jobs` every second with `rule_files` loaded (evaluated every
    /// second too).
    pub async fn start(jobs: &[ScrapeJob], rule_files: &[PathBuf]) -> anyhow::Result<Self> {
        let program = which("prometheus")
            .context("prometheus is not installed: install the prometheus package")?;
        let temp = tempfile::Builder::new()
            .prefix("herald-prometheus-")
            .tempdir()?;
        let config = temp.path().join("prometheus.yml");
        std::fs::write(&config, config_text(jobs, rule_files)?)?;
        let port = free_port()?;
        let args = vec![
            format!("--config.file={}", utf8(&config)?),
            format!("--storage.tsdb.path={}", utf8(&temp.path().join("data"))?),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".to_owned(),
        ];
        let process = Managed::spawn(Launch {
            program,
            args,
            env: Vec::new(),
            user: None,
            log: temp.path().join("prometheus.log"),
        })?;
        let prometheus = Self {
            _process: process,
            port,
            client: reqwest::Client::new(),
            _temp: temp,
        };
        let ready = format!("{}/-/ready", prometheus.url());
        let client = prometheus.client.clone();
        wait_until("prometheus", Duration::from_secs(30), || {
            let request = client.get(&ready).timeout(Duration::from_secs(1));
            async move {
                anyhow::ensure!(request.send().await?.status().is_success(), "not ready");
                Ok(())
            }
        })
        .await
        .with_context(|| prometheus._process.log_tail(2000))?;
        Ok(prometheus)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Runs an instant query; returns the result vector (or an error with Prometheus's reason).
    pub async fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let answer: Value = self
            .client
            .get(format!("{}/api/v1/query", self.url()))
            .query(&[("query", expr)])
            .send()
            .await?
            .json()
            .await?;
        anyhow::ensure!(
            answer["status"] == "success",
            "query {expr:?} failed: {} {}",
            answer["errorType"],
            answer["error"]
        );
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Every metric name Prometheus has stored from its scrapes.
    pub async fn metric_names(&self) -> anyhow::Result<Vec<String>> {
        let answer: Value = self
            .client
            .get(format!("{}/api/v1/label/__name__/values", self.url()))
            .send()
            .await?
            .json()
            .await?;
        Ok(answer["data"]
            .as_array()
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The loaded rule groups, as `/api/v1/rules` answers them.
    pub async fn rules(&self) -> anyhow::Result<Value> {
        let answer: Value = self
            .client
            .get(format!("{}/api/v1/rules", self.url()))
            .send()
            .await?
            .json()
            .await?;
        Ok(answer["data"]["groups"].clone())
    }
}

fn config_text(jobs: &[ScrapeJob], rule_files: &[PathBuf]) -> anyhow::Result<String> {
    let mut text =
        String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n");
    for file in rule_files {
        text.push_str(&format!("  - {:?}\n", utf8(file)?));
    }
    text.push_str("scrape_configs:\n");
    for job in jobs {
        text.push_str(&format!(
            "  - job_name: {:?}\n    static_configs:\n      - targets: [{}]\n",
            job.job,
            job.targets
                .iter()
                .map(|t| format!("{t:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(text)
}

fn utf8(path: &Path) -> anyhow::Result<&str> {
    path.to_str().context("non-UTF-8 path")
}
