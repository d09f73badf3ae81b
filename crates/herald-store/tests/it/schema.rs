use herald_core::{MessageState, PartitionCount};
use herald_store::migrate::{migrate, partition_count};
use herald_store::StoreError;

use crate::{count, message, migrated};

#[tokio::test]
async fn migrate_records_the_partition_count_and_refuses_another() {
    let (_pg, pool) = migrated(16).await;
    assert_eq!(partition_count(&pool).await.unwrap().get(), 16);
    // One child per partition, each with its partial index on PENDING rows.
    let children = count(
        &pool,
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass",
    )
    .await;
    assert_eq!(children, 16);
    let pending_indexes = count(
        &pool,
        "SELECT count(*) FROM pg_indexes
         WHERE tablename LIKE 'outbox\\_p%' AND indexdef LIKE '%WHERE (status = ''PENDING''::text)%'",
    )
    .await;
    assert_eq!(pending_indexes, 16);

    // Running again with the same count is a no-op; another count is refused.
    migrate(&pool, PartitionCount::new(16).unwrap())
        .await
        .unwrap();
    let err = migrate(&pool, PartitionCount::new(32).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::PartitionCountMismatch {
                recorded: 16,
                requested: 32
            }
        ),
        "{err}"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
        )
        .await,
        16
    );
}

#[tokio::test]
async fn state_rank_in_sql_matches_the_domain() {
    let (_pg, pool) = migrated(4).await;
    for state in MessageState::ALL {
        let rank: i32 = sqlx::query_scalar("SELECT herald_state_rank($1)")
            .bind(state.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rank, state.rank(), "{state}");
    }
}

#[tokio::test]
async fn history_is_append_only_and_messages_immutable() {
    let (_pg, pool) = migrated(4).await;
    herald_store::accept::accept_messages(&pool, &[message(1, None, "x")])
        .await
        .unwrap();
    for statement in [
        "UPDATE messages SET recipient = 'other'",
        "UPDATE message_events SET state = 'ACCEPTED'",
        "DELETE FROM message_events",
    ] {
        let err = sqlx::query(statement).execute(&pool).await.unwrap_err();
        assert!(
            err.to_string().contains("append-only"),
            "{statement}: {err}"
        );
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM message_events").await, 1);
}
