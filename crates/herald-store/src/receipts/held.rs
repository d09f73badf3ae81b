//! Receipts whose send is not recorded yet: held, released once a ledger row matches, parked
//! after waiting too long.

use super::*;

/// How long a receipt for a settled send (see [`settled_sends`]) waits for a newer send with
/// its provider id before it is applied to the settled one after all (a duplicate with another
/// time, or the provider correcting itself). Longer than a send takes from its provider call to
/// its ledger row, through a worker that died after the call and the claim lease that re-drives
/// it.
pub const SUPERSEDED_HOLD: Duration = Duration::from_secs(300);

/// How far the provider's clock may run behind PostgreSQL's: a receipt stamped up to this long
/// (plus its timestamp's resolution) before its effect's first attempt started still belongs
/// to it. A gateway must not reuse a provider id within this long plus its timestamps'
/// resolution (a minute for `YYMMDDhhmm`); one issuing 65,535 ids wraps after about a minute
/// at 1,000 messages a second.
pub const RECEIPT_CLOCK_SKEW: Duration = Duration::from_secs(10);

/// A receipt whose send is not recorded yet, to hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptToHold {
    pub partition: u32,
    pub outbox_id: i64,
    pub receipt_id: i64,
    pub gateway: String,
    pub provider_id: String,
    /// The latest moment the provider can have written it (stated time plus resolution).
    pub provider_time: DateTime<Utc>,
    /// Held although a recorded send matches: that send (submitted at this time) is settled by
    /// another final receipt. `None`: no recorded send matches.
    pub superseding: Option<DateTime<Utc>>,
}

/// Holds receipts no recorded send matches yet: each status job becomes DONE and its receipt
/// waits in `held_receipts`, in one statement, charged nothing. [`release_held_receipts`]
/// queues it again once a ledger row matches. Returns the (partition, outbox id) of the jobs
/// held; the others were another copy's. [`finish_status_jobs`] with holds only.
pub async fn hold_receipts(
    pool: &PgPool,
    receipts: &[ReceiptToHold],
) -> Result<Vec<(u32, i64)>, StoreError> {
    let outcomes = StatusOutcomes {
        holds: receipts.to_vec(),
        ..StatusOutcomes::default()
    };
    finish_status_jobs(pool, &outcomes.jobs(), &outcomes).await
}

/// Queues a new status job for every held receipt a ledger row now matches (at most `limit`),
/// and stops holding it, in one statement; rows another worker is releasing are skipped. A
/// receipt held against a settled send is released when a newer send with its provider id is
/// recorded, or, after [`SUPERSEDED_HOLD`], marked `as_duplicate` to be applied to the settled
/// send. Answers the partition of each job queued, to wake their pollers.
pub async fn release_held_receipts(pool: &PgPool, limit: i64) -> Result<Vec<u32>, StoreError> {
    let partitions: Vec<i32> = measured(
        Operation::Hold,
        sqlx::query_scalar(
            "WITH candidates AS (
                 SELECT h.receipt_id,
                        EXISTS (
                            SELECT 1 FROM ledger l
                            WHERE l.gateway = h.gateway AND l.provider_id = h.provider_id
                              AND coalesce(l.submitted_at, l.created_at)
                                  > coalesce(h.superseding, '-infinity')
                              AND coalesce(l.submitted_at, l.created_at)
                                  <= h.provider_time + make_interval(secs => $2)) AS recorded,
                        h.superseding IS NOT NULL
                            AND h.held_at < now() - make_interval(secs => $4) AS waited_out,
                        h.held_at
                 FROM held_receipts h
             ), matched AS (
                 SELECT h.receipt_id, NOT c.recorded AS as_duplicate
                 FROM held_receipts h JOIN candidates c USING (receipt_id)
                 WHERE c.recorded OR c.waited_out
                 ORDER BY c.held_at
                 LIMIT $1
                 FOR UPDATE OF h SKIP LOCKED
             ), released AS (
                 DELETE FROM held_receipts h USING matched m
                 WHERE h.receipt_id = m.receipt_id
                 RETURNING h.receipt_id, h.partition, h.held_at, m.as_duplicate
             ), queued AS (
                 INSERT INTO outbox (partition, job_type, payload)
                 SELECT partition, $3,
                        jsonb_build_object('receipt_id', receipt_id, 'held_since', held_at)
                        || CASE WHEN as_duplicate THEN '{\"as_duplicate\": true}'::jsonb
                                ELSE '{}'::jsonb END
                 FROM released ORDER BY receipt_id
                 RETURNING partition
             )
             SELECT partition FROM queued",
        )
        .bind(limit)
        .bind(RECEIPT_CLOCK_SKEW.as_secs_f64())
        .bind(JobType::Status.as_str())
        .bind(SUPERSEDED_HOLD.as_secs_f64())
        .fetch_all(pool),
    )
    .await?;
    Ok(partitions.into_iter().map(|p| p as u32).collect())
}

/// Parks receipts held longer than `hold_for` (no send with their provider id was ever
/// recorded: a gateway misconfigured, or a receipt for another system), with their raw bodies
/// and the reason, at most `limit`. Answers how many were parked.
pub async fn park_expired_held(
    pool: &PgPool,
    hold_for: Duration,
    limit: i64,
) -> Result<u64, StoreError> {
    let done = measured(
        Operation::Hold,
        sqlx::query(
            "WITH expired AS (
                 DELETE FROM held_receipts
                 WHERE receipt_id IN (SELECT receipt_id FROM held_receipts
                                      WHERE held_at < now() - make_interval(secs => $1)
                                      ORDER BY held_at LIMIT $2
                                      FOR UPDATE SKIP LOCKED)
                 RETURNING receipt_id, gateway, provider_id, held_at
             )
             INSERT INTO parking (job_type, receipt_id, raw, reason)
             SELECT $3, e.receipt_id, r.raw,
                    format('no send through gateway %s with provider id %s was recorded \
                            while the receipt was held (since %s)',
                           e.gateway, e.provider_id, e.held_at)
             FROM expired e JOIN receipts r ON r.id = e.receipt_id",
        )
        .bind(hold_for.as_secs_f64())
        .bind(limit)
        .bind(JobType::Status.as_str())
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected())
}

/// Receipts held now (a gauge: a growing number means sends are recorded late, or receipts
/// come for provider ids Herald never sent).
pub async fn count_held(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM held_receipts")
        .fetch_one(pool)
        .await?)
}
