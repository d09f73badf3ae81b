use herald_core::MessageState;
use herald_store::accept::{accept_each, accept_messages, AcceptError, KeyReused, NewMessage};
use herald_store::group::{GroupCommit, GroupSettings};
use herald_store::messages::message_with_history;
use herald_store::receipts::{accept_receipts, NewReceipt, RECEIPTS_PER_JOB};
use herald_store::StoreError;

use crate::{count, message, migrated};

#[tokio::test]
async fn accept_writes_message_and_outbox_row_and_the_history_starts_queued() {
    let (_pg, pool) = migrated(8).await;
    let batch = vec![message(3, None, "a"), message(5, Some("k-1"), "b")];
    let accepted = accept_messages(&pool, &batch).await.unwrap();
    assert_eq!(accepted.len(), 2);
    for (answer, sent) in accepted.iter().zip(&batch) {
        assert_eq!(answer.id, sent.id);
        assert!(answer.created);
        assert_eq!(answer.state, MessageState::Queued);
    }
    let outbox: Vec<(i32, String, String)> =
        sqlx::query_as("SELECT partition, status, job_type FROM outbox ORDER BY partition")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        outbox,
        vec![
            (3, "PENDING".to_owned(), "send".to_owned()),
            (5, "PENDING".to_owned(), "send".to_owned())
        ]
    );
    let view = message_with_history(&pool, batch[1].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.state, "QUEUED");
    assert_eq!(view.events.len(), 1);
    assert_eq!(view.events[0].state, "QUEUED");
    assert_eq!(view.events[0].at, view.created_at);
    assert_eq!(view.idempotency_key.as_deref(), Some("k-1"));
    // QUEUED is derived from the message row (migration 0019): the accept appends no event.
    assert_eq!(count(&pool, "SELECT count(*) FROM message_events").await, 0);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM message_current_state WHERE state = 'QUEUED'"
        )
        .await,
        2
    );
}

/// A history written before migration 0019 holds its QUEUED event: it reads back once, with
/// its own time, and the events after it keep their order.
#[tokio::test]
async fn a_history_with_a_written_queued_event_reads_it_once() {
    let (_pg, pool) = migrated(8).await;
    let sent = message(1, None, "old");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO message_events (message_id, state, at)
         VALUES ($1, 'QUEUED', now() - interval '1 second'), ($1, 'CLAIMED', now())",
    )
    .bind(sent.id)
    .execute(&pool)
    .await
    .unwrap();
    let view = message_with_history(&pool, sent.id).await.unwrap().unwrap();
    let states: Vec<&str> = view.events.iter().map(|e| e.state.as_str()).collect();
    assert_eq!(states, ["QUEUED", "CLAIMED"]);
    assert_ne!(
        view.events[0].seq, 0,
        "the written event, not a derived one"
    );
    assert_eq!(view.state, "CLAIMED");
}

#[tokio::test]
async fn a_reused_key_replays_or_conflicts_and_a_conflict_writes_nothing() {
    let (_pg, pool) = migrated(8).await;
    let first = message(2, Some("same-key"), "hello");
    accept_messages(&pool, std::slice::from_ref(&first))
        .await
        .unwrap();

    // Same key, same content (a retry): the first id, nothing new written.
    let mut retry = message(2, Some("same-key"), "hello");
    retry.id = uuid::Uuid::now_v7();
    let replayed = accept_messages(&pool, &[retry]).await.unwrap();
    assert_eq!(replayed[0].id, first.id);
    assert!(!replayed[0].created);

    // Same key, other content, in a batch with a new message: nothing of the batch is written.
    let fresh = message(4, None, "new");
    let conflicting = message(2, Some("same-key"), "different");
    let err = accept_messages(&pool, &[fresh.clone(), conflicting])
        .await
        .unwrap_err();
    assert!(
        matches!(err, AcceptError::KeyConflict { index: 1, .. }),
        "{err}"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM messages").await, 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM message_events").await, 0);
}

