//! The batched statements of the delivery path read only the rows of their batch, however
//! big the outbox and the history are. Their input is an `UNNEST` of keys, and the planner,
//! which costs a nested loop into the partitioned outbox as a probe of every child per key,
//! used to pick a hash join over a sequential scan of every child (and of every event)
//! instead: a confirm of 60 jobs read 113,000 outbox rows, and grew with the table.
//!
//! Longer than 400 lines: each plan test builds the table sizes that once chose a bad plan.

use std::time::Duration;

use herald_store::effects::confirm_ownership_batch;
use herald_store::receipts::{
    apply_receipts, finish_status_jobs, settled_sends, ReceiptToApply, SettledCheck, StatusOutcomes,
};
use sqlx::PgPool;

use crate::migrated;

/// Makes this connection's statistics visible to its next query.
async fn flush_stats(one: &PgPool) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(one)
        .await
        .unwrap();
}

/// Rows read from the ledger, by sequential scans and through indexes, as one connection's
/// statistics show them right after its statements.
async fn ledger_rows_read(one: &PgPool) -> i64 {
    flush_stats(one).await;
    sqlx::query_scalar(
        "SELECT (coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::bigint
         FROM pg_stat_user_tables WHERE relname = 'ledger'",
    )
    .fetch_one(one)
    .await
    .unwrap()
}

/// Rows read from the outbox's children and the history, by sequential scans and through
/// indexes, as one connection's statistics show them right after its statements.
async fn rows_read(one: &PgPool) -> i64 {
    flush_stats(one).await;
    sqlx::query_scalar(
        "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
         FROM pg_stat_user_tables
         WHERE relname LIKE 'outbox_p%' OR relname = 'message_events'",
    )
    .fetch_one(one)
    .await
    .unwrap()
}

/// One connection that runs statements as the workers' sessions do: one generic plan per
/// statement, made at its first call from the statistics of that moment.
async fn worker_session(pool: &PgPool) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            (*pool.connect_options())
                .clone()
                .options(herald_store::GENERIC_PLANS),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn the_batched_worker_statements_read_only_their_own_rows() {
    batched_statements_read_only_their_batch(Statistics::Fresh).await;
}

/// The statistics a generic plan is made from are those of the moment a worker's session
/// first runs the statement. A drain starts with every row PENDING, so they say the partial
/// index of in-flight rows is empty; a probe that named the status matched that index, and
/// each key read every in-flight row of its child (a confirm of 64 jobs: 50 ms).
#[tokio::test]
async fn a_plan_made_while_no_row_was_in_flight_still_reads_only_the_batch() {
    batched_statements_read_only_their_batch(Statistics::BeforeTheClaim).await;
}

enum Statistics {
    /// Analysed with the rows in flight.
    Fresh,
    /// Analysed while every row was PENDING, and not since.
    BeforeTheClaim,
}

