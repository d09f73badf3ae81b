//! The worker runtime against a real Redis: what happens to a batch whose handler panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::job::Job;
use herald_core::JobType;
use herald_queue::{Delivery, QueueStore, StoreSettings};
use herald_testkit::redis::LocalRedis;
use herald_worker::{Handled, Handler, WorkerSettings};
use tokio_util::sync::CancellationToken;

/// Panics on its first call; afterwards records the outbox id of every job it handles.
#[derive(Default)]
struct PanicsOnce {
    calls: AtomicUsize,
    handled: Mutex<Vec<i64>>,
}

impl Handler for PanicsOnce {
    async fn handle(&self, delivery: Delivery, _cancel: CancellationToken) -> Handled {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a handler bug");
        }
        let job = delivery.job.expect("the test publishes valid jobs");
        self.handled.lock().unwrap().push(job.outbox_id);
        Handled::Done
    }
}

/// A batch whose handler panics is neither lost nor acknowledged: the reader keeps going,
/// and the entries are reclaimed and handled, then acknowledged and deleted. The panic is
/// counted, and the batch leaves the in-flight gauge.
#[tokio::test]
async fn a_panicking_batch_is_reclaimed_and_handled_again() {
    // This binary's only test, so it may own the process's recorder.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("no other recorder in this test binary");
    let redis = LocalRedis::start().await.unwrap();
    let store = QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 4,
    })
    .unwrap();
    store.ensure_group().await.unwrap();
    let jobs: Vec<Job> = (1..=3)
        .map(|outbox_id| Job {
            outbox_id,
            partition: 0,
            job_type: JobType::Send,
            message_id: None,
            attempt: 0,
            payload: serde_json::json!({}),
        })
        .collect();
    store.publish(&jobs).await.unwrap();

    let handler = Arc::new(PanicsOnce::default());
    let cancel = CancellationToken::new();
    let settings = WorkerSettings {
        consumer: "runtime-test".to_owned(),
        concurrency: 1,
        max_batch: 1,
        read_block: Duration::from_millis(100),
        reclaim_idle: Duration::from_millis(300),
        reclaim_interval: Duration::from_millis(100),
        ..WorkerSettings::default()
    };
    let worker = tokio::spawn(herald_worker::run(
        vec![store.clone()],
        handler.clone(),
        settings,
        cancel.clone(),
    ));

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
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops on cancel")
        .expect("the worker itself did not panic");
}
