//! What the runtime's test binaries share: entries written to a stream as any client could,
//! and a worker stopped the way a role stops it.

use std::sync::Arc;
use std::time::Duration;

use herald_queue::QueueStore;
use herald_worker::{Handler, WorkerSettings};
use tokio_util::sync::CancellationToken;

/// Appends one entry per `raw`, its `job` field holding `raw` as it is.
pub async fn add_raw_entries(redis_url: &str, stream: &str, raws: &[String]) {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for raw in raws {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("job")
            .arg(raw)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Runs `handler` over `store` until the token is cancelled ([`stop`]).
pub fn start<H: Handler>(
    store: &QueueStore<H::Kind>,
    handler: Arc<H>,
    settings: WorkerSettings,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(herald_worker::run(
        vec![store.clone()],
        handler,
        settings,
        cancel.clone(),
    ));
    (cancel, worker)
}

/// Cancels the worker and waits for it to end on its own.
pub async fn stop(cancel: CancellationToken, worker: tokio::task::JoinHandle<()>) {
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops on cancel")
        .expect("the worker itself did not panic");
}
