//! A local deployment: servers from the test kit, roles as processes of the built binary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use herald_testkit::{free_port, LocalEtcd, LocalPostgres, LocalRedis, RoleProcess};
use serde_json::{json, Value};
use sqlx::PgPool;

pub const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// Knobs a test may turn.
#[derive(Debug, Clone)]
pub struct Options {
    pub partitions: u32,
    /// Extra `herald provider-sim` flags.
    pub sim_flags: Vec<String>,
    /// Extra `herald worker` flags.
    pub worker_flags: Vec<String>,
    /// Extra `herald poller` flags.
    pub poller_flags: Vec<String>,
    /// How many pollers; with `fleet` they share the partitions through etcd.
    pub pollers: usize,
    pub fleet: bool,
    /// Redis instances of the send job type (shards).
    pub send_shards: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            partitions: 16,
            sim_flags: Vec::new(),
            worker_flags: Vec::new(),
            poller_flags: Vec::new(),
            pollers: 1,
            fleet: false,
            send_shards: 1,
        }
    }
}

pub struct Deployment {
    pub pg: LocalPostgres,
    pub redis: LocalRedis,
    /// Send shards after the first (`redis` is shard 0).
    pub more_redis: Vec<LocalRedis>,
    pub etcd: LocalEtcd,
    pub database_url: String,
    pub pool: PgPool,
    pub api_url: String,
    pub sim_url: String,
    pub poller_admins: Vec<String>,
    pub worker_admin: String,
    pub roles: Vec<RoleProcess>,
    pub client: reqwest::Client,
    pub logs: tempfile::TempDir,
}

impl Deployment {
    pub async fn start(options: Options) -> Self {
        let (pg, redis, etcd) = tokio::join!(
            LocalPostgres::start(),
            LocalRedis::start(),
            LocalEtcd::start()
        );
        let (pg, redis, etcd) = (
            pg.expect("postgres"),
            redis.expect("redis"),
            etcd.expect("etcd"),
        );
        let database_url = pg.create_database("herald").await.expect("database");
        let status = tokio::process::Command::new(HERALD)
            .args(["migrate", "--database-url", &database_url])
            .args(["--partitions", &options.partitions.to_string()])
            .status()
            .await
            .unwrap();
        assert!(status.success(), "herald migrate failed");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&database_url)
            .await
            .unwrap();
        let logs = tempfile::Builder::new()
            .prefix("herald-it-")
            .tempdir()
            .unwrap();
        let port = || free_port().unwrap();
        let (api_port, sim_port, worker_port) = (port(), port(), port());
        let poller_ports: Vec<u16> = (0..options.pollers).map(|_| port()).collect();
        let mut deployment = Self {
            api_url: format!("http://127.0.0.1:{api_port}"),
            sim_url: format!("http://127.0.0.1:{sim_port}"),
            poller_admins: poller_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            worker_admin: format!("http://127.0.0.1:{worker_port}"),
            pg,
            redis,
            more_redis: Vec::new(),
            etcd,
            database_url,
            pool,
            roles: Vec::new(),
            client: reqwest::Client::new(),
            logs,
        };
        for _ in 1..options.send_shards {
            deployment
                .more_redis
                .push(LocalRedis::start().await.expect("redis shard"));
        }
        let send_urls = deployment.send_urls().join(",");
        let sim_log = deployment.logs.path().join("submits.jsonl");
        let mut sim = args(&[
            "provider-sim",
            "--listen",
            &format!("127.0.0.1:{sim_port}"),
            "--log-path",
            sim_log.to_str().unwrap(),
        ]);
        sim.extend(options.sim_flags.iter().cloned());
        deployment
            .spawn(
                "provider-sim",
                sim,
                format!("{}/healthz", deployment.sim_url),
            )
            .await;

        let api = args(&["api", "--listen", &format!("127.0.0.1:{api_port}")]);
        deployment
            .spawn("api", api, format!("{}/healthz", deployment.api_url))
            .await;

