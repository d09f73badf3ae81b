//! The seven rules, each proven by reproducing the failure it prevents against real servers.
//!
//! Longer than 400 lines: the seven rules' reproductions side by side, so the index in
//! docs/DESIGN.md points into one file.

use std::time::Duration;

use herald_client::wire::{BatchItem, SendRequest};
use herald_core::send_effect_key;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::deployment::{args, KeptIds};
use crate::{Deployment, Options};

const MINUTE: Duration = Duration::from_secs(60);

async fn post_batch(herald: &Deployment, recipients: &[&str]) -> Vec<String> {
    let messages = recipients
        .iter()
        .map(|r| BatchItem {
            recipient: r.to_string(),
            body: json!({"text": format!("to {r}")}),
            partition_key: None,
            idempotency_key: None,
        })
        .collect();
    let answer = herald
        .api
        .send_batch(messages)
        .await
        .expect("the API answers 202");
    answer.messages.iter().map(|m| m.id.to_string()).collect()
}

fn recipients(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

async fn send_n(herald: &Deployment, prefix: &str, n: usize) -> Vec<String> {
    let names = recipients(prefix, n);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    post_batch(herald, &refs).await
}

async fn count(herald: &Deployment, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&herald.pool)
        .await
        .unwrap()
}

async fn verify_ok(herald: &Deployment) {
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
}

fn states(history: &[(String, Value)]) -> Vec<&str> {
    history.iter().map(|(s, _)| s.as_str()).collect()
}

