//! Retention: DONE outbox rows are removed once older than their retention, a closed message's
//! history is folded into one event (compaction), and later a closed message goes whole with
//! its ledger rows, as do old receipts with their replayed parking rows. Every statement is a
//! function of the schema (migration 0016): the runtime role holds no DELETE on the outbox or
//! the history, and the rules of what may go are written once, in the database. All are
//! fenced by the maintenance fence (the owner of partition 0), so two maintenance loops never
//! change anything at once.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::archive::{ArchiveDir, Kind};

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

/// Removes DONE outbox rows (sends and status jobs) created more than `older_than` ago,
/// looking at up to `batch` rows per partition in id order. A partition's pass stops at its
/// first row that is younger or still open; DEAD rows are kept. Fails with [`StoreError::Fenced`] (and removes nothing)
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
        return Err(deposed(fence));
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
    /// Closed messages whose history of two or more events is now one event (a closed
    /// history of one event is left as it is: nothing to fold; migration 0020).
    pub compacted: u64,
    /// Events folded away (the new compact events not counted).
    pub folded: u64,
    /// Messages looked at whose outcome was still open (QUEUED ones, without events,
    /// included): their histories are kept whole.
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
        return Err(deposed(fence));
    }
    Ok(Compacted {
        examined: examined as u64,
        compacted: compacted as u64,
        folded: folded as u64,
        left_open: left_open as u64,
    })
}

/// What one message-removal statement did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessagesRemoved {
    /// Messages looked at (the cursor passed them).
    pub examined: u64,
    /// Closed messages removed whole.
    pub removed: u64,
    /// Rows removed in all: the messages, their events and their ledger rows.
    pub rows: u64,
    /// Messages looked at whose outcome was still open: kept.
    pub left_open: u64,
    /// A full batch was looked at: more may be due now.
    pub more: bool,
}

/// Removes closed messages (DELIVERED, UNDELIVERED, EXPIRED, FAILED) accepted more than
/// `older_than` ago whole: the message, its events and its ledger rows, looking at up to
/// `batch` messages after the cursor. Open messages are kept. The pass stops at the first
/// message whose send row the outbox retention ([`remove_done_jobs`]) has not looked at yet, so
/// it needs that retention on. With `archive`, the removed rows are written there first, and
/// the removal commits only once the file is on disk. Fails with [`StoreError::Fenced`] when
/// `fence` no longer holds, and with [`StoreError::Archive`] (nothing removed) when the file
/// cannot be written.
pub async fn remove_messages(
    pool: &PgPool,
    fence: Fence,
    older_than: Duration,
    batch: u32,
    archive: Option<&ArchiveDir>,
) -> Result<MessagesRemoved, StoreError> {
    let before = SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(UNIX_EPOCH);
    let statement = sqlx::query_as("SELECT * FROM herald_remove_messages($1, $2, $3, $4, $5)")
        .bind(fence.partition as i32)
        .bind(fence.epoch)
        .bind(first_id_at(before))
        .bind(batch.max(1) as i32)
        .bind(archive.is_some());
    let (fenced, examined, removed, rows, left_open, more, _): MessagesRow = archived(
        pool,
        archive,
        Kind::Messages,
        statement,
        |row: &mut MessagesRow| row.6.take(),
    )
    .await?;
    if fenced {
        return Err(deposed(fence));
    }
    Ok(MessagesRemoved {
        examined: examined as u64,
        removed: removed as u64,
        rows: rows as u64,
        left_open: left_open as u64,
        more,
    })
}

/// What one receipt-removal statement did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiptsRemoved {
    pub removed: u64,
    /// Replayed parking rows that named a removed receipt.
    pub parked_removed: u64,
    /// A full batch was looked at: more may be due now.
    pub more: bool,
}

/// Removes receipts received more than `older_than` ago, with the replayed parking rows that
/// name them, up to `batch` after the cursor. The pass stops at the first receipt that is
/// younger, held for its send, or whose status row may still be owed; one named by a parking
/// row not replayed is passed and kept. With `archive`, as [`remove_messages`]. Fails with [`StoreError::Fenced`]
/// when `fence` no longer holds.
pub async fn remove_receipts(
    pool: &PgPool,
    fence: Fence,
    older_than: Duration,
    batch: u32,
    archive: Option<&ArchiveDir>,
) -> Result<ReceiptsRemoved, StoreError> {
    let statement = sqlx::query_as(
        "SELECT * FROM herald_remove_receipts($1, $2, now() - make_interval(secs => $3), $4, $5)",
    )
    .bind(fence.partition as i32)
    .bind(fence.epoch)
    .bind(older_than.as_secs_f64())
    .bind(batch.max(1) as i32)
    .bind(archive.is_some());
    let (fenced, removed, parked_removed, more, _): ReceiptsRow = archived(
        pool,
        archive,
        Kind::Receipts,
        statement,
        |row: &mut ReceiptsRow| row.4.take(),
    )
    .await?;
    if fenced {
        return Err(deposed(fence));
    }
    Ok(ReceiptsRemoved {
        removed: removed as u64,
        parked_removed: parked_removed as u64,
        more,
    })
}

