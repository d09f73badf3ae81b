//! The verifier's counts: what was accepted, what has its effect, and what is missing.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;

/// The database side of the proof that nothing was lost or doubled.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LedgerSummary {
    /// Messages committed by the API.
    pub accepted: i64,
    /// Messages with a ledger row: the provider accepted them.
    pub delivered: i64,
    /// Messages whose outbox row is DEAD (visible, re-drivable, not lost).
    pub dead: i64,
    /// Messages that ended FAILED by an internal check or a permanent provider rejection.
    pub failed: i64,
    /// Messages with no ledger row that are neither DEAD nor FAILED.
    pub lost: i64,
    /// Messages with more than one ledger row (must be 0).
    pub duplicate_effects: i64,
    /// Up to 20 ids of lost messages, to start an investigation.
    pub lost_sample: Vec<Uuid>,
}

/// Counts over the whole database. Run it after the pipeline drained: a message still in
/// flight counts as lost.
pub async fn ledger_summary(pool: &PgPool) -> Result<LedgerSummary, StoreError> {
    let (accepted, delivered, dead, failed, duplicate_effects): (i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT
                 (SELECT count(*) FROM messages),
                 (SELECT count(DISTINCT message_id) FROM ledger),
                 (SELECT count(DISTINCT message_id) FROM outbox
                  WHERE status = 'DEAD' AND job_type = 'send'),
                 (SELECT count(DISTINCT message_id) FROM message_events WHERE state = 'FAILED'),
                 (SELECT count(*) FROM (SELECT message_id FROM ledger
                                        GROUP BY message_id HAVING count(*) > 1) d)",
        )
        .fetch_one(pool)
        .await?;
    let lost_ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT m.id FROM messages m
         WHERE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.message_id = m.id)
           AND NOT EXISTS (SELECT 1 FROM outbox o
                           WHERE o.message_id = m.id AND o.status = 'DEAD')
           AND NOT EXISTS (SELECT 1 FROM message_events e
                           WHERE e.message_id = m.id AND e.state = 'FAILED')",
    )
    .fetch_all(pool)
    .await?;
    Ok(LedgerSummary {
        accepted,
        delivered,
        dead,
        failed,
        lost: lost_ids.len() as i64,
        duplicate_effects,
        lost_sample: lost_ids.into_iter().take(20).collect(),
    })
}

/// The idempotency keys of every effect in the ledger, to check against the provider's log.
pub async fn ledger_keys(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar("SELECT idempotency_key FROM ledger")
        .fetch_all(pool)
        .await?)
}