/// Group commit: separate requests share a transaction but are answered one by one. A reused
/// key fails only its own request, two requests with one key behave as if sent in turn, and a
/// request the database refuses (a NUL in jsonb) fails alone: its neighbours are committed.
#[tokio::test]
async fn a_shared_transaction_answers_each_request_on_its_own() {
    let (_pg, pool) = migrated(8).await;
    accept_messages(&pool, &[message(1, Some("taken"), "first")])
        .await
        .unwrap();
    let writer_pool = pool.clone();
    let group = GroupCommit::spawn(
        "test",
        GroupSettings {
            max_group: 64,
            parallel: 1,
            linger: std::time::Duration::ZERO,
        },
        move |messages: std::sync::Arc<Vec<NewMessage>>| {
            let pool = writer_pool.clone();
            async move { accept_each(&pool, &messages).await }
        },
    );
    let mut refused = message(3, None, "x");
    refused.body = serde_json::json!({ "text": "nul \u{0} here" });
    let requests = [
        message(2, None, "plain"),
        message(1, Some("taken"), "other content"),
        message(4, Some("twice"), "same"),
        message(4, Some("twice"), "same"),
        message(5, Some("clash"), "one"),
        message(5, Some("clash"), "two"),
        refused,
        message(6, None, "after the refused one"),
    ];
    let answers = futures::future::join_all(requests.iter().map(|m| group.write(m.clone()))).await;
    assert!(matches!(&answers[0], Ok(Ok(a)) if a.created));
    assert!(matches!(&answers[1], Ok(Err(KeyReused { key })) if key == "taken"));
    let (Ok(Ok(twice_a)), Ok(Ok(twice_b))) = (&answers[2], &answers[3]) else {
        panic!("{answers:?}");
    };
    assert!(twice_a.created && !twice_b.created && twice_a.id == twice_b.id);
    assert!(matches!(&answers[4], Ok(Ok(a)) if a.created));
    assert!(matches!(&answers[5], Ok(Err(KeyReused { key })) if key == "clash"));
    assert!(
        matches!(&answers[6], Err(StoreError::Database(_))),
        "{:?}",
        answers[6]
    );
    assert!(matches!(&answers[7], Ok(Ok(a)) if a.created));
    // 1 before + plain + twice + clash + the one after the refused request.
    assert_eq!(count(&pool, "SELECT count(*) FROM messages").await, 5);
    assert_eq!(count(&pool, "SELECT count(*) FROM outbox").await, 5);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM message_current_state").await,
        5
    );
}

/// Receipts written together get their ids in input order and share status jobs.
#[tokio::test]
async fn receipts_written_together_keep_their_order() {
    let (_pg, pool) = migrated(8).await;
    let receipts: Vec<NewReceipt> = (0..20)
        .map(|i| NewReceipt {
            gateway: "gw".to_owned(),
            raw: format!("receipt {i}").into_bytes(),
            content_type: (i % 2 == 0).then(|| "text/plain".to_owned()),
            partition: i % 3,
        })
        .collect();
    let ids = accept_receipts(&pool, &receipts).await.unwrap();
    assert_eq!(ids.len(), 20);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for (id, receipt) in ids.iter().zip(&receipts) {
        let (raw, content_type): (Vec<u8>, Option<String>) =
            sqlx::query_as("SELECT raw, content_type FROM receipts WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(raw, receipt.raw);
        assert_eq!(content_type, receipt.content_type);
    }
    // One status job carries them all, in order, on the first receipt's partition.
    let jobs: Vec<(serde_json::Value, i32)> =
        sqlx::query_as("SELECT payload, partition FROM outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        jobs,
        [(
            serde_json::json!({ "receipt_ids": ids }),
            receipts[0].partition as i32
        )]
    );
    // More than a job carries are split in order.
    let many: Vec<NewReceipt> = (0..(RECEIPTS_PER_JOB + 5))
        .map(|i| NewReceipt {
            gateway: "gw".to_owned(),
            raw: format!("more {i}").into_bytes(),
            content_type: None,
            partition: 1,
        })
        .collect();
    let ids = accept_receipts(&pool, &many).await.unwrap();
    let sizes: Vec<Vec<i64>> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT jsonb_array_elements_text(payload->'receipt_ids')::bigint)
         FROM outbox ORDER BY id OFFSET 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(sizes.concat(), ids);
    assert_eq!(
        sizes.iter().map(Vec::len).collect::<Vec<_>>(),
        [RECEIPTS_PER_JOB, 5]
    );
}
