use std::collections::HashMap;
use std::time::Duration;

use crate::wait::{until, EXIT_GRACE, PATIENCE};
use crate::{Deployment, Options};

/// How many messages `herald verify`'s report puts in `fate` (a fate it leaves out has none).
fn fate(report: &str, fate: &str) -> u64 {
    report
        .lines()
        .filter_map(|line| line.trim().strip_prefix(fate)?.trim().parse::<u64>().ok())
        .sum()
}

/// Accepted messages that are not where they should be: missing, or never settled.
fn lost(report: &str) -> u64 {
    ["missing", "missing_at_provider", "unsettled"]
        .iter()
        .map(|name| fate(report, name))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_are_each_accepted_once() {
    let herald = Deployment::start(Options::default()).await;
    let ids = herald.send(10_000, 500, 4).await;
    assert_eq!(ids.len(), 10_000);
    herald
        .wait_delivered(10_000, Duration::from_secs(240))
        .await;
    // The simulator's receipts follow: every message ends DELIVERED.
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
            10_000,
            Duration::from_secs(120),
        )
        .await;

    // Exactly one ledger row per accepted id, and every one DELIVERED.
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT m.id::text, (SELECT count(*) FROM ledger l WHERE l.message_id = m.id), s.state
         FROM messages m JOIN message_current_state s ON s.message_id = m.id",
    )
    .fetch_all(&herald.pool)
    .await
    .unwrap();
    let by_id: HashMap<String, (i64, String)> = rows
        .into_iter()
        .map(|(id, n, state)| (id, (n, state)))
        .collect();
    assert_eq!(by_id.len(), 10_000);
    for id in &ids {
        let (ledger_rows, state) = &by_id[id];
        assert_eq!(*ledger_rows, 1, "{id}");
        assert_eq!(state, "DELIVERED", "{id}");
    }

    // Every ledger key was submitted to the provider at least once.
    let submitted = herald.provider_submits().await;
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM ledger")
        .fetch_all(&herald.pool)
        .await
        .unwrap();
    for key in &keys {
        assert!(
            submitted.get(key).copied().unwrap_or(0) >= 1,
            "{key} never submitted"
        );
    }

    // The outbox is all DONE, nothing deleted.
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status = 'DONE' AND job_type = 'send'",
    )
    .fetch_one(&herald.pool)
    .await
    .unwrap();
    assert_eq!(done, 10_000);

    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(fate(&report, "delivered"), 10_000, "{report}");
    assert_eq!(lost(&report), 0, "{report}");

    // Every stage exports its timing histogram and counters.
    let poller = herald.metrics(&herald.poller_admins[0]).await;
    let worker = herald.metrics(&herald.worker_admin).await;
    let api = herald.metrics(&herald.api_url).await;
    for (text, names) in [
        (
            &api,
            vec![
                "herald_accept_transaction_duration_seconds_bucket",
                "herald_messages_accepted_total",
            ],
        ),
        (
            &poller,
            vec![
                "herald_outbox_claim_duration_seconds_bucket",
                "herald_queue_publish_duration_seconds_bucket",
                "herald_outbox_mark_duration_seconds_bucket",
                "herald_outbox_claimed_total",
                "herald_jobs_published_total",
                "herald_outbox_marked_total",
            ],
        ),
        (
            &worker,
            vec![
                "herald_ownership_confirm_duration_seconds_bucket",
                "herald_provider_call_duration_seconds_bucket",
                "herald_ledger_write_duration_seconds_bucket",
                "herald_provider_calls_total",
                "herald_jobs_total",
            ],
        ),
    ] {
        for name in names {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
    assert!(
        api.contains("herald_messages_accepted_total 10000"),
        "{api}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_and_timeouts_are_retried_without_a_second_effect() {
    let herald = Deployment::start(Options {
        sim_flags: [
            "--error-rate",
            "0.3",
            "--timeout-rate",
            "0.1",
            "--timeout-delay",
            "2s",
        ]
        .map(String::from)
        .to_vec(),
        worker_flags: [
            "--provider-timeout",
            "300ms",
            "--retry-base",
            "20ms",
            // A timed-out submit keeps its key busy at the provider for the 2 s delay, so the
            // attempts right after it answer 409: with the default 60 s cap, a message unlucky
            // twice waits out minute-long back-offs and the test outlives its deadline on a
            // loaded machine.
            "--retry-max",
            "500ms",
            "--max-attempts",
            "50",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    })
    .await;
    let ids = herald.send(400, 100, 2).await;
    assert_eq!(ids.len(), 400);
    herald.wait_delivered(400, Duration::from_secs(120)).await;

    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
    let stats: serde_json::Value = herald
        .client
        .get(format!("{}/v1/stats", herald.sim_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Timeouts took effect at the provider and were retried with the same key: duplicate
    // submits exist, yet the ledger has one row per message.
    assert!(stats["injected_errors"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["duplicate_submits"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["distinct_keys"], 400);
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&herald.pool)
        .await
        .unwrap();
    assert_eq!(ledger, 400);
    let retried: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT message_id) FROM message_events WHERE state = 'RETRYING'",
    )
    .fetch_one(&herald.pool)
    .await
    .unwrap();
    assert!(retried > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_fails_when_an_accepted_message_never_reached_the_provider() {
    let mut herald = Deployment::start(Options::default()).await;
    let ids = herald.send(20, 10, 1).await;
    herald.wait_delivered(20, Duration::from_secs(60)).await;
    assert_eq!(herald.verify().await.0, 0);

    // Stop the poller, accept more: they are committed but cannot be delivered.
    let poller = herald.role("poller-0");
    assert!(
        poller.terminate(EXIT_GRACE).await.unwrap(),
        "poller exits on SIGTERM"
    );
    let more = herald.send(5, 5, 1).await;
    assert_eq!(ids.len() + more.len(), 25);
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    assert_eq!(lost(&report), 5, "{report}");

    // Back up: the rows wait in the outbox and are delivered.
    let poller = herald.role("poller-0");
    poller.restart().await.unwrap();
    herald.wait_delivered(25, Duration::from_secs(60)).await;
    assert_eq!(herald.verify().await.0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_publish_to_their_shard_and_workers_read_every_shard() {
    let herald = Deployment::start(Options {
        send_shards: 2,
        ..Options::default()
    })
    .await;
    let ids = herald.send(2000, 200, 2).await;
    herald
        .wait_delivered(ids.len() as i64, Duration::from_secs(120))
        .await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");

    // Each shard's stream saw exactly the jobs of its partitions (p mod 2), and kept none.
    let by_shard: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT partition % 2, count(*) FROM outbox WHERE job_type = 'send' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&herald.pool)
    .await
    .unwrap();
    for (shard, url) in herald.send_urls().iter().enumerate() {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let (added, _) = stream_counts(&mut conn, shard).await;
        assert_eq!(added, by_shard[shard].1, "shard {shard}");
        // A job is acknowledged (and its entry deleted) after its ledger row is written.
        let conn = &conn;
        until(
            &format!("shard {shard}: acknowledged entries are deleted"),
            PATIENCE,
            || async {
                match stream_counts(&mut conn.clone(), shard).await {
                    (_, 0) => Ok(()),
                    (_, length) => Err(format!("{length} entries left")),
                }
            },
        )
        .await;
    }
}

/// (entries ever added, entries left) of the send stream of `shard`.
async fn stream_counts(conn: &mut redis::aio::MultiplexedConnection, shard: usize) -> (i64, i64) {
    let info: redis::Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(format!("herald:send:{shard}"))
        .query_async(conn)
        .await
        .unwrap();
    let fields: std::collections::HashMap<String, redis::Value> =
        redis::from_redis_value(info).unwrap();
    let added: i64 = redis::from_redis_value(fields["entries-added"].clone()).unwrap();
    let length: i64 = redis::from_redis_value(fields["length"].clone()).unwrap();
    (added, length)
}
