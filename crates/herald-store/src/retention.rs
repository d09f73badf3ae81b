//! Retention: DONE outbox rows are removed once older than their retention, and a closed
//! message's history is folded into one event (compaction). Both statements are functions of
//! the schema (migration 0016): the runtime role holds no DELETE on the outbox or the history,
//! and the rules of what may go are written once, in the database. Both are fenced by the
//! maintenance fence (the owner of partition 0), so two maintenance loops never change
//! anything at once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics::{measured, Operation};
use crate::outbox::Fence;
use crate::StoreError;

/// What one removal statement did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DoneJobsRemoved {
    /// DONE rows removed.
    pub removed: u64,
    /// DEAD rows looked at and kept (a DEAD row is never removed).
    pub dead_kept: u64,
    /// Partitions whose oldest row not yet looked at is older than the retention but still
    /// open (PENDING, claimed, published, or a send whose claim has no outcome): retention of
    /// that partition waits for it.
    pub waiting: u64,
    /// Some partition had a full batch to look at: more may be due now.
    pub more: bool,
}

/// Removes DONE outbox rows created more than `older_than` ago, looking at up to `batch` rows
/// per partition in id order. A partition's pass stops at its first row that is younger or
/// still open; DEAD rows are kept. Fails with [`StoreError::Fenced`] (and removes nothing)
/// when `fence` no longer holds.
pub async fn remove_done_jobs(
    pool: &PgPool,
    fence: Fence,
    older_than: Duration,
    batch: u32,
) -> Result<DoneJobsRemoved, StoreError> {
    let (fenced, removed, dead_kept, waiting, more): (bool, i64, i64, i64, bool) = measured(
        Operation::Retention,
        sqlx::query_as(
            "SELECT * FROM herald_remove_done_jobs($1, $2, now() - make_interval(secs => $3), $4)",
        )
        .bind(fence.partition as i32)
        .bind(fence.epoch)
        .bind(older_than.as_secs_f64())
        .bind(batch.max(1) as i32)
        .fetch_one(pool),
    )
    .await?;
    if fenced {
        return Err(StoreError::Fenced {
            partition: fence.partition,
            epoch: fence.epoch,
        });
    }
    Ok(DoneJobsRemoved {
        removed: removed as u64,
        dead_kept: dead_kept as u64,
        waiting: waiting as u64,
        more,
    })
}

/// What one compaction statement did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Messages looked at (the cursor passed them).
    pub examined: u64,
    /// Closed messages whose history is now one event.
    pub compacted: u64,
    /// Events folded away (the new compact events not counted).
    pub folded: u64,
    /// Messages looked at whose outcome was still open: their histories are kept whole.
    pub left_open: u64,
}

/// Folds the histories of up to `batch` messages accepted more than `older_than` ago (after
/// the compaction cursor) into one event each, if their outcome is closed (DELIVERED,
/// UNDELIVERED, EXPIRED or FAILED). The compact event has the message's final state and
/// time, and its detail lists every transition: `{"compacted": [{"seq", "state", "at",
/// "detail"?}, ...]}` ([`crate::messages::message_with_history`] reads it back as the events
/// it replaced). Fails with [`StoreError::Fenced`] when `fence` no longer holds.
pub async fn compact_histories(
    pool: &PgPool,
    fence: Fence,
    older_than: Duration,
    batch: u32,
) -> Result<Compacted, StoreError> {
    let before = SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(UNIX_EPOCH);
    let (fenced, examined, compacted, folded, left_open): (bool, i64, i64, i64, i64) = measured(
        Operation::Retention,
        sqlx::query_as("SELECT * FROM herald_compact_histories($1, $2, $3, $4)")
            .bind(fence.partition as i32)
            .bind(fence.epoch)
            .bind(first_id_at(before))
            .bind(batch.max(1) as i32)
            .fetch_one(pool),
    )
    .await?;
    if fenced {
        return Err(StoreError::Fenced {
            partition: fence.partition,
            epoch: fence.epoch,
        });
    }
    Ok(Compacted {
        examined: examined as u64,
        compacted: compacted as u64,
        folded: folded as u64,
        left_open: left_open as u64,
    })
}

/// The smallest UUIDv7 of the millisecond `at`: every message id generated at or after `at`
/// sorts above it (message ids are UUIDv7, their first 48 bits the accept's Unix time in
/// milliseconds, and PostgreSQL orders UUIDs byte by byte).
pub fn first_id_at(at: SystemTime) -> Uuid {
    let millis = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    bytes[8] = 0x80;
    Uuid::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_id_of_a_millisecond_sorts_below_every_id_made_in_it_and_above_earlier_ones() {
        let before = Uuid::now_v7();
        std::thread::sleep(Duration::from_millis(3));
        let at = SystemTime::now();
        let floor = first_id_at(at);
        std::thread::sleep(Duration::from_millis(2));
        let after = Uuid::now_v7();
        assert!(before < floor, "{before} < {floor}");
        assert!(floor < after, "{floor} < {after}");
        assert_eq!(floor.get_version_num(), 7);
    }
}
