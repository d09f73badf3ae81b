//! Retention and compaction (`herald_store::retention`): what goes, what never goes, what a
//! compacted message reads back as, and the archive written before removal. Longer than 400
//! lines: one test per promise of docs/DESIGN.md's "Retention", sharing the helpers at the top.

use std::time::Duration;

use herald_store::accept::accept_messages;
use herald_store::archive::{self, ArchiveDir};
use herald_store::leases::take_over;
use herald_store::messages::message_with_history;
use herald_store::outbox::redrive_dead;
use herald_store::receipts::{accept_receipts, NewReceipt};
use herald_store::retention::{
    compact_histories, remove_done_jobs, remove_messages, remove_receipts,
};
use herald_store::verify::database_findings;
use herald_store::StoreError;
use sqlx::PgPool;
use uuid::Uuid;

use crate::{count, message, migrated};

const HOUR: Duration = Duration::from_secs(3600);

/// Ages rows of a table whose trigger refuses updates (messages, receipts): the test's owner
/// role sets the clock back as time would.
async fn age(pool: &PgPool, table: &str, trigger: &str, set: &str) {
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        format!("ALTER TABLE {table} DISABLE TRIGGER {trigger}"),
        format!("UPDATE {table} SET {set}"),
        format!("ALTER TABLE {table} ENABLE TRIGGER {trigger}"),
    ] {
        sqlx::query(&sql).execute(&mut *tx).await.expect(&sql);
    }
    tx.commit().await.unwrap();
}

/// Accepts one message on `partition` and gives its send row `status`, created `age_hours`
/// ago. A row a worker took (anything but PENDING) gets CLAIMED, as a worker writes it.
async fn send_row(pool: &PgPool, partition: u32, status: &str, age_hours: i32) -> Uuid {
    let new = message(partition, None, status);
    accept_messages(pool, std::slice::from_ref(&new))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = $2, created_at = now() - make_interval(hours => $3)
         WHERE message_id = $1",
    )
    .bind(new.id)
    .bind(status)
    .bind(age_hours)
    .execute(pool)
    .await
    .unwrap();
    if status != "PENDING" {
        append(pool, new.id, "CLAIMED", serde_json::json!({"worker": "w"})).await;
    }
    new.id
}

async fn append(pool: &PgPool, message_id: Uuid, state: &str, detail: serde_json::Value) {
    sqlx::query("INSERT INTO message_events (message_id, state, detail) VALUES ($1, $2, $3)")
        .bind(message_id)
        .bind(state)
        .bind(detail)
        .execute(pool)
        .await
        .unwrap();
}

