//! The queue store against a real Redis: entries a consumer left unacknowledged are taken over
//! by another consumer once idle (and not before), and a store past `maxmemory` refuses a
//! publish with an error the poller can tell apart as OOM.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use herald_core::job::Job;
use herald_core::JobType;
use herald_queue::{QueueError, QueueStore, StoreSettings};
use herald_testkit::{LocalRedis, RedisOptions};

fn store(redis: &LocalRedis) -> QueueStore {
    QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type: JobType::Send,
        shard: 0,
        max_connections: 4,
    })
    .expect("pool")
}

fn jobs(first_outbox_id: i64, n: usize) -> Vec<Job> {
    (0..n as i64)
        .map(|i| Job {
            outbox_id: first_outbox_id + i,
            partition: 3,
            job_type: JobType::Send,
            message_id: Some(uuid::Uuid::now_v7()),
            attempt: 1,
            payload: serde_json::json!({}),
        })
        .collect()
}

async fn connection(redis: &LocalRedis) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// `XLEN`, read with a connection of the test's own.
async fn stream_length(redis: &LocalRedis, store: &QueueStore) -> u64 {
    redis::cmd("XLEN")
        .arg(store.stream_key())
        .query_async(&mut connection(redis).await)
        .await
        .unwrap()
}

/// `XLEN` and the pending count of `XPENDING`, read with a connection of the test's own.
async fn length_and_pending(redis: &LocalRedis, store: &QueueStore) -> (u64, u64) {
    let summary: redis::Value = redis::cmd("XPENDING")
        .arg(store.stream_key())
        .arg(store.group())
        .query_async(&mut connection(redis).await)
        .await
        .unwrap();
    let pending = match summary {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n as u64,
            other => panic!("XPENDING answered {other:?}"),
        },
        other => panic!("XPENDING answered {other:?}"),
    };
    (stream_length(redis, store).await, pending)
}

