//! The poller's statements on the outbox: claim, mark, release and re-drive (rules R2, R3).
//! Every one of them names the partition and checks the caller's fencing epoch against
//! `partition_leases` in the same statement: a poller that lost its partition changes nothing.
//!
//! Longer than 400 lines: every statement on the outbox is written out beside its function, so the
//! fence and the lock order of each can be read in one place; most of the length is SQL.

use std::time::Duration;

use herald_core::job::Job;
use herald_core::JobType;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::metrics::{measured, Operation};
use crate::StoreError;

pub use herald_core::Fence;

/// Claims up to `limit` PENDING rows that are due, oldest first, skipping rows another
/// transaction holds. Claimed rows become PROCESSING with `claimed_at` set (a claim charges
/// no attempt: the worker's confirm does, before its provider call). Fails with [`StoreError::Fenced`] (and claims nothing) when the fence's epoch
/// is no longer the partition's.
pub async fn claim_pending(
    pool: &PgPool,
    fence: Fence,
    limit: u32,
) -> Result<Vec<Job>, StoreError> {
    claim_pending_of(pool, fence, limit, &JobType::ALL).await
}

/// [`claim_pending`] restricted to `job_types`: rows of other types stay PENDING (their queue
/// store is full or unreachable).
pub async fn claim_pending_of(
    pool: &PgPool,
    fence: Fence,
    limit: u32,
    job_types: &[JobType],
) -> Result<Vec<Job>, StoreError> {
    claim_pending_many(
        pool,
        &[(fence, job_types.to_vec())],
        limit,
        ClaimAs::Processing,
    )
    .await?
    .pop()
    .unwrap_or(Ok(Vec::new()))
}

/// The status a claim gives its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAs {
    /// PROCESSING: the caller publishes and then marks the rows PUBLISHED (two writes per
    /// row; a row whose owner died before publishing is returned at once by the next owner's
    /// [`redrive_orphaned`]).
    Processing,
    /// PUBLISHED at once, before the publish: one write per row fewer and no mark statement.
    /// A row whose publish never happened (its poller died between the claim's commit and the
    /// XADD) is in no stream and is returned by [`redrive_stale`] after `--stale-after`, like
    /// a job the queue store lost. A publish that fails is released as before.
    Published,
}

impl ClaimAs {
    fn status(self) -> &'static str {
        match self {
            ClaimAs::Processing => "PROCESSING",
            ClaimAs::Published => "PUBLISHED",
        }
    }
}

#[derive(sqlx::FromRow)]
struct ClaimedRow {
    ord: i64,
    held: bool,
    partition: Option<i32>,
    id: Option<i64>,
    job_type: Option<String>,
    message_id: Option<Uuid>,
    payload: Option<Json<Value>>,
    attempts: Option<i32>,
}