        for (i, poller_port) in poller_ports.iter().enumerate() {
            let mut poller = args(&[
                "poller",
                "--poller-id",
                &format!("poller-{i}"),
                "--admin-listen",
                &format!("127.0.0.1:{poller_port}"),
                "--redis-send-url",
                &send_urls,
                "--poll-interval",
                "100ms",
            ]);
            if options.fleet {
                poller.extend(args(&["--etcd-endpoints", &deployment.etcd.endpoint()]));
            }
            poller.extend(options.poller_flags.iter().cloned());
            let health = format!("{}/healthz", deployment.poller_admins[i]);
            deployment
                .spawn(&format!("poller-{i}"), poller, health)
                .await;
        }

        let mut worker = args(&[
            "worker",
            "--job-type",
            "send",
            "--admin-listen",
            &format!("127.0.0.1:{worker_port}"),
            "--redis-url",
            &send_urls,
            "--provider-url",
            &deployment.sim_url,
        ]);
        worker.extend(options.worker_flags.iter().cloned());
        deployment
            .spawn(
                "worker",
                worker,
                format!("{}/healthz", deployment.worker_admin),
            )
            .await;
        deployment
    }

    /// Starts one more role process named `name`.
    pub async fn spawn(&mut self, name: &str, args: Vec<String>, health: String) {
        let env = vec![
            ("HERALD_DATABASE_URL".to_owned(), self.database_url.clone()),
            ("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()),
        ];
        let role = RoleProcess::spawn(
            PathBuf::from(HERALD).as_path(),
            name,
            &args,
            &env,
            self.logs.path(),
            health,
        )
        .await
        .unwrap_or_else(|err| panic!("{name} did not start: {err:#}"));
        self.roles.push(role);
    }

    /// Every send shard's URL, shard 0 first.
    pub fn send_urls(&self) -> Vec<String> {
        std::iter::once(&self.redis)
            .chain(&self.more_redis)
            .map(|r| r.url())
            .collect()
    }

    /// The role process named `name`.
    pub fn role(&mut self, name: &str) -> &mut RoleProcess {
        self.roles
            .iter_mut()
            .find(|r| r.name() == name)
            .unwrap_or_else(|| panic!("no role {name}"))
    }

    /// Sends `count` messages in batches; returns every id the API accepted.
    pub async fn send(&self, count: usize, batch: usize, in_flight: usize) -> Vec<String> {
        use futures::StreamExt;
        let ranges: Vec<std::ops::Range<usize>> = (0..count)
            .step_by(batch)
            .map(|start| start..(start + batch).min(count))
            .collect();
        let answers: Vec<Vec<String>> = futures::stream::iter(ranges)
            .map(|range| async move {
                let messages: Vec<Value> = range
                    .map(|i| json!({"recipient": format!("+1555{i:07}"), "body": {"n": i}}))
                    .collect();
                let response = self
                    .client
                    .post(format!("{}/v1/messages/batch", self.api_url))
                    .json(&json!({ "messages": messages }))
                    .send()
                    .await
                    .expect("API reachable");
                assert_eq!(response.status(), 202);
                let answer: Value = response.json().await.unwrap();
                answer["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .buffered(in_flight)
            .collect()
            .await;
        answers.into_iter().flatten().collect()
    }

    /// Waits until the ledger holds `count` rows; panics with the role logs after `timeout`.
    pub async fn wait_delivered(&self, count: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let delivered: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if delivered >= count {
                return;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .roles
                    .iter()
                    .map(|r| format!("--- {} ---\n{}", r.name(), r.log_tail(3000)))
                    .collect();
                panic!(
                    "only {delivered} of {count} delivered after {timeout:?}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `herald verify`; returns its exit code and output.
    pub async fn verify(&self) -> (i32, String) {
        let out = tokio::process::Command::new(HERALD)
            .args([
                "verify",
                "--database-url",
                &self.database_url,
                "--provider-sim",
                &self.sim_url,
            ])
            .output()
            .await
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    pub async fn metrics(&self, admin: &str) -> String {
        self.client
            .get(format!("{admin}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