/// ACCEPTED by the provider, with its ledger row (gateway `gw`, provider id `p`).
async fn provider_accepted(pool: &PgPool, id: Uuid) {
    append(pool, id, "ACCEPTED", serde_json::json!({"gateway": "gw"})).await;
    sqlx::query(
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
         VALUES ('k-' || $1::text, $1, 'gw', 'p')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

/// Every message accepted two hours ago.
async fn age_messages(pool: &PgPool) {
    age(
        pool,
        "messages",
        "messages_immutable",
        "created_at = now() - interval '2 hours'",
    )
    .await;
}

/// Every receipt received two hours ago.
async fn age_receipts(pool: &PgPool) {
    age(
        pool,
        "receipts",
        "receipts_immutable",
        "received_at = now() - interval '2 hours'",
    )
    .await;
}

async fn has_send_row(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE message_id = $1)")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn retention_removes_old_done_rows_and_never_open_work_or_dead_rows() {
    let (_pg, pool) = migrated(8).await;
    // Partition 1: two old DONE rows, then an old PENDING one (still owed), then a DONE one.
    let p1_done_a = send_row(&pool, 1, "DONE", 3).await;
    let p1_done_b = send_row(&pool, 1, "DONE", 3).await;
    let p1_pending = send_row(&pool, 1, "PENDING", 3).await;
    let p1_done_after = send_row(&pool, 1, "DONE", 3).await;
    // Partition 2: an old DEAD row, an old DONE one, a young DONE one.
    let p2_dead = send_row(&pool, 2, "DEAD", 3).await;
    let p2_done = send_row(&pool, 2, "DONE", 3).await;
    let p2_young = send_row(&pool, 2, "DONE", 0).await;
    // Partition 3: an old DONE row whose claim is still in flight (no outcome yet), and an
    // old published one.
    let p3_in_flight = send_row(&pool, 3, "DONE", 3).await;
    sqlx::query(
        "INSERT INTO in_flight_sends (message_id, partition, outbox_id, lease, lease_until)
         SELECT message_id, partition, id, gen_random_uuid(), now() + interval '30 s'
         FROM outbox WHERE message_id = $1",
    )
    .bind(p3_in_flight)
    .execute(&pool)
    .await
    .unwrap();
    let p4_published = send_row(&pool, 4, "PUBLISHED", 3).await;
    // Partition 5: an old DONE status row.
    sqlx::query(
        "INSERT INTO outbox (partition, job_type, payload, status, created_at)
         VALUES (5, 'status', '{\"receipt_ids\": []}', 'DONE', now() - interval '3 hours')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    for _ in 0..5 {
        remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    }
    for gone in [p1_done_a, p1_done_b, p2_done] {
        assert!(!has_send_row(&pool, gone).await, "{gone} removed");
    }
    for kept in [
        p1_pending,
        p1_done_after,
        p2_dead,
        p2_young,
        p3_in_flight,
        p4_published,
    ] {
        assert!(has_send_row(&pool, kept).await, "{kept} kept");
    }
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE job_type = 'status'"
        )
        .await,
        0,
        "an old DONE status row goes too"
    );
    let waiting = remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    assert_eq!(waiting.removed, 0);
    assert_eq!(
        waiting.waiting, 3,
        "partitions 1, 3 and 4 wait on open work"
    );
    // Messages and their histories are not touched, and the proof still finds every send
    // accounted for: a removed row was DONE, and its history says a worker took it.
    assert_eq!(count(&pool, "SELECT count(*) FROM messages").await, 9);
    assert_eq!(
        database_findings(&pool).await.unwrap().outbox_rows_missing,
        0
    );

    // Once the open work is done, the rows behind it go on the next pass.
    sqlx::query("UPDATE outbox SET status = 'DONE' WHERE message_id = $1")
        .bind(p1_pending)
        .execute(&pool)
        .await
        .unwrap();
    let done = remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    assert_eq!(done.removed, 2);
    assert!(!has_send_row(&pool, p1_done_after).await);
    assert!(has_send_row(&pool, p2_dead).await, "DEAD is never removed");
}

#[tokio::test]
async fn a_dead_row_re_driven_behind_the_cursor_goes_once_it_is_done_and_old() {
    let (_pg, pool) = migrated(4).await;
    let dead = send_row(&pool, 1, "DEAD", 3).await;
    let done = send_row(&pool, 1, "DONE", 3).await;
    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    let passed = remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    assert_eq!((passed.removed, passed.dead_kept), (1, 1));
    assert!(!has_send_row(&pool, done).await);
    assert!(has_send_row(&pool, dead).await, "DEAD is kept");

    // The cursor is past the DEAD row when an operator re-drives it: open work again.
    let outbox_id: i64 = sqlx::query_scalar("SELECT id FROM outbox WHERE message_id = $1")
        .bind(dead)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(redrive_dead(&pool, outbox_id).await.unwrap(), Some(1));
    for _ in 0..3 {
        remove_done_jobs(&pool, fence, Duration::ZERO, 100)
            .await
            .unwrap();
    }
    assert!(
        has_send_row(&pool, dead).await,
        "open work is never removed"
    );

    // Delivered: DONE behind the cursor. It is kept for the retention from the pass that
    // first sees it DONE (an hour here), then removed like any DONE row.
    sqlx::query("UPDATE outbox SET status = 'DONE' WHERE id = $1")
        .bind(outbox_id)
        .execute(&pool)
        .await
        .unwrap();
    let seen = remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    assert_eq!(seen.removed, 0);
    assert!(has_send_row(&pool, dead).await, "kept for the retention");
    let later = remove_done_jobs(&pool, fence, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(later.removed, 1);
    assert!(
        !has_send_row(&pool, dead).await,
        "a re-driven row is not kept for ever"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM retention_passed_dead").await,
        0,
        "and is forgotten"
    );
}

#[tokio::test]
async fn retention_looks_at_a_batch_per_partition_and_says_when_more_is_due() {
    let (_pg, pool) = migrated(4).await;
    for _ in 0..5 {
        send_row(&pool, 2, "DONE", 2).await;
    }
    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    let first = remove_done_jobs(&pool, fence, HOUR, 2).await.unwrap();
    assert_eq!((first.removed, first.more), (2, true));
    let second = remove_done_jobs(&pool, fence, HOUR, 2).await.unwrap();
    assert_eq!((second.removed, second.more), (2, true));
    let third = remove_done_jobs(&pool, fence, HOUR, 2).await.unwrap();
    assert_eq!((third.removed, third.more), (1, false));
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 0);
}

