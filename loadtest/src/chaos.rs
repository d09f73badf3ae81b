//! Chaos steps: a scenario file schedules actions against a local deployment during the run.
//!
//! ```toml
//! name = "kill the send worker"
//! [[step]]
//! at = "2s"               # since the load started
//! action = "kill"         # kill | term | stop | cont | restart-role | restart-redis | stop-etcd
//!                         # | restart-postgres | kill-postgres
//! role = "send-worker"    # kill, term, stop, cont, restart-role
//! for = "1s"              # kill, term: started again after; stop: SIGCONT after; stop-etcd,
//!                         # restart-postgres, kill-postgres: down for
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use herald_testkit::LocalDeployment;

use crate::breakdown::ScrapeHandle;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(default, rename = "step")]
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(with = "humantime_serde_shim")]
    pub at: Duration,
    pub action: Action,
    pub role: Option<String>,
    /// send or status, for restart-redis.
    pub job_type: Option<String>,
    #[serde(default, rename = "for", with = "humantime_serde_shim::option")]
    pub for_: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// kill -9 the role.
    Kill,
    /// SIGTERM the role and wait for its graceful exit.
    Term,
    /// SIGSTOP the role.
    Stop,
    /// SIGCONT the role.
    Cont,
    /// Start the role again (SIGTERM first if it runs).
    RestartRole,
    /// Stop a job type's Redis and start it again: its streams are gone.
    RestartRedis,
    /// Stop etcd; start it again after `for`.
    StopEtcd,
    /// Shut PostgreSQL down (fast shutdown: sessions ended, clean checkpoint); start it again
    /// after `for` (default at once).
    RestartPostgres,
    /// Crash PostgreSQL: kill -9 every one of its processes at once; start it again after
    /// `for` (default at once), recovering from its WAL.
    KillPostgres,
}

impl Step {
    pub fn describe(&self) -> String {
        let action = serde_json::to_value(self.action)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let target = self
            .role
            .clone()
            .or_else(|| self.job_type.clone())
            .unwrap_or_default();
        let mut text = format!("{action} {target}").trim().to_owned();
        if let Some(d) = self.for_ {
            text.push_str(&format!(" for {}", humantime::format_duration(d)));
        }
        text
    }

    fn validate(&self, roles: &[String]) -> anyhow::Result<()> {
        match self.action {
            Action::Kill | Action::Term | Action::Stop | Action::Cont | Action::RestartRole => {
                let role = self.role.as_deref().ok_or_else(|| {
                    anyhow::anyhow!("step at {:?}: {} needs a role", self.at, self.describe())
                })?;
                anyhow::ensure!(
                    roles.iter().any(|r| r == role),
                    "step at {:?}: no role {role:?} (roles: {})",
                    self.at,
                    roles.join(", ")
                );
            }
            Action::RestartRedis => anyhow::ensure!(
                matches!(self.job_type.as_deref(), Some("send" | "status")),
                "step at {:?}: restart-redis needs job_type = \"send\" or \"status\"",
                self.at
            ),
            Action::StopEtcd => anyhow::ensure!(
                self.for_.is_some(),
                "step at {:?}: stop-etcd needs `for`",
                self.at
            ),
            Action::RestartPostgres | Action::KillPostgres => {}
        }
        Ok(())
    }
}

impl Scenario {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
        toml::from_str(&text).map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))
    }

    /// Every step names a role of the deployment and has what its action needs.
    pub fn validate(&self, roles: &[String]) -> anyhow::Result<()> {
        self.steps.iter().try_for_each(|s| s.validate(roles))
    }
}

/// What one step did, for the report and the plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: String,
    /// Seconds since the load started, when the action began and when it (and its `for`)
    /// ended.
    pub started_s: f64,
    pub ended_s: f64,
    pub ok: bool,
    pub error: Option<String>,
    /// The pid the action was aimed at (roles only).
    pub pid: Option<i32>,
}

