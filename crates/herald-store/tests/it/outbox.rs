//! The outbox life cycle against a real PostgreSQL: claims, publishes, re-drives and fences.
//! Longer than 400 lines: one test per statement family, sharing the helpers of `main.rs`.

use std::time::Duration;

use herald_store::accept::accept_messages;
use herald_store::leases::{record_epoch, take_over, Acquisition};
use herald_store::outbox::{
    claim_pending, mark_published, redrive_orphaned, redrive_stale, release_unpublished, ClaimAs,
    LostBefore, Redriven,
};
use herald_store::StoreError;

use crate::{count, message, migrated};

async fn statuses(pool: &sqlx::PgPool) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT status, attempts FROM outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn claim_mark_and_release_walk_the_states_and_count_attempts() {
    let (_pg, pool) = migrated(4).await;
    let batch: Vec<_> = (0..5).map(|i| message(1, None, &format!("m{i}"))).collect();
    accept_messages(&pool, &batch).await.unwrap();
    accept_messages(&pool, &[message(2, None, "other partition")])
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p1").await.unwrap();

    let jobs = claim_pending(&pool, fence, 3).await.unwrap();
    assert_eq!(jobs.len(), 3);
    // A claim charges no attempt: the worker's confirm does, before its provider call.
    assert!(jobs.iter().all(|j| j.partition == 1 && j.attempt == 0));
    let ids: Vec<i64> = jobs.iter().map(|j| j.outbox_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");
    assert_eq!(mark_published(&pool, fence, &ids[..2]).await.unwrap(), 2);
    assert_eq!(
        release_unpublished(&pool, fence, &ids[2..]).await.unwrap(),
        1
    );
    let mut seen = statuses(&pool).await;
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("PENDING".to_owned(), 0),
            ("PENDING".to_owned(), 0),
            ("PENDING".to_owned(), 0),
            ("PENDING".to_owned(), 0),
            ("PUBLISHED".to_owned(), 0),
            ("PUBLISHED".to_owned(), 0),
        ]
    );
    // The rest of partition 1 (three rows); partition 2's row is not touched.
    assert_eq!(claim_pending(&pool, fence, 100).await.unwrap().len(), 3);
    assert_eq!(claim_pending(&pool, fence, 100).await.unwrap().len(), 0);
}

#[tokio::test]
async fn a_deposed_owner_changes_nothing() {
    let (_pg, pool) = migrated(4).await;
    accept_messages(&pool, &[message(0, None, "a"), message(0, None, "b")])
        .await
        .unwrap();
    let old = take_over(&pool, 0, "old").await.unwrap();
    let claimed = claim_pending(&pool, old, 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let new = take_over(&pool, 0, "new").await.unwrap();
    assert!(new.epoch > old.epoch);

    let ids = vec![claimed[0].outbox_id];
    let err = claim_pending(&pool, old, 10).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { partition: 0, .. }),
        "{err}"
    );
    assert_eq!(mark_published(&pool, old, &ids).await.unwrap(), 0);
    assert_eq!(release_unpublished(&pool, old, &ids).await.unwrap(), 0);
    assert_eq!(
        redrive_stale(&pool, old, Duration::ZERO, LostBefore::ANY)
            .await
            .unwrap(),
        Redriven::default()
    );
    // An ownership recorded from the coordinator gets the next epoch and fences the rest; an
    // overtaken one (a lower revision of the same generation) is refused.
    let taken = |generation, revision, current_revision| Acquisition {
        generation,
        revision,
        current_revision,
    };
    let first = record_epoch(&pool, 0, "first", taken("g1", 50, 60))
        .await
        .unwrap();
    assert_eq!(first, Some(new.epoch + 1));
    assert!(claim_pending(&pool, new, 10).await.is_err());
    assert_eq!(
        record_epoch(&pool, 0, "overtaken", taken("g1", 40, 70))
            .await
            .unwrap(),
        None
    );
    // etcd lost its data: a new generation, revisions from 1 again, soon past the old ones
    // elsewhere. The new ownership gets the next epoch, so the partition is not stranded…
    let after_wipe = record_epoch(&pool, 0, "after-wipe", taken("g2", 7, 80))
        .await
        .unwrap();
    assert_eq!(after_wipe, Some(new.epoch + 2));
    // …and an overtaken acquisition of the new generation is still refused.
    assert_eq!(
        record_epoch(&pool, 0, "stale", taken("g2", 5, 80))
            .await
            .unwrap(),
        None
    );
    // A restore took etcd's history back below what was recorded: superseded.
    let restored = record_epoch(&pool, 0, "restored", taken("g2", 3, 4))
        .await
        .unwrap();
    assert_eq!(restored, Some(new.epoch + 3));
    // The deposed owners touched nothing: one row claimed, by the first epoch.
    let touched: Vec<(String, Option<i64>)> =
        sqlx::query_as("SELECT status, claimed_epoch FROM outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        touched,
        vec![
            ("PROCESSING".to_owned(), Some(old.epoch)),
            ("PENDING".to_owned(), None)
        ]
    );
}