#[tokio::test]
async fn a_compacted_message_reads_back_with_the_same_states_and_times() {
    let (_pg, pool) = migrated(4).await;
    let delivered = message(1, None, "delivered");
    let awaiting = message(2, None, "awaiting a receipt");
    let unknown = message(3, None, "unknown");
    let dead = message(1, None, "dead");
    let failed = message(2, None, "failed");
    let refused = message(3, None, "refused before any claim");
    let queued = message(0, None, "queued");
    accept_messages(
        &pool,
        &[
            delivered.clone(),
            awaiting.clone(),
            unknown.clone(),
            dead.clone(),
            failed.clone(),
            refused.clone(),
            queued.clone(),
        ],
    )
    .await
    .unwrap();
    let accepted = serde_json::json!({"gateway": "gw-a", "provider_id": "p-1"});
    for id in [delivered.id, awaiting.id, unknown.id] {
        append(&pool, id, "CLAIMED", serde_json::json!({"worker": "w"})).await;
        append(&pool, id, "ACCEPTED", accepted.clone()).await;
    }
    append(&pool, delivered.id, "ENROUTE", serde_json::json!({})).await;
    append(
        &pool,
        delivered.id,
        "DELIVERED",
        serde_json::json!({"receipt_id": 7}),
    )
    .await;
    append(
        &pool,
        unknown.id,
        "UNKNOWN",
        serde_json::json!({"reason": "silent"}),
    )
    .await;
    append(&pool, dead.id, "DEAD", serde_json::json!({"reason": "429"})).await;
    append(
        &pool,
        failed.id,
        "CLAIMED",
        serde_json::json!({"worker": "w"}),
    )
    .await;
    for id in [failed.id, refused.id] {
        append(&pool, id, "FAILED", serde_json::json!({"reason": "400"})).await;
    }
    let ids = [
        delivered.id,
        awaiting.id,
        unknown.id,
        dead.id,
        failed.id,
        refused.id,
        queued.id,
    ];
    let mut before = Vec::new();
    for id in ids {
        before.push(message_with_history(&pool, id).await.unwrap().unwrap());
    }

    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    let pass = compact_histories(&pool, fence, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(pass.examined, 7);
    assert_eq!(
        pass.compacted, 2,
        "DELIVERED and FAILED are closed; a FAILED alone is one event already (0020)"
    );
    assert_eq!(
        pass.left_open, 4,
        "awaiting a receipt, UNKNOWN, DEAD and QUEUED (no event, 0019) stay open"
    );
    // QUEUED is derived, not written (0019): CLAIMED, ACCEPTED, ENROUTE, DELIVERED and
    // CLAIMED, FAILED are folded.
    assert_eq!(pass.folded, 4 + 2);

    let events_of = |id: Uuid| {
        let pool = pool.clone();
        async move {
            count(
                &pool,
                &format!("SELECT count(*) FROM message_events WHERE message_id = '{id}'"),
            )
            .await
        }
    };
    assert_eq!(events_of(delivered.id).await, 1);
    assert_eq!(events_of(failed.id).await, 1);
    let untouched: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM message_events WHERE message_id = $1")
            .bind(refused.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        untouched,
        serde_json::json!({"reason": "400"}),
        "not rewritten"
    );
    assert_eq!(events_of(queued.id).await, 0);
    assert_eq!(
        events_of(awaiting.id).await,
        2,
        "CLAIMED, ACCEPTED: left whole"
    );
    for (id, was) in ids.iter().zip(&before) {
        let now = message_with_history(&pool, *id).await.unwrap().unwrap();
        assert_eq!(now.state, was.state, "{id}");
        let times = |view: &herald_store::messages::MessageView| {
            view.events
                .iter()
                .map(|e| (e.seq, e.state.clone(), e.at))
                .collect::<Vec<_>>()
        };
        assert_eq!(times(&now), times(was), "{id}: the same states and times");
    }
    // What a dispute needs stays: the provider's id and gateway, and the outcome's detail.
    let compacted = message_with_history(&pool, delivered.id)
        .await
        .unwrap()
        .unwrap();
    let accepted_event = compacted
        .events
        .iter()
        .find(|e| e.state == "ACCEPTED")
        .unwrap();
    assert_eq!(accepted_event.detail, accepted);
    assert_eq!(
        compacted.events.last().unwrap().detail,
        serde_json::json!({"receipt_id": 7})
    );

    // Each message is looked at once; an event appended later (a late receipt) is read
    // beside the compacted ones.
    let again = compact_histories(&pool, fence, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(again.examined, 0);
    append(
        &pool,
        delivered.id,
        "DELIVERED",
        serde_json::json!({"late": true}),
    )
    .await;
    let late = message_with_history(&pool, delivered.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late.events.len(), before[0].events.len() + 1);
    assert_eq!(late.state, "DELIVERED");
    // Without compaction's own setting, the history is still append-only.
    let refused = sqlx::query("DELETE FROM message_events WHERE message_id = $1")
        .bind(delivered.id)
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("append-only"), "{refused}");
}

#[tokio::test]
async fn a_deposed_maintenance_fence_removes_and_compacts_nothing() {
    let (_pg, pool) = migrated(4).await;
    let old = send_row(&pool, 1, "DONE", 2).await;
    append(&pool, old, "ACCEPTED", serde_json::json!({})).await;
    append(&pool, old, "DELIVERED", serde_json::json!({})).await;
    let deposed = take_over(&pool, 0, "first").await.unwrap();
    let current = take_over(&pool, 0, "second").await.unwrap();

    let removed = remove_done_jobs(&pool, deposed, HOUR, 100).await;
    assert!(
        matches!(removed, Err(StoreError::Fenced { partition: 0, .. })),
        "{removed:?}"
    );
    let compacted = compact_histories(&pool, deposed, Duration::ZERO, 100).await;
    assert!(
        matches!(compacted, Err(StoreError::Fenced { .. })),
        "{compacted:?}"
    );
    assert!(has_send_row(&pool, old).await);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM message_events").await,
        3,
        "CLAIMED, ACCEPTED, DELIVERED (QUEUED is derived)"
    );

    assert_eq!(
        remove_done_jobs(&pool, current, HOUR, 100)
            .await
            .unwrap()
            .removed,
        1
    );
    assert_eq!(
        compact_histories(&pool, current, Duration::ZERO, 100)
            .await
            .unwrap()
            .compacted,
        1
    );
}