// ---------------------------------------------------------------------------------------- R1

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_killing_the_api_loses_no_message_it_answered_202_for() {
    let mut herald = Deployment::start(Options::default()).await;
    let load = KeptIds::start(&herald, 4);
    // Kill the API while requests are in flight: once it has committed some.
    herald
        .wait_for("SELECT count(*) FROM messages", 50, MINUTE)
        .await;
    herald.role("api").kill9().await.unwrap();
    herald.role("api").restart().await.unwrap();
    // And let the load go on until the restarted API committed more.
    let before = count(&herald, "SELECT count(*) FROM messages").await;
    herald
        .wait_for("SELECT count(*) FROM messages", before + 50, MINUTE)
        .await;
    let (kept, failed) = load.finish().await;
    assert!(failed > 0, "the kill interrupted requests");
    assert!(kept.len() > 50);

    herald.wait_delivered(kept.len() as i64, MINUTE).await;
    for id in &kept {
        let delivered: i64 =
            sqlx::query_scalar("SELECT count(*) FROM ledger WHERE message_id = $1::uuid")
                .bind(id)
                .fetch_one(&herald.pool)
                .await
                .unwrap();
        assert_eq!(
            delivered, 1,
            "{id} was answered 202 and must be delivered once"
        );
    }
    // Requests cut off after their commit are delivered too: nothing committed is lost.
    herald
        .wait_for(
            "SELECT count(*) FROM ledger",
            count(&herald, "SELECT count(*) FROM messages").await,
            MINUTE,
        )
        .await;
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_the_api_accepts_while_redis_is_down_and_everything_is_delivered_after() {
    let mut herald = Deployment::start(Options::default()).await;
    herald.send_redis.stop().await.unwrap();
    let ids = send_n(&herald, "no-redis", 200).await;
    assert_eq!(ids.len(), 200);
    let single = SendRequest {
        recipient: "one".to_owned(),
        body: json!(1),
        partition_key: None,
    };
    herald.api.send(&single, None).await.expect("202");
    // The poller saw the store unreachable and held the rows back (or tried and was refused):
    // only then is "nothing sent" news.
    let poller = herald.poller_admins[0].clone();
    let deadline = std::time::Instant::now() + MINUTE;
    loop {
        let held_back = herald.metric(&poller, "herald_publish_paused_total").await
            + herald
                .metric(&poller, "herald_publish_failures_total")
                .await;
        if held_back > 0.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the poller never noticed that Redis was down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count(&herald, "SELECT count(*) FROM ledger").await,
        0,
        "nothing can be sent yet"
    );

    herald.send_redis.restart().await.unwrap();
    herald.wait_delivered(201, MINUTE).await;
    verify_ok(&herald).await;
    // The outage did not use up attempts: a batch the store refused gave its attempt back.
    let max_attempts = count(
        &herald,
        "SELECT max(attempts)::bigint FROM outbox WHERE job_type = 'send'",
    )
    .await;
    assert!(max_attempts <= 2, "attempts {max_attempts}");
}

// ---------------------------------------------------------------------------------------- R3

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_a_redis_restart_before_workers_took_the_jobs_is_redriven() {
    let mut herald = Deployment::start(Options {
        poller_flags: args(&["--stale-after", "10s", "--redrive-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(10))
        .await
        .unwrap());
    send_n(&herald, "lost-stream", 300).await;
    herald
        .wait_for(
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND status = 'PUBLISHED'",
            300,
            MINUTE,
        )
        .await;
    // Redis keeps nothing on disk: the restart loses every published job.
    herald.send_redis.stop().await.unwrap();
    herald.send_redis.restart().await.unwrap();
    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(300, MINUTE).await;
    verify_ok(&herald).await;
    let redriven = herald
        .metric(&herald.poller_admins[0], "herald_outbox_redriven_total")
        .await;
    assert!(redriven >= 300.0, "re-driven {redriven}");
    // The store lost the jobs, the messages did nothing wrong: the lost claims charged
    // nothing, and each send used exactly the one attempt that reached a worker.
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND attempts <> 1"
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_a_poller_killed_between_publish_and_mark_does_not_lose_the_batch() {
    use herald_core::{JobType, PartitionCount};
    use herald_queue::{QueueStore, StoreSettings};

    let mut herald = Deployment::start(Options {
        pollers: 0,
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(10))
        .await
        .unwrap());
    send_n(&herald, "half-done", 100).await;

    // The poller's first half, done by hand: take the partitions, claim, publish — then it
    // "dies" before marking anything.
    let store = QueueStore::new(&StoreSettings {
        url: herald.send_redis.url(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 2,
    })
    .unwrap();
    let mut claimed = 0;
    for partition in PartitionCount::new(16).unwrap().all() {
        let fence = herald_store::leases::take_over(&herald.pool, partition, "doomed")
            .await
            .unwrap();
        let jobs = herald_store::outbox::claim_pending(&herald.pool, fence, 1000)
            .await
            .unwrap();
        store.publish(&jobs).await.unwrap();
        claimed += jobs.len();
    }
    assert_eq!(claimed, 100);
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE status = 'PROCESSING'"
        )
        .await,
        100
    );
    // And the published copies are lost with a Redis restart: only the outbox row remains.
    herald.send_redis.stop().await.unwrap();
    herald.send_redis.restart().await.unwrap();

    let poller = args(&[
        "poller",
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
    ]);
    herald.spawn_with_admin("poller-new", poller).await;
    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(100, MINUTE).await;
    verify_ok(&herald).await;
}

/// Waiting is not failing: jobs that sit in their stream for many stale-after periods (no
/// worker reads them) are neither re-driven, nor charged another attempt, nor DEAD, because
/// their entries are still in the store. Before the re-drive asked the store, every job here
/// was published again each second and DEAD after two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_a_backlog_waiting_in_its_stream_is_never_redriven_or_dead() {
    let mut herald = Deployment::start(Options {
        poller_flags: args(&["--stale-after", "1s", "--redrive-interval", "200ms"]),
        worker_flags: args(&["--max-attempts", "2"]),
        ..Options::default()
    })
    .await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(10))
        .await
        .unwrap());
    send_n(&herald, "waiting", 100).await;
    herald
        .wait_for(
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND status = 'PUBLISHED'",
            100,
            MINUTE,
        )
        .await;
    // Twelve stale-after periods with nobody reading the stream.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let redriven = herald
        .metric(&herald.poller_admins[0], "herald_outbox_redriven_total")
        .await;
    assert_eq!(redriven, 0.0, "a waiting job was re-driven");
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE status = 'DEAD' OR attempts > 1"
        )
        .await,
        0
    );
    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(100, MINUTE).await;
    verify_ok(&herald).await;
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND attempts > 1"
        )
        .await,
        0
    );
}

