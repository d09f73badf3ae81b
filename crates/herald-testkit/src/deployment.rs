//! A whole local deployment: PostgreSQL, one Redis per job type, etcd, and every role as its
//! own process of the built `herald` binary, with known addresses and pids. Any role can be
//! killed, terminated, paused and started again; Redis restarted; etcd stopped and started.
//! The load tester's chaos steps and tests drive it; dropping it kills everything. It runs as
//! production does: the roles connect as the runtime database role, the API holds a client
//! and an operator key, and the simulator signs its receipts with the API's secrets.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::{
    free_port, DeploymentKeys, LocalEtcd, LocalPostgres, LocalRedis, PostgresOptions, RedisOptions,
    RoleProcess,
};

/// The shape of a local deployment. Extra flags are added to each role's command line and
/// replace the deployment's own setting of the same flag.
#[derive(Debug, Clone)]
pub struct DeploymentOptions {
    /// The `herald` binary whose subcommands run the roles.
    pub herald_bin: PathBuf,
    /// Where servers keep their data and roles their logs (a temporary folder when None).
    pub dir: Option<PathBuf>,
    pub partitions: u32,
    /// Pollers, sharing the partitions through etcd (so etcd matters even with one).
    pub pollers: usize,
    /// PostgreSQL with fsync and synchronous commit (as `herald dev` runs it).
    pub durable: bool,
    /// Shorter recovery timers ([`quick_recovery_flags`]) so chaos is recovered within a short
    /// run; off, every role runs with Herald's defaults.
    pub quick_recovery: bool,
    pub api_flags: Vec<String>,
    pub poller_flags: Vec<String>,
    pub send_worker_flags: Vec<String>,
    pub status_worker_flags: Vec<String>,
    pub sim_flags: Vec<String>,
}

impl DeploymentOptions {
    pub fn new(herald_bin: PathBuf) -> Self {
        Self {
            herald_bin,
            dir: None,
            partitions: 16,
            pollers: 1,
            durable: false,
            quick_recovery: false,
            api_flags: Vec::new(),
            poller_flags: Vec::new(),
            send_worker_flags: Vec::new(),
            status_worker_flags: Vec::new(),
            sim_flags: Vec::new(),
        }
    }
}

/// Flags that make recovery from chaos fit in a short run: a short etcd lease, quick
/// re-drives of lost rows, short claim leases, quick reclaim of a dead worker's entries. They
/// change how fast Herald notices a failure, not how fast it moves messages: a job waiting in
/// its stream is never re-driven, however long it waits.
pub fn quick_recovery_flags(role: &str) -> Vec<String> {
    let flags: &[&str] = match role {
        "poller" => &[
            "--lease-ttl",
            "3s",
            "--redrive-interval",
            "1s",
            "--stale-after",
            "20s",
            "--drain-timeout",
            "5s",
        ],
        "worker" => &[
            "--reclaim-idle",
            "3s",
            "--provider-timeout",
            "5s",
            "--claim-lease",
            "8s",
        ],
        _ => &[],
    };
    flags.iter().map(|f| (*f).to_owned()).collect()
}

fn quick(options: &DeploymentOptions, role: &str) -> Vec<String> {
    if options.quick_recovery {
        quick_recovery_flags(role)
    } else {
        Vec::new()
    }
}

/// One role of the deployment: its process and the base URL of its `/metrics`.
pub struct DeployedRole {
    pub process: RoleProcess,
    pub admin_url: String,
}

