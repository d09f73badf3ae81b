//! The parking table for operators: list parked input, and replay it.

use super::*;

/// A parked item, for operators.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Parked {
    pub id: i64,
    pub job_type: String,
    pub receipt_id: Option<i64>,
    pub gateway: Option<String>,
    /// The raw body as text (lossy for non-UTF-8 bytes; the bytes are kept as they came).
    pub raw: String,
    pub reason: String,
    pub parked_at: DateTime<Utc>,
}

/// Parked items not replayed yet with an id above `after` (0: from the first), oldest first,
/// at most `limit`.
pub async fn list_parked(pool: &PgPool, after: i64, limit: i64) -> Result<Vec<Parked>, StoreError> {
    let rows: Vec<ParkedRow> = sqlx::query_as(
        "SELECT p.id, p.job_type, p.receipt_id, r.gateway, p.raw, p.reason, p.parked_at
         FROM parking p LEFT JOIN receipts r ON r.id = p.receipt_id
         WHERE p.replayed_at IS NULL AND p.id > $2 ORDER BY p.id LIMIT $1",
    )
    .bind(limit)
    .bind(after)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Parked {
            id: row.id,
            job_type: row.job_type,
            receipt_id: row.receipt_id,
            gateway: row.gateway,
            raw: String::from_utf8_lossy(&row.raw).into_owned(),
            reason: row.reason,
            parked_at: row.parked_at,
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct ParkedRow {
    id: i64,
    job_type: String,
    receipt_id: Option<i64>,
    gateway: Option<String>,
    raw: Vec<u8>,
    reason: String,
    parked_at: DateTime<Utc>,
}

/// What an operator's replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// A new job was queued for the parked input.
    Queued {
        outbox_id: i64,
    },
    NotFound,
    AlreadyReplayed,
    /// Only parked receipts can be replayed.
    NotReplayable,
}

/// Queues the parked receipt again (after its mapping was fixed) and marks the item replayed,
/// in one transaction. `partition_of` routes the receipt like the receipts endpoint does.
pub async fn replay_parked(
    pool: &PgPool,
    id: i64,
    partition_of: impl Fn(&str, &[u8]) -> u32,
) -> Result<Replay, StoreError> {
    let mut tx = pool.begin().await?;
    let row: Option<(Option<i64>, bool)> = sqlx::query_as(
        "SELECT receipt_id, replayed_at IS NOT NULL FROM parking WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let receipt_id = match row {
        None => return Ok(Replay::NotFound),
        Some((_, true)) => return Ok(Replay::AlreadyReplayed),
        Some((None, false)) => return Ok(Replay::NotReplayable),
        Some((Some(receipt_id), false)) => receipt_id,
    };
    let (gateway, raw): (String, Vec<u8>) =
        sqlx::query_as("SELECT gateway, raw FROM receipts WHERE id = $1")
            .bind(receipt_id)
            .fetch_one(&mut *tx)
            .await?;
    let partition = partition_of(&gateway, &raw);
    sqlx::query("UPDATE parking SET replayed_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let outbox_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (partition, job_type, payload)
         VALUES ($1, $2, jsonb_build_object('receipt_id', $3::bigint, 'replay_of', $4::bigint))
         RETURNING id",
    )
    .bind(partition as i32)
    .bind(JobType::Status.as_str())
    .bind(receipt_id)
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    crate::accept::notify_partitions(&mut tx, &[partition as i32]).await?;
    tx.commit().await?;
    Ok(Replay::Queued { outbox_id })
}
