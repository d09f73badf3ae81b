use herald_core::MessageState;
use herald_store::accept::{accept_messages, AcceptError};
use herald_store::messages::message_with_history;

use crate::{count, message, migrated};

#[tokio::test]
async fn accept_writes_message_outbox_row_and_first_event_together() {
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
    assert_eq!(view.idempotency_key.as_deref(), Some("k-1"));
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
    assert_eq!(count(&pool, "SELECT count(*) FROM message_events").await, 1);
}
