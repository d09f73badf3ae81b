//! The send handler against a real PostgreSQL and the provider simulator.

mod common;

use common::{count, migrated};

use std::time::Duration;

use herald_core::job::Job;
use herald_core::JobType;
use herald_store::accept::{accept_messages, NewMessage};
use herald_testkit::shared::message;
use herald_worker::provider::ProviderClient;
use herald_worker::send::{SendHandler, SendSettings};
use herald_worker::{Handled, Handler};
use tokio_util::sync::CancellationToken;

/// Batches read at the same time share their ownership confirmations (group commit). A job
/// whose copies are in both batches, or twice in one, is still confirmed and sent once: the
/// other copies are stale and acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_confirm_and_send_each_job_once() {
    let (_pg, pool) = migrated(4).await;
    let messages: Vec<NewMessage> = (0..100)
        .map(|i| message(i % 4, None, &format!("message {i}")))
        .collect();
    accept_messages(&pool, &messages).await.unwrap();
    let rows: Vec<(i32, i64, uuid::Uuid)> = sqlx::query_as(
        "UPDATE outbox SET status = 'PUBLISHED', claimed_at = now()
         WHERE job_type = 'send' RETURNING partition, id, message_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 100);
    let jobs: Vec<Job> = rows
        .iter()
        .map(|(partition, id, message)| Job {
            outbox_id: *id,
            partition: *partition as u32,
            job_type: JobType::Send,
            message_id: Some(*message),
            attempt: 0,
            payload: serde_json::json!({}),
        })
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let sim = herald_provider_sim::router(herald_provider_sim::SimSettings {
        log_path: dir.path().join("submits.jsonl"),
        ..Default::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, sim).await });

    let cancel = CancellationToken::new();
    let handler = SendHandler::new(
        pool.clone(),
        ProviderClient::new(&sim_url, Duration::from_secs(10)).unwrap(),
        SendSettings::default(),
        cancel.clone(),
    );
    let copies = |range: std::ops::Range<usize>, tag: &str| -> Vec<(String, Job)> {
        range
            .map(|i| (format!("{tag}-{i}"), jobs[i].clone()))
            .collect()
    };
    // Jobs 40..60 are in both batches; job 0 is twice in the first.
    let mut first = copies(0..60, "a");
    first.push(("a-again-0".to_owned(), jobs[0].clone()));
    let second = copies(40..100, "b");
    let (a, b) = tokio::join!(
        handler.handle(first, cancel.clone()),
        handler.handle(second, cancel.clone())
    );
    assert_eq!(a.len(), 61);
    assert_eq!(b.len(), 60);
    assert!(
        a.iter()
            .chain(&b)
            .all(|(_, handled)| *handled == Handled::Done),
        "every copy is acknowledged: {a:?} {b:?}"
    );

    assert_eq!(count(&pool, "SELECT count(*) FROM ledger").await, 100);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM message_events WHERE state = 'CLAIMED'"
        )
        .await,
        100,
        "one CLAIMED per message"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE job_type = 'send' AND attempts = 1"
        )
        .await,
        100,
        "one attempt charged per message"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM in_flight_sends").await,
        0
    );
    let stats: serde_json::Value = reqwest::get(format!("{sim_url}/v1/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["distinct_keys"], 100, "{stats}");
    assert_eq!(stats["duplicate_submits"], 0, "{stats}");
    cancel.cancel();
}
