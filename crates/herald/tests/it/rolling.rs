//! A rolling restart of the API under load drops nothing. Two API processes sit behind a
//! proxy that, like a Kubernetes Service, sends each new connection to a backend whose
//! `/readyz` answered 200 at its last check (every 50 ms). Each API is stopped with SIGTERM
//! and started again in turn while clients keep sending, each request on its own connection.
//! With `--shutdown-delay`, a stopping API answers `/readyz` 503 at once and keeps serving
//! until the proxy has moved on, so no request fails even once; every message is delivered.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

use crate::deployment::args;
use crate::{Deployment, Options};

/// A TCP proxy choosing, per connection, the next backend that is ready.
struct Proxy {
    url: String,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(backends: Vec<String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let ready = Arc::new(Mutex::new(vec![false; backends.len()]));
        let stop = Arc::new(AtomicBool::new(false));
        let checker = reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        {
            let (ready, stop, backends) = (ready.clone(), stop.clone(), backends.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    for (i, backend) in backends.iter().enumerate() {
                        let answer = checker.get(format!("http://{backend}/readyz")).send().await;
                        let up = answer.is_ok_and(|r| r.status() == 200);
                        ready.lock().unwrap()[i] = up;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
        // Like a Service, the proxy has endpoints once the first readiness checks passed.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ready.lock().unwrap().iter().all(|&up| up) {
            assert!(
                std::time::Instant::now() < deadline,
                "the backends never all became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let next = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let choice = {
                    let ready = ready.lock().unwrap();
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    (0..backends.len())
                        .map(|k| (start + k) % backends.len())
                        .find(|&i| ready[i])
                };
                let Some(i) = choice else { continue };
                let backend = backends[i].clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { url, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A deployment whose API runs with `flags`, and a second API process ("api-2") with the same
/// flags; returns the second's address.
async fn two_apis(flags: &[&str]) -> (Deployment, String) {
    let mut herald = Deployment::start(Options {
        api_flags: args(flags),
        ..Options::default()
    })
    .await;
    let second = format!("127.0.0.1:{}", herald_testkit::free_port().unwrap());
    let mut api = args(&[
        "api",
        "--listen",
        &second,
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
    ]);
    api.extend(args(flags));
    herald.spawn("api-2", api, format!("http://{second}")).await;
    (herald, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_each_api_under_load_fails_no_request() {
    let drain = ["--shutdown-delay", "1s"];
    let (mut herald, second) = two_apis(&drain).await;
    let first = herald.api_url.trim_start_matches("http://").to_owned();
    let proxy = Proxy::start(vec![first, second]).await;

    // Clients: each request on a new connection (as through a Service), retried with its
    // Idempotency-Key when it fails.
    let client = herald_testkit::keys::bearer_client_builder(&herald.keys.client_key)
        .unwrap()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let sending = Arc::new(AtomicBool::new(true));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for task in 0..4 {
        let (client, sending, failures) = (
            herald_client::Client::from_http(&proxy.url, client.clone()),
            sending.clone(),
            failures.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut accepted = 0usize;
            let mut n = 0;
            while sending.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("roll-{task}-{n}");
                let message = herald_client::wire::SendRequest {
                    recipient: format!("+1555{task:02}{n:05}"),
                    body: json!({"n": n}),
                    partition_key: None,
                };
                let mut done = false;
                for attempt in 1..=20 {
                    match client.send(&message, Some(&key)).await {
                        Ok(_) => {
                            done = true;
                            break;
                        }
                        Err(err) => failures
                            .lock()
                            .unwrap()
                            .push(format!("{key} attempt {attempt}: {err}")),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert!(done, "{key} was never accepted");
                accepted += 1;
            }
            accepted
        }));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["api", "api-2"] {
        let role = herald.role(name);
        assert!(
            role.terminate(Duration::from_secs(20)).await.unwrap(),
            "{name} did not exit by itself within its grace"
        );
        role.restart().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    sending.store(false, Ordering::Relaxed);
    let mut accepted = 0;
    for client in clients {
        accepted += client.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    println!("{accepted} messages accepted through two restarts; failed attempts: {failures:?}");
    assert!(
        accepted > 50,
        "too little load to mean anything: {accepted}"
    );
    assert!(
        failures.is_empty(),
        "requests failed during the restarts: {failures:?}"
    );

    herald
        .wait_delivered(accepted as i64, Duration::from_secs(120))
        .await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
}

/// The backlog gauges come from one API replica of a deployment, not from each: the replica
/// holding the exporter's advisory lock. When it dies, another takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_api_replica_exports_the_backlog_and_another_takes_over() {
    let interval = ["--backlog-gauge-interval", "300ms"];
    let (mut herald, second) = two_apis(&interval).await;
    let bases = [herald.api_url.clone(), format!("http://{second}")];
    let client = reqwest::Client::new();
    let exporters = || async {
        let mut which = Vec::new();
        for (i, base) in bases.iter().enumerate() {
            let Ok(answer) = client.get(format!("{base}/metrics")).send().await else {
                continue;
            };
            let text = answer.text().await.unwrap_or_default();
            if text.contains("herald_outbox_backlog_rows{") {
                which.push(i);
            }
        }
        which
    };
    let settled = |want_other_than: Option<usize>| {
        let exporters = &exporters;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let which = exporters().await;
                if which.len() == 1 && Some(which[0]) != want_other_than {
                    return which[0];
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "expected one exporter (not {want_other_than:?}), found {which:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let first = settled(None).await;
    // It stays one: both replicas keep asking for the lock every 300 ms.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(exporters().await, vec![first]);
    herald.role(["api", "api-2"][first]).kill9().await.unwrap();
    let next = settled(Some(first)).await;
    assert_ne!(next, first);
}