/// How old the oldest row still kept is, per table, in seconds (`None`: the table is empty):
/// `messages` and `message_events` (by the message id's accept time), `ledger` (its
/// `created_at`), `outbox` (each partition's first row), `receipts` and `parking`. Each is
/// read through an index's first entry, so this costs a few index probes.
pub async fn oldest_retained(
    pool: &PgPool,
) -> Result<Vec<(&'static str, Option<f64>)>, StoreError> {
    type Ages = (
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
    );
    // A UUIDv7's first 48 bits are its Unix time in milliseconds.
    let (messages, events, ledger, outbox, receipts, parking): Ages = sqlx::query_as(
        "SELECT (SELECT extract(epoch FROM now() - m.created_at)::float8
                 FROM (SELECT created_at FROM messages ORDER BY id LIMIT 1) m),
                (SELECT (extract(epoch FROM now()) - ('x' || lpad(left(replace(
                        e.message_id::text, '-', ''), 12), 16, '0'))::bit(64)::bigint / 1000.0)::float8
                 FROM (SELECT message_id FROM message_events ORDER BY message_id LIMIT 1) e),
                (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM ledger),
                (SELECT extract(epoch FROM now() - min(o.created_at))::float8
                 FROM generate_series(0, (SELECT value::integer FROM herald_settings
                                          WHERE name = 'partitions') - 1) p
                 CROSS JOIN LATERAL (SELECT created_at FROM outbox
                                     WHERE partition = p ORDER BY id LIMIT 1) o),
                (SELECT extract(epoch FROM now() - r.received_at)::float8
                 FROM (SELECT received_at FROM receipts ORDER BY id LIMIT 1) r),
                (SELECT extract(epoch FROM now() - k.parked_at)::float8
                 FROM (SELECT parked_at FROM parking ORDER BY id LIMIT 1) k)",
    )
    .fetch_one(pool)
    .await?;
    Ok(vec![
        ("messages", messages),
        ("message_events", events),
        ("ledger", ledger),
        ("outbox", outbox),
        ("receipts", receipts),
        ("parking", parking),
    ])
}

/// The tables retention keeps bounded, for [`table_sizes`].
pub const RETAINED_TABLES: [&str; 6] = [
    "messages",
    "message_events",
    "ledger",
    "outbox",
    "receipts",
    "parking",
];

/// Bytes on disk of each table retention keeps bounded (heap, indexes and TOAST; the outbox's
/// partitions summed): what removal frees shows here once vacuum has made the space reusable,
/// as a table that stops growing.
pub async fn table_sizes(pool: &PgPool) -> Result<Vec<(&'static str, i64)>, StoreError> {
    let sizes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t.name,
                coalesce(CASE WHEN c.relkind = 'p'
                              THEN (SELECT sum(pg_total_relation_size(p.relid))
                                    FROM pg_partition_tree(c.oid) p WHERE p.isleaf)
                              ELSE pg_total_relation_size(c.oid) END, 0)::bigint
         FROM unnest($1::text[]) t(name) JOIN pg_class c ON c.oid = t.name::regclass",
    )
    .bind(RETAINED_TABLES.as_slice())
    .fetch_all(pool)
    .await?;
    Ok(RETAINED_TABLES
        .iter()
        .map(|table| {
            let bytes = sizes
                .iter()
                .find(|(name, _)| name == table)
                .map_or(0, |(_, bytes)| *bytes);
            (*table, bytes)
        })
        .collect())
}

/// What `herald_remove_messages` answers: fenced, examined, removed, rows removed, left open,
/// more, and the removed rows when archiving.
type MessagesRow = (bool, i64, i64, i64, i64, bool, Option<Json<Vec<Value>>>);
/// What `herald_remove_receipts` answers: fenced, removed, parked rows removed, more, and the
/// removed rows when archiving.
type ReceiptsRow = (bool, i64, i64, bool, Option<Json<Vec<Value>>>);

/// Runs a removal statement; with an archive, inside a transaction that commits only after
/// the rows it answered (`rows_of`) are written to a file and synced.
async fn archived<T>(
    pool: &PgPool,
    archive: Option<&ArchiveDir>,
    kind: Kind,
    statement: sqlx::query::QueryAs<'_, sqlx::Postgres, T, sqlx::postgres::PgArguments>,
    rows_of: impl FnOnce(&mut T) -> Option<Json<Vec<Value>>>,
) -> Result<T, StoreError>
where
    T: Send + Unpin + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
{
    let Some(archive) = archive else {
        return Ok(measured(Operation::Retention, statement.fetch_one(pool)).await?);
    };
    let mut tx = pool.begin().await?;
    let mut row = measured(Operation::Retention, statement.fetch_one(&mut *tx)).await?;
    if let Some(Json(rows)) = rows_of(&mut row) {
        if !rows.is_empty() {
            let archive = archive.clone();
            let written = tokio::task::spawn_blocking(move || archive.write(kind, &rows))
                .await
                .map_err(|err| crate::archive::ArchiveError::Io {
                    path: PathBuf::new(),
                    source: std::io::Error::other(err.to_string()),
                })??;
            tracing::info!(kind = kind.as_str(), file = %written.file, rows = written.rows,
                bytes = written.bytes, "archived before removal");
            ::metrics::counter!(ARCHIVED_ROWS, "what" => kind.as_str()).increment(written.rows);
            ::metrics::counter!(ARCHIVED_BYTES, "what" => kind.as_str()).increment(written.bytes);
        }
    }
    tx.commit().await?;
    Ok(row)
}

/// Rows written to the archive before their removal, by kind (`messages`, `receipts`).
pub const ARCHIVED_ROWS: &str = "herald_retention_archived_total";
/// Compressed bytes written to the archive, by kind.
pub const ARCHIVED_BYTES: &str = "herald_retention_archived_bytes_total";

/// What every retention statement answers when `fence` no longer holds: it changed nothing.
fn deposed(fence: Fence) -> StoreError {
    StoreError::Fenced {
        partition: fence.partition,
        epoch: fence.epoch,
    }
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