/// The claim, for many partitions in one statement: up to `limit` due PENDING rows of each
/// fence's partition (oldest first, skipping rows another transaction holds, through the
/// partition's partial index), of the job types open for it; claimed rows become PROCESSING
/// or PUBLISHED (`claim_as`) with `claimed_at` set; no attempt is charged. Answers, in
/// input order, the jobs
/// claimed for each fence, or `Err(Fenced)` for a fence that no longer holds (nothing of its
/// partition was claimed).
pub async fn claim_pending_many(
    pool: &PgPool,
    requests: &[(Fence, Vec<JobType>)],
    limit: u32,
    claim_as: ClaimAs,
) -> Result<Vec<Result<Vec<Job>, StoreError>>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let partitions: Vec<i32> = requests.iter().map(|(f, _)| f.partition as i32).collect();
    let epochs: Vec<i64> = requests.iter().map(|(f, _)| f.epoch).collect();
    let open: Vec<String> = requests
        .iter()
        .map(|(_, types)| {
            types
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let rows: Vec<ClaimedRow> = measured(
        Operation::Claim,
        sqlx::query_as(
            "WITH input AS (
                 SELECT * FROM UNNEST($1::int[], $2::bigint[], $3::text[]) WITH ORDINALITY
                     AS t(partition, epoch, open, ord)
             ), fences AS (
                 SELECT i.ord, i.partition, i.epoch, string_to_array(i.open, ',') AS open,
                        EXISTS (SELECT 1 FROM partition_leases l
                                WHERE l.partition = i.partition AND l.epoch = i.epoch) AS held
                 FROM input i
             ), candidates AS (
                 SELECT f.ord, c.partition, c.id
                 FROM fences f
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id FROM outbox o
                     WHERE o.partition = f.partition AND o.status = 'PENDING'
                       AND o.available_at <= now() AND o.job_type = ANY(f.open)
                     ORDER BY o.id
                     LIMIT $4
                     FOR UPDATE SKIP LOCKED
                 ) c
                 WHERE f.held
             ), claimed AS (
                 UPDATE outbox o
                 SET status = $5, claimed_at = now(), claimed_epoch = f.epoch
                 FROM candidates c JOIN fences f ON f.ord = c.ord
                 WHERE o.partition = c.partition AND o.id = c.id
                 RETURNING f.ord, o.partition, o.id, o.job_type, o.message_id, o.payload,
                           o.attempts
             )
             SELECT f.ord, f.held, c.partition, c.id, c.job_type, c.message_id, c.payload,
                    c.attempts
             FROM fences f LEFT JOIN claimed c ON c.ord = f.ord",
        )
        .bind(&partitions)
        .bind(&epochs)
        .bind(&open)
        .bind(i64::from(limit))
        .bind(claim_as.status())
        .fetch_all(pool),
    )
    .await?;
    let mut answers: Vec<Result<Vec<Job>, StoreError>> =
        requests.iter().map(|_| Ok(Vec::new())).collect();
    for row in rows {
        let Some(slot) = answers.get_mut((row.ord - 1) as usize) else {
            continue;
        };
        let (fence, _) = requests[(row.ord - 1) as usize];
        if !row.held {
            *slot = Err(StoreError::Fenced {
                partition: fence.partition,
                epoch: fence.epoch,
            });
            continue;
        }
        let (Some(partition), Some(id), Some(job_type), Some(Json(payload)), Some(attempts)) = (
            row.partition,
            row.id,
            row.job_type,
            row.payload,
            row.attempts,
        ) else {
            continue; // the fence row alone: nothing was due
        };
        let job_type = job_type
            .parse()
            .map_err(|err: herald_core::job::UnknownJobType| {
                StoreError::Corrupt(err.to_string())
            })?;
        if let Ok(jobs) = slot {
            jobs.push(Job {
                outbox_id: id,
                partition: partition as u32,
                job_type,
                message_id: row.message_id,
                attempt: attempts,
                payload,
            });
        }
    }
    for jobs in answers.iter_mut().flatten() {
        jobs.sort_by_key(|job| job.outbox_id);
    }
    Ok(answers)
}