#[tokio::test]
async fn closed_messages_go_whole_after_their_send_rows_and_open_ones_stay() {
    let (_pg, pool) = migrated(4).await;
    // In id order: one whose send is still PENDING (its row owes work), then a delivered
    // one, one awaiting its receipt and an UNKNOWN one.
    let owed = send_row(&pool, 3, "PENDING", 2).await;
    let delivered = send_row(&pool, 1, "DONE", 2).await;
    let awaiting = send_row(&pool, 2, "DONE", 2).await;
    let unknown = send_row(&pool, 1, "DONE", 2).await;
    for id in [delivered, awaiting, unknown] {
        provider_accepted(&pool, id).await;
    }
    append(&pool, delivered, "DELIVERED", serde_json::json!({})).await;
    append(&pool, unknown, "UNKNOWN", serde_json::json!({})).await;
    age_messages(&pool).await;
    // (Message ids carry their accept time, now: the message pass is asked for everything
    // accepted until now, and the send rows' age decides.)
    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();

    // The first message's send row is still owed: nothing after it goes yet.
    let blocked = remove_messages(&pool, fence, Duration::ZERO, 100, None)
        .await
        .unwrap();
    assert_eq!((blocked.examined, blocked.removed), (0, 0));

    sqlx::query("UPDATE outbox SET status = 'DONE' WHERE message_id = $1")
        .bind(owed)
        .execute(&pool)
        .await
        .unwrap();
    append(&pool, owed, "CLAIMED", serde_json::json!({})).await;
    append(&pool, owed, "FAILED", serde_json::json!({"reason": "400"})).await;
    remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    // A receipt held for the delivered message's provider id: the pass waits for it (it
    // must still find its send when it is released).
    let held = NewReceipt {
        gateway: "gw".to_owned(),
        raw: b"{}".to_vec(),
        content_type: None,
        partition: 0,
    };
    let held = accept_receipts(&pool, &[held]).await.unwrap()[0];
    sqlx::query(
        "INSERT INTO held_receipts (receipt_id, gateway, provider_id, provider_time, partition)
         VALUES ($1, 'gw', 'p', now(), 0)",
    )
    .bind(held)
    .execute(&pool)
    .await
    .unwrap();
    let waiting = remove_messages(&pool, fence, Duration::ZERO, 100, None)
        .await
        .unwrap();
    assert_eq!(
        (waiting.examined, waiting.removed, waiting.rows),
        (1, 1, 1 + 2),
        "the FAILED message (and its CLAIMED, FAILED), up to the delivered one"
    );
    sqlx::query("DELETE FROM held_receipts")
        .execute(&pool)
        .await
        .unwrap();
    let pass = remove_messages(&pool, fence, Duration::ZERO, 100, None)
        .await
        .unwrap();
    assert_eq!(pass.examined, 3);
    assert_eq!(pass.removed, 1, "the DELIVERED message");
    assert_eq!(pass.left_open, 2);
    // The message, its events (CLAIMED, ACCEPTED, DELIVERED) and its ledger row.
    assert_eq!(pass.rows, 1 + 3 + 1);
    for gone in [owed, delivered] {
        assert!(message_with_history(&pool, gone).await.unwrap().is_none());
    }
    for kept in [awaiting, unknown] {
        let view = message_with_history(&pool, kept).await.unwrap().unwrap();
        assert_eq!(view.events.len(), 3 + usize::from(kept == unknown));
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM ledger").await, 2);
    let findings = database_findings(&pool).await.unwrap();
    assert_eq!(findings.history_without_message, 0);
    assert_eq!(findings.outbox_rows_missing, 0);
    assert_eq!(
        remove_messages(&pool, fence, Duration::ZERO, 100, None)
            .await
            .unwrap()
            .examined,
        0
    );
}

#[tokio::test]
async fn receipts_go_after_their_status_rows_held_ones_wait_and_unresolved_ones_stay() {
    let (_pg, pool) = migrated(4).await;
    let receipt = |n: u32| NewReceipt {
        gateway: "gw".to_owned(),
        raw: format!("{{\"n\": {n}}}").into_bytes(),
        content_type: Some("application/json".to_owned()),
        partition: n % 4,
    };
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.extend(accept_receipts(&pool, &[receipt(n)]).await.unwrap());
    }
    let [replayed, plain, parked, held, last] = ids[..] else {
        panic!("{ids:?}")
    };
    sqlx::query(
        "INSERT INTO parking (job_type, receipt_id, raw, reason, replayed_at)
         VALUES ('status', $1, '', 'unknown status', now()),
                ('status', $2, '', 'unknown status', NULL)",
    )
    .bind(replayed)
    .bind(parked)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO held_receipts (receipt_id, gateway, provider_id, provider_time, partition)
         VALUES ($1, 'gw', 'p', now(), 0)",
    )
    .bind(held)
    .execute(&pool)
    .await
    .unwrap();
    age_receipts(&pool).await;
    let fence = take_over(&pool, 0, "maintenance").await.unwrap();

    // Their status rows are still PENDING: no receipt goes before its status row.
    remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    assert_eq!(
        remove_receipts(&pool, fence, HOUR, 100, None)
            .await
            .unwrap()
            .removed,
        0
    );

    sqlx::query(
        "UPDATE outbox SET status = 'DONE', created_at = now() - interval '2 hours'
         WHERE job_type = 'status'",
    )
    .execute(&pool)
    .await
    .unwrap();
    remove_done_jobs(&pool, fence, HOUR, 100).await.unwrap();
    let pass = remove_receipts(&pool, fence, HOUR, 100, None)
        .await
        .unwrap();
    assert_eq!(
        (pass.removed, pass.parked_removed),
        (2, 1),
        "up to the held one; the unresolved parked one passed and kept"
    );
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM receipts ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![parked, held, last]);
    assert!(!left.contains(&plain) && !left.contains(&replayed));

    // Once released, the held one goes with the rest; the unresolved parked one stays,
    // however many passes run, and its parking row too.
    sqlx::query("DELETE FROM held_receipts")
        .execute(&pool)
        .await
        .unwrap();
    let pass = remove_receipts(&pool, fence, HOUR, 100, None)
        .await
        .unwrap();
    assert_eq!((pass.removed, pass.parked_removed), (2, 0));
    for _ in 0..3 {
        let again = remove_receipts(&pool, fence, HOUR, 100, None)
            .await
            .unwrap();
        assert_eq!(again.removed, 0);
    }
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM receipts ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![parked]);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM parking WHERE replayed_at IS NULL"
        )
        .await,
        1
    );
    // The proof does not miss what retention removed.
    assert_eq!(
        database_findings(&pool).await.unwrap().outbox_rows_missing,
        0
    );
}