async fn batched_statements_read_only_their_batch(statistics: Statistics) {
    // 64 children of about 2,000 rows each: big enough that probing a child by key beats
    // reading it by the planner's own costs, so only a statement that can probe does so.
    let (_pg, pool) = migrated(64).await;
    // 128,000 messages waiting in their streams (PUBLISHED) with QUEUED events, as histories
    // written before migration 0019 hold them (they give the history the size a statement
    // reading all of it would show), and as many receipts' status jobs.
    sqlx::query(
        "WITH m AS (
             INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
             SELECT gen_random_uuid(), g % 64, '+15550100', '{}', '\\x00'
             FROM generate_series(1, 128000) g
             RETURNING id, partition
         ), e AS (
             INSERT INTO message_events (message_id, state) SELECT id, 'QUEUED' FROM m
         )
         INSERT INTO outbox (partition, job_type, message_id)
         SELECT partition, 'send', id FROM m",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox (partition, job_type, payload)
         SELECT g % 64, 'status', jsonb_build_object('receipt_id', g)
         FROM generate_series(1, 128000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    if let Statistics::BeforeTheClaim = statistics {
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
        // No autovacuum may analyse the children again before the statements run.
        sqlx::query(
            "DO $$ DECLARE c regclass; BEGIN
                 FOR c IN SELECT inhrelid::regclass FROM pg_inherits
                          WHERE inhparent = 'outbox'::regclass LOOP
                     EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', c);
                 END LOOP;
             END $$",
        )
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("UPDATE outbox SET status = 'PUBLISHED', claimed_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    if let Statistics::Fresh = statistics {
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    }

    let one = worker_session(&pool).await;
    let sends: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT partition, id FROM outbox WHERE job_type = 'send' ORDER BY id LIMIT 60",
    )
    .fetch_all(&one)
    .await
    .unwrap();
    let status_jobs: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT partition, id FROM outbox WHERE job_type = 'status' ORDER BY id LIMIT 60",
    )
    .fetch_all(&one)
    .await
    .unwrap();

    let before = rows_read(&one).await;
    let jobs: Vec<(u32, i64)> = sends.iter().map(|(p, id)| (*p as u32, *id)).collect();
    let owned = confirm_ownership_batch(&one, &jobs, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(owned.len(), 60);
    let after_confirm = rows_read(&one).await;
    assert!(
        after_confirm - before < 1000,
        "confirming 60 jobs read {} rows",
        after_confirm - before
    );

    let to_apply: Vec<ReceiptToApply> = status_jobs
        .iter()
        .zip(&owned)
        .map(|((partition, id), owned)| ReceiptToApply {
            partition: *partition as u32,
            outbox_id: *id,
            message_id: owned.send.message_id,
            state: herald_core::MessageState::Delivered,
            detail: serde_json::json!({"provider_status": "DELIVRD",
                                       "provider_time": "2026-12-05T10:00:00Z"}),
        })
        .collect();
    let checks: Vec<_> = to_apply
        .iter()
        .map(|r| SettledCheck {
            message_id: r.message_id,
            provider_time: chrono::Utc::now(),
            written_by: chrono::Utc::now(),
        })
        .collect();
    settled_sends(&one, &checks).await.unwrap();
    let applied = apply_receipts(&one, &to_apply).await.unwrap();
    assert_eq!(applied.len(), 60);
    let after_apply = rows_read(&one).await;
    assert!(
        after_apply - after_confirm < 1000,
        "checking and applying 60 receipts read {} rows",
        after_apply - after_confirm
    );
}

/// `count` messages spread over partitions `0..partitions`, each with its send job waiting
/// in its stream (PUBLISHED).
async fn published_sends(pool: &PgPool, partitions: i32, count: i32) {
    sqlx::query(
        "WITH m AS (
             INSERT INTO messages (id, partition, recipient, body, request_fingerprint)
             SELECT gen_random_uuid(), g % $1, '+15550100', '{}', '\\x00'
             FROM generate_series(1, $2) g
             RETURNING id, partition
         )
         INSERT INTO outbox (partition, job_type, message_id, status, claimed_at)
         SELECT partition, 'send', id, 'PUBLISHED', now() FROM m",
    )
    .bind(partitions)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

/// The outbox children whose heap a connection's statements have read so far, by name.
async fn children_read(one: &PgPool) -> Vec<(String, i64)> {
    flush_stats(one).await;
    sqlx::query_as(
        "SELECT relname::text, (coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0))::bigint
         FROM pg_statio_user_tables WHERE relname LIKE 'outbox_p%' ORDER BY relname",
    )
    .fetch_all(one)
    .await
    .unwrap()
}

/// The children read between two [`children_read`]s.
fn read_between(before: &[(String, i64)], after: &[(String, i64)]) -> Vec<String> {
    after
        .iter()
        .filter(|(name, blocks)| {
            before
                .iter()
                .find(|(n, _)| n == name)
                .is_none_or(|(_, b)| b < blocks)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// A batch's update reaches only the children its rows are in. Joined to the partitioned
/// outbox by a hash join, or found by `ctid = ANY(…)`, it read every one of the 64 children
/// for each statement: at 600 msg/s a confirm took 15 ms, most of it in children none of its
/// rows was in.
#[tokio::test]
async fn a_batch_reads_only_the_children_its_rows_are_in() {
    let (_pg, pool) = migrated(64).await;
    // 64 children of 320 rows, every row waiting in its stream.
    published_sends(&pool, 64, 10_240).await;
    sqlx::query(
        "INSERT INTO outbox (partition, job_type, payload, status, claimed_at)
         SELECT g % 64, 'status', jsonb_build_object('receipt_id', g), 'PUBLISHED', now()
         FROM generate_series(1, 10240) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    let one = worker_session(&pool).await;
    let batch = |job_type: &'static str| {
        let one = one.clone();
        async move {
            sqlx::query_as::<_, (i32, i64)>(
                "SELECT partition, id FROM outbox
                 WHERE job_type = $1 AND status = 'PUBLISHED' AND partition IN (3, 17, 42)
                 ORDER BY id LIMIT 9",
            )
            .bind(job_type)
            .fetch_all(&one)
            .await
            .unwrap()
            .into_iter()
            .map(|(p, id)| (p as u32, id))
            .collect::<Vec<_>>()
        }
    };
    let expected = ["outbox_p0003", "outbox_p0017", "outbox_p0042"];

    // Twice each: the first call makes the generic plan, the second runs it.
    for round in 0..2 {
        let sends = batch("send").await;
        let before = children_read(&one).await;
        let owned = confirm_ownership_batch(&one, &sends, "w", Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(owned.len(), 9, "round {round}");
        let read = read_between(&before, &children_read(&one).await);
        assert_eq!(read, expected, "a confirm of 9 jobs read these children");

        let status_jobs = batch("status").await;
        let before = children_read(&one).await;
        let finished = finish_status_jobs(&one, &status_jobs, &StatusOutcomes::default())
            .await
            .unwrap();
        assert_eq!(finished.len(), 9, "round {round}");
        let read = read_between(&before, &children_read(&one).await);
        assert_eq!(
            read, expected,
            "finishing 9 status jobs read these children"
        );
    }
}

/// The confirm asks, for each job, whether its message already has a ledger row. A session
/// makes its plan at the first call; made while the ledger was nearly empty, `EXISTS` became a
/// hash of the whole ledger, built again at every confirm: at 900 msg/s each confirm read
/// 21,000 ledger rows and took 14 ms, and it grew with the ledger.
#[tokio::test]
async fn a_confirm_reads_the_ledger_by_key_however_it_grew_since_its_plan() {
    let (_pg, pool) = migrated(8).await;
    published_sends(&pool, 8, 40).await;
    let one = worker_session(&pool).await;
    let jobs: Vec<(u32, i64)> =
        sqlx::query_as::<_, (i32, i64)>("SELECT partition, id FROM outbox ORDER BY id")
            .fetch_all(&one)
            .await
            .unwrap()
            .into_iter()
            .map(|(p, id)| (p as u32, id))
            .collect();
    let lease = Duration::from_secs(30);
    // The plan is made now, with an empty ledger.
    let owned = confirm_ownership_batch(&one, &jobs[..10], "w", lease)
        .await
        .unwrap();
    assert_eq!(owned.len(), 10);

    // The ledger grows: 20,000 effects of other messages, and one of a message still to be
    // confirmed (its confirm must see it: already accepted, no second CLAIMED).
    sqlx::query(
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
         SELECT 'k' || g, gen_random_uuid(), 'sim', 'p' || g FROM generate_series(1, 20000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
         SELECT 'accepted', message_id, 'sim', 'p0' FROM outbox WHERE id = $1",
    )
    .bind(jobs[10].1)
    .execute(&pool)
    .await
    .unwrap();
    let before = ledger_rows_read(&one).await;
    let owned = confirm_ownership_batch(&one, &jobs[10..20], "w", lease)
        .await
        .unwrap();
    let read = ledger_rows_read(&one).await - before;
    assert_eq!(owned.len(), 10);
    assert!(read < 100, "a confirm of 10 jobs read {read} ledger rows");
    let accepted: Vec<i64> = owned
        .iter()
        .filter(|o| o.send.already_accepted)
        .map(|o| o.outbox_id)
        .collect();
    assert_eq!(accepted, [jobs[10].1], "the jobs found already accepted");
    assert!(owned
        .iter()
        .all(|o| o.send.already_accepted == o.send.lease.is_none()));
}

/// A provider id that wrapped many times has many ledger rows; a receipt lookup reads the
/// newest few of them through the index, not every row the id ever had.
#[tokio::test]
async fn a_receipt_lookup_reads_a_few_ledger_rows_however_often_its_id_wrapped() {
    use herald_store::receipts::{messages_for_receipts, ReceiptLookup};

    let (_pg, pool) = migrated(4).await;
    // Provider ids 1..=100 of one gateway, each issued 500 times, one send a second.
    sqlx::query(
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id, created_at,
                             submitted_at)
         SELECT 'send:' || g, gen_random_uuid(), 'gw', (g % 100 + 1)::text,
                now() - make_interval(secs => 50000 - g), now() - make_interval(secs => 50000 - g)
         FROM generate_series(1, 50000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE ledger").execute(&pool).await.unwrap();
    let one = worker_session(&pool).await;
    let now = chrono::Utc::now();
    let lookups: Vec<ReceiptLookup> = (1..=50)
        .map(|id| ReceiptLookup {
            gateway: "gw".to_owned(),
            provider_id: id.to_string(),
            written_from: now,
            written_by: now + chrono::Duration::seconds(1),
            is_final: true,
        })
        .collect();
    let before = ledger_rows_read(&one).await;
    let found = messages_for_receipts(&one, &lookups).await.unwrap();
    assert!(found.iter().all(|m| m.message_id.is_some()));
    let read = ledger_rows_read(&one).await - before;
    assert!(
        read <= 50 * 8,
        "50 lookups of ids with 500 ledger rows each read {read} ledger rows"
    );
}