/// The shared rounds claim rows as PUBLISHED before publishing them, with no mark after: a
/// poller that dies between the claim's commit and its XADDs leaves PUBLISHED rows that are in
/// no stream. The stale re-drive must return them and the messages must be delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_a_poller_killed_between_claim_and_publish_is_redriven() {
    use herald_core::{JobType, PartitionCount};

    let mut herald = Deployment::start(Options {
        pollers: 0,
        ..Options::default()
    })
    .await;
    send_n(&herald, "claimed-never-published", 60).await;
    // The poller's claim, done by hand, for every partition in one statement; then it "dies"
    // before publishing anything.
    let mut requests = Vec::new();
    for partition in PartitionCount::new(16).unwrap().all() {
        let fence = herald_store::leases::take_over(&herald.pool, partition, "doomed")
            .await
            .unwrap();
        requests.push((fence, JobType::ALL.to_vec()));
    }
    let claimed: usize = herald_store::outbox::claim_pending_many(
        &herald.pool,
        &requests,
        1000,
        herald_store::outbox::ClaimAs::Published,
    )
    .await
    .unwrap()
    .into_iter()
    .map(|jobs| jobs.unwrap().len())
    .sum();
    assert_eq!(claimed, 60);
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE status = 'PUBLISHED'"
        )
        .await,
        60
    );
    let poller = args(&[
        "poller",
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
        "--stale-after",
        "3s",
        "--redrive-interval",
        "500ms",
    ]);
    herald.spawn_with_admin("poller-new", poller).await;
    herald.wait_delivered(60, MINUTE).await;
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_past_the_attempt_limit_a_send_is_dead_visible_and_can_be_redriven() {
    let herald = Deployment::start(Options {
        worker_flags: args(&["--max-attempts", "2", "--retry-base", "50ms"]),
        ..Options::default()
    })
    .await;
    herald.set_faults(1.0, 0.0).await;
    let ids = send_n(&herald, "doomed", 5).await;
    herald
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'DEAD'",
            5,
            MINUTE,
        )
        .await;
    let dead = herald.get_json("/v1/dead").await;
    assert_eq!(dead["count"], 5);
    let rows = dead["dead"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    // Two submits answered 503 (which may or may not have taken effect), then a third attempt
    // asked the provider by key and found nothing: only now is DEAD the truth.
    assert!(rows
        .iter()
        .all(|r| r["attempts"] == 3 && r["job_type"] == "send"));
    assert!(
        rows[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("no submit under this key"),
        "{}",
        rows[0]
    );
    let history = herald.history(&ids[0]).await;
    assert!(
        history
            .iter()
            .any(|(s, d)| s == "RETRYING" && d["next"] == "ask the provider by key"),
        "{history:?}"
    );
    assert_eq!(
        herald
            .metric(&herald.worker_admin, "herald_dead_total")
            .await,
        5.0
    );
    for id in &ids {
        assert_eq!(states(&herald.history(id).await).last(), Some(&"DEAD"));
    }
    // DEAD is visible, not delivered: the proof fails unless the run declares it, and then
    // only with exactly that many.
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("WRONG dead: 5 (expected 0)"), "{report}");
    assert!(
        ids.iter().all(|id| report.contains(id.as_str())),
        "{report}"
    );
    let (code, report) = herald.verify_expecting("dead=5").await;
    assert_eq!(code, 0, "{report}");
    let (code, report) = herald.verify_expecting("dead=4").await;
    assert_eq!(code, 1, "{report}");

    // The provider recovers; an operator re-drives each row.
    herald.set_faults(0.0, 0.0).await;
    for row in rows {
        let response = herald
            .client
            .post(format!("{}/v1/dead/{}/redrive", herald.api_url, row["id"]))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
    }
    let again = herald
        .client
        .post(format!(
            "{}/v1/dead/{}/redrive",
            herald.api_url, rows[0]["id"]
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404, "no longer DEAD");
    herald.wait_delivered(5, MINUTE).await;
    assert_eq!(herald.get_json("/v1/dead").await["count"], 0);
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proof_fails_when_the_provider_answers_404_to_everything() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--refuse-status", "404"]),
        worker_flags: args(&["--max-attempts", "2", "--retry-base", "50ms"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "misrouted", 5).await;
    herald
        .wait_for(
            "SELECT count(*) FROM outbox WHERE status = 'DEAD'",
            5,
            MINUTE,
        )
        .await;
    // A 404 refuses Herald's configuration, not the message: retried, never FAILED.
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM message_events WHERE state = 'FAILED'"
        )
        .await,
        0
    );
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("WRONG dead: 5 (expected 0)"), "{report}");
    assert!(
        ids.iter().all(|id| report.contains(id.as_str())),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_the_proof_fails_when_an_outbox_row_is_gone() {
    let herald = Deployment::start(Options::default()).await;
    send_n(&herald, "kept", 5).await;
    herald.wait_delivered(5, MINUTE).await;
    verify_ok(&herald).await;
    // What a deleting code path would do: a message whose outbox row went before any worker
    // took it (no event in its history: QUEUED). Retention removes DONE rows alone, whose
    // history shows the worker that took them; the proof tells the two apart.
    let id = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
         VALUES ($1, 0, '+15550100', '{}', '\\x00')",
    )
    .bind(id)
    .execute(&herald.pool)
    .await
    .unwrap();
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("WRONG outbox_rows_missing: 1"), "{report}");
}