/// Two delivered messages (with ledger rows) and one receipt (with a replayed parking row),
/// all old enough to go, and the outbox retention past them.
async fn removable(pool: &PgPool) -> (Vec<Uuid>, i64, herald_core::Fence) {
    let mut ids = Vec::new();
    for partition in [1, 2] {
        let id = send_row(pool, partition, "DONE", 2).await;
        append(
            pool,
            id,
            "ACCEPTED",
            serde_json::json!({"gateway": "gw", "provider_id": "p"}),
        )
        .await;
        sqlx::query(
            "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id)
             VALUES ('k-' || $1::text, $1, 'gw', 'p')",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
        append(pool, id, "DELIVERED", serde_json::json!({"receipt_id": 1})).await;
        ids.push(id);
    }
    let receipt = NewReceipt {
        gateway: "gw".to_owned(),
        raw: b"{\"status\": \"?\"}".to_vec(),
        content_type: Some("application/json".to_owned()),
        partition: 3,
    };
    let receipt = accept_receipts(pool, &[receipt]).await.unwrap()[0];
    sqlx::query(
        "INSERT INTO parking (job_type, receipt_id, raw, reason, replayed_at)
         VALUES ('status', $1, 'raw', 'unknown status', now())",
    )
    .bind(receipt)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = 'DONE', created_at = now() - interval '2 hours'
         WHERE job_type = 'status'",
    )
    .execute(pool)
    .await
    .unwrap();
    let two_hours = "created_at = now() - interval '2 hours'";
    age(pool, "messages", "messages_immutable", two_hours).await;
    let received = "received_at = now() - interval '2 hours'";
    age(pool, "receipts", "receipts_immutable", received).await;
    let fence = take_over(pool, 0, "maintenance").await.unwrap();
    remove_done_jobs(pool, fence, HOUR, 100).await.unwrap();
    (ids, receipt, fence)
}