#[tokio::test]
async fn a_new_owner_takes_back_rows_an_old_owner_claimed_and_never_published() {
    let (_pg, pool) = migrated(4).await;
    accept_messages(&pool, &[message(2, None, "a"), message(2, None, "b")])
        .await
        .unwrap();
    let old = take_over(&pool, 2, "old").await.unwrap();
    let claimed = claim_pending(&pool, old, 2).await.unwrap();
    mark_published(&pool, old, &[claimed[0].outbox_id])
        .await
        .unwrap();
    let new = take_over(&pool, 2, "new").await.unwrap();
    // The old owner cannot do it; the new one moves only the unpublished row.
    assert_eq!(redrive_orphaned(&pool, old).await.unwrap(), 0);
    assert_eq!(redrive_orphaned(&pool, new).await.unwrap(), 1);
    // The handoff costs the unpublished row nothing: a claim charges no attempt.
    assert_eq!(
        statuses(&pool).await,
        vec![("PUBLISHED".to_owned(), 0), ("PENDING".to_owned(), 0)]
    );
}

#[tokio::test]
async fn redrive_returns_lost_rows_without_charging_an_attempt_and_never_kills_them() {
    let (_pg, pool) = migrated(4).await;
    let sent = message(3, None, "stale");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 3, "p").await.unwrap();

    // Claimed and published, never confirmed: not stale yet under a long timeout…
    let jobs = claim_pending(&pool, fence, 10).await.unwrap();
    mark_published(&pool, fence, &[jobs[0].outbox_id])
        .await
        .unwrap();
    let moved = redrive_stale(&pool, fence, Duration::from_secs(3600), LostBefore::ANY)
        .await
        .unwrap();
    assert_eq!(moved, Redriven::default());
    // …nor under a zero timeout while its queue store still holds an entry older than the
    // claim (the job may be waiting in the stream)…
    let now_ms = chrono::Utc::now().timestamp_millis();
    let waiting = LostBefore {
        send_ms: Some(now_ms - 3_600_000),
        status_ms: None,
    };
    let moved = redrive_stale(&pool, fence, Duration::ZERO, waiting)
        .await
        .unwrap();
    assert_eq!(moved, Redriven::default());
    assert_eq!(statuses(&pool).await, vec![("PUBLISHED".to_owned(), 0)]);
    // …stale under a zero timeout, with every entry of its store newer than the claim (the
    // store lost it): back to PENDING, uncharged (no worker saw it).
    let lost = LostBefore {
        send_ms: Some(now_ms + 60_000),
        status_ms: Some(0),
    };
    for round in 0..5 {
        if round > 0 {
            // A claim charges nothing: only a worker's confirm does.
            assert_eq!(claim_pending(&pool, fence, 10).await.unwrap()[0].attempt, 0);
        }
        let moved = redrive_stale(&pool, fence, Duration::ZERO, lost)
            .await
            .unwrap();
        assert_eq!(moved, Redriven { pending: 1 }, "round {round}");
        assert_eq!(statuses(&pool).await, vec![("PENDING".to_owned(), 0)]);
    }
    // However often the store loses it, the message is never DEAD for it.
    let dead_events = count(
        &pool,
        &format!(
            "SELECT count(*) FROM message_events WHERE state = 'DEAD' AND message_id = '{}'",
            sent.id
        ),
    )
    .await;
    assert_eq!(dead_events, 0);
    // Nothing was deleted on the way.
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 1);
}

