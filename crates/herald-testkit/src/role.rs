//! Herald's roles as separate processes of the built `herald` binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;

use crate::process::{Launch, Managed};
use crate::wait_until;

/// One `herald <role>` process with its admin (or API) address for health checks.
pub struct RoleProcess {
    name: String,
    process: Managed,
    health_url: String,
}

impl RoleProcess {
    /// Starts `binary args…` with `env`, logging to `<log_dir>/<name>.log`, and waits until
    /// `health_url` answers 200.
    pub async fn spawn(
        binary: &Path,
        name: &str,
        args: &[String],
        env: &[(String, String)],
        log_dir: &Path,
        health_url: String,
    ) -> anyhow::Result<Self> {
        let process = Managed::spawn(Launch {
            program: PathBuf::from(binary),
            args: args.to_vec(),
            env: env.to_vec(),
            user: None,
            log: log_dir.join(format!("{name}.log")),
        })?;
        let role = Self {
            name: name.to_owned(),
            process,
            health_url,
        };
        role.wait_healthy().await?;
        Ok(role)
    }

    async fn wait_healthy(&self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        wait_until(&self.name, Duration::from_secs(30), || {
            let request = client.get(&self.health_url).timeout(Duration::from_secs(1));
            async move {
                let status = request.send().await?.status();
                anyhow::ensure!(status.is_success(), "healthz answered {status}");
                Ok(())
            }
        })
        .await
        .with_context(|| format!("{} log:\n{}", self.name, self.process.log_tail(4000)))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the process was started and not stopped or killed since (a process that
    /// exited by itself still counts until it is stopped).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    pub fn pid(&self) -> Option<i32> {
        self.process.pid()
    }

    pub async fn kill9(&mut self) -> anyhow::Result<()> {
        self.process.kill9().await
    }

    /// SIGTERM and wait for the graceful exit; returns false if it had to be killed.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<bool> {
        self.process.stop_with(Signal::SIGTERM, grace).await
    }

    pub fn pause(&self) -> anyhow::Result<()> {
        self.process.signal(Signal::SIGSTOP)
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.process.signal(Signal::SIGCONT)
    }

    /// Starts the same command again and waits until it is healthy.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process.start()?;
        self.wait_healthy().await
    }

    pub fn log_tail(&self, max_bytes: usize) -> String {
        self.process.log_tail(max_bytes)
    }
}
