//! The outbox backlog as gauges see it: per partition, the rows still owed work and the age of
//! the oldest PENDING row; in all, the DEAD rows waiting for an operator.

use sqlx::PgPool;

use crate::metrics::{measured, Operation};
use crate::StoreError;

/// One partition's backlog. Partitions with nothing owed read as zero, never as absent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionBacklog {
    pub partition: u32,
    /// Rows not yet DONE or DEAD: PENDING, PROCESSING and PUBLISHED.
    pub rows: i64,
    /// Age of the oldest PENDING row (including rows waiting out a retry back-off); 0 if none.
    pub oldest_pending_age_seconds: f64,
}

/// The whole outbox's backlog at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// Every partition `0..count`, in order.
    pub partitions: Vec<PartitionBacklog>,
    /// Rows in DEAD now; an operator's re-drive lowers it.
    pub dead_rows: i64,
}

#[derive(sqlx::FromRow)]
struct BacklogRow {
    partition: i32,
    rows: i64,
    dead: i64,
    oldest: f64,
}

/// Reads the backlog of every partition `0..count` in one statement. It reads only rows that
/// a partial index covers (PENDING, PROCESSING, PUBLISHED, DEAD), never the DONE ones.
pub async fn outbox_backlog(pool: &PgPool, count: u32) -> Result<Backlog, StoreError> {
    let rows: Vec<BacklogRow> = measured(
        Operation::Backlog,
        sqlx::query_as(
            "SELECT p.partition, coalesce(b.rows, 0) AS rows, coalesce(b.dead, 0) AS dead,
                    coalesce(b.oldest, 0) AS oldest
             FROM generate_series(0, $1 - 1) AS p(partition)
             LEFT JOIN (
                 SELECT partition,
                        count(*) FILTER (WHERE status <> 'DEAD') AS rows,
                        count(*) FILTER (WHERE status = 'DEAD') AS dead,
                        extract(epoch FROM now() - min(created_at)
                                FILTER (WHERE status = 'PENDING'))::float8 AS oldest
                 FROM outbox
                 WHERE status IN ('PENDING', 'PROCESSING', 'PUBLISHED', 'DEAD')
                 GROUP BY partition) b ON b.partition = p.partition
             ORDER BY p.partition",
        )
        .bind(count as i32)
        .fetch_all(pool),
    )
    .await?;
    let dead_rows = rows.iter().map(|row| row.dead).sum();
    Ok(Backlog {
        partitions: rows
            .into_iter()
            .map(|row| PartitionBacklog {
                partition: row.partition as u32,
                rows: row.rows,
                oldest_pending_age_seconds: row.oldest.max(0.0),
            })
            .collect(),
        dead_rows,
    })
}

/// The session-level advisory lock of the one API replica that exports the backlog gauges
/// (`'herald.backlog'` as eight bytes). The lock lives as long as the session that took it.
pub const EXPORTER_LOCK: i64 = 0x6865_7261_6c64_626c;

/// Takes the exporter's lock on `conn` if no other session holds it; true when this session
/// holds it (now or already).
pub async fn try_lead_exporter(conn: &mut sqlx::PgConnection) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(EXPORTER_LOCK)
        .fetch_one(conn)
        .await?)
}
