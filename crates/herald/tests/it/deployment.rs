//! A local deployment: servers from the test kit, roles as processes of the built binary. It
//! runs with production's credentials: the roles connect as the runtime database role, the API
//! holds random client and operator keys ([`Deployment::client`] sends the operator key), and
//! the simulator signs its receipts with the API's secrets.
//!
//! Longer than 400 lines: the deployment builder of the end-to-end tests with its chaos controls;
//! merging it with `herald_testkit::LocalDeployment` (one builder) is open work.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_client::wire::{BatchItem, SendRequest};
use herald_testkit::{
    free_port, DeploymentKeys, LocalEtcd, LocalPostgres, LocalRedis, PostgresOptions, RedisOptions,
    RoleProcess, TestCerts,
};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// Knobs a test may turn.
#[derive(Debug, Clone)]
pub struct Options {
    pub partitions: u32,
    /// Extra `herald provider-sim` flags.
    pub sim_flags: Vec<String>,
    /// Extra `herald worker --job-type send` flags.
    pub worker_flags: Vec<String>,
    /// Extra `herald worker --job-type status` flags.
    pub status_worker_flags: Vec<String>,
    /// Extra `herald poller` flags.
    pub poller_flags: Vec<String>,
    /// Extra `herald api` flags.
    pub api_flags: Vec<String>,
    /// How many pollers; with `fleet` they share the partitions through etcd.
    pub pollers: usize,
    pub fleet: bool,
    /// Redis instances of the send job type (shards).
    pub send_shards: usize,
    /// `maxmemory` of the send store (shard 0).
    pub send_max_memory: Option<u64>,
    /// PostgreSQL, both Redis and etcd speak TLS only (PostgreSQL also plaintext, for the
    /// test's own queries): every role connects with `verify-full`, `rediss://` and `https://`,
    /// trusting the test CA and presenting a client certificate to Redis and etcd.
    pub tls: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            partitions: 16,
            sim_flags: Vec::new(),
            worker_flags: Vec::new(),
            status_worker_flags: Vec::new(),
            poller_flags: Vec::new(),
            api_flags: Vec::new(),
            pollers: 1,
            fleet: false,
            send_shards: 1,
            send_max_memory: None,
            tls: false,
        }
    }
}

pub struct Deployment {
    pub pg: LocalPostgres,
    pub redis: LocalRedis,
    /// Send shards after the first (`redis` is shard 0).
    pub more_redis: Vec<LocalRedis>,
    pub etcd: LocalEtcd,
    /// The database as its owner: for the test's own queries and `herald verify`.
    pub database_url: String,
    /// The database as the runtime role, which every role connects as.
    pub runtime_database_url: String,
    /// The API's keys and the gateways' receipt secrets.
    pub keys: DeploymentKeys,
    pub pool: PgPool,
    pub api_url: String,
    pub sim_url: String,
    pub poller_admins: Vec<String>,
    pub worker_admin: String,
    pub status_worker_admin: String,
    /// The status job type's queue store.
    pub status_redis: LocalRedis,
    pub roles: Vec<RoleProcess>,
    /// Sends the operator key with every request (to any role).
    pub client: reqwest::Client,
    /// The API's client, with the operator key.
    pub api: herald_client::Client,
    pub logs: tempfile::TempDir,
    /// The certificates of a TLS deployment.
    pub certs: Option<TestCerts>,
}

