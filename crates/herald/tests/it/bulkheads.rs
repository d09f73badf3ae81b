//! The queue store is bounded and counted: one stream entry per job, publishing pauses before
//! the store is full, readiness tells the truth, and a Redis restart heals by itself.

use std::time::Duration;

use herald_core::JobType;
use herald_queue::{QueueStore, StoreSettings};

use crate::deployment::{args, Load};
use crate::wait::{accepted_more, count, grown, until, EXIT_GRACE, PATIENCE};
use crate::{Deployment, Options};

const MINUTE: Duration = Duration::from_secs(60);

fn send_store(herald: &Deployment) -> QueueStore {
    QueueStore::new(&StoreSettings {
        url: herald.send_redis.url(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 2,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_flight_is_exactly_one_stream_entry_and_none_is_left_after() {
    let mut herald = Deployment::start(Options::default()).await;
    assert!(herald
        .role("send-worker")
        .terminate(EXIT_GRACE)
        .await
        .unwrap());
    let ids = herald.send(500, 100, 2).await;
    herald
        .wait_for(
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND status = 'PUBLISHED'",
            500,
            MINUTE,
        )
        .await;
    let store = send_store(&herald);
    // A claim commits its rows as PUBLISHED before it publishes them, so the last batch's
    // entries may still be on their way when the table says 500.
    let stats = until("every claimed job has its entry", PATIENCE, || async {
        let stats = store.stats().await.map_err(|err| err.to_string())?;
        if stats.stream_length >= 500 {
            Ok(stats)
        } else {
            Err(format!("{stats:?}"))
        }
    })
    .await;
    assert_eq!(stats.stream_length, 500, "one entry per job");
    assert_eq!(stats.keys, 1, "the stream is the only key: nothing per job");

    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(ids.len() as i64, MINUTE).await;
    // A job is acknowledged (and its entry deleted) after its ledger row is written.
    let stats = until("acknowledged entries are deleted", PATIENCE, || async {
        let stats = store.stats().await.map_err(|err| err.to_string())?;
        if stats.stream_length == 0 && stats.pending == 0 {
            Ok(stats)
        } else {
            Err(format!("{stats:?}"))
        }
    })
    .await;
    assert_eq!(stats.keys, 1);
}

/// Batches the poller could not publish plus claims it skipped, for any store.
async fn publish_trouble(herald: &Deployment) -> f64 {
    let poller = &herald.poller_admins[0];
    herald.metric(poller, "herald_publish_failures_total").await
        + herald.metric(poller, "herald_publish_paused_total").await
}

/// Claims the poller skipped because the send store was full (`job_type="send"` only).
async fn paused_sends(herald: &Deployment) -> f64 {
    let text = herald.metrics(&herald.poller_admins[0]).await;
    text.lines()
        .filter(|line| {
            line.starts_with("herald_publish_paused_total{") && line.contains("job_type=\"send\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_pauses_publishing_and_readiness_says_why_and_nothing_is_lost() {
    // The API stays ready (it never needs Redis to accept, and every replica shares the store:
    // turning them all unready would leave no endpoint); its /readyz answer names the store.
    let mut herald = Deployment::start(Options {
        send_max_memory: Some(3 << 20),
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(EXIT_GRACE)
        .await
        .unwrap());
    // Fill until readiness names the full store: how many jobs fit depends on the entry size and on
    // what else Redis holds (client buffers), so the test measures instead of guessing.
    let readyz = format!("{}/readyz", herald.api_url);
    // A polling loop: each round sends more and watches readiness for a while.
    let deadline = std::time::Instant::now() + 3 * MINUTE;
    let mut sent = 0usize;
    let reason = loop {
        let ids = herald.send(2_000, 1000, 2).await;
        assert_eq!(
            ids.len(),
            2_000,
            "the API keeps accepting while the store fills"
        );
        sent += ids.len();
        let full = async {
            for _ in 0..10 {
                let response = herald.client.get(&readyz).send().await.unwrap();
                assert_eq!(
                    response.status(),
                    200,
                    "the API stays ready while the store fills"
                );
                let text = response.text().await.unwrap();
                if text.contains("full") {
                    return Some(text);
                }
                // Readiness trails the store by one reading of its memory.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None
        };
        if let Some(reason) = full.await {
            break reason;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "readiness never named the full store after {sent} jobs"
        );
    };
    assert!(
        reason.contains("herald:send:0") && reason.contains("full"),
        "{reason}"
    );
    // Once the store is full, newly accepted messages wait PENDING in the outbox.
    let ids = herald.send(4_000, 1000, 2).await;
    assert_eq!(
        ids.len(),
        4_000,
        "the API keeps accepting while the store is full"
    );
    sent += ids.len();
    // Rows wait PENDING and the poller counts the claims it skips for them. Only the pause
    // does both: without it the poller would claim the rows, have Redis refuse them (OOM) and
    // put them back — PENDING too, but never a paused claim.
    let paused_before = paused_sends(&herald).await;
    let (pending, paused) = until(
        "rows wait PENDING while the poller pauses publishing sends",
        PATIENCE,
        || async {
            let pending = count(
                &herald,
                "SELECT count(*) FROM outbox WHERE job_type = 'send' AND status = 'PENDING'",
            )
            .await;
            let paused = paused_sends(&herald).await;
            if pending > 0 && paused > paused_before {
                Ok((pending, paused))
            } else {
                Err(format!(
                    "{pending} sends PENDING, {paused} paused claims (first read {paused_before})"
                ))
            }
        },
    )
    .await;
    println!("store full: {pending} sends PENDING, {paused} claims paused");
    let stats = send_store(&herald).stats().await.unwrap();
    // Concurrent batches in flight when the threshold was crossed may overshoot it a little
    // (Redis then refuses writes with OOM, which is handled); the store does not keep growing.
    assert!((stats.stream_length as usize) < sent, "{stats:?}");
    assert!(
        (stats.used_memory as f64) < stats.max_memory as f64 * 1.2,
        "{stats:?}"
    );
    let ratio = herald
        .metric(&herald.poller_admins[0], "herald_queue_memory_ratio")
        .await;
    // Publishing pauses at 80 % and resumes below it, so the store hovers around the
    // threshold: the gauge must say so, and agree with a direct reading.
    let direct = stats.used_memory as f64 / stats.max_memory as f64;
    assert!(
        ratio >= 0.7 && (ratio - direct).abs() < 0.1,
        "memory ratio gauge {ratio}, direct reading {direct}"
    );
    // The API process is fine: only readiness changed.
    assert_eq!(
        herald
            .client
            .get(format!("{}/healthz", herald.api_url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Workers drain the store; publishing resumes; everything is delivered.
    herald.role("send-worker").restart().await.unwrap();
    herald
        .wait_delivered(sent as i64, Duration::from_secs(180))
        .await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
    // Readiness follows the store's memory, which the API reads periodically.
    until("readiness no longer names the store", PATIENCE, || async {
        let response = herald
            .client
            .get(&readyz)
            .send()
            .await
            .map_err(|err| err.to_string())?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        match (status, text.as_str()) {
            (200, "ready\n") => Ok(()),
            _ => Err(format!("{status} {text}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarts_under_load_heal_without_restarting_herald() {
    let mut herald = Deployment::start(Options {
        // Long enough that a status worker behind by a few seconds on a busy machine is not
        // re-driven over and over until its jobs run out of attempts (DEAD).
        poller_flags: args(&["--stale-after", "10s", "--redrive-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    let load = Load::start(&herald, 20, Duration::from_millis(50));
    // Redis goes down while messages flow.
    accepted_more(&herald, 200).await;
    let before = publish_trouble(&herald).await;
    herald.send_redis.stop().await.unwrap();
    herald.status_redis.stop().await.unwrap();
    // Redis stays down until the poller has run into it (a refused publish or a paused claim).
    until("the poller notices Redis is down", PATIENCE, || async {
        let now = publish_trouble(&herald).await;
        if now > before {
            Ok(())
        } else {
            Err(format!("{now} failed publishes and paused claims"))
        }
    })
    .await;
    herald.send_redis.restart().await.unwrap();
    herald.status_redis.restart().await.unwrap();
    // Load goes on until sends flow again end to end, through the restarted stores.
    grown(&herald, "SELECT count(*) FROM ledger", 200).await;
    let accepted = load.finish().await;
    // A liveness bound, not a speed check: sends that timed out while the machine was busy
    // come back through retries whose back-off doubles (0.5 s, 1 s, … 32 s).
    herald.wait_delivered(accepted as i64, 3 * MINUTE).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
            accepted as i64,
            2 * MINUTE,
        )
        .await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
}
