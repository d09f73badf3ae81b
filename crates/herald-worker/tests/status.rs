//! The status handler against a real PostgreSQL.

mod common;

use common::{count, migrated};

use herald_core::job::Job;
use herald_core::JobType;
use herald_store::receipts::{accept_receipts, NewReceipt};
use herald_worker::status::{StatusHandler, StatusSettings};
use herald_worker::{Handled, Handler};
use tokio_util::sync::CancellationToken;

/// Two copies of one status job read in the same batch (a re-drive published it again while
/// the first copy waited) finish it once: its undecodable receipt is parked once, its
/// unmatched receipt held once, and both entries are acknowledged.
#[tokio::test]
async fn two_copies_of_a_status_job_in_one_batch_finish_it_once() {
    let (_pg, pool) = migrated(4).await;
    let receipts: Vec<NewReceipt> = [
        "not json".to_owned(),
        r#"{"provider_id":"9","status":"DELIVRD","timestamp":1700000000}"#.to_owned(),
    ]
    .into_iter()
    .map(|raw| NewReceipt {
        gateway: "gw".to_owned(),
        raw: raw.into_bytes(),
        content_type: None,
        partition: 2,
    })
    .collect();
    accept_receipts(&pool, &receipts).await.unwrap();
    let (outbox_id, payload): (i64, serde_json::Value) = sqlx::query_as(
        "UPDATE outbox SET status = 'PUBLISHED', claimed_at = now()
         WHERE job_type = 'status' RETURNING id, payload",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let job = Job {
        outbox_id,
        partition: 2,
        job_type: JobType::Status,
        message_id: None,
        attempt: 0,
        payload,
    };
    let handler = StatusHandler {
        pool: pool.clone(),
        settings: StatusSettings::default(),
    };
    let copies = ["1-0", "2-0"].map(|entry| (entry.to_owned(), job.clone()));
    let answers = handler
        .handle(copies.into(), CancellationToken::new())
        .await;
    assert_eq!(
        answers,
        [
            ("1-0".to_owned(), Handled::Done),
            ("2-0".to_owned(), Handled::Done)
        ]
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM parking").await, 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM held_receipts").await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox WHERE status = 'DONE'").await,
        1
    );
}