impl Deployment {
    pub async fn start(options: Options) -> Self {
        let logs = tempfile::Builder::new()
            .prefix("herald-it-")
            .tempdir()
            .unwrap();
        let certs = options
            .tls
            .then(|| TestCerts::generate(&logs.path().join("certs")).expect("certificates"));
        let server_tls = certs.as_ref().map(TestCerts::server);
        let send_options = RedisOptions {
            max_memory_bytes: options.send_max_memory.unwrap_or(256 << 20),
            tls: server_tls.clone(),
        };
        let status_options = RedisOptions {
            tls: server_tls.clone(),
            ..RedisOptions::default()
        };
        let pg_options = PostgresOptions {
            tls: server_tls.clone(),
            ..PostgresOptions::default()
        };
        let etcd = async {
            match &server_tls {
                Some(tls) => LocalEtcd::start_tls(tls).await,
                None => LocalEtcd::start().await,
            }
        };
        let (pg, redis, status_redis, etcd) = tokio::join!(
            LocalPostgres::start_with(&pg_options),
            LocalRedis::start_with(&send_options),
            LocalRedis::start_with(&status_options),
            etcd
        );
        let (pg, redis, status_redis, etcd) = (
            pg.expect("postgres"),
            redis.expect("redis"),
            status_redis.expect("redis"),
            etcd.expect("etcd"),
        );
        let database_url = pg.create_database("herald").await.expect("database");
        // Roles (and the migration) verify the server's certificate and name.
        let verified = |url: &str| match &certs {
            Some(certs) => format!(
                "{url}?sslmode=verify-full&sslrootcert={}",
                certs.ca.display()
            ),
            None => url.to_owned(),
        };
        let keys = DeploymentKeys::generate();
        let status = tokio::process::Command::new(HERALD)
            .args(["migrate", "--database-url", &verified(&database_url)])
            .args(["--partitions", &options.partitions.to_string()])
            .envs(keys.migrate_env())
            .status()
            .await
            .unwrap();
        assert!(status.success(), "herald migrate failed");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&database_url)
            .await
            .unwrap();
        let port = || free_port().unwrap();
        let (api_port, sim_port, worker_port, status_port) = (port(), port(), port(), port());
        let poller_ports: Vec<u16> = (0..options.pollers).map(|_| port()).collect();
        let mut deployment = Self {
            api_url: format!("http://127.0.0.1:{api_port}"),
            sim_url: format!("http://127.0.0.1:{sim_port}"),
            poller_admins: poller_ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            worker_admin: format!("http://127.0.0.1:{worker_port}"),
            status_worker_admin: format!("http://127.0.0.1:{status_port}"),
            status_redis,
            pg,
            redis,
            more_redis: Vec::new(),
            etcd,
            runtime_database_url: verified(&keys.runtime_url(&database_url).unwrap()),
            database_url,
            pool,
            roles: Vec::new(),
            client: keys.operator_client().unwrap(),
            api: herald_client::Client::from_http(
                &format!("http://127.0.0.1:{api_port}"),
                keys.operator_client().unwrap(),
            ),
            keys,
            logs,
            certs,
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
            "--callback-url",
            &format!("http://127.0.0.1:{api_port}"),
        ]);
        sim.extend(options.sim_flags.iter().cloned());
        deployment
            .spawn(
                "provider-sim",
                sim,
                format!("{}/healthz", deployment.sim_url),
            )
            .await;

        let mut api = args(&[
            "api",
            "--listen",
            &format!("127.0.0.1:{api_port}"),
            "--redis-send-url",
            &send_urls,
            "--redis-status-url",
            &deployment.status_redis.url(),
        ]);
        api.extend(options.api_flags.iter().cloned());
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
                "--redis-status-url",
                &deployment.status_redis.url(),
                "--poll-interval",
                "100ms",
                "--idle-poll-interval",
                "400ms",
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
        let mut status_worker = args(&[
            "worker",
            "--job-type",
            "status",
            "--admin-listen",
            &format!("127.0.0.1:{status_port}"),
            "--redis-url",
            &deployment.status_redis.url(),
        ]);
        status_worker.extend(options.status_worker_flags.iter().cloned());
        let health = format!("{}/healthz", deployment.status_worker_admin);
        deployment
            .spawn("status-worker", status_worker, health)
            .await;
        deployment
    }

    /// Starts one more role process named `name`.
    pub async fn spawn(&mut self, name: &str, args: Vec<String>, health: String) {
        let mut env = vec![
            (
                "HERALD_DATABASE_URL".to_owned(),
                self.runtime_database_url.clone(),
            ),
            ("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()),
        ];
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

    /// Starts one more role on a free admin port (appended as `--admin-listen`) and returns
    /// its admin base URL.
    pub async fn spawn_with_admin(&mut self, name: &str, mut role_args: Vec<String>) -> String {
        let port = free_port().unwrap();
        let admin = format!("http://127.0.0.1:{port}");
        role_args.extend(args(&["--admin-listen", &format!("127.0.0.1:{port}")]));
        self.spawn(name, role_args, format!("{admin}/healthz"))
            .await;
        admin
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
                let messages = range.map(|i| item(format!("+1555{i:07}"), i)).collect();
                let answer = self.api.send_batch(messages).await.expect("API accepts");
                answer.messages.iter().map(|m| m.id.to_string()).collect()
            })
            .buffered(in_flight)
            .collect()
            .await;
        answers.into_iter().flatten().collect()
    }

    /// Waits until the ledger holds `count` rows; panics with the role logs after `timeout`.
    pub async fn wait_delivered(&self, count: i64, timeout: Duration) {
        self.wait_for("SELECT count(*) FROM ledger", count, timeout)
            .await
    }

    /// GET a JSON document from the API.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get_json_from(&self.api_url, path).await
    }

    /// GET a JSON document from any role.
    pub async fn get_json_from(&self, base: &str, path: &str) -> Value {
        self.client
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Changes the simulator's injected error and timeout rates.
    pub async fn set_faults(&self, error_rate: f64, timeout_rate: f64) {
        let response = self
            .client
            .put(format!("{}/v1/faults", self.sim_url))
            .json(&json!({"error_rate": error_rate, "timeout_rate": timeout_rate}))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }

    /// The sum of every series of `name` (any labels) on a role's /metrics.
    pub async fn metric(&self, admin: &str, name: &str) -> f64 {
        herald_testkit::metric_value(&self.metrics(admin).await, name, "").unwrap_or(0.0)
    }

    /// A message's history as the API reads it (the derived QUEUED first): (state, detail),
    /// oldest first.
    pub async fn history(&self, id: &str) -> Vec<(String, Value)> {
        let id: uuid::Uuid = id.parse().unwrap();
        herald_store::messages::message_with_history(&self.pool, id)
            .await
            .unwrap()
            .map(|view| {
                view.events
                    .into_iter()
                    .map(|event| (event.state, event.detail))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How often the provider saw each idempotency key.
    pub async fn provider_submits(&self) -> std::collections::HashMap<String, u64> {
        let text = self
            .client
            .get(format!("{}/v1/submits", self.sim_url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .map(|line| {
                let (key, n) = line.rsplit_once(' ').unwrap();
                (key.to_owned(), n.parse().unwrap())
            })
            .collect()
    }

    /// Waits until `count_sql` (a `SELECT count(*)`) reaches `count`.
    pub async fn wait_for(&self, count_sql: &str, count: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let now: i64 = sqlx::query_scalar(count_sql)
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if now >= count {
                return;
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .roles
                    .iter()
                    .map(|r| format!("--- {} ---\n{}", r.name(), r.log_tail(3000)))
                    .collect();
                panic!(
                    "{count_sql}: {now} of {count} after {timeout:?}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `herald verify`; returns its exit code and output.
    pub async fn verify(&self) -> (i32, String) {
        self.verify_expecting("").await
    }

    /// Runs `herald verify --expect {expect}`, again while messages are still on their way
    /// (receipts follow the ledger write), until nothing is unsettled, or nothing settled for
    /// two minutes; returns the last exit code and output.
    pub async fn verify_expecting(&self, expect: &str) -> (i32, String) {
        let mut last_progress = Instant::now();
        let mut moving_before = u64::MAX;
        loop {
            let out = tokio::process::Command::new(HERALD)
                .args([
                    "verify",
                    "--database-url",
                    &self.database_url,
                    "--provider-sim",
                    &self.sim_url,
                    "--expect",
                    expect,
                ])
                .output()
                .await
                .unwrap();
            let code = out.status.code().unwrap_or(-1);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let moving =
                class_count(&text, "unsettled") + class_count(&text, "receipts_unfinished");
            if moving < moving_before {
                moving_before = moving;
                last_progress = Instant::now();
            }
            // Two minutes: longer than a worker's reclaim of entries a failed batch left
            // pending (--reclaim-idle 60 s plus its 15 s pass), Herald's own recovery.
            if code == 0 || moving == 0 || last_progress.elapsed() > Duration::from_secs(120) {
                return (code, text);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
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

/// The count `herald verify` printed for a fate or finding (`  unsettled   12`), 0 if absent.
pub fn class_count(report: &str, class: &str) -> u64 {
    report
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == class).then(|| words.next()?.parse().ok())?
        })
        .next()
        .unwrap_or(0)
}

pub fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A steady open load of small batches until stopped. Every request must be answered 202.
pub struct Load {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<usize>,
}

impl Load {
    pub fn start(herald: &Deployment, batch: usize, every: Duration) -> Self {
        let stop = CancellationToken::new();
        let (api, cancel) = (herald.api.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut sent = 0;
            let mut tick = tokio::time::interval(every);
            while !cancel.is_cancelled() {
                tick.tick().await;
                let messages = (0..batch)
                    .map(|i| item(format!("r{}", sent + i), sent + i))
                    .collect();
                api.send_batch(messages)
                    .await
                    .expect("the API keeps accepting");
                sent += batch;
            }
            sent
        });
        Self { stop, task }
    }

    /// Stops the load; returns how many messages were accepted.
    pub async fn finish(self) -> usize {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// A load that tolerates failed requests (the API is being killed) and keeps the id of every
/// message that was answered 202, one request per message.
pub struct KeptIds {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<(Vec<String>, usize)>,
}

impl KeptIds {
    pub fn start(herald: &Deployment, in_flight: usize) -> Self {
        let stop = CancellationToken::new();
        let (api, cancel) = (herald.api.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let kept = Arc::new(Mutex::new(Vec::new()));
            let failed = Arc::new(AtomicUsize::new(0));
            let mut senders = tokio::task::JoinSet::new();
            for lane in 0..in_flight {
                let (api, cancel) = (api.clone(), cancel.clone());
                let (kept, failed) = (kept.clone(), failed.clone());
                senders.spawn(async move {
                    let mut n = 0;
                    while !cancel.is_cancelled() {
                        n += 1;
                        let message = SendRequest {
                            recipient: format!("lane{lane}-{n}"),
                            body: json!({"n": n}),
                            partition_key: None,
                        };
                        let answer =
                            tokio::time::timeout(Duration::from_secs(5), api.send(&message, None))
                                .await;
                        match answer {
                            Ok(Ok(accepted)) => {
                                kept.lock().unwrap().push(accepted.id.to_string());
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                });
            }
            while senders.join_next().await.is_some() {}
            let ids = kept.lock().unwrap().clone();
            (ids, failed.load(Ordering::Relaxed))
        });
        Self { stop, task }
    }

    /// Stops; returns the ids answered 202 and how many requests failed.
    pub async fn finish(self) -> (Vec<String>, usize) {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// A batch item with a recipient and `{"n": n}` as its body.
fn item(recipient: String, n: usize) -> BatchItem {
    BatchItem {
        recipient,
        body: json!({ "n": n }),
        partition_key: None,
        idempotency_key: None,
    }
}