pub struct LocalDeployment {
    pub pg: LocalPostgres,
    pub send_redis: LocalRedis,
    pub status_redis: LocalRedis,
    pub etcd: LocalEtcd,
    /// The database as its owner (what the proof and the cost probe read with).
    pub database_url: String,
    /// The database as the runtime role, which every role connects as.
    pub runtime_database_url: String,
    /// The API's keys and the gateways' receipt secrets.
    pub keys: DeploymentKeys,
    pub api_url: String,
    pub sim_url: String,
    /// The simulator's append-only submit record (JSON lines with timestamps).
    pub sim_log: PathBuf,
    roles: Vec<DeployedRole>,
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl LocalDeployment {
    /// Starts the servers, migrates a fresh database and starts every role, each healthy
    /// before the next starts.
    pub async fn start(options: &DeploymentOptions) -> anyhow::Result<Self> {
        crate::packages::ensure_installed().await?;
        let (temp, dir) = match &options.dir {
            Some(dir) => {
                if dir.exists() {
                    std::fs::remove_dir_all(dir)?;
                }
                std::fs::create_dir_all(dir)?;
                (None, std::fs::canonicalize(dir)?)
            }
            None => {
                let temp = tempfile::Builder::new().prefix("herald-local-").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let pg_options = PostgresOptions {
            durable: options.durable,
            max_connections: 300,
            ..PostgresOptions::default()
        };
        let (pg_dir, send_dir, status_dir, etcd_dir) = (
            dir.join("postgres"),
            dir.join("redis-send"),
            dir.join("redis-status"),
            dir.join("etcd"),
        );
        let redis_options = RedisOptions::default();
        let (pg, send_redis, status_redis, etcd) = tokio::try_join!(
            LocalPostgres::start_in(&pg_dir, &pg_options),
            LocalRedis::start_in(&send_dir, &redis_options),
            LocalRedis::start_in(&status_dir, &redis_options),
            LocalEtcd::start_in(&etcd_dir),
        )?;
        let database_url = pg.create_database("herald").await?;
        let keys = DeploymentKeys::generate();
        let migrate = tokio::process::Command::new(&options.herald_bin)
            .args(["migrate", "--database-url", &database_url])
            .args(["--partitions", &options.partitions.to_string()])
            .args(["--log-format", "pretty"])
            .envs(keys.migrate_env())
            .output()
            .await
            .with_context(|| format!("running {} migrate", options.herald_bin.display()))?;
        anyhow::ensure!(
            migrate.status.success(),
            "herald migrate failed: {}",
            String::from_utf8_lossy(&migrate.stderr)
        );
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let api_url = format!("http://127.0.0.1:{}", free_port()?);
        let sim_url = format!("http://127.0.0.1:{}", free_port()?);
        let mut deployment = Self {
            pg,
            send_redis,
            status_redis,
            etcd,
            runtime_database_url: keys.runtime_url(&database_url)?,
            keys,
            database_url,
            sim_log: dir.join("provider-sim-submits.jsonl"),
            api_url,
            sim_url,
            roles: Vec::new(),
            dir,
            _temp: temp,
        };
        deployment.start_roles(options).await?;
        Ok(deployment)
    }

    async fn start_roles(&mut self, options: &DeploymentOptions) -> anyhow::Result<()> {
        let (send, status) = (self.send_redis.url(), self.status_redis.url());
        let sim_listen = address(&self.sim_url);
        let api_listen = address(&self.api_url);
        let sim = merge_flags(
            &[
                strings(&["provider-sim", "--listen", &sim_listen]),
                strings(&["--log-path", path_str(&self.sim_log)?]),
                strings(&["--callback-url", &self.api_url]),
            ]
            .concat(),
            &options.sim_flags,
        );
        let sim_url = self.sim_url.clone();
        self.spawn(options, "provider-sim", sim, sim_url).await?;

        let api = merge_flags(
            &[
                strings(&["api", "--listen", &api_listen]),
                strings(&["--redis-send-url", &send, "--redis-status-url", &status]),
                strings(&["--database-max-connections", "32"]),
            ]
            .concat(),
            &options.api_flags,
        );
        let api_url = self.api_url.clone();
        self.spawn(options, "api", api, api_url).await?;

        for i in 0..options.pollers.max(1) {
            let admin = format!("http://127.0.0.1:{}", free_port()?);
            let poller = [
                strings(&["poller", "--poller-id", &format!("poller-{i}")]),
                strings(&["--admin-listen", &address(&admin)]),
                strings(&["--redis-send-url", &send, "--redis-status-url", &status]),
                strings(&["--etcd-endpoints", &self.etcd.endpoint()]),
                strings(&["--database-max-connections", "24"]),
                quick(options, "poller"),
            ]
            .concat();
            let poller = merge_flags(&poller, &options.poller_flags);
            self.spawn(options, &format!("poller-{i}"), poller, admin)
                .await?;
        }

        for (job_type, redis, extra) in [
            ("send", &send, &options.send_worker_flags),
            ("status", &status, &options.status_worker_flags),
        ] {
            let admin = format!("http://127.0.0.1:{}", free_port()?);
            let mut worker = [
                strings(&["worker", "--job-type", job_type, "--redis-url", redis]),
                strings(&["--admin-listen", &address(&admin)]),
                strings(&["--worker-id", &format!("{job_type}-worker")]),
                strings(&["--database-max-connections", "32"]),
                quick(options, "worker"),
            ]
            .concat();
            if job_type == "send" {
                worker.extend(strings(&["--provider-url", &self.sim_url]));
            }
            let worker = merge_flags(&worker, extra);
            self.spawn(options, &format!("{job_type}-worker"), worker, admin)
                .await?;
        }
        Ok(())
    }

    async fn spawn(
        &mut self,
        options: &DeploymentOptions,
        name: &str,
        args: Vec<String>,
        admin_url: String,
    ) -> anyhow::Result<()> {
        let mut env = vec![
            (
                "HERALD_DATABASE_URL".to_owned(),
                self.runtime_database_url.clone(),
            ),
            ("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()),
        ];
        let subcommand = args.first().map(String::as_str).unwrap_or_default();
        env.extend(self.keys.env_for(subcommand));
        let process = RoleProcess::spawn(
            &options.herald_bin,
            name,
            &args,
            &env,
            &self.dir.join("logs"),
            format!("{admin_url}/healthz"),
        )
        .await?;
        self.roles.push(DeployedRole { process, admin_url });
        Ok(())
    }

    /// Every role's name and the base URL of its `/metrics`, in start order.
    pub fn metrics_urls(&self) -> Vec<(String, String)> {
        self.roles
            .iter()
            .map(|r| (r.process.name().to_owned(), r.admin_url.clone()))
            .collect()
    }

    /// The pid of every running process of the deployment but PostgreSQL (whose backends
    /// come and go: find them from `pg.data_dir()`), by name: each role, each Redis, etcd.
    pub fn pids(&self) -> Vec<(String, i32)> {
        let servers = [
            ("redis-send", self.send_redis.pid()),
            ("redis-status", self.status_redis.pid()),
            ("etcd", self.etcd.pid()),
        ];
        self.roles
            .iter()
            .map(|r| (r.process.name().to_owned(), r.process.pid()))
            .chain(servers.into_iter().map(|(n, pid)| (n.to_owned(), pid)))
            .filter_map(|(name, pid)| Some((name, pid?)))
            .collect()
    }

    pub fn role_names(&self) -> Vec<String> {
        self.roles
            .iter()
            .map(|r| r.process.name().to_owned())
            .collect()
    }

    /// The role named `name`.
    pub fn role(&mut self, name: &str) -> anyhow::Result<&mut RoleProcess> {
        let known = self.role_names().join(", ");
        self.roles
            .iter_mut()
            .map(|r| &mut r.process)
            .find(|p| p.name() == name)
            .with_context(|| format!("no role {name:?} in this deployment (roles: {known})"))
    }

    /// The folder holding the servers' data and the roles' logs (`logs/<role>.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the send or status job type's Redis and starts it again on the same port.
    /// Redis keeps nothing on disk, so every stream entry is gone: the outbox re-drive
    /// (rule R3) has to bring the jobs back.
    pub async fn restart_redis(&mut self, job_type: &str) -> anyhow::Result<()> {
        let redis = match job_type {
            "send" => &mut self.send_redis,
            "status" => &mut self.status_redis,
            other => anyhow::bail!("no Redis for job type {other:?} (send or status)"),
        };
        redis.stop().await?;
        redis.restart().await
    }

    /// PostgreSQL down: a fast shutdown (`crash` false: SIGINT, sessions ended, a clean
    /// checkpoint) or a crash (every process killed at once, recovery from WAL at the next
    /// start). [`start_postgres`](Self::start_postgres) brings it back on the same port.
    pub async fn stop_postgres(&mut self, crash: bool) -> anyhow::Result<()> {
        if crash {
            self.pg.crash().await
        } else {
            self.pg.stop().await
        }
    }

    pub async fn start_postgres(&mut self) -> anyhow::Result<()> {
        self.pg.restart().await
    }

    pub async fn stop_etcd(&mut self) -> anyhow::Result<()> {
        self.etcd.stop().await
    }

    pub async fn start_etcd(&mut self) -> anyhow::Result<()> {
        self.etcd.restart().await
    }
}

/// `base` without the flags `extra` sets, then `extra`: a flag given twice is an error for
/// the roles' command line, so the caller's wins by replacing ours.
pub fn merge_flags(base: &[String], extra: &[String]) -> Vec<String> {
    let named = |flag: &str| {
        extra
            .iter()
            .any(|e| e == flag || e.starts_with(&format!("{flag}=")))
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < base.len() {
        let flag = base[i].split('=').next().unwrap_or_default().to_owned();
        let takes_value =
            !base[i].contains('=') && base.get(i + 1).is_some_and(|next| !next.starts_with("--"));
        let width = if takes_value { 2 } else { 1 };
        if !(flag.starts_with("--") && named(&flag)) {
            out.extend(base[i..i + width].iter().cloned());
        }
        i += width;
    }
    out.extend(extra.iter().cloned());
    out
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| (*p).to_owned()).collect()
}

/// `host:port` of an `http://host:port` URL.
fn address(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str().context("non-UTF-8 path")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_given_by_the_caller_replaces_ours() {
        let base = strings(&[
            "poller",
            "--stale-after",
            "20s",
            "--lease-ttl=3s",
            "--fleet",
        ]);
        let extra = strings(&["--stale-after=2m", "--lease-ttl", "10s"]);
        assert_eq!(
            merge_flags(&base, &extra),
            strings(&[
                "poller",
                "--fleet",
                "--stale-after=2m",
                "--lease-ttl",
                "10s"
            ])
        );
    }
}
