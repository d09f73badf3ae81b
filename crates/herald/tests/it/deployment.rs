//! The end-to-end tests' deployment: the test kit's one builder
//! ([`herald_testkit::LocalDeployment`], which `herald dev` and the load tester run too) with
//! the tests' conveniences on top. It runs with production's credentials: the roles connect as
//! the runtime database role, the API holds random client and operator keys
//! ([`Deployment::client`] sends the operator key), and the simulator signs its receipts with
//! the API's secrets.
//!
//! Longer than 400 lines: the conveniences (sending, waiting, the proof, loads the tests
//! keep running while they break things) share the deployment they drive.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_client::wire::{BatchItem, SendRequest};
use herald_testkit::{free_port, DeploymentOptions, LocalDeployment, RoleProcess};
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
    /// The servers and roles; the deployment's fields (`pg`, `send_redis`, `api_url`, …) are
    /// read through it.
    pub local: LocalDeployment,
    /// The database as its owner: for the test's own queries.
    pub pool: PgPool,
    pub poller_admins: Vec<String>,
    pub worker_admin: String,
    pub status_worker_admin: String,
    /// Sends the operator key with every request (to any role).
    pub client: reqwest::Client,
    /// The API's client, with the operator key.
    pub api: herald_client::Client,
}

impl Deref for Deployment {
    type Target = LocalDeployment;

    fn deref(&self) -> &LocalDeployment {
        &self.local
    }
}

impl DerefMut for Deployment {
    fn deref_mut(&mut self) -> &mut LocalDeployment {
        &mut self.local
    }
}

impl Deployment {
    pub async fn start(options: Options) -> Self {
        let mut shape = DeploymentOptions::new(PathBuf::from(HERALD));
        shape.partitions = options.partitions;
        shape.pollers = options.pollers;
        shape.fleet = options.fleet;
        shape.send_shards = options.send_shards;
        shape.send_max_memory = options.send_max_memory;
        shape.tls = options.tls;
        shape.sim_flags = options.sim_flags;
        shape.api_flags = options.api_flags;
        // Quick polling, so a test's messages move without waiting out idle intervals.
        shape.poller_flags = args(&["--poll-interval", "100ms", "--idle-poll-interval", "400ms"]);
        shape.poller_flags.extend(options.poller_flags);
        shape.send_worker_flags = options.worker_flags;
        shape.status_worker_flags = options.status_worker_flags;
        let local = LocalDeployment::start(&shape)
            .await
            .unwrap_or_else(|err| panic!("the deployment did not start: {err:#}"));
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&local.database_url)
            .await
            .unwrap();
        let admin = |name: &str| {
            local
                .admin_url(name)
                .unwrap_or_else(|| panic!("no role {name}"))
                .to_owned()
        };
        let client = local.keys.operator_client().unwrap();
        Self {
            pool,
            poller_admins: (0..options.pollers)
                .map(|i| admin(&format!("poller-{i}")))
                .collect(),
            worker_admin: admin("send-worker"),
            status_worker_admin: admin("status-worker"),
            api: herald_client::Client::from_http(&local.api_url, client.clone()),
            client,
            local,
        }
    }

    /// Starts one more role process named `name`, `herald <args…>`, whose admin (or API)
    /// server is at `admin_url`; waits until it is healthy.
    pub async fn spawn(&mut self, name: &str, args: Vec<String>, admin_url: String) {
        self.local
            .spawn_role(name, &args, admin_url)
            .await
            .unwrap_or_else(|err| panic!("{name} did not start: {err:#}"));
    }

    /// Starts one more role on a free admin port (appended as `--admin-listen`) and returns
    /// its admin base URL.
    pub async fn spawn_with_admin(&mut self, name: &str, mut role_args: Vec<String>) -> String {
        let port = free_port().unwrap();
        let admin = format!("http://127.0.0.1:{port}");
        role_args.extend(args(&["--admin-listen", &format!("127.0.0.1:{port}")]));
        self.spawn(name, role_args, admin.clone()).await;
        admin
    }

    /// The role process named `name`.
    pub fn role(&mut self, name: &str) -> &mut RoleProcess {
        self.local
            .role(name)
            .unwrap_or_else(|err| panic!("{err:#}"))
    }

    /// The folder of the roles' logs (`<role>.log`).
    pub fn logs(&self) -> PathBuf {
        self.local.dir().join("logs")
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
                    .processes()
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
