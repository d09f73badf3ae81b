//! A whole local deployment: PostgreSQL, one Redis per job type, etcd, and every role as its
//! own process of the built `herald` binary, with known addresses and pids. `herald dev`, the
//! load tester, its chaos steps and herald's end-to-end tests run this one. Any role can be
//! killed, terminated, paused and started again; Redis restarted; etcd stopped and started.
//! The load tester's chaos steps and tests drive it; dropping it kills everything. It runs as
//! production does: the roles connect as the runtime database role, the API holds a client
//! and an operator key, and the simulator signs its receipts with the API's secrets.
//!
//! Longer than 400 lines: the one deployment builder, with the shapes its three users need
//! (TLS, send shards, a fleet or a lone poller, roles started from flags) and its chaos controls.

use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::Context;
use herald_api::ApiConfig;
use herald_core::JobType;
use herald_poller::config::PollerConfig;
use herald_provider_sim::config::SimConfig;
use herald_worker::config::WorkerConfig;

use crate::config::write_role_config;
use crate::{
    free_port, DeploymentKeys, LocalEtcd, LocalPostgres, LocalRedis, PostgresOptions, RedisOptions,
    RoleProcess, TestCerts,
};

/// The shape of a local deployment. Each role runs with its typed configuration (written as
/// its `--config` file); extra flags are added to its command line and win over the
/// deployment's own setting of the same flag.
#[derive(Debug, Clone)]
pub struct DeploymentOptions {
    /// The `herald` binary whose subcommands run the roles.
    pub herald_bin: PathBuf,
    /// Where servers keep their data and roles their logs (a temporary folder when None).
    pub dir: Option<PathBuf>,
    pub partitions: u32,
    /// Pollers: with `fleet` they share the partitions through etcd (so etcd matters even with
    /// one). 0 starts none (a test then claims by hand or starts its own).
    pub pollers: usize,
    /// PostgreSQL with fsync and synchronous commit (as `herald dev` runs it).
    pub durable: bool,
    /// Shorter recovery timers ([`quick_recovery_poller`], [`quick_recovery_worker`]) so chaos
    /// is recovered within a short run; off, every role runs with Herald's defaults.
    pub quick_recovery: bool,
    /// Pollers share the partitions through etcd, as deployed. Off, pollers run without etcd
    /// and each owns every partition (for a deployment of one poller).
    pub fleet: bool,
    /// Redis instances of the send job type (its shards), at least 1.
    pub send_shards: usize,
    /// `maxmemory` of the send job type's first shard (256 MiB when None).
    pub send_max_memory: Option<u64>,
    /// PostgreSQL, Redis and etcd speak TLS (PostgreSQL plaintext too, for the owner's
    /// queries): every role connects with `verify-full`, `rediss://` and `https://`, trusting
    /// the deployment's CA ([`LocalDeployment::certs`]) and presenting a client certificate
    /// to Redis and etcd.
    pub tls: bool,
    pub api_flags: Vec<String>,
    pub poller_flags: Vec<String>,
    pub send_worker_flags: Vec<String>,
    pub status_worker_flags: Vec<String>,
    pub sim_flags: Vec<String>,
    /// The API's port (a free one when None).
    pub api_port: Option<u16>,
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
            fleet: true,
            send_shards: 1,
            send_max_memory: None,
            tls: false,
            api_flags: Vec::new(),
            poller_flags: Vec::new(),
            send_worker_flags: Vec::new(),
            status_worker_flags: Vec::new(),
            sim_flags: Vec::new(),
            api_port: None,
        }
    }
}

/// Settings that make recovery from chaos fit in a short run: a short etcd lease, quick
/// re-drives of lost rows, short claim leases, quick reclaim of a dead worker's entries. They
/// change how fast Herald notices a failure, not how fast it moves messages: a job waiting in
/// its stream is never re-driven, however long it waits.
pub fn quick_recovery_poller(poller: &mut PollerConfig) {
    poller.lease_ttl = Duration::from_secs(3);
    poller.redrive_interval = Duration::from_secs(1);
    poller.stale_after = Duration::from_secs(20);
    poller.drain_timeout = Duration::from_secs(5);
}

/// The workers' part of [`quick_recovery_poller`].
pub fn quick_recovery_worker(worker: &mut WorkerConfig) {
    worker.reclaim_idle = Duration::from_secs(3);
    worker.provider_timeout = Duration::from_secs(5);
    worker.claim_lease = Duration::from_secs(8);
}

/// One role of the deployment: its process and the base URL of its `/metrics`.
pub struct DeployedRole {
    pub process: RoleProcess,
    pub admin_url: String,
}

