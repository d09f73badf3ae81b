//! The verifier's counts: what was accepted, what has its effect, and what is missing.

use std::collections::HashMap;

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

/// What PostgreSQL knows about one message, for a proof that goes id by id (the load
/// tester's): when it was accepted, its effects, and how it ended.
#[derive(Debug, Clone, Default)]
pub struct MessageFacts {
    /// `messages.created_at`: the accept transaction.
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Ledger rows (effects).
    pub effects: i64,
    pub dead: bool,
    pub failed: bool,
    pub unknown: bool,
    /// The first ACCEPTED event.
    pub accepted_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl MessageFacts {
    /// The message has an outcome: an effect, DEAD or FAILED.
    pub fn settled(&self) -> bool {
        self.effects > 0 || self.dead || self.failed
    }
}

/// Looks up `ids` in PostgreSQL, 5,000 at a time.
pub async fn message_facts(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, MessageFacts>, StoreError> {
    let mut out: HashMap<Uuid, MessageFacts> = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(5000) {
        let chunk = chunk.to_vec();
        let created: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as("SELECT id, created_at FROM messages WHERE id = ANY($1)")
                .bind(&chunk)
                .fetch_all(pool)
                .await?;
        for (id, at) in created {
            out.entry(id).or_default().created_at = Some(at);
        }
        let effects: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT message_id, count(*) FROM ledger WHERE message_id = ANY($1) GROUP BY 1",
        )
        .bind(&chunk)
        .fetch_all(pool)
        .await?;
        for (id, n) in effects {
            out.entry(id).or_default().effects = n;
        }
        let events: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
            "SELECT message_id, state, min(at) FROM message_events
             WHERE message_id = ANY($1) AND state IN ('ACCEPTED', 'FAILED', 'UNKNOWN')
             GROUP BY 1, 2",
        )
        .bind(&chunk)
        .fetch_all(pool)
        .await?;
        for (id, state, at) in events {
            let fact = out.entry(id).or_default();
            match state.as_str() {
                "ACCEPTED" => fact.accepted_at = Some(at),
                "FAILED" => fact.failed = true,
                _ => fact.unknown = true,
            }
        }
        let dead: Vec<Uuid> = sqlx::query_scalar(
            "SELECT DISTINCT message_id FROM outbox
             WHERE message_id = ANY($1) AND job_type = 'send' AND status = 'DEAD'",
        )
        .bind(&chunk)
        .fetch_all(pool)
        .await?;
        for id in dead {
            out.entry(id).or_default().dead = true;
        }
    }
    Ok(out)
}