#[tokio::test]
async fn r2_the_claim_uses_the_partial_index() {
    let (_pg, pool) = migrated(2).await;
    // 100,000 finished rows and a few pending ones in one partition.
    sqlx::query(
        "INSERT INTO outbox (partition, job_type, status)
         SELECT 1, 'send', CASE WHEN g % 20000 = 0 THEN 'PENDING' ELSE 'DONE' END
         FROM generate_series(1, 100000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox").execute(&pool).await.unwrap();
    // The production statement, on one connection whose statistics are flushed right after,
    // so the index and table scan counters show what the claim itself did.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let scans = || async {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&one)
            .await
            .unwrap();
        let counters: (i64, i64) = sqlx::query_as(
            "SELECT coalesce((SELECT idx_scan FROM pg_stat_user_indexes
                              WHERE indexrelname = 'outbox_p0001_pending'), 0),
                    coalesce((SELECT seq_scan FROM pg_stat_user_tables
                              WHERE relname = 'outbox_p0001'), 0)",
        )
        .fetch_one(&one)
        .await
        .unwrap();
        counters
    };
    let before = scans().await;
    let fence = take_over(&one, 1, "indexed").await.unwrap();
    let claimed = claim_pending(&one, fence, 100).await.unwrap();
    assert_eq!(claimed.len(), 5);
    let after = scans().await;
    assert!(
        after.0 > before.0,
        "the claim did not read the partial index: idx_scan {before:?} -> {after:?}"
    );
    assert_eq!(
        after.1, before.1,
        "the claim scanned the whole partition: seq_scan {before:?} -> {after:?}"
    );
}

#[tokio::test]
async fn r2_a_claim_passes_over_rows_another_transaction_holds_without_waiting() {
    let (_pg, pool) = migrated(2).await;
    sqlx::query(
        "INSERT INTO outbox (partition, job_type) SELECT 1, 'send' FROM generate_series(1, 100)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let fence = take_over(&pool, 1, "skipper").await.unwrap();
    // Another transaction holds the ten oldest PENDING rows (a slow claimer).
    let mut holder = pool.begin().await.unwrap();
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox WHERE partition = 1 ORDER BY id LIMIT 10 FOR UPDATE",
    )
    .fetch_all(&mut *holder)
    .await
    .unwrap();
    // A claim that waited for those locks would never return while the holder is open.
    let claimed = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        claim_pending(&pool, fence, 1000),
    )
    .await
    .expect("the claim waited for a locked row instead of skipping it")
    .unwrap();
    let claimed: Vec<i64> = claimed.into_iter().map(|j| j.outbox_id).collect();
    assert_eq!(claimed.len(), 90, "every row but the held ones");
    assert!(claimed.iter().all(|id| !held.contains(id)));
    holder.rollback().await.unwrap();
}

#[tokio::test]
async fn r2_two_claimers_of_one_partition_get_disjoint_rows() {
    let (_pg, pool) = migrated(2).await;
    sqlx::query(
        "INSERT INTO outbox (partition, job_type) SELECT 1, 'send' FROM generate_series(1, 5000)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let fence = take_over(&pool, 1, "both").await.unwrap();
    // Two pollers that both believe they own the partition, claiming as fast as they can.
    let claimer = |pool: sqlx::PgPool| async move {
        let mut mine = Vec::new();
        loop {
            let jobs = claim_pending(&pool, fence, 37).await.unwrap();
            if jobs.is_empty() {
                return mine;
            }
            mine.extend(jobs.into_iter().map(|j| j.outbox_id));
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(claimer(pool.clone())),
        tokio::spawn(claimer(pool.clone()))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both claimed: {} and {}",
        a.len(),
        b.len()
    );
    let a: std::collections::HashSet<i64> = a.into_iter().collect();
    let b: std::collections::HashSet<i64> = b.into_iter().collect();
    assert!(a.is_disjoint(&b), "a row was claimed twice");
    assert_eq!(a.len() + b.len(), 5000);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE status = 'PROCESSING' AND attempts = 0"
        )
        .await,
        5000
    );
}

