//! Claims of the design no other test proves, each reproduced against real servers: a
//! PostgreSQL outage (the API refuses and says it is not ready, the send worker's writes after
//! the provider call wait it out), a worker draining its in-flight sends on SIGTERM, a publish
//! refused with OOM giving its batch and attempts back, and a content rejection ending FAILED.
//!
//! Longer than 400 lines: one test per claim, each a whole scenario against real servers.

use std::path::PathBuf;
use std::time::Duration;

use herald_core::send_effect_key;
use herald_testkit::process::{Launch, Managed};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::deployment::{args, HERALD};
use crate::wait::{count, until, PATIENCE};
use crate::{Deployment, Options};

/// The sum of the series of `name` on a role's /metrics whose labels contain `label`.
async fn metric_where(herald: &Deployment, admin: &str, name: &str, label: &str) -> f64 {
    herald_testkit::metric_value(&herald.metrics(admin).await, name, label).unwrap_or(0.0)
}

/// The simulator's `GET /v1/stats`.
async fn sim_stats(herald: &Deployment) -> Value {
    herald.get_json_from(&herald.sim_url, "/v1/stats").await
}

/// Ledger rows per message among `ids`: every id must have exactly one.
async fn assert_one_ledger_row_each(herald: &Deployment, ids: &[String]) {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT m.id::text, count(l.message_id)
         FROM messages m LEFT JOIN ledger l ON l.message_id = m.id
         WHERE m.id = ANY($1::uuid[])
         GROUP BY m.id",
    )
    .bind(ids)
    .fetch_all(&herald.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), ids.len(), "every id is a stored message");
    let wrong: Vec<&(String, i64)> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(
        wrong.is_empty(),
        "messages without exactly one ledger row: {wrong:?}"
    );
}

async fn verify_ok(herald: &Deployment) {
    let (code, report) = herald.verify().await;
    if code != 0 {
        let stats = herald.get_json_from(&herald.sim_url, "/v1/stats").await;
        panic!("verify exited {code}\n{report}\nsimulator: {stats}");
    }
}

fn states(history: &[(String, Value)]) -> Vec<&str> {
    history.iter().map(|(state, _)| state.as_str()).collect()
}

/// The first three states of a message's history: how its send went.
fn send_states(history: &[(String, Value)]) -> Vec<&str> {
    states(history).into_iter().take(3).collect()
}

/// POSTs one message under the Idempotency-Key `key`; the answer's status, content type and
/// body.
async fn post_one(herald: &Deployment, key: &str) -> (u16, Option<String>, Value) {
    let response = herald
        .client
        .post(format!("{}/v1/messages", herald.api_url))
        .timeout(Duration::from_secs(30))
        .header("Idempotency-Key", key)
        .json(&json!({"recipient": key, "body": {"key": key}}))
        .send()
        .await
        .expect("the API answers");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json().await.unwrap_or(Value::Null);
    (status, content_type, body)
}