/// Each message as `GET /v1/messages/{id}` reads it, with its history.
async fn histories(pool: &PgPool, ids: &[Uuid]) -> Vec<herald_store::messages::MessageView> {
    let mut views = Vec::new();
    for id in ids {
        views.push(
            message_with_history(pool, *id)
                .await
                .unwrap()
                .expect("stored"),
        );
    }
    views
}

#[tokio::test]
async fn removed_rows_are_archived_first_verify_against_their_manifest_and_restore() {
    let (_pg, pool) = migrated(4).await;
    let (ids, receipt, fence) = removable(&pool).await;
    let before = histories(&pool, &ids).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = ArchiveDir::new(dir.path());

    let messages = remove_messages(&pool, fence, Duration::ZERO, 100, Some(&archive))
        .await
        .unwrap();
    assert_eq!(messages.removed, 2);
    let receipts = remove_receipts(&pool, fence, HOUR, 100, Some(&archive))
        .await
        .unwrap();
    assert_eq!((receipts.removed, receipts.parked_removed), (1, 1));
    assert!(message_with_history(&pool, ids[0]).await.unwrap().is_none());

    let files = archive::manifests(dir.path()).unwrap();
    assert_eq!(files.len(), 2, "one file per removal statement: {files:?}");
    let mut kinds = Vec::new();
    for file in &files {
        let manifest = archive::verify(file).unwrap();
        kinds.push((manifest.kind.clone(), manifest.rows));
        if manifest.kind == "messages" {
            assert_eq!(manifest.first_id, ids[0].to_string());
        } else {
            assert_eq!(manifest.first_id, receipt.to_string());
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        vec![("messages".to_owned(), 2), ("receipts".to_owned(), 1)]
    );

    // Restored, a message reads back as it did; restoring twice changes nothing.
    for _ in 0..2 {
        for file in &files {
            archive::restore(&pool, file).await.unwrap();
        }
    }
    assert_eq!(histories(&pool, &ids).await, before);
    assert_eq!(count(&pool, "SELECT count(*) FROM ledger").await, 2);
    assert_eq!(count(&pool, "SELECT count(*) FROM receipts").await, 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM parking").await, 1);
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw FROM receipts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(raw, b"{\"status\": \"?\"}", "byte for byte");
}

#[tokio::test]
async fn an_hours_archive_files_roll_up_into_one_that_restores_the_same() {
    let (_pg, pool) = migrated(4).await;
    let (ids, _, fence) = removable(&pool).await;
    let before = histories(&pool, &ids).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = ArchiveDir::new(dir.path());
    // One message per statement: one file each.
    for _ in 0..3 {
        remove_messages(&pool, fence, Duration::ZERO, 1, Some(&archive))
            .await
            .unwrap();
    }
    assert_eq!(archive::manifests(dir.path()).unwrap().len(), 2);
    let later = std::time::SystemTime::now() + 2 * HOUR;
    let done = archive.roll_up(archive::Kind::Messages, later).unwrap();
    assert_eq!((done.files, done.parts), (1, 2));
    let files = archive::manifests(dir.path()).unwrap();
    assert_eq!(files.len(), 1);
    let rolled = archive::verify(&files[0]).unwrap();
    assert_eq!(rolled.rows, 2);
    assert_eq!(rolled.first_id, ids[0].to_string());

    assert_eq!(archive::restore(&pool, &files[0]).await.unwrap(), 2);
    assert_eq!(histories(&pool, &ids).await, before);
}

#[tokio::test]
async fn nothing_is_removed_when_its_archive_cannot_be_written() {
    let (_pg, pool) = migrated(4).await;
    let (ids, _, fence) = removable(&pool).await;
    // The archive directory's place is taken by a file.
    let dir = tempfile::tempdir().unwrap();
    let blocked = dir.path().join("archive");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let archive = ArchiveDir::new(&blocked);
    let refused = remove_messages(&pool, fence, Duration::ZERO, 100, Some(&archive)).await;
    assert!(
        matches!(refused, Err(StoreError::Archive(_))),
        "{refused:?}"
    );
    let refused = remove_receipts(&pool, fence, HOUR, 100, Some(&archive)).await;
    assert!(
        matches!(refused, Err(StoreError::Archive(_))),
        "{refused:?}"
    );
    for id in ids {
        assert!(message_with_history(&pool, id).await.unwrap().is_some());
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM receipts").await, 1);
    // And the cursor did not move: with a writable archive the same rows go.
    let archive = ArchiveDir::new(dir.path().join("ok"));
    let removed = remove_messages(&pool, fence, Duration::ZERO, 100, Some(&archive))
        .await
        .unwrap();
    assert_eq!(removed.removed, 2);
}

#[tokio::test]
async fn accepts_go_on_while_retention_statements_hold_their_locks() {
    let (_pg, pool) = migrated(4).await;
    let (_, _, fence) = removable(&pool).await;
    for partition in 0..4 {
        send_row(&pool, partition, "DONE", 2).await;
    }
    // Every retention statement in one transaction left open, its rows locked (as while an
    // archive file is written before the commit).
    let mut tx = pool.begin().await.unwrap();
    let (removed,): (i64,) = sqlx::query_as(
        "SELECT removed FROM herald_remove_done_jobs(0, $1, now() - interval '1 hour', 100)",
    )
    .bind(fence.epoch)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(removed, 4);
    let (compacted,): (i64,) =
        sqlx::query_as("SELECT compacted FROM herald_compact_histories(0, $1, $2, 100)")
            .bind(fence.epoch)
            .bind(herald_store::retention::first_id_at(
                std::time::SystemTime::now(),
            ))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(compacted, 2);
    // New messages on every partition are accepted meanwhile, and read back.
    let fresh: Vec<_> = (0..4).map(|p| message(p, None, "meanwhile")).collect();
    tokio::time::timeout(Duration::from_secs(10), accept_messages(&pool, &fresh))
        .await
        .expect("retention does not block accepts")
        .unwrap();
    for new in &fresh {
        assert!(message_with_history(&pool, new.id).await.unwrap().is_some());
    }
    tx.commit().await.unwrap();
}

/// Every removal statement once, with nothing young enough to be spared by its age.
async fn every_statement(pool: &PgPool, fence: herald_store::outbox::Fence) {
    remove_done_jobs(pool, fence, Duration::ZERO, 100)
        .await
        .unwrap();
    compact_histories(pool, fence, Duration::ZERO, 100)
        .await
        .unwrap();
    remove_messages(pool, fence, Duration::ZERO, 100, None)
        .await
        .unwrap();
    remove_receipts(pool, fence, Duration::ZERO, 100, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn open_messages_dead_rows_and_parked_input_survive_any_number_of_passes() {
    let (_pg, pool) = migrated(4).await;
    let ages = herald_store::retention::oldest_retained(&pool)
        .await
        .unwrap();
    assert_eq!(ages.len(), 6);
    assert!(ages.iter().all(|(_, age)| age.is_none()), "{ages:?}");

    // In id order: a closed message (it goes), then one of every open kind.
    let closed = send_row(&pool, 0, "DONE", 2).await;
    append(
        &pool,
        closed,
        "FAILED",
        serde_json::json!({"reason": "400"}),
    )
    .await;
    let dead = send_row(&pool, 1, "DEAD", 2).await;
    append(
        &pool,
        dead,
        "DEAD",
        serde_json::json!({"reason": "attempts"}),
    )
    .await;
    let in_flight = send_row(&pool, 2, "DONE", 2).await;
    sqlx::query(
        "INSERT INTO in_flight_sends (message_id, partition, outbox_id, claimed_at)
         SELECT message_id, partition, id, now() - interval '2 hours' FROM outbox
         WHERE message_id = $1",
    )
    .bind(in_flight)
    .execute(&pool)
    .await
    .unwrap();
    let awaiting = send_row(&pool, 3, "DONE", 2).await;
    let unknown = send_row(&pool, 1, "DONE", 2).await;
    for id in [awaiting, unknown] {
        provider_accepted(&pool, id).await;
    }
    append(&pool, unknown, "UNKNOWN", serde_json::json!({})).await;
    age_messages(&pool).await;
    // A receipt parked and not replayed, its status job done long ago.
    let parked = accept_receipts(
        &pool,
        &[NewReceipt {
            gateway: "gw".to_owned(),
            raw: b"{\"status\": \"NEW-WORD\"}".to_vec(),
            content_type: Some("application/json".to_owned()),
            partition: 0,
        }],
    )
    .await
    .unwrap()[0];
    sqlx::query(
        "INSERT INTO parking (job_type, receipt_id, raw, reason)
         VALUES ('status', $1, '{\"status\": \"NEW-WORD\"}', 'unknown status')",
    )
    .bind(parked)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = 'DONE', created_at = now() - interval '2 hours'
         WHERE job_type = 'status'",
    )
    .execute(&pool)
    .await
    .unwrap();
    age_receipts(&pool).await;
    let histories = |id| {
        let pool = pool.clone();
        async move {
            message_with_history(&pool, id)
                .await
                .unwrap()
                .map(|view| view.events)
        }
    };
    let mut before = Vec::new();
    for id in [dead, in_flight, awaiting, unknown] {
        before.push(histories(id).await.expect("accepted"));
    }

    let fence = take_over(&pool, 0, "maintenance").await.unwrap();
    for _ in 0..5 {
        every_statement(&pool, fence).await;
    }

    assert!(histories(closed).await.is_none(), "the closed message went");
    for (id, events) in [dead, in_flight, awaiting, unknown]
        .into_iter()
        .zip(&before)
    {
        let after = histories(id).await.expect("an open message stays");
        assert_eq!(&after, events, "{id}: its history whole, not compacted");
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox WHERE status = 'DEAD'").await,
        1
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM in_flight_sends").await,
        1
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM ledger").await, 2);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM parking WHERE replayed_at IS NULL"
        )
        .await,
        1
    );
    let receipts: Vec<i64> = sqlx::query_scalar("SELECT id FROM receipts")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(receipts, vec![parked]);

    // What is kept is reported by its age: the aged tables about two hours, the history by its
    // messages' ids (accepted just now).
    let ages: std::collections::HashMap<_, _> = herald_store::retention::oldest_retained(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    for table in ["messages", "outbox", "receipts"] {
        let age = ages[table].expect(table);
        assert!((7_000.0..7_400.0).contains(&age), "{table}: {age}");
    }
    for table in ["message_events", "ledger", "parking"] {
        let age = ages[table].expect(table);
        assert!((0.0..600.0).contains(&age), "{table}: {age}");
    }
    let sizes = herald_store::retention::table_sizes(&pool).await.unwrap();
    assert_eq!(sizes.len(), 6);
    assert!(sizes.iter().all(|(_, bytes)| *bytes > 0), "{sizes:?}");
}