/// One statement claims for many partitions: each fence gets at most `limit` of its own rows,
/// of the job types open for it; a fence that no longer holds claims nothing and says so.
#[tokio::test]
async fn one_claim_serves_many_partitions_each_behind_its_own_fence() {
    let (_pg, pool) = migrated(4).await;
    sqlx::query(
        "INSERT INTO outbox (partition, job_type)
         SELECT p, CASE WHEN g % 2 = 0 THEN 'send' ELSE 'status' END
         FROM generate_series(0, 3) p, generate_series(1, 10) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let fences: Vec<_> = futures::future::join_all((0..4).map(|p| take_over(&pool, p, "many")))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Partition 3 changes hands: the old fence must claim nothing there.
    take_over(&pool, 3, "newer").await.unwrap();
    use herald_core::JobType;
    let requests = vec![
        (fences[0], vec![JobType::Send, JobType::Status]),
        (fences[1], vec![JobType::Send]),
        (fences[2], vec![JobType::Status, JobType::Send]),
        (fences[3], vec![JobType::Send, JobType::Status]),
    ];
    let answers =
        herald_store::outbox::claim_pending_many(&pool, &requests, 4, ClaimAs::Processing)
            .await
            .unwrap();
    let jobs = |i: usize| answers[i].as_ref().unwrap();
    assert_eq!(jobs(0).len(), 4);
    assert!(jobs(0).iter().all(|j| j.partition == 0));
    assert!(jobs(0).windows(2).all(|w| w[0].outbox_id < w[1].outbox_id));
    assert_eq!(jobs(1).len(), 4);
    assert!(jobs(1)
        .iter()
        .all(|j| j.partition == 1 && j.job_type == JobType::Send));
    assert_eq!(jobs(2).len(), 4);
    assert!(matches!(
        answers[3],
        Err(StoreError::Fenced { partition: 3, .. })
    ));
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE partition = 3 AND status <> 'PENDING'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE status = 'PROCESSING' AND attempts = 0"
        )
        .await,
        12
    );
    // Claimed as PUBLISHED: no mark follows, and a failed publish is still released (only
    // by the fence that claimed the rows).
    let published = herald_store::outbox::claim_pending_many(
        &pool,
        &[(fences[0], vec![JobType::Send, JobType::Status])],
        4,
        ClaimAs::Published,
    )
    .await
    .unwrap()
    .pop()
    .unwrap()
    .unwrap();
    assert_eq!(published.len(), 4);
    let ids: Vec<i64> = published.iter().map(|j| j.outbox_id).collect();
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE status = 'PUBLISHED' AND attempts = 0"
        )
        .await,
        4
    );
    assert_eq!(
        release_unpublished(&pool, fences[3], &ids).await.unwrap(),
        0
    );
    assert_eq!(
        release_unpublished(&pool, fences[0], &ids[..1])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE status = 'PUBLISHED' AND attempts = 0"
        )
        .await,
        3
    );
}

/// One re-drive statement for many partitions: each partition is judged by its own fence and
/// its own store's `lost_before`, and a deposed fence moves nothing of its partition while the
/// others are re-driven.
#[tokio::test]
async fn one_redrive_statement_covers_many_partitions_each_by_its_own_fence_and_store() {
    use herald_store::outbox::redrive_stale_many;

    let (_pg, pool) = migrated(4).await;
    for partition in 0..3 {
        accept_messages(&pool, &[message(partition, None, "stale")])
            .await
            .unwrap();
    }
    let mut fences = Vec::new();
    for partition in 0..3 {
        let fence = take_over(&pool, partition, "p").await.unwrap();
        let jobs = claim_pending(&pool, fence, 10).await.unwrap();
        mark_published(&pool, fence, &[jobs[0].outbox_id])
            .await
            .unwrap();
        fences.push(fence);
    }
    // Partition 2 changed hands: its old fence is deposed.
    take_over(&pool, 2, "q").await.unwrap();
    let now_ms = chrono::Utc::now().timestamp_millis();
    // Partition 0's store lost its job; partition 1's store still holds an older entry.
    let lost = LostBefore {
        send_ms: Some(now_ms + 60_000),
        status_ms: Some(now_ms + 60_000),
    };
    let waiting = LostBefore {
        send_ms: Some(now_ms - 3_600_000),
        status_ms: Some(now_ms - 3_600_000),
    };
    let moved = redrive_stale_many(
        &pool,
        &[(fences[0], lost), (fences[1], waiting), (fences[2], lost)],
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(
        moved,
        vec![
            Redriven { pending: 1 },
            Redriven::default(),
            Redriven::default()
        ]
    );
    let by_partition: Vec<(i32, String)> =
        sqlx::query_as("SELECT partition, status FROM outbox ORDER BY partition")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        by_partition,
        vec![
            (0, "PENDING".to_owned()),
            (1, "PUBLISHED".to_owned()),
            (2, "PUBLISHED".to_owned()),
        ]
    );
}