/// Marks published rows PUBLISHED. Rows a worker already finished (DONE) are left alone.
/// Returns how many rows changed. The rows are locked in id order first, the order every
/// batched statement on the outbox locks in (the worker's confirm, the receipts' apply):
/// locked in whatever order the plan visits them, a mark and a confirm of the same rows
/// deadlocked, and the loser's whole batch waited a minute to be reclaimed.
pub async fn mark_published(pool: &PgPool, fence: Fence, ids: &[i64]) -> Result<u64, StoreError> {
    let done = measured(
        Operation::Mark,
        sqlx::query(
            "WITH locked AS (
                 SELECT id FROM outbox
                 WHERE partition = $1 AND id = ANY($3) AND status = 'PROCESSING'
                   AND EXISTS (SELECT 1 FROM partition_leases l
                               WHERE l.partition = $1 AND l.epoch = $2)
                 ORDER BY id
                 FOR UPDATE
             )
             UPDATE outbox o SET status = 'PUBLISHED'
             FROM locked l
             WHERE o.partition = $1 AND o.id = l.id AND o.status = 'PROCESSING'",
        )
        .bind(fence.partition as i32)
        .bind(fence.epoch)
        .bind(ids)
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// Returns claimed rows that could not be published to PENDING (a claim charged no attempt,
/// so an outage of the queue store never pushes rows towards DEAD). Only rows this fence claimed (PROCESSING, or PUBLISHED by a
/// [`ClaimAs::Published`] claim) move; one a worker already finished stays DONE.
pub async fn release_unpublished(
    pool: &PgPool,
    fence: Fence,
    ids: &[i64],
) -> Result<u64, StoreError> {
    let done = measured(
        Operation::Release,
        sqlx::query(
            "WITH locked AS (
                 SELECT id FROM outbox
                 WHERE partition = $1 AND id = ANY($3)
                   AND status IN ('PROCESSING', 'PUBLISHED') AND claimed_epoch = $2
                   AND EXISTS (SELECT 1 FROM partition_leases l
                               WHERE l.partition = $1 AND l.epoch = $2)
                 ORDER BY id
                 FOR UPDATE
             )
             UPDATE outbox o SET status = 'PENDING', claimed_at = NULL
             FROM locked l
             WHERE o.partition = $1 AND o.id = l.id
               AND o.status IN ('PROCESSING', 'PUBLISHED')",
        )
        .bind(fence.partition as i32)
        .bind(fence.epoch)
        .bind(ids)
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// What one re-drive pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Redriven {
    /// Stale rows returned to PENDING.
    pub pending: u64,
}

/// Per job type, the moment before which a published job that is still unconfirmed can only
/// have been lost by its queue store: the store's oldest entry (minus a margin for the clocks
/// of PostgreSQL and Redis) was added after it. A row claimed later may still be waiting in the
/// stream, read or not, and is not re-driven however long it waits. `None`: no limit (the
/// stream is empty, so every unconfirmed job is lost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LostBefore {
    /// Milliseconds since the epoch.
    pub send_ms: Option<i64>,
    pub status_ms: Option<i64>,
}

impl LostBefore {
    /// No limit for either job type: every row past `stale_after` is re-driven.
    pub const ANY: LostBefore = LostBefore {
        send_ms: None,
        status_ms: None,
    };

    /// For one job type.
    pub fn set(&mut self, job_type: JobType, ms: Option<i64>) {
        match job_type {
            JobType::Send => self.send_ms = ms,
            JobType::Status => self.status_ms = ms,
        }
    }
}

/// Moves PROCESSING/PUBLISHED rows claimed longer than `stale_after` ago, and before their job
/// type's `lost_before`, back to PENDING, uncharged: no worker confirmed them, so no provider
/// call was made for that claim, and a job its queue store lost is no fault of the message.
/// Such a row never becomes DEAD here. Nothing is deleted. A job
/// waiting in a long stream is not stale: the poller passes the age of each store's oldest
/// entry as `lost_before`.
pub async fn redrive_stale(
    pool: &PgPool,
    fence: Fence,
    stale_after: Duration,
    lost_before: LostBefore,
) -> Result<Redriven, StoreError> {
    let mut moved = redrive_stale_many(pool, &[(fence, lost_before)], stale_after).await?;
    Ok(moved.pop().unwrap_or_default())
}