/// GET the API's /readyz: status and reason.
async fn api_readiness(herald: &Deployment) -> (u16, String) {
    let response = herald
        .client
        .get(format!("{}/readyz", herald.api_url))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the API answers");
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

// ------------------------------------------------------------------------- PostgreSQL outage

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_postgres_is_down_the_api_refuses_with_503_and_everything_is_delivered_after() {
    let mut herald = Deployment::start(Options::default()).await;
    let mut ids = herald.send(100, 50, 2).await;

    herald.pg.stop().await.unwrap();
    let (status, content_type, problem) = post_one(&herald, "outage-refused").await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    assert_eq!(problem["status"], 503, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("urn:herald:problem:")),
        "{problem}"
    );
    let batch = herald
        .client
        .post(format!("{}/v1/messages/batch", herald.api_url))
        .timeout(Duration::from_secs(30))
        .json(&json!({"messages": [{"recipient": "outage-batch", "body": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 503);
    let (status, reason) = api_readiness(&herald).await;
    assert_eq!(status, 503, "{reason}");
    assert!(reason.starts_with("not ready"), "{reason}");

    herald.pg.restart().await.unwrap();
    // The API accepts again without a restart, and the refused request was not stored: its
    // retry under the same Idempotency-Key creates the message (202), it does not replay one.
    let retried = until("the API accepts again", PATIENCE, || async {
        match post_one(&herald, "outage-refused").await {
            (202, _, body) if body["created"] == false => {
                panic!("the refused request had been stored: {body}")
            }
            (202, _, body) => Ok(body["id"].as_str().unwrap().to_owned()),
            (status, _, body) => Err(format!("{status} {body}")),
        }
    })
    .await;
    ids.push(retried);
    ids.extend(herald.send(100, 50, 2).await);
    assert_eq!(
        count(&herald, "SELECT count(*) FROM messages").await,
        ids.len() as i64,
        "the refused batch wrote nothing"
    );
    until("the API is ready again", PATIENCE, || async {
        match api_readiness(&herald).await {
            (200, _) => Ok(()),
            (status, reason) => Err(format!("{status} {reason}")),
        }
    })
    .await;

    herald.wait_delivered(ids.len() as i64, PATIENCE).await;
    assert_one_ledger_row_each(&herald, &ids).await;
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_send_worker_retries_its_writes_after_the_provider_call_through_a_postgres_outage() {
    const SENDS: i64 = 20;
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--latency", "2s"]),
        ..Options::default()
    })
    .await;
    let ids = herald.send(SENDS as usize, SENDS as usize, 1).await;
    herald
        .wait_for("SELECT count(*) FROM in_flight_sends", SENDS, PATIENCE)
        .await;
    assert_eq!(count(&herald, "SELECT count(*) FROM ledger").await, 0);

    // Every send is CLAIMED and waiting on the provider: PostgreSQL goes away under them.
    herald.pg.stop().await.unwrap();
    until("the provider took every send", PATIENCE, || async {
        let submits = sim_stats(&herald).await["submits"].as_i64().unwrap_or(0);
        (submits >= SENDS).then_some(()).ok_or(submits.to_string())
    })
    .await;
    let worker = herald.worker_admin.clone();
    until("a ledger write failed in the worker", PATIENCE, || async {
        let failed = metric_where(
            &herald,
            &worker,
            "herald_store_errors_total",
            "operation=\"ledger_write\"",
        )
        .await;
        (failed >= 1.0).then_some(()).ok_or(failed.to_string())
    })
    .await;
    herald.pg.restart().await.unwrap();

    herald.wait_delivered(SENDS, PATIENCE).await;
    assert_one_ledger_row_each(&herald, &ids).await;
    let submits = herald.provider_submits().await;
    for id in &ids {
        let history = herald.history(id).await;
        assert_eq!(
            send_states(&history),
            ["QUEUED", "CLAIMED", "ACCEPTED"],
            "{id}: the write was retried, not the send: {history:?}"
        );
        assert!(!states(&history).contains(&"RETRYING"), "{history:?}");
        let key = send_effect_key(Uuid::parse_str(id).unwrap());
        assert_eq!(submits.get(&key), Some(&1), "{id} was submitted once");
    }
    verify_ok(&herald).await;
}

// ---------------------------------------------------------------------- SIGTERM on a worker

/// A send worker of the test's own, so its exit status can be read.
async fn start_send_worker(herald: &Deployment, worker_id: &str) -> Managed {
    let port = herald_testkit::free_port().unwrap();
    let launch = Launch {
        program: PathBuf::from(HERALD),
        args: args(&[
            "worker",
            "--job-type",
            "send",
            "--worker-id",
            worker_id,
            "--admin-listen",
            &format!("127.0.0.1:{port}"),
            "--redis-url",
            &herald.send_urls().join(","),
            "--provider-url",
            &herald.sim_url,
        ]),
        env: vec![
            (
                "HERALD_DATABASE_URL".to_owned(),
                herald.runtime_database_url.clone(),
            ),
            ("HERALD_LOG_FORMAT".to_owned(), "json".to_owned()),
        ],
        user: None,
        log: herald.logs().join(format!("{worker_id}.log")),
    };
    let worker = Managed::spawn(launch).unwrap();
    let health = format!("http://127.0.0.1:{port}/healthz");
    let client = herald.client.clone();
    herald_testkit::wait_until(worker_id, PATIENCE, || {
        let request = client.get(&health).timeout(Duration::from_secs(1));
        async move {
            let status = request.send().await?.status();
            anyhow::ensure!(status.is_success(), "healthz answered {status}");
            Ok(())
        }
    })
    .await
    .unwrap_or_else(|err| panic!("{err:#}\n{}", worker.log_tail(3000)));
    worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sent_sigterm_records_every_send_in_flight_before_it_exits() {
    const SENDS: i64 = 20;
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--latency", "5s"]),
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(30))
        .await
        .unwrap());
    let mut worker = start_send_worker(&herald, "draining-worker").await;

    let ids = herald.send(SENDS as usize, SENDS as usize, 1).await;
    herald
        .wait_for("SELECT count(*) FROM in_flight_sends", SENDS, PATIENCE)
        .await;
    assert_eq!(count(&herald, "SELECT count(*) FROM ledger").await, 0);
    let pid = worker.pid().expect("the worker runs");
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let answered = sim_stats(&herald).await["submits"].as_i64().unwrap_or(0);
    assert!(
        answered < SENDS,
        "the provider had answered every call before SIGTERM: nothing was in flight"
    );

    let exit = worker
        .wait(Duration::from_secs(120))
        .await
        .unwrap_or_else(|err| panic!("{err:#}\n{}", worker.log_tail(3000)));
    assert_eq!(exit, Some(0), "{}", worker.log_tail(3000));

    // Right after the exit, with no other send worker running: nothing is left to re-drive.
    assert_one_ledger_row_each(&herald, &ids).await;
    assert_eq!(
        count(&herald, "SELECT count(*) FROM in_flight_sends").await,
        0
    );
    for id in &ids {
        let history = herald.history(id).await;
        assert_eq!(
            send_states(&history),
            ["QUEUED", "CLAIMED", "ACCEPTED"],
            "{id}: {history:?}"
        );
        assert_eq!(history[1].1["worker"], "draining-worker", "{history:?}");
    }
    let store = herald_queue::QueueStore::new(&herald_queue::StoreSettings {
        url: herald.send_redis.url(),
        job_type: herald_core::JobType::Send,
        shard: 0,
        max_connections: 1,
    })
    .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.stream_length),
        (0, 0),
        "every entry was acknowledged and deleted"
    );
    verify_ok(&herald).await;
}

