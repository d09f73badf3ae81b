//! One partition task against a real PostgreSQL and Redis: it publishes every PENDING row of
//! its own partition once, leaves other partitions alone, and once a newer owner recorded a
//! higher epoch it stops and claims nothing more (rule R7, the fence). The owner of partition 0
//! alone runs the maintenance loop, a deposed one stops, and one with an archive writes what
//! it removes first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use herald_core::{Fence, JobType};
use herald_poller::maintenance::{self, RetentionSettings};
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
    setup_with(PollerSettings {
        poll_interval: Duration::from_millis(20),
        idle_poll_interval: Duration::from_millis(100),
        ..PollerSettings::default()
    })
    .await
}

async fn setup_with(settings: PollerSettings) -> Setup {
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

/// Settings whose maintenance loop removes every DONE send row and compacts every closed
/// history at once, every 50 ms.
fn eager_maintenance() -> PollerSettings {
    PollerSettings {
        poll_interval: Duration::from_millis(20),
        idle_poll_interval: Duration::from_millis(100),
        retention: RetentionSettings {
            done_jobs: Some(Duration::from_millis(1)),
            compact_after: Some(Duration::from_millis(1)),
            messages: None,
            interval: Duration::from_millis(50),
            batch: 100,
            archive: None,
        },
        ..PollerSettings::default()
    }
}

/// Accepts `n` messages into `partition` and finishes them: DONE, with a delivered history.
async fn delivered(pool: &PgPool, partition: u32, n: usize) -> BTreeSet<Uuid> {
    let ids = accept(pool, partition, n).await;
    let ids_vec: Vec<Uuid> = ids.iter().copied().collect();
    sqlx::query(
        "WITH done AS (UPDATE outbox SET status = 'DONE' WHERE message_id = ANY($1))
         INSERT INTO message_events (message_id, state)
         SELECT id, state FROM UNNEST($1) AS id, UNNEST(ARRAY['CLAIMED', 'ACCEPTED', 'DELIVERED']) AS state",
    )
    .bind(&ids_vec)
    .execute(pool)
    .await
    .expect("finish");
    ids
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

#[tokio::test]
async fn only_the_owner_of_partition_0_runs_retention_and_compaction() {
    let s = setup_with(eager_maintenance()).await;
    delivered(&s.pool, 1, 30).await;
    delivered(&s.pool, 2, 30).await;
    let one = herald_store::leases::take_over(&s.pool, 1, "test")
        .await
        .unwrap();
    let (cancel_one, task_one) = run(&s.poller, one);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&s.pool, "SELECT count(*) FROM outbox").await, 60);
    assert_eq!(
        count(&s.pool, "SELECT count(*) FROM message_events").await,
        // CLAIMED, ACCEPTED, DELIVERED each (QUEUED is derived, not written).
        180
    );

    let zero = herald_store::leases::take_over(&s.pool, 0, "test")
        .await
        .unwrap();
    let (cancel_zero, task_zero) = run(&s.poller, zero);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = count(&s.pool, "SELECT count(*) FROM outbox").await;
        let events = count(&s.pool, "SELECT count(*) FROM message_events").await;
        if rows == 0 && events == 60 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{rows} outbox rows and {events} events left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        count(
            &s.pool,
            "SELECT count(*) FROM message_current_state WHERE state = 'DELIVERED'"
        )
        .await,
        60
    );
    for (cancel, task) in [(cancel_one, task_one), (cancel_zero, task_zero)] {
        cancel.cancel();
        tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_maintenance_loop_whose_fence_was_superseded_stops_and_removes_nothing() {
    let s = setup().await;
    let settings = eager_maintenance().retention;
    let deposed = herald_store::leases::take_over(&s.pool, 0, "old")
        .await
        .unwrap();
    let current = herald_store::leases::take_over(&s.pool, 0, "new")
        .await
        .unwrap();
    delivered(&s.pool, 3, 10).await;
    let cancel = CancellationToken::new();
    tokio::time::timeout(
        PATIENCE,
        maintenance::run(s.pool.clone(), deposed, settings.clone(), cancel.clone()),
    )
    .await
    .expect("a deposed loop stops by itself");
    assert_eq!(count(&s.pool, "SELECT count(*) FROM outbox").await, 10);

    // The current owner's loop runs until it is cancelled.
    let running = tokio::spawn(maintenance::run(
        s.pool.clone(),
        current,
        settings,
        cancel.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!running.is_finished());
    assert_eq!(count(&s.pool, "SELECT count(*) FROM outbox").await, 0);
    cancel.cancel();
    tokio::time::timeout(PATIENCE, running)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_maintenance_loop_with_an_archive_writes_what_it_removes_first() {
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let settings = RetentionSettings {
        messages: Some(Duration::from_millis(1)),
        archive: Some(dir.path().to_owned()),
        ..eager_maintenance().retention
    };
    let ids = delivered(&s.pool, 3, 10).await;
    // Accepted two minutes ago: a message goes once the outbox cursor has passed rows created a
    // minute after it (the runtime role may not update a message; the test's role sets the
    // clock back as time would).
    let mut tx = s.pool.begin().await.unwrap();
    for sql in [
        "ALTER TABLE messages DISABLE TRIGGER messages_immutable",
        "UPDATE messages SET created_at = now() - interval '2 minutes'",
        "ALTER TABLE messages ENABLE TRIGGER messages_immutable",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.expect(sql);
    }
    tx.commit().await.unwrap();
    let fence = herald_store::leases::take_over(&s.pool, 0, "test")
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(maintenance::run(
        s.pool.clone(),
        fence,
        settings,
        cancel.clone(),
    ));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while count(&s.pool, "SELECT count(*) FROM messages").await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "messages left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    tokio::time::timeout(PATIENCE, running)
        .await
        .unwrap()
        .unwrap();

    let mut archived = Vec::new();
    for manifest in herald_store::archive::manifests(dir.path()).unwrap() {
        let manifest = herald_store::archive::verify(&manifest).expect("verifies");
        assert_eq!(manifest.kind, "messages");
        archived.push((manifest.first_id, manifest.rows));
    }
    assert_eq!(archived.iter().map(|(_, rows)| rows).sum::<u64>(), 10);
    let first = ids.iter().next().unwrap().to_string();
    assert!(archived.iter().any(|(id, _)| *id == first), "{archived:?}");
    assert_eq!(
        count(&s.pool, "SELECT count(*) FROM message_events").await,
        0
    );
    assert_eq!(count(&s.pool, "SELECT count(*) FROM outbox").await, 0);
}