/// [`redrive_stale`] for many partitions in one statement, each with its own fence and
/// `lost_before` (partitions publish to different shards). A fence that no longer holds moves
/// nothing of its partition. Answers, in input order, what moved in each partition.
pub async fn redrive_stale_many(
    pool: &PgPool,
    requests: &[(Fence, LostBefore)],
    stale_after: Duration,
) -> Result<Vec<Redriven>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let partitions: Vec<i32> = requests.iter().map(|(f, _)| f.partition as i32).collect();
    let epochs: Vec<i64> = requests.iter().map(|(f, _)| f.epoch).collect();
    let send_ms: Vec<Option<f64>> = requests
        .iter()
        .map(|(_, l)| l.send_ms.map(|ms| ms as f64))
        .collect();
    let status_ms: Vec<Option<f64>> = requests
        .iter()
        .map(|(_, l)| l.status_ms.map(|ms| ms as f64))
        .collect();
    let counts: Vec<(i32, String, i64)> = measured(
        Operation::Redrive,
        sqlx::query_as(
            "WITH held AS (
                 SELECT i.partition,
                        coalesce(to_timestamp(i.send_ms / 1000), 'infinity') AS send_before,
                        coalesce(to_timestamp(i.status_ms / 1000), 'infinity') AS status_before
                 FROM UNNEST($1::int[], $2::bigint[], $4::float8[], $5::float8[])
                     AS i(partition, epoch, send_ms, status_ms)
                 WHERE EXISTS (SELECT 1 FROM partition_leases l
                               WHERE l.partition = i.partition AND l.epoch = i.epoch)
             ), stale AS (
                 SELECT s.partition, s.id
                 FROM held h
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id FROM outbox o
                     WHERE o.partition = h.partition AND o.status IN ('PROCESSING', 'PUBLISHED')
                       AND o.claimed_at < now() - make_interval(secs => $3)
                       AND o.claimed_at < CASE o.job_type WHEN 'send' THEN h.send_before
                                                          ELSE h.status_before END
                     FOR UPDATE SKIP LOCKED
                 ) s
             ), moved AS (
                 UPDATE outbox o
                 SET status = 'PENDING',
                     last_error = 'stale: not confirmed by a worker in time, and gone from \
                                   its queue store'
                 FROM stale
                 WHERE o.partition = stale.partition AND o.id = stale.id
                 RETURNING o.partition, o.status
             )
             SELECT partition, status, count(*) FROM moved GROUP BY partition, status",
        )
        .bind(&partitions)
        .bind(&epochs)
        .bind(stale_after.as_secs_f64())
        .bind(&send_ms)
        .bind(&status_ms)
        .fetch_all(pool),
    )
    .await?;
    tally_by_partition(&partitions, counts)
}