/// A text search over the code, beside the behavioural proof above (`herald verify` checks
/// after every end-to-end test that every message and receipt still has its outbox row).
#[test]
fn r3_no_code_path_deletes_an_outbox_row() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut offenders = Vec::new();
    let roots = [root.join("crates"), root.join("migrations")];
    for path in herald_testkit::source_files(&roots, &["tests", "target"]) {
        let text = std::fs::read_to_string(&path).unwrap().to_ascii_lowercase();
        let squeezed: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        // Retention's deletes (herald_remove_done_jobs: rows its cursor passes, and
        // re-driven rows behind it) remove DONE rows only: their work is done, and
        // the proof tells them from a lost row.
        let retention = [
            ("0016_retention.sql", 1),
            ("0018_retention_redriven.sql", 2),
        ];
        if let Some((_, deletes)) = retention.iter().find(|(f, _)| path.ends_with(f)) {
            let statements: Vec<&str> = squeezed.split("delete from outbox").skip(1).collect();
            assert_eq!(statements.len(), *deletes, "{}", path.display());
            for statement in statements {
                let statement = statement.split("returning").next().unwrap();
                assert!(
                    statement.contains("and o.status = 'done'"),
                    "{}: a retention delete of a row that may not be DONE: {statement}",
                    path.display()
                );
            }
            continue;
        }
        for needle in ["delete from outbox", "truncate outbox", "drop table outbox"] {
            if squeezed.contains(needle) {
                offenders.push(format!("{}: {needle}", path.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "outbox rows are the proof: {offenders:?}"
    );
}

// ---------------------------------------------------------------------------------------- R4

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_a_message_refused_by_an_internal_check_fails_without_a_claim() {
    let herald = Deployment::start(Options {
        worker_flags: args(&["--blocked-recipients", "+15550999,+15550998"]),
        ..Options::default()
    })
    .await;
    let ids = post_batch(&herald, &["+15550999", "+15550100"]).await;
    herald.wait_delivered(1, MINUTE).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_events WHERE state = 'FAILED'",
            1,
            MINUTE,
        )
        .await;
    let blocked = herald.history(&ids[0]).await;
    assert_eq!(states(&blocked), vec!["QUEUED", "FAILED"]);
    assert!(blocked[1].1["reason"].as_str().unwrap().contains("blocked"));
    let submits = herald.provider_submits().await;
    let blocked_key = send_effect_key(Uuid::parse_str(&ids[0]).unwrap());
    assert!(
        !submits.contains_key(&blocked_key),
        "a refused message never reaches the provider"
    );
    assert!(states(&herald.history(&ids[1]).await).contains(&"ACCEPTED"));
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_a_worker_killed_after_claimed_is_redriven_and_accepted_once() {
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--latency", "2s"]),
        worker_flags: args(&["--claim-lease", "4s"]),
        poller_flags: args(&["--redrive-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "claimed", 40).await;
    herald
        .wait_for("SELECT count(*) FROM in_flight_sends", 40, MINUTE)
        .await;
    // Every send is CLAIMED and waiting on the provider: kill the worker now.
    herald.role("send-worker").kill9().await.unwrap();
    assert_eq!(count(&herald, "SELECT count(*) FROM ledger").await, 0);
    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(40, MINUTE).await;
    for id in &ids {
        let history = herald.history(id).await;
        let accepted = states(&history)
            .iter()
            .filter(|s| **s == "ACCEPTED")
            .count();
        assert_eq!(accepted, 1, "{id}: {history:?}");
        assert!(
            history.iter().any(|(s, d)| s == "RETRYING"
                && d["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("claim lease expired")),
            "{id}: {history:?}"
        );
    }
    verify_ok(&herald).await;
}

/// A slow provider is no reason to re-drive: a live worker renews its claims while its calls
/// run, however much longer than the lease they take (before, a claim older than
/// `--stale-claim-after` was re-driven while its call was in flight). A worker frozen with
/// calls in flight stops renewing: its claims are re-driven after the lease and another worker
/// sends them with the same keys; thawed, its late writes present leases that are gone and move
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_a_send_worker_frozen_past_its_lease_is_redriven_and_its_thaw_writes_nothing() {
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--latency", "5s"]),
        worker_flags: args(&["--claim-lease", "3s", "--retry-base", "200ms"]),
        poller_flags: args(&["--redrive-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    let lease_expired = "SELECT count(*) FROM message_events
                         WHERE state = 'RETRYING' AND detail->>'reason' LIKE 'claim lease expired%'";

    // A live worker whose calls take 5 s under a 3 s lease keeps every claim.
    let slow = send_n(&herald, "slow", 10).await;
    herald.wait_delivered(10, MINUTE).await;
    assert_eq!(
        count(&herald, lease_expired).await,
        0,
        "nothing was re-driven"
    );
    let stats = herald.get_json_from(&herald.sim_url, "/v1/stats").await;
    assert_eq!(stats["duplicate_submits"], 0, "{stats}");
    assert_eq!(stats["conflicts"], 0, "{stats}");

    // Frozen with ten calls in flight.
    let frozen = send_n(&herald, "frozen", 10).await;
    herald
        .wait_for("SELECT count(*) FROM in_flight_sends", 10, MINUTE)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // the requests have left
    herald.role("send-worker").pause().unwrap();
    herald.wait_for(lease_expired, 10, MINUTE).await;
    let mut other = args(&["worker", "--job-type", "send", "--claim-lease", "3s"]);
    other.extend(args(&[
        "--retry-base",
        "200ms",
        "--redis-url",
        &herald.send_redis.url(),
        "--provider-url",
        &herald.sim_url,
    ]));
    herald.spawn_with_admin("worker-2", other).await;
    herald.wait_delivered(20, MINUTE).await;
    herald.role("send-worker").resume().unwrap();
    // Whatever the thawed worker writes now (ACCEPTED again, or a retry of a call it thinks
    // timed out), no row goes back to PENDING and nothing is written twice.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND status <> 'DONE'"
        )
        .await,
        0
    );
    for id in slow.iter().chain(&frozen) {
        let history = herald.history(id).await;
        let accepted = states(&history)
            .iter()
            .filter(|s| **s == "ACCEPTED")
            .count();
        assert_eq!(accepted, 1, "{id}: {history:?}");
        assert!(!states(&history).contains(&"DEAD"), "{id}: {history:?}");
    }
    verify_ok(&herald).await;
}

// ---------------------------------------------------------------------------------------- R5

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_every_path_that_writes_an_effect_writes_one_row_with_one_key() {
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--timeout-delay", "3s"]),
        worker_flags: args(&[
            "--provider-timeout",
            "10s",
            "--max-attempts",
            "2",
            "--retry-base",
            "50ms",
            "--claim-lease",
            "5s",
        ]),
        poller_flags: args(&["--redrive-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    // Path 1: the plain send.
    let plain = send_n(&herald, "plain", 10).await;
    herald.wait_delivered(10, MINUTE).await;

    // Path 2: the provider takes the submit but answers late; the worker dies before it can
    // write ACCEPTED. The stale claim is re-driven and submitted again with the same key.
    herald.set_faults(0.0, 1.0).await;
    let crashed = send_n(&herald, "crashed", 10).await;
    herald
        .wait_for("SELECT count(*) FROM in_flight_sends", 10, MINUTE)
        .await;
    // The provider took all ten submits (and holds their answers back): kill the worker now.
    let deadline = std::time::Instant::now() + MINUTE;
    loop {
        let stats = herald.get_json_from(&herald.sim_url, "/v1/stats").await;
        if stats["injected_timeouts"].as_u64().unwrap_or(0) >= 10 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "stats: {stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    herald.role("send-worker").kill9().await.unwrap();
    herald.set_faults(0.0, 0.0).await;
    herald.role("send-worker").restart().await.unwrap();
    herald.wait_delivered(20, MINUTE).await;
    // The provider took those ten and posted their receipts while no send was recorded: the
    // receipts were held (not retried until parked) and applied once the re-driven sends were.
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state
             WHERE state IN ('DELIVERED', 'UNDELIVERED', 'EXPIRED')",
            20,
            MINUTE,
        )
        .await;
    assert!(
        herald
            .metric(
                &herald.status_worker_admin,
                "herald_receipts_released_total"
            )
            .await
            > 0.0,
        "receipts outran their sends' ledger rows and were held"
    );
    assert_eq!(count(&herald, "SELECT count(*) FROM parking").await, 0);

    // Path 3: every attempt times out after the provider took it (the retries meet a 409: the
    // first submit is still in progress). Attempts used up with the outcome unknown is no
    // reason for DEAD: the next attempt asks the provider by key, finds the effect and records
    // it. (Before, these five ended DEAD although the provider had them.)
    herald.role("send-worker").kill9().await.unwrap();
    let mut impatient = args(&[
        "worker",
        "--job-type",
        "send",
        "--provider-timeout",
        "300ms",
    ]);
    impatient.extend(args(&[
        "--max-attempts",
        "2",
        "--retry-base",
        "50ms",
        "--claim-lease",
        "5s",
        "--redis-url",
        &herald.send_redis.url(),
        "--provider-url",
        &herald.sim_url,
    ]));
    herald.spawn_with_admin("impatient-worker", impatient).await;
    herald.set_faults(0.0, 1.0).await;
    let settled = send_n(&herald, "settled", 5).await;
    herald.wait_delivered(25, MINUTE).await;
    herald.set_faults(0.0, 0.0).await;
    assert_eq!(
        count(&herald, "SELECT count(*) FROM outbox WHERE status = 'DEAD'").await,
        0
    );
    let stats = herald.get_json_from(&herald.sim_url, "/v1/stats").await;
    assert!(
        stats["conflicts"].as_u64().unwrap_or(0) > 0,
        "a retry met the first submit still in progress (409): {stats}"
    );
    for id in &settled {
        let history = herald.history(id).await;
        assert!(
            history.iter().any(|(s, d)| s == "RETRYING"
                && d["outcome"] == "unknown"
                && d["next"] == "ask the provider by key"),
            "{id}: {history:?}"
        );
        assert!(!states(&history).contains(&"DEAD"), "{id}: {history:?}");
    }

    // One ledger row per message, its key derived from the message, and every submit the
    // provider saw for a message carried that same key.
    let submits = herald.provider_submits().await;
    assert_eq!(submits.len(), 25, "one key per message: {submits:?}");
    for (ids, at_least) in [(&plain, 1), (&crashed, 2), (&settled, 1)] {
        for id in ids {
            let key = send_effect_key(Uuid::parse_str(id).unwrap());
            let rows: Vec<String> = sqlx::query_scalar(
                "SELECT idempotency_key FROM ledger WHERE message_id = $1::uuid",
            )
            .bind(id)
            .fetch_all(&herald.pool)
            .await
            .unwrap();
            assert_eq!(rows, vec![key.clone()], "{id}");
            let seen = submits.get(&key).copied().unwrap_or(0);
            assert!(
                seen >= at_least,
                "{id}: {seen} submits, expected at least {at_least}"
            );
        }
    }
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_two_gateways_issuing_the_same_provider_id_land_on_the_right_messages() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--gateways", "gw-a,gw-b", "--id-wrap", "1000"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "twins", 40).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
            40,
            MINUTE,
        )
        .await;
    let shared = count(
        &herald,
        "SELECT count(*) FROM ledger a JOIN ledger b
           ON a.provider_id = b.provider_id AND a.gateway = 'gw-a' AND b.gateway = 'gw-b'",
    )
    .await;
    assert!(shared > 0, "both gateways issued the same ids");
    for id in &ids {
        let (gateway, provider_id): (String, String) =
            sqlx::query_as("SELECT gateway, provider_id FROM ledger WHERE message_id = $1::uuid")
                .bind(id)
                .fetch_one(&herald.pool)
                .await
                .unwrap();
        let history = herald.history(id).await;
        let delivered = history.iter().find(|(s, _)| s == "DELIVERED").unwrap();
        assert_eq!(delivered.1["gateway"], gateway.as_str());
        assert_eq!(delivered.1["provider_id"], provider_id.as_str());
    }
    let stats = herald.get_json_from(&herald.sim_url, "/v1/stats").await;
    assert_eq!(stats["duplicate_submits"], 0, "nothing was sent again");
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_provider_ids_reused_within_one_gateway_land_on_the_right_messages() {
    let herald = Deployment::start(Options {
        sim_flags: args(&[
            "--gateways",
            "gw-a",
            "--id-wrap",
            "3",
            "--enroute-rate",
            "0",
        ]),
        ..Options::default()
    })
    .await;
    // Four rounds over ids 1..=3 of one gateway: every id is issued four times.
    let mut ids = Vec::new();
    for round in 0..4 {
        ids.extend(send_n(&herald, &format!("reuse-{round}"), 3).await);
        herald
            .wait_for(
                "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
                ids.len() as i64,
                MINUTE,
            )
            .await;
    }
    let reused = count(
        &herald,
        "SELECT count(*) FROM (SELECT provider_id FROM ledger GROUP BY provider_id
                               HAVING count(*) > 1) r",
    )
    .await;
    assert!(
        reused > 0,
        "the gateway issued the same id to several messages"
    );
    for id in &ids {
        let (gateway, provider_id): (String, String) =
            sqlx::query_as("SELECT gateway, provider_id FROM ledger WHERE message_id = $1::uuid")
                .bind(id)
                .fetch_one(&herald.pool)
                .await
                .unwrap();
        let history = herald.history(id).await;
        let delivered: Vec<&Value> = history
            .iter()
            .filter(|(s, _)| s == "DELIVERED")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(
            delivered.len(),
            1,
            "{id}: one final receipt each: {history:?}"
        );
        assert_eq!(delivered[0]["gateway"], gateway.as_str());
        assert_eq!(delivered[0]["provider_id"], provider_id.as_str());
    }
    verify_ok(&herald).await;
}

// ---------------------------------------------------------------------------------------- R6

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_an_unknown_status_is_parked_and_replayed_once_the_mapping_is_fixed() {
    let mut herald = Deployment::start(Options {
        sim_flags: args(&["--unknown-status-rate", "1", "--enroute-rate", "0"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "odd-status", 5).await;
    herald
        .wait_for("SELECT count(*) FROM parking", 5, MINUTE)
        .await;
    let parked = herald.get_json("/v1/parking").await;
    let items = parked["parked"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    for item in items {
        assert!(
            item["reason"]
                .as_str()
                .unwrap()
                .contains("unknown provider status \"ACKD\""),
            "{item}"
        );
        // The raw body, exactly as the provider posted it.
        let raw: Vec<u8> = sqlx::query_scalar("SELECT raw FROM receipts WHERE id = $1")
            .bind(item["receipt_id"].as_i64().unwrap())
            .fetch_one(&herald.pool)
            .await
            .unwrap();
        assert_eq!(item["raw"].as_str().unwrap().as_bytes(), raw.as_slice());
    }
    // Nothing else changed: every message is still just ACCEPTED.
    for id in &ids {
        assert_eq!(
            states(&herald.history(id).await),
            vec!["QUEUED", "CLAIMED", "ACCEPTED"]
        );
    }
    assert_eq!(
        herald
            .metric(&herald.status_worker_admin, "herald_parked_total")
            .await,
        5.0
    );
    // Parked receipts are not delivered: the proof names them until they are replayed.
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("WRONG receipt_parked: 5"), "{report}");
    assert!(report.contains("WRONG parked: 5"), "{report}");

    // The operator teaches Herald the status and replays the parked receipts.
    assert!(herald
        .role("status-worker")
        .terminate(Duration::from_secs(10))
        .await
        .unwrap());
    let fixed = args(&[
        "worker",
        "--job-type",
        "status",
        "--status-alias",
        "ACKD=DELIVRD",
        "--redis-url",
        &herald.status_redis.url(),
    ]);
    herald.spawn_with_admin("status-worker-fixed", fixed).await;
    for item in items {
        let url = format!("{}/v1/parking/{}/replay", herald.api_url, item["id"]);
        assert_eq!(herald.client.post(&url).send().await.unwrap().status(), 202);
        assert_eq!(herald.client.post(&url).send().await.unwrap().status(), 409);
    }
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
            5,
            MINUTE,
        )
        .await;
    assert_eq!(
        herald.get_json("/v1/parking").await["parked"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_an_unparseable_timestamp_is_parked_and_never_replaced_by_now() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--bad-timestamp-rate", "1", "--enroute-rate", "0"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "bad-time", 5).await;
    herald
        .wait_for("SELECT count(*) FROM parking", 5, MINUTE)
        .await;
    let items = herald.get_json("/v1/parking").await;
    let items = items["parked"].as_array().unwrap();
    assert_eq!(items.len(), 5, "{items:?}");
    for item in items {
        assert!(
            item["reason"]
                .as_str()
                .unwrap()
                .contains("unparseable timestamp"),
            "{item}"
        );
    }
    // Parking and finishing the job are one statement: nothing can follow it.
    for id in &ids {
        assert_eq!(
            states(&herald.history(id).await),
            vec!["QUEUED", "CLAIMED", "ACCEPTED"]
        );
    }
    let with_time = count(
        &herald,
        "SELECT count(*) FROM message_events WHERE detail ? 'provider_time'",
    )
    .await;
    assert_eq!(with_time, 0, "no receipt was applied with an invented time");
    let (code, report) = herald.verify_expecting("receipt_parked=5,parked=5").await;
    assert_eq!(code, 0, "{report}");
}

// ---------------------------------------------------------------------------------------- R7

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_a_silent_gateway_s_messages_become_unknown_never_failed() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--silent-rate", "1"]),
        status_worker_flags: args(&["--receipt-window", "2s", "--reconcile-interval", "500ms"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "silent", 10).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'UNKNOWN'",
            10,
            MINUTE,
        )
        .await;
    for id in &ids {
        assert_eq!(
            states(&herald.history(id).await),
            vec!["QUEUED", "CLAIMED", "ACCEPTED", "ENROUTE", "UNKNOWN"]
        );
    }
    assert_eq!(
        count(
            &herald,
            "SELECT count(*) FROM message_events WHERE state IN ('FAILED', 'UNDELIVERED')"
        )
        .await,
        0
    );
    assert_eq!(
        herald
            .metric(&herald.status_worker_admin, "herald_unknown_total")
            .await,
        10.0
    );
    // UNKNOWN is an honest answer, not a delivery: the run must declare it.
    let (code, report) = herald.verify().await;
    assert_eq!(code, 1, "{report}");
    let (code, report) = herald.verify_expecting("unknown=10").await;
    assert_eq!(code, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_a_late_final_receipt_settles_an_unknown_message() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--enroute-rate", "0", "--receipt-delay", "4s"]),
        status_worker_flags: args(&["--receipt-window", "1s", "--reconcile-interval", "200ms"]),
        ..Options::default()
    })
    .await;
    let ids = send_n(&herald, "late", 10).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'",
            10,
            MINUTE,
        )
        .await;
    for id in &ids {
        assert_eq!(
            states(&herald.history(id).await),
            vec!["QUEUED", "CLAIMED", "ACCEPTED", "UNKNOWN", "DELIVERED"],
            "{id}: UNKNOWN past the window, settled by the late receipt"
        );
    }
    verify_ok(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_a_receipted_message_is_never_marked_unknown() {
    let herald = Deployment::start(Options {
        sim_flags: args(&["--silent-rate", "0.5", "--enroute-rate", "1"]),
        // Receipts follow their submit within milliseconds; the window leaves room for a
        // loaded machine, since a receipt later than it would rightly settle an UNKNOWN.
        status_worker_flags: args(&["--receipt-window", "8s", "--reconcile-interval", "200ms"]),
        ..Options::default()
    })
    .await;
    // One batch: every message is accepted at about the same time, so by the time the silent
    // ones are UNKNOWN, the window of every receipted one has passed as well.
    let ids = send_n(&herald, "mixed", 40).await;
    herald
        .wait_for(
            "SELECT count(*) FROM message_current_state WHERE state IN ('UNKNOWN', 'DELIVERED')",
            40,
            MINUTE,
        )
        .await;
    let mut silent = 0;
    for id in &ids {
        let history = herald.history(id).await;
        let states = states(&history);
        if states.contains(&"DELIVERED") {
            assert!(
                !states.contains(&"UNKNOWN"),
                "{id} had its receipt: {states:?}"
            );
        } else {
            // Silent after ENROUTE: UNKNOWN (an ENROUTE later than the window may follow it).
            assert!(states.contains(&"UNKNOWN"), "{id}: {states:?}");
            silent += 1;
        }
    }
    assert!(
        silent > 0 && silent < 40,
        "both kinds were sent: {silent} silent"
    );
    let (code, report) = herald.verify_expecting(&format!("unknown={silent}")).await;
    assert_eq!(code, 0, "{report}");
}