// -------------------------------------------------------------------------- OOM on publish

/// Batches the poller at `admin` counted as refused with OOM.
async fn oom_failures(herald: &Deployment, admin: &str) -> f64 {
    metric_where(
        herald,
        admin,
        "herald_publish_failures_total",
        "reason=\"oom\"",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_with_oom_goes_back_to_pending_uncharged() {
    let mut herald = Deployment::start(Options {
        send_max_memory: Some(2 << 20),
        // Publishing pauses at the threshold; at 1.0 it goes on until Redis refuses, so the
        // refusal the pause usually avoids happens on every run.
        poller_flags: args(&["--queue-full-threshold", "1.0"]),
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(30))
        .await
        .unwrap());
    let poller = herald.poller_admins[0].clone();
    let sent = std::cell::Cell::new(0);
    until("a publish refused with OOM", PATIENCE, || async {
        if oom_failures(&herald, &poller).await >= 1.0 {
            return Ok(());
        }
        sent.set(sent.get() + herald.send(500, 500, 1).await.len());
        Err(format!("{} sent, no publish refused with OOM", sent.get()))
    })
    .await;
    // Stop the poller: its in-flight batch finishes (published and marked, or released).
    assert!(herald
        .role("poller-0")
        .terminate(Duration::from_secs(30))
        .await
        .unwrap());

    let by_status: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT status, attempts, count(*) FROM outbox WHERE job_type = 'send'
         GROUP BY status, attempts ORDER BY status, attempts",
    )
    .fetch_all(&herald.pool)
    .await
    .unwrap();
    eprintln!(
        "{} sent; send rows by (status, attempts): {by_status:?}",
        sent.get()
    );
    // Nothing reached a worker, so no row was charged an attempt: a claim charges none, and a
    // refused batch returned to PENDING as it was.
    let expected = |_: &str| 0;
    for (status, attempts, rows) in &by_status {
        assert!(
            status == "PUBLISHED" || status == "PENDING",
            "{rows} rows {status}: {by_status:?}"
        );
        assert_eq!(*attempts, expected(status), "{by_status:?}");
    }
    let pending: i64 = by_status
        .iter()
        .filter(|(status, _, _)| status == "PENDING")
        .map(|(_, _, rows)| rows)
        .sum();
    assert!(pending > 0, "{by_status:?}");

    // With a worker draining the store, every message is delivered once.
    herald.role("send-worker").restart().await.unwrap();
    herald.role("poller-0").restart().await.unwrap();
    let accepted = count(&herald, "SELECT count(*) FROM messages").await;
    herald.wait_delivered(accepted, 3 * PATIENCE).await;
    let doubled = count(
        &herald,
        "SELECT count(*) FROM (SELECT message_id FROM ledger GROUP BY message_id
                               HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(doubled, 0);
    verify_ok(&herald).await;
}

// --------------------------------------------------------------------- a content rejection

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_rejection_by_the_provider_ends_failed_without_a_retry_or_an_effect() {
    const SENDS: usize = 5;
    let herald = Deployment::start(Options::default()).await;
    let faults = herald
        .client
        .put(format!("{}/v1/faults", herald.sim_url))
        .json(&json!({"error_rate": 0.0, "timeout_rate": 0.0, "reject_rate": 1.0}))
        .send()
        .await
        .unwrap();
    assert!(faults.status().is_success());
    let applied: Value = faults.json().await.unwrap();
    assert_eq!(
        applied["reject_rate"], 1.0,
        "the simulator took the rate: {applied}"
    );

    let ids = herald.send(SENDS, SENDS, 1).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_events WHERE state = 'FAILED'",
            SENDS as i64,
            PATIENCE,
        )
        .await;
    let submits = herald.provider_submits().await;
    for id in &ids {
        let history = herald.history(id).await;
        assert_eq!(
            states(&history),
            ["QUEUED", "CLAIMED", "FAILED"],
            "{id}: {history:?}"
        );
        assert_eq!(history[2].1["cause"], "content", "{history:?}");
        let key = send_effect_key(Uuid::parse_str(id).unwrap());
        assert_eq!(
            submits.get(&key),
            None,
            "{id}: the provider recorded a submit"
        );
    }
    assert_eq!(count(&herald, "SELECT count(*) FROM ledger").await, 0);
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND (status <> 'DONE' OR attempts <> 1)",
        )
        .await,
        0,
        "each send was tried once and finished"
    );
    let stats = sim_stats(&herald).await;
    assert_eq!(
        stats["injected_rejections"], SENDS,
        "one call each: {stats}"
    );
    // A content rejection is the caller's fault: the run is still correct.
    verify_ok(&herald).await;
}
