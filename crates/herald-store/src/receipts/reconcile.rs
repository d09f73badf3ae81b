//! Reconciliation of silent gateways (rule R7): sends accepted long ago without a final
//! receipt become UNKNOWN.

use super::*;

/// Reconciliation of silent gateways (rule R7) for messages accepted by an earlier release,
/// which kept them in `awaiting_receipt`: those accepted longer than `window` ago get
/// UNKNOWN unless a final receipt (or UNKNOWN) came since, at most `limit` per call; their
/// rows are deleted either way. Never FAILED, never UNDELIVERED: nobody knows. Returns how
/// many became UNKNOWN, and whether rows are left. [`reconcile_ledger`] reconciles the rest.
pub async fn mark_silent_unknown(
    pool: &PgPool,
    window: Duration,
    limit: i64,
) -> Result<(u64, bool), StoreError> {
    let (marked, taken): (i64, i64) = measured(
        Operation::Reconcile,
        sqlx::query_as(concat!(
            "WITH silent AS (
                 DELETE FROM awaiting_receipt
                 WHERE message_id = ANY(ARRAY(
                     SELECT message_id FROM awaiting_receipt
                     WHERE accepted_at < now() - make_interval(secs => $1)
                     ORDER BY accepted_at LIMIT $2
                     FOR UPDATE SKIP LOCKED))
                 RETURNING message_id, accepted_at
             ), marked AS (",
            mark_unknown!("silent", "accepted_at"),
            ")
             SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM silent)"
        ))
        .bind(window.as_secs_f64())
        .bind(limit)
        .fetch_one(pool),
    )
    .await?;
    Ok((marked as u64, taken >= limit))
}

/// The moment up to which every ledger row is committed: the clock, read before the
/// transactions writing the ledger at that moment (found in `pg_locks`, which every role may
/// read) have ended. A ledger row's `created_at` is the clock when its statement, holding its
/// lock on the ledger, wrote it; so a row created before that moment whose transaction had
/// not ended is among those waited for. `None` when they did not end within `wait`.
pub async fn ledger_committed_up_to(
    pool: &PgPool,
    wait: Duration,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let moment: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await?;
    let writers: Vec<String> = sqlx::query_scalar(
        "SELECT virtualtransaction FROM pg_locks
         WHERE locktype = 'relation' AND relation = 'ledger'::regclass
           AND mode = 'RowExclusiveLock' AND granted AND pid <> pg_backend_pid()",
    )
    .fetch_all(pool)
    .await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut writers = writers;
    while !writers.is_empty() {
        writers = sqlx::query_scalar(
            "SELECT virtualxid FROM pg_locks
             WHERE locktype = 'virtualxid' AND virtualxid = ANY($1) AND granted",
        )
        .bind(&writers)
        .fetch_all(pool)
        .await?;
        if writers.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Some(moment))
}

/// Reconciliation of silent gateways (rule R7): looks at the ledger rows created since the
/// last pass (`reconcile_watermark`) up to `cutoff` — at most about `limit` of them, oldest
/// first — and appends UNKNOWN to each whose message has neither a final receipt nor UNKNOWN,
/// then moves the watermark past them; in one statement, under the watermark's row lock (a
/// worker that finds it locked does nothing). `cutoff` must be no later than
/// [`ledger_committed_up_to`] minus the window, so no row below it can still appear. Returns
/// how many became UNKNOWN, and whether rows up to `cutoff` are left.
pub async fn reconcile_ledger(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<(u64, bool), StoreError> {
    let (marked, looked, locked): (i64, i64, bool) = measured(
        Operation::Reconcile,
        sqlx::query_as(concat!(
            "WITH mark AS (
                 SELECT reconciled_to FROM reconcile_watermark LIMIT 1 FOR UPDATE SKIP LOCKED
             ), bound AS (
                 SELECT coalesce(
                     (SELECT l.created_at FROM ledger l
                      WHERE l.created_at > mark.reconciled_to AND l.created_at <= $1
                      ORDER BY l.created_at OFFSET $2 - 1 LIMIT 1),
                     $1) AS upto,
                     mark.reconciled_to AS since
                 FROM mark
             ), candidates AS (
                 SELECT l.message_id, l.created_at FROM ledger l, bound
                 WHERE l.created_at > bound.since AND l.created_at <= bound.upto
             ), marked AS (",
            mark_unknown!("candidates", "created_at"),
            "), moved AS (
                 UPDATE reconcile_watermark w SET reconciled_to = bound.upto
                 FROM bound WHERE bound.upto > w.reconciled_to
             )
             SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM candidates),
                    EXISTS (SELECT 1 FROM mark)"
        ))
        .bind(cutoff)
        .bind(limit)
        .fetch_one(pool),
    )
    .await?;
    Ok((marked as u64, locked && looked >= limit))
}