#[tokio::test]
async fn entries_a_consumer_left_unacknowledged_are_reclaimed_by_another_once_idle() {
    let redis = LocalRedis::start().await.expect("redis");
    let store = store(&redis);
    store.ensure_group().await.unwrap();
    let published_jobs = jobs(100, 5);
    let published: BTreeSet<String> = store
        .publish(&published_jobs)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(published.len(), 5);

    // Consumer A reads every entry and never acknowledges (it died holding them).
    let read = store
        .read("consumer-a", 10, Duration::from_millis(500))
        .await
        .unwrap();
    let read_ids: BTreeSet<String> = read.iter().map(|d| d.entry_id.clone()).collect();
    assert_eq!(read_ids, published, "A read every published entry");
    assert_eq!(length_and_pending(&redis, &store).await, (5, 5));

    // Not idle long enough yet: B takes nothing.
    let early = store
        .reclaim_idle("consumer-b", Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert!(
        early.is_empty(),
        "entries idle for less than min-idle were taken: {early:?}"
    );

    // Once idle past min-idle, B takes exactly A's entries, with their jobs intact.
    let min_idle = Duration::from_millis(200);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reclaimed = Vec::new();
    while reclaimed.len() < published.len() {
        let found = store
            .reclaim_idle("consumer-b", min_idle, 10)
            .await
            .unwrap();
        reclaimed.extend(found);
        assert!(
            Instant::now() < deadline,
            "B reclaimed only {reclaimed:?} of {published:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reclaimed_ids: Vec<String> = reclaimed.iter().map(|d| d.entry_id.clone()).collect();
    assert_eq!(
        reclaimed_ids.iter().cloned().collect::<BTreeSet<_>>(),
        published,
        "B reclaimed exactly A's entries"
    );
    assert_eq!(reclaimed_ids.len(), published.len(), "each entry once");
    let mut reclaimed_outbox_ids: Vec<i64> = reclaimed
        .iter()
        .map(|d| d.job.as_ref().expect("decodable job").outbox_id)
        .collect();
    reclaimed_outbox_ids.sort();
    let published_outbox_ids: Vec<i64> = published_jobs.iter().map(|j| j.outbox_id).collect();
    assert_eq!(reclaimed_outbox_ids, published_outbox_ids);

    store.ack_and_delete(&reclaimed_ids).await.unwrap();
    assert_eq!(
        length_and_pending(&redis, &store).await,
        (0, 0),
        "acknowledged and deleted: the stream is empty and nothing is pending"
    );
}

#[tokio::test]
async fn a_store_past_maxmemory_refuses_a_publish_with_an_oom_error() {
    let redis = LocalRedis::start_with(&RedisOptions {
        max_memory_bytes: 2 << 20,
        ..RedisOptions::default()
    })
    .await
    .expect("redis");
    let store = store(&redis);
    // The workers' group exists before the store fills, as in a running deployment.
    store.ensure_group().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut accepted_batches = 0;
    let err = loop {
        match store.publish(&jobs(accepted_batches * 500, 500)).await {
            Ok(ids) => {
                assert_eq!(ids.len(), 500);
                accepted_batches += 1;
            }
            Err(err) => break err,
        }
        assert!(
            Instant::now() < deadline,
            "{accepted_batches} batches of 500 accepted and no refusal"
        );
    };
    assert!(
        accepted_batches > 0,
        "the store took batches before it was full: {err:#}"
    );
    // The poller tells an OOM refusal from other failures by its error code.
    assert!(err.is_out_of_memory(), "{err:#}");
    let QueueError::Redis(redis_err) = err else {
        panic!("not a Redis error: {err:?}");
    };
    // A pipelined publish fails command by command: every refused XADD is an OOM, and the
    // ones before the first refusal were written (the batch is partly in the stream).
    let refused = redis_err
        .into_server_errors()
        .expect("a pipeline failure lists the refused commands");
    assert!(!refused.is_empty());
    for (index, refusal) in refused.iter() {
        assert_eq!(refusal.code(), "OOM", "command {index}: {refusal:?}");
    }
    assert_eq!(
        stream_length(&redis, &store).await,
        accepted_batches as u64 * 500 + (500 - refused.len() as u64),
        "the stream holds every accepted batch and the failed batch's entries before the refusal"
    );
    // A worker (re)starting now must still get to read the full stream: XGROUP CREATE is
    // refused past maxmemory even for a group that exists, so the existing group is found.
    store.ensure_group().await.expect("the group exists");
    let other = QueueStore::new(&StoreSettings {
        url: redis.url(),
        job_type: JobType::Status,
        shard: 0,
        max_connections: 1,
    })
    .expect("pool");
    assert!(
        other.ensure_group().await.is_err(),
        "a group that does not exist cannot be created past maxmemory"
    );
}

/// The re-drive asks a store how old its oldest entry is: an entry counts until it is deleted,
/// read or not and pending or not, and an empty or missing stream has none.
#[tokio::test]
async fn the_oldest_entry_is_the_oldest_not_yet_handled_read_or_not() {
    let redis = LocalRedis::start().await.expect("redis");
    let store = store(&redis);
    assert_eq!(
        store.oldest_entry_ms().await.unwrap(),
        None,
        "no stream yet"
    );
    store.ensure_group().await.unwrap();
    assert_eq!(store.oldest_entry_ms().await.unwrap(), None, "empty stream");

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let first = store.publish(&jobs(1, 2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = store.publish(&jobs(3, 1)).await.unwrap();
    let oldest = store.oldest_entry_ms().await.unwrap().expect("an entry");
    assert!(
        oldest >= before.saturating_sub(1000),
        "{oldest} vs {before}"
    );
    let id_ms = |id: &str| id.split('-').next().unwrap().parse::<u64>().unwrap();
    assert_eq!(oldest, id_ms(&first[0]));

    // Read (pending) entries still count.
    let read = store
        .read("consumer-a", 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(read.len(), 3);
    assert_eq!(store.oldest_entry_ms().await.unwrap(), Some(oldest));

    // Handled (deleted) ones do not: the oldest is now the later publish.
    store.ack_and_delete(&first).await.unwrap();
    assert_eq!(
        store.oldest_entry_ms().await.unwrap(),
        Some(id_ms(&second[0]))
    );
    store.ack_and_delete(&second).await.unwrap();
    assert_eq!(store.oldest_entry_ms().await.unwrap(), None);
}

/// A store whose `maxmemory-policy` may evict data could drop a stream with its jobs: it is
/// reported as not OK (publishing stops, `/readyz` says why) until it is `noeviction` again.
#[tokio::test]
async fn a_store_that_may_evict_is_not_published_to() {
    use herald_queue::monitor::{MonitoredStore, Pressure};

    let redis = LocalRedis::start().await.unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let monitored = MonitoredStore::start(store(&redis), 0.8, Duration::from_secs(3600), cancel);
    monitored.refresh().await;
    assert_eq!(monitored.pressure(), Pressure::Ok);
    let set_policy = |policy: &'static str| {
        let redis = &redis;
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(&mut connection(redis).await)
                .await
                .unwrap();
        }
    };
    set_policy("allkeys-lru").await;
    monitored.refresh().await;
    assert_eq!(
        monitored.pressure(),
        Pressure::Evicting {
            policy: "allkeys-lru".to_owned()
        }
    );
    let why = monitored.describe_pressure().unwrap();
    assert!(why.contains("noeviction"), "{why}");
    set_policy("noeviction").await;
    monitored.refresh().await;
    assert_eq!(monitored.pressure(), Pressure::Ok);
}