/// Returns rows a previous owner claimed but never published to PENDING at once, without
/// waiting for them to go stale: a claim under an older epoch can never be marked (the fence
/// refuses it), so its rows would otherwise sit until the re-drive timeout. A claim charges
/// no attempt, so a handoff costs the message nothing. Rows already PUBLISHED
/// are in a stream and are left to the workers. Returns how many rows moved.
pub async fn redrive_orphaned(pool: &PgPool, fence: Fence) -> Result<u64, StoreError> {
    let done = measured(
        Operation::Redrive,
        sqlx::query(
            "UPDATE outbox SET status = 'PENDING', claimed_at = NULL,
                               last_error = 'claimed by a previous owner, never published'
             WHERE partition = $1 AND status = 'PROCESSING' AND claimed_epoch < $2
               AND EXISTS (SELECT 1 FROM partition_leases l
                           WHERE l.partition = $1 AND l.epoch = $2)",
        )
        .bind(fence.partition as i32)
        .bind(fence.epoch)
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// A claim written before claims had leases (by a worker of an earlier version during a
/// rolling upgrade) is re-driven this long after it was made.
pub const UNLEASED_CLAIM_STALE_AFTER: Duration = Duration::from_secs(300);

/// Re-drives sends whose worker wrote CLAIMED and then stopped renewing the claim's lease
/// before it recorded an outcome (it died or froze before, during or after the provider
/// call): the outbox row goes back to PENDING with a RETRYING event saying the outcome is
/// unknown. Never DEAD: the attempt was charged at the confirm, and once attempts are used up
/// the next one asks the provider by key. The next attempt carries the same idempotency key,
/// so a call the provider did take is not doubled; the frozen worker's own later writes
/// present a lease that no longer exists and change nothing.
pub async fn redrive_stale_claims(pool: &PgPool, fence: Fence) -> Result<Redriven, StoreError> {
    let mut moved = redrive_stale_claims_many(pool, &[fence]).await?;
    Ok(moved.pop().unwrap_or_default())
}

/// [`redrive_stale_claims`] for many partitions in one statement. A fence that no longer holds
/// moves nothing of its partition. Answers, in input order, what moved in each partition.
pub async fn redrive_stale_claims_many(
    pool: &PgPool,
    fences: &[Fence],
) -> Result<Vec<Redriven>, StoreError> {
    if fences.is_empty() {
        return Ok(Vec::new());
    }
    let partitions: Vec<i32> = fences.iter().map(|f| f.partition as i32).collect();
    let epochs: Vec<i64> = fences.iter().map(|f| f.epoch).collect();
    let counts: Vec<(i32, String, i64)> = measured(
        Operation::Redrive,
        sqlx::query_as(
            "WITH held AS (
                 SELECT i.partition
                 FROM UNNEST($1::int[], $2::bigint[]) AS i(partition, epoch)
                 WHERE EXISTS (SELECT 1 FROM partition_leases l
                               WHERE l.partition = i.partition AND l.epoch = i.epoch)
             ), stale AS (
                 DELETE FROM in_flight_sends s
                 WHERE s.partition IN (SELECT partition FROM held)
                   AND coalesce(s.lease_until, s.claimed_at + make_interval(secs => $3)) < now()
                 RETURNING s.partition, s.message_id, s.outbox_id
             ), moved AS (
                 UPDATE outbox o
                 SET status = 'PENDING', claimed_at = NULL,
                     last_error = 'claim lease expired: the worker recorded no outcome'
                 FROM stale
                 WHERE o.partition = stale.partition AND o.id = stale.outbox_id
                   AND o.status = 'DONE'
                   AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.message_id = stale.message_id)
                 RETURNING o.partition, o.id, o.message_id, o.status, o.attempts
             ), events AS (
                 INSERT INTO message_events (message_id, state, detail)
                 SELECT message_id, 'RETRYING',
                        jsonb_build_object('reason', 'claim lease expired: the worker recorded no outcome',
                                           'attempt', attempts, 'outbox_id', id,
                                           'outcome', 'unknown')
                 FROM moved
             )
             SELECT partition, status, count(*) FROM moved GROUP BY partition, status",
        )
        .bind(&partitions)
        .bind(&epochs)
        .bind(UNLEASED_CLAIM_STALE_AFTER.as_secs_f64())
        .fetch_all(pool),
    )
    .await?;
    tally_by_partition(&partitions, counts)
}

/// Returns a claimed or published job to PENDING, due after `backoff`, keeping its attempt
/// count (a receipt whose message is not known yet waits for the send to be recorded).
pub async fn defer_job(
    pool: &PgPool,
    partition: u32,
    outbox_id: i64,
    reason: &str,
    backoff: Duration,
) -> Result<bool, StoreError> {
    let done = measured(
        Operation::Retry,
        sqlx::query(
            "UPDATE outbox SET status = 'PENDING', claimed_at = NULL, last_error = $3,
                               available_at = now() + make_interval(secs => $4)
             WHERE partition = $1 AND id = $2 AND status IN ('PROCESSING', 'PUBLISHED')",
        )
        .bind(partition as i32)
        .bind(outbox_id)
        .bind(reason)
        .bind(backoff.as_secs_f64())
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A DEAD outbox row, for operators.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeadRow {
    pub id: i64,
    pub partition: i32,
    pub job_type: String,
    pub message_id: Option<Uuid>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// DEAD rows with an id above `after` (0: from the first), oldest first, at most `limit`.
pub async fn list_dead(pool: &PgPool, after: i64, limit: i64) -> Result<Vec<DeadRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT id, partition, job_type, message_id, attempts, last_error, created_at
         FROM outbox WHERE status = 'DEAD' AND id > $2 ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .bind(after)
    .fetch_all(pool)
    .await?)
}

/// DEAD rows in all.
pub async fn count_dead(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'DEAD'")
            .fetch_one(pool)
            .await?,
    )
}