/// Runs every step at its time since `started`; returns what each did.
pub async fn run(
    steps: Vec<Step>,
    deployment: Arc<Mutex<LocalDeployment>>,
    scrapes: ScrapeHandle,
    started: Instant,
) -> Vec<StepRecord> {
    let tasks: Vec<_> = steps
        .into_iter()
        .map(|step| {
            let (deployment, scrapes) = (deployment.clone(), scrapes.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(started + step.at).await;
                let started_s = started.elapsed().as_secs_f64();
                let mut pid = None;
                let result = perform(&step, &deployment, &scrapes, &mut pid).await;
                if let Err(err) = &result {
                    tracing::warn!(step = %step.describe(), error = %format!("{err:#}"), "chaos step failed");
                }
                StepRecord {
                    step: step.describe(),
                    started_s,
                    ended_s: started.elapsed().as_secs_f64(),
                    ok: result.is_ok(),
                    error: result.err().map(|e| format!("{e:#}")),
                    pid,
                }
            })
        })
        .collect();
    let mut records = Vec::new();
    for task in tasks {
        if let Ok(record) = task.await {
            records.push(record);
        }
    }
    records.sort_by(|a, b| a.started_s.total_cmp(&b.started_s));
    records
}

async fn perform(
    step: &Step,
    deployment: &Mutex<LocalDeployment>,
    scrapes: &ScrapeHandle,
    pid: &mut Option<i32>,
) -> anyhow::Result<()> {
    let role = step.role.as_deref().unwrap_or_default();
    let grace = Duration::from_secs(15);
    match step.action {
        Action::Kill | Action::Term => {
            scrapes.scrape_role(role).await;
            {
                let mut d = deployment.lock().await;
                let process = d.role(role)?;
                *pid = process.pid();
                if step.action == Action::Kill {
                    process.kill9().await?;
                } else {
                    process.terminate(grace).await?;
                }
            }
            scrapes.restarted(role);
            if let Some(down) = step.for_ {
                tokio::time::sleep(down).await;
                deployment.lock().await.role(role)?.restart().await?;
            }
        }
        Action::Stop => {
            {
                let mut d = deployment.lock().await;
                let process = d.role(role)?;
                *pid = process.pid();
                process.pause()?;
            }
            if let Some(down) = step.for_ {
                tokio::time::sleep(down).await;
                deployment.lock().await.role(role)?.resume()?;
            }
        }
        Action::Cont => {
            let mut d = deployment.lock().await;
            let process = d.role(role)?;
            *pid = process.pid();
            process.resume()?;
        }
        Action::RestartRole => {
            scrapes.scrape_role(role).await;
            let mut d = deployment.lock().await;
            let process = d.role(role)?;
            *pid = process.pid();
            if process.is_running() {
                process.terminate(grace).await?;
            }
            scrapes.restarted(role);
            process.restart().await?;
        }
        Action::RestartRedis => {
            let job_type = step.job_type.as_deref().unwrap_or("send");
            deployment.lock().await.restart_redis(job_type).await?;
        }
        Action::StopEtcd => {
            deployment.lock().await.stop_etcd().await?;
            tokio::time::sleep(step.for_.unwrap_or_default()).await;
            deployment.lock().await.start_etcd().await?;
        }
        Action::RestartPostgres | Action::KillPostgres => {
            let crash = step.action == Action::KillPostgres;
            deployment.lock().await.stop_postgres(crash).await?;
            tokio::time::sleep(step.for_.unwrap_or_default()).await;
            deployment.lock().await.start_postgres().await?;
        }
    }
    Ok(())
}

/// Durations in scenario files are humantime strings ("3s", "1m 30s").
mod humantime_serde_shim {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let text = Option::<String>::deserialize(d)?;
            text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks_a_scenario() {
        let scenario: Scenario = toml::from_str(
            r#"
            name = "mix"
            [[step]]
            at = "2s"
            action = "kill"
            role = "send-worker"
            for = "1s"
            [[step]]
            at = "4s"
            action = "restart-redis"
            job_type = "send"
            [[step]]
            at = "5s"
            action = "stop-etcd"
            for = "3s"
            "#,
        )
        .unwrap();
        assert_eq!(scenario.steps.len(), 3);
        assert_eq!(scenario.steps[0].for_, Some(Duration::from_secs(1)));
        assert_eq!(scenario.steps[0].describe(), "kill send-worker for 1s");
        let roles = vec!["send-worker".to_owned()];
        scenario.validate(&roles).unwrap();
        let bad: Scenario =
            toml::from_str("[[step]]\nat = \"1s\"\naction = \"term\"\nrole = \"poller-9\"\n")
                .unwrap();
        assert!(bad.validate(&roles).is_err());
        assert!(
            toml::from_str::<Scenario>("[[step]]\nat = \"1s\"\naction = \"explode\"\n").is_err()
        );
    }

    #[test]
    fn every_shipped_scenario_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            Scenario::load(&path).unwrap_or_else(|err| panic!("{err:#}"));
        }
    }
}
