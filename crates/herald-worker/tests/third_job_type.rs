//! A job type of the test's own, to show what adding one takes: an enum with one variant more
//! than Herald's (`Echo`) and a handler. Reading, decoding, the type check, dropping what is
//! not an echo job, panic capture, the in-flight gauge and acknowledging all come from the
//! runtime, against a real Redis, as they do for sends and receipts.

mod streams;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::job::Job;
use herald_core::JobKind;
use herald_queue::{QueueStore, StoreSettings};
use herald_testkit::redis::LocalRedis;
use herald_worker::{BatchAnswers, BatchJobs, Handled, Handler, WorkerSettings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Herald's job types and the one this test adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Send,
    Status,
    Echo,
}

impl JobKind for Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::Status => "status",
            Kind::Echo => "echo",
        }
    }
}

/// The echo job type's handler: it keeps each job's `text`. Its first batch panics.
#[derive(Default)]
struct EchoHandler {
    panicked: AtomicBool,
    echoed: Mutex<Vec<(i64, String)>>,
}

impl Handler for EchoHandler {
    type Kind = Kind;
    const JOB_TYPE: Kind = Kind::Echo;

    async fn handle(&self, jobs: BatchJobs<Kind>, _cancel: CancellationToken) -> BatchAnswers {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("the echo handler's first batch fails");
        }
        let mut echoed = self.echoed.lock().unwrap();
        jobs.into_iter()
            .map(|(entry, job)| {
                assert_eq!(job.job_type, Kind::Echo, "the runtime checked the type");
                let text = job.payload["text"].as_str().unwrap_or_default().to_owned();
                echoed.push((job.outbox_id, text));
                (entry, Handled::Done)
            })
            .collect()
    }
}

fn job(outbox_id: i64, job_type: Kind) -> Job<Kind> {
    Job {
        outbox_id,
        partition: 0,
        job_type,
        message_id: None,
        attempt: 0,
        payload: json!({ "text": format!("echo {outbox_id}") }),
    }
}

#[tokio::test]
async fn a_third_job_type_is_an_enum_variant_and_a_handler() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let redis = LocalRedis::start().await.unwrap();
    let store = QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type: Kind::Echo,
        shard: 0,
        max_connections: 4,
    })
    .unwrap();
    assert_eq!(store.stream_key(), "herald:echo:0", "its own stream");
    assert_eq!(store.group(), "herald-echo-workers", "its own group");
    store.ensure_group().await.unwrap();
    // Its own jobs, a send job on the wrong stream, and entries of a type nobody knows or no
    // job at all.
    store
        .publish(&[job(1, Kind::Echo), job(2, Kind::Send), job(3, Kind::Echo)])
        .await
        .unwrap();
    let unknown_type = json!({"outbox_id": 4, "partition": 0, "job_type": "sms",
                              "message_id": null, "attempt": 0, "payload": {}});
    let raws = [unknown_type.to_string(), "not json".to_owned()];
    streams::add_raw_entries(&redis.url(), store.stream_key(), &raws).await;
    store.publish(&[job(6, Kind::Echo)]).await.unwrap();

    let handler = Arc::new(EchoHandler::default());
    let settings = WorkerSettings {
        consumer: "echo-test".to_owned(),
        max_batch: 2,
        read_block: Duration::from_millis(100),
        // Long enough that a slow batch on a busy machine is not taken over while it runs.
        reclaim_idle: Duration::from_secs(2),
        reclaim_interval: Duration::from_millis(200),
        ..WorkerSettings::default()
    };
    let (cancel, worker) = streams::start(&store, handler.clone(), settings);
    herald_testkit::wait_until(
        "every echo job handled, the stream empty and the gauge at 0",
        Duration::from_secs(30),
        || async {
            let count = handler.echoed.lock().unwrap().len();
            anyhow::ensure!(count >= 3, "{count} echoed");
            anyhow::ensure!(store.oldest_entry_ms().await?.is_none(), "entries left");
            let gauge = herald_testkit::metric_value(
                &metrics.render(),
                "herald_worker_jobs_in_flight",
                r#"job_type="echo""#,
            );
            anyhow::ensure!(gauge == Some(0.0), "in flight {gauge:?}");
            Ok(())
        },
    )
    .await
    .unwrap();
    streams::stop(cancel, worker).await;

    let mut echoed = handler.echoed.lock().unwrap().clone();
    echoed.sort();
    let expected: Vec<(i64, String)> = [1, 3, 6].map(|id| (id, format!("echo {id}"))).into();
    assert_eq!(
        echoed, expected,
        "each echo job handled once it was reclaimed after the panic, decoded, and nothing else"
    );
    let rendered = metrics.render();
    let value = |name: &str, labels: &str| herald_testkit::metric_value(&rendered, name, labels);
    assert_eq!(
        value("herald_worker_handler_panics_total", r#"job_type="echo""#),
        Some(1.0),
        "{rendered}"
    );
    assert_eq!(
        value(
            "herald_jobs_total",
            r#"job_type="echo",outcome="wrong_job_type""#
        ),
        Some(1.0),
        "the send job on the echo stream, once, whichever batch panicked: {rendered}"
    );
    assert_eq!(
        value("herald_queue_malformed_entries_total", r#"job_type="echo""#),
        Some(2.0),
        "the unknown type and the entry that is no job, once each: {rendered}"
    );
}
