//! The worker runtime against a real Redis: what happens to a batch whose handler panics, and
//! to entries that are not the handler's jobs.

mod streams;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::job::Job;
use herald_core::JobType;
use herald_queue::{QueueStore, StoreSettings};
use herald_testkit::redis::LocalRedis;
use herald_worker::{BatchAnswers, BatchJobs, Handled, Handler, WorkerSettings};
use tokio_util::sync::CancellationToken;

/// Panics on its first call; afterwards records the outbox id of every job it handles.
#[derive(Default)]
struct PanicsOnce {
    calls: AtomicUsize,
    handled: Mutex<Vec<i64>>,
}

impl Handler for PanicsOnce {
    type Kind = JobType;
    const JOB_TYPE: JobType = JobType::Send;

    async fn handle(&self, jobs: BatchJobs, _cancel: CancellationToken) -> BatchAnswers {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a handler bug");
        }
        let mut handled = self.handled.lock().unwrap();
        jobs.into_iter()
            .map(|(entry, job)| {
                handled.push(job.outbox_id);
                (entry, Handled::Done)
            })
            .collect()
    }
}

/// Records every job it is given, as it was given.
#[derive(Default)]
struct Records {
    jobs: Mutex<Vec<Job>>,
}

impl Handler for Records {
    type Kind = JobType;
    const JOB_TYPE: JobType = JobType::Status;

    async fn handle(&self, jobs: BatchJobs, _cancel: CancellationToken) -> BatchAnswers {
        let mut seen = self.jobs.lock().unwrap();
        jobs.into_iter()
            .map(|(entry, job)| {
                seen.push(job);
                (entry, Handled::Done)
            })
            .collect()
    }
}

/// The job type's stream on `redis`, with its consumer group.
async fn stream(redis: &LocalRedis, job_type: JobType) -> QueueStore {
    let store = QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type,
        shard: 0,
        max_connections: 4,
    })
    .unwrap();
    store.ensure_group().await.unwrap();
    store
}

fn job(outbox_id: i64, job_type: JobType) -> Job {
    Job {
        outbox_id,
        partition: 0,
        job_type,
        message_id: None,
        attempt: 0,
        payload: serde_json::json!({ "receipt_ids": [outbox_id] }),
    }
}

/// A batch whose handler panics is neither lost nor acknowledged: the reader keeps going,
/// and the entries are reclaimed and handled, then acknowledged and deleted. The panic is
/// counted, and the batch leaves the in-flight gauge.
#[tokio::test]
async fn a_panicking_batch_is_reclaimed_and_handled_again() {
    // The only test of this binary that reads metrics, so it may own the process's recorder
    // (the other one's handler does the status job type: its series have other labels).
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("no other recorder in this test binary");
    let redis = LocalRedis::start().await.unwrap();
    let store = stream(&redis, JobType::Send).await;
    let jobs: Vec<Job> = (1..=3).map(|id| job(id, JobType::Send)).collect();
    store.publish(&jobs).await.unwrap();

    let handler = Arc::new(PanicsOnce::default());
    let settings = WorkerSettings {
        consumer: "runtime-test".to_owned(),
        concurrency: 1,
        max_batch: 1,
        read_block: Duration::from_millis(100),
        reclaim_idle: Duration::from_millis(300),
        reclaim_interval: Duration::from_millis(100),
        ..WorkerSettings::default()
    };
    let (cancel, worker) = streams::start(&store, handler.clone(), settings);

    herald_testkit::wait_until(
        "every job handled and its entry deleted after a panic",
        Duration::from_secs(30),
        || async {
            let mut handled = handler.handled.lock().unwrap().clone();
            handled.sort();
            anyhow::ensure!(handled == [1, 2, 3], "handled {handled:?}");
            anyhow::ensure!(
                store.oldest_entry_ms().await?.is_none(),
                "entries left in the stream"
            );
            Ok(())
        },
    )
    .await
    .unwrap();
    assert!(
        handler.calls.load(Ordering::SeqCst) >= 4,
        "the panicking job was handled again"
    );
    let in_flight = |text: &str| {
        herald_testkit::metric_value(text, "herald_worker_jobs_in_flight", r#"job_type="send""#)
    };
    // The last batch leaves the gauge just after its entries are deleted.
    let settled = herald_testkit::wait_until(
        "the in-flight gauge at 0",
        Duration::from_secs(5),
        || async {
            anyhow::ensure!(in_flight(&metrics.render()) == Some(0.0), "still counted");
            Ok(())
        },
    )
    .await;
    let rendered = metrics.render();
    assert!(settled.is_ok(), "{rendered}");
    assert_eq!(
        herald_testkit::metric_value(
            &rendered,
            "herald_worker_handler_panics_total",
            r#"job_type="send""#
        ),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(in_flight(&rendered), Some(0.0), "{rendered}");
    streams::stop(cancel, worker).await;
}

/// The runtime hands a handler only its own job type's decoded jobs: an entry holding another
/// type's job or no job at all never reaches it, and is acknowledged and deleted (its outbox
/// row stays the proof), in the same batches as the handler's own jobs.
#[tokio::test]
async fn entries_that_are_not_the_handlers_jobs_never_reach_it_and_are_deleted() {
    let redis = LocalRedis::start().await.unwrap();
    let store = stream(&redis, JobType::Status).await;
    store
        .publish(&[
            job(1, JobType::Status),
            job(2, JobType::Send),
            job(3, JobType::Status),
        ])
        .await
        .unwrap();
    let raws = ["not json", r#"{"outbox_id": "four"}"#].map(String::from);
    streams::add_raw_entries(&redis.url(), store.stream_key(), &raws).await;
    store.publish(&[job(5, JobType::Status)]).await.unwrap();

    let handler = Arc::new(Records::default());
    let settings = WorkerSettings {
        consumer: "runtime-test".to_owned(),
        read_block: Duration::from_millis(100),
        ..WorkerSettings::default()
    };
    let (cancel, worker) = streams::start(&store, handler.clone(), settings);
    herald_testkit::wait_until("the stream emptied", Duration::from_secs(30), || async {
        anyhow::ensure!(
            store.oldest_entry_ms().await?.is_none(),
            "entries left in the stream"
        );
        Ok(())
    })
    .await
    .unwrap();
    let mut seen: Vec<Job> = handler.jobs.lock().unwrap().clone();
    seen.sort_by_key(|j| j.outbox_id);
    assert_eq!(
        seen,
        vec![
            job(1, JobType::Status),
            job(3, JobType::Status),
            job(5, JobType::Status)
        ],
        "the handler saw its own jobs, decoded, and nothing else"
    );
    streams::stop(cancel, worker).await;
}