pub struct LocalDeployment {
    pub pg: LocalPostgres,
    /// The send job type's first shard.
    pub send_redis: LocalRedis,
    /// The send job type's other shards.
    pub more_send_redis: Vec<LocalRedis>,
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
    certs: Option<TestCerts>,
    herald_bin: PathBuf,
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
        let certs = match options.tls {
            true => Some(TestCerts::generate(&dir.join("certs"))?),
            false => None,
        };
        let server_tls = certs.as_ref().map(TestCerts::server);
        let pg_options = PostgresOptions {
            durable: options.durable,
            max_connections: 300,
            tls: server_tls.clone(),
        };
        let (pg_dir, send_dir, status_dir, etcd_dir) = (
            dir.join("postgres"),
            dir.join("redis-send"),
            dir.join("redis-status"),
            dir.join("etcd"),
        );
        let redis_options = RedisOptions {
            tls: server_tls.clone(),
            ..RedisOptions::default()
        };
        let send_options = RedisOptions {
            max_memory_bytes: options
                .send_max_memory
                .unwrap_or(redis_options.max_memory_bytes),
            ..redis_options.clone()
        };
        let etcd = async {
            match &server_tls {
                Some(tls) => LocalEtcd::start_tls_in(&etcd_dir, tls).await,
                None => LocalEtcd::start_in(&etcd_dir).await,
            }
        };
        let (pg, send_redis, status_redis, etcd) = tokio::try_join!(
            LocalPostgres::start_in(&pg_dir, &pg_options),
            LocalRedis::start_in(&send_dir, &send_options),
            LocalRedis::start_in(&status_dir, &redis_options),
            etcd,
        )?;
        let mut more_send_redis = Vec::new();
        for shard in 1..options.send_shards.max(1) {
            let shard_dir = dir.join(format!("redis-send-{shard}"));
            more_send_redis.push(LocalRedis::start_in(&shard_dir, &redis_options).await?);
        }
        let database_url = pg.create_database("herald").await?;
        // Roles (and the migration) verify the server's certificate and name.
        let verified = |url: &str| match &certs {
            Some(certs) => format!(
                "{url}?sslmode=verify-full&sslrootcert={}",
                certs.ca.display()
            ),
            None => url.to_owned(),
        };
        let keys = DeploymentKeys::generate();
        let migrate = tokio::process::Command::new(&options.herald_bin)
            .args(["migrate", "--database-url", &verified(&database_url)])
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
        let api_port = match options.api_port {
            Some(port) => port,
            None => free_port()?,
        };
        let api_url = format!("http://127.0.0.1:{api_port}");
        let sim_url = format!("http://127.0.0.1:{}", free_port()?);
        let mut deployment = Self {
            pg,
            send_redis,
            more_send_redis,
            status_redis,
            etcd,
            runtime_database_url: verified(&keys.runtime_url(&database_url)?),
            keys,
            database_url,
            sim_log: dir.join("provider-sim-submits.jsonl"),
            api_url,
            sim_url,
            roles: Vec::new(),
            certs,
            herald_bin: options.herald_bin.clone(),
            dir,
            _temp: temp,
        };
        deployment.start_roles(options).await?;
        Ok(deployment)
    }

    /// Starts every role from its typed configuration (written as the role's `--config`
    /// file), with the caller's extra flags on top.
    async fn start_roles(&mut self, options: &DeploymentOptions) -> anyhow::Result<()> {
        let (send, status) = (self.send_urls(), vec![self.status_redis.url()]);
        let sim = SimConfig {
            listen: address(&self.sim_url)?,
            log_path: self.sim_log.clone(),
            callback_url: Some(self.api_url.clone()),
            ..SimConfig::default()
        };
        let sim_url = self.sim_url.clone();
        let sim_flags = &options.sim_flags;
        self.spawn("provider-sim", "provider-sim", &sim, sim_flags, sim_url)
            .await?;

        let mut api = ApiConfig::new(&self.runtime_database_url);
        api.listen = address(&self.api_url)?;
        api.database.database_max_connections = 32;
        api.redis_send_url = send.clone();
        api.redis_status_url = status.clone();
        let api_url = self.api_url.clone();
        self.spawn("api", "api", &api, &options.api_flags, api_url)
            .await?;

        for i in 0..options.pollers {
            let admin = format!("http://127.0.0.1:{}", free_port()?);
            let mut poller = PollerConfig::new(&self.runtime_database_url, &send[0], &status[0]);
            poller.queue.redis_send_url = send.clone();
            poller.poller_id = Some(format!("poller-{i}"));
            poller.admin_listen = address(&admin)?;
            if options.fleet {
                poller.etcd_endpoints = vec![self.etcd.endpoint()];
            }
            poller.database.database_max_connections = 24;
            if options.quick_recovery {
                quick_recovery_poller(&mut poller);
            }
            let name = format!("poller-{i}");
            let flags = &options.poller_flags;
            self.spawn(&name, "poller", &poller, flags, admin).await?;
        }

        for (job_type, redis, extra) in [
            (JobType::Send, &send, &options.send_worker_flags),
            (JobType::Status, &status, &options.status_worker_flags),
        ] {
            let admin = format!("http://127.0.0.1:{}", free_port()?);
            let mut worker = WorkerConfig::new(job_type, &self.runtime_database_url, &redis[0]);
            worker.redis_url = redis.clone();
            worker.admin_listen = address(&admin)?;
            worker.worker_id = Some(format!("{job_type}-worker"));
            worker.database.database_max_connections = 32;
            if job_type == JobType::Send {
                worker.provider_url = Some(self.sim_url.clone());
            }
            if options.quick_recovery {
                quick_recovery_worker(&mut worker);
            }
            let name = format!("{job_type}-worker");
            self.spawn(&name, "worker", &worker, extra, admin).await?;
        }
        Ok(())
    }

    /// Starts `herald <subcommand> --config <its file> <extra…>` as `name`: the file holds
    /// `config`, the caller's flags win over it, and the keys and secrets come from the
    /// environment, as in a deployment.
    async fn spawn<T: serde::Serialize>(
        &mut self,
        name: &str,
        subcommand: &str,
        config: &T,
        extra: &[String],
        admin_url: String,
    ) -> anyhow::Result<()> {
        let file = self.dir.join("config").join(format!("{name}.toml"));
        write_role_config(config, &file)?;
        let mut args = vec![subcommand.to_owned(), "--config".to_owned()];
        args.push(path_str(&file)?.to_owned());
        args.extend(extra.iter().cloned());
        self.spawn_with_env(name, &args, Vec::new(), admin_url)
            .await
    }

    /// Starts one more role, `herald <args…>`, as `name`, with its admin (or API) server at
    /// `admin_url`, and waits until it is healthy. It connects as the runtime role
    /// (`HERALD_DATABASE_URL`) with the deployment's keys and, under TLS, its client
    /// certificates; its flags name everything else (stores, ports).
    pub async fn spawn_role(
        &mut self,
        name: &str,
        args: &[String],
        admin_url: String,
    ) -> anyhow::Result<()> {
        let database = (
            "HERALD_DATABASE_URL".to_owned(),
            self.runtime_database_url.clone(),
        );
        self.spawn_with_env(name, args, vec![database], admin_url)
            .await
    }

    async fn spawn_with_env(
        &mut self,
        name: &str,
        args: &[String],
        mut env: Vec<(String, String)>,
        admin_url: String,
    ) -> anyhow::Result<()> {
        env.push(("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()));
        let subcommand = args.first().map(String::as_str).unwrap_or_default();
        env.extend(self.keys.env_for(subcommand));
        if let Some(certs) = &self.certs {
            for service in ["REDIS", "ETCD"] {
                for (file, path) in [
                    ("CA", &certs.ca),
                    ("CERT", &certs.client_cert),
                    ("KEY", &certs.client_key),
                ] {
                    env.push((
                        format!("HERALD_{service}_{file}_FILE"),
                        path.display().to_string(),
                    ));
                }
            }
        }
        let process = RoleProcess::spawn(
            &self.herald_bin,
            name,
            args,
            &env,
            &self.dir.join("logs"),
            format!("{admin_url}/healthz"),
        )
        .await?;
        self.roles.push(DeployedRole { process, admin_url });
        Ok(())
    }

    /// Every send shard's URL, the first shard first.
    pub fn send_urls(&self) -> Vec<String> {
        std::iter::once(&self.send_redis)
            .chain(&self.more_send_redis)
            .map(LocalRedis::url)
            .collect()
    }

    /// The certificates of a TLS deployment ([`DeploymentOptions::tls`]).
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// The base URL of the admin (or API) server of the role named `name`.
    pub fn admin_url(&self, name: &str) -> Option<&str> {
        self.roles
            .iter()
            .find(|r| r.process.name() == name)
            .map(|r| r.admin_url.as_str())
    }

    /// Every role process, in start order.
    pub fn processes(&self) -> impl Iterator<Item = &RoleProcess> {
        self.roles.iter().map(|r| &r.process)
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
        let shards = self
            .more_send_redis
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("redis-send-{}", i + 1), r.pid()));
        let servers = [
            ("redis-send".to_owned(), self.send_redis.pid()),
            ("redis-status".to_owned(), self.status_redis.pid()),
            ("etcd".to_owned(), self.etcd.pid()),
        ];
        self.roles
            .iter()
            .map(|r| (r.process.name().to_owned(), r.process.pid()))
            .chain(servers)
            .chain(shards)
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

    /// Stops the send or status job type's Redis (the send type's first shard) and starts it
    /// again on the same port.
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

/// The socket address of an `http://host:port` URL.
fn address(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    let host_port = url.trim_start_matches("http://");
    host_port
        .parse()
        .with_context(|| format!("{host_port:?} is no socket address"))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str().context("non-UTF-8 path")
}
