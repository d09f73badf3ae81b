//! One partition task against a real PostgreSQL and Redis: it publishes every PENDING row of
//! its own partition once, leaves other partitions alone, and once a newer owner recorded a
//! higher epoch it stops and claims nothing more (rule R7, the fence).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use herald_core::{Fence, JobType};
use herald_poller::{PartitionExit, Poller, PollerSettings};
use herald_queue::monitor::MonitoredStore;
use herald_queue::{QueueStore, StoreSettings};
use herald_store::accept::{accept_messages, NewMessage};
use herald_testkit::shared::message;
use herald_testkit::{LocalRedis, TestDatabase};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PATIENCE: Duration = Duration::from_secs(20);

struct Setup {
    _db: TestDatabase,
    _redis: LocalRedis,
    pool: PgPool,
    store: QueueStore,
    poller: Poller,
}

async fn setup() -> Setup {
    let db = TestDatabase::migrated(4).await.expect("database");
    let pool = db.pool(8).await.expect("pool");
    let redis = LocalRedis::start().await.expect("redis");
    let store = QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 4,
    })
    .expect("queue store");
    store.ensure_group().await.expect("group");
    let monitored = MonitoredStore::start(
        store.clone(),
        0.8,
        Duration::from_secs(1),
        CancellationToken::new(),
    );
    let settings = PollerSettings {
        poll_interval: Duration::from_millis(20),
        idle_poll_interval: Duration::from_millis(100),
        ..PollerSettings::default()
    };
    let poller = Poller::new(
        pool.clone(),
        HashMap::from([(JobType::Send, vec![monitored])]),
        settings,
    );
    Setup {
        _db: db,
        _redis: redis,
        pool,
        store,
        poller,
    }
}

/// Accepts `n` messages into `partition`; answers their ids.
async fn accept(pool: &PgPool, partition: u32, n: usize) -> BTreeSet<Uuid> {
    let messages: Vec<NewMessage> = (0..n)
        .map(|i| message(partition, None, &format!("m{i}")))
        .collect();
    accept_messages(pool, &messages).await.expect("accept");
    messages.iter().map(|m| m.id).collect()
}

fn run(poller: &Poller, fence: Fence) -> (CancellationToken, JoinHandle<PartitionExit>) {
    let cancel = CancellationToken::new();
    let (poller, stop) = (poller.clone(), cancel.clone());
    let task = tokio::spawn(async move {
        poller
            .run_partition(fence, Arc::new(Notify::new()), stop)
            .await
    });
    (cancel, task)
}

/// Reads the stream until it has `n` entries' message ids (or fails after PATIENCE).
async fn published(store: &QueueStore, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ids.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} published",
            ids.len()
        );
        let read = store
            .read("test", 1000, Duration::from_millis(100))
            .await
            .expect("read");
        for delivery in read {
            let job = delivery.job.expect("a valid job");
            ids.push(job.message_id.expect("a send names its message"));
        }
    }
    ids
}

async fn statuses(pool: &PgPool, partition: u32) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM outbox WHERE partition = $1 ORDER BY id")
        .bind(partition as i32)
        .fetch_all(pool)
        .await
        .expect("statuses")
}

#[tokio::test]
async fn an_owned_partition_has_each_row_published_once_and_no_other_partition_is_touched() {
    let s = setup().await;
    let mine = accept(&s.pool, 1, 150).await;
    accept(&s.pool, 2, 20).await;
    let fence = herald_store::leases::take_over(&s.pool, 1, "test")
        .await
        .unwrap();
    let (cancel, task) = run(&s.poller, fence);
    let ids = published(&s.store, mine.len()).await;
    let unique: BTreeSet<Uuid> = ids.iter().copied().collect();
    assert_eq!(unique, mine, "every row of the partition, and only those");
    assert_eq!(ids.len(), mine.len(), "each once");
    // Nothing more arrives: no row is published twice while it waits for a worker.
    let more = s
        .store
        .read("test", 1000, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(more.is_empty(), "published again: {}", more.len());
    assert!(statuses(&s.pool, 1)
        .await
        .iter()
        .all(|st| st == "PUBLISHED"));
    assert!(statuses(&s.pool, 2).await.iter().all(|st| st == "PENDING"));
    cancel.cancel();
    assert_eq!(
        tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap(),
        PartitionExit::Cancelled
    );
}

#[tokio::test]
async fn a_task_whose_fence_was_superseded_stops_and_claims_nothing_more() {
    let s = setup().await;
    let first = accept(&s.pool, 3, 10).await;
    let old = herald_store::leases::take_over(&s.pool, 3, "old")
        .await
        .unwrap();
    let (_cancel, task) = run(&s.poller, old);
    published(&s.store, first.len()).await;
    // A newer owner records a higher epoch; rows accepted from then on are its own.
    let newer = herald_store::leases::take_over(&s.pool, 3, "new")
        .await
        .unwrap();
    assert!(newer.epoch > old.epoch);
    accept(&s.pool, 3, 10).await;
    let exit = tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the old task stops")
        .unwrap();
    assert_eq!(exit, PartitionExit::Fenced);
    let statuses = statuses(&s.pool, 3).await;
    assert_eq!(
        statuses.iter().filter(|st| *st == "PENDING").count(),
        10,
        "the deposed owner claimed none of the new rows: {statuses:?}"
    );
    let more = s
        .store
        .read("test", 1000, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(more.is_empty());
}