/// An operator's re-drive of a DEAD row: PENDING again with a fresh attempt budget, a
/// RETRYING event on its message, and a wake-up for the partition's poller. Returns the row's
/// partition, or `None` when no DEAD row has that id.
pub async fn redrive_dead(pool: &PgPool, outbox_id: i64) -> Result<Option<u32>, StoreError> {
    let mut tx = pool.begin().await?;
    let row: Option<(i32, Option<Uuid>, String)> = sqlx::query_as(
        "UPDATE outbox SET status = 'PENDING', attempts = 0, available_at = now(),
                           claimed_at = NULL, last_error = 'operator re-drive'
         WHERE id = $1 AND status = 'DEAD'
         RETURNING partition, message_id, job_type",
    )
    .bind(outbox_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((partition, message_id, job_type)) = row else {
        return Ok(None);
    };
    if let (Some(message_id), "send") = (message_id, job_type.as_str()) {
        sqlx::query(
            "INSERT INTO message_events (message_id, state, detail)
             VALUES ($1, 'RETRYING', jsonb_build_object('reason', 'operator re-drive', 'outbox_id', $2::bigint))",
        )
        .bind(message_id)
        .bind(outbox_id)
        .execute(&mut *tx)
        .await?;
    }
    crate::accept::notify_partitions(&mut tx, &[partition]).await?;
    tx.commit().await?;
    Ok(Some(partition as u32))
}

/// Counts a re-drive's `(partition, status, rows)` result for each of `partitions`, in order.
fn tally_by_partition(
    partitions: &[i32],
    counts: Vec<(i32, String, i64)>,
) -> Result<Vec<Redriven>, StoreError> {
    let mut moved = vec![Redriven::default(); partitions.len()];
    for (partition, status, count) in counts {
        if status != "PENDING" {
            return Err(StoreError::Corrupt(format!(
                "re-drive moved a row to {status}"
            )));
        }
        for (slot, asked) in moved.iter_mut().zip(partitions) {
            if *asked == partition {
                slot.pending += count as u64;
                break;
            }
        }
    }
    Ok(moved)
}

/// One partition as operators see it: its recorded owner and epoch, and its backlog.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionView {
    pub partition: u32,
    /// The poller that recorded the latest epoch (etcd is the source of truth for liveness).
    pub owner: Option<String>,
    pub epoch: Option<i64>,
    pub acquired_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
}

#[derive(sqlx::FromRow)]
struct PartitionRow {
    partition: i32,
    owner: Option<String>,
    epoch: Option<i64>,
    acquired_at: Option<chrono::DateTime<chrono::Utc>>,
    pending: i64,
    oldest: f64,
}

/// Every partition `0..count` with its owner, epoch and PENDING backlog.
pub async fn partitions_overview(
    pool: &PgPool,
    count: u32,
) -> Result<Vec<PartitionView>, StoreError> {
    let rows: Vec<PartitionRow> = measured(
        Operation::Backlog,
        sqlx::query_as(
            "SELECT p.partition, l.owner, l.epoch, l.acquired_at,
                    coalesce(b.pending, 0) AS pending, coalesce(b.oldest, 0) AS oldest
             FROM generate_series(0, $1 - 1) AS p(partition)
             LEFT JOIN partition_leases l ON l.partition = p.partition
             LEFT JOIN (SELECT partition, count(*) AS pending,
                               extract(epoch FROM now() - min(created_at))::float8 AS oldest
                        FROM outbox WHERE status = 'PENDING' GROUP BY partition) b
                    ON b.partition = p.partition
             ORDER BY p.partition",
        )
        .bind(count as i32)
        .fetch_all(pool),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| PartitionView {
            partition: row.partition as u32,
            owner: row.owner,
            epoch: row.epoch,
            acquired_at: row.acquired_at,
            pending: row.pending,
            oldest_pending_age_seconds: row.oldest,
        })
        .collect())
}
